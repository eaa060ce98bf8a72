"""The recall task: layout by hand, chance, determinism, only the queries scored, settings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import tiny, tiny_train

from inftyformer import MemoryLM
from inftyformer.native.model import IGNORE_INDEX
from inftyformer.tasks import RunContext, Shard, get_task
from inftyformer.tasks.recall import (
    RecallConfig,
    RecallDataset,
    RecallTask,
    chance_accuracy,
    recall_example,
)
from inftyformer.training import Trainer, evaluate_run

SMALL = RecallConfig(num_pairs=2, gap=3, num_keys=4, num_values=3, num_fillers=2)


def test_layout_by_hand() -> None:
    inputs, targets = recall_example(SMALL, 2, 3, 1, np.random.default_rng(0), block=8)
    x, y = inputs[0].tolist(), targets[0].tolist()
    assert len(x) == 16  # 4P + G = 11, padded in front to 16
    keys, values, fillers = range(0, 4), range(4, 7), range(7, 9)
    pad, pairs, gap, asked = x[:5], x[5:9], x[9:12], x[12:]
    assert all(t in fillers for t in pad + gap)
    k1, v1, k2, v2 = pairs
    assert k1 in keys and k2 in keys and k1 != k2 and v1 in values and v2 in values
    answer = {k1: v1, k2: v2}
    q1, a1, q2, a2 = asked
    assert {q1, q2} == {k1, k2} and a1 == answer[q1] and a2 == answer[q2]
    # the position of each query predicts its value; nothing else is scored
    assert y == [IGNORE_INDEX] * 12 + [a1, IGNORE_INDEX, a2, IGNORE_INDEX]


def test_queries_and_scoring_on_a_batch() -> None:
    config = RecallConfig(num_pairs=5, gap=40, num_keys=8, num_values=6, num_fillers=3)
    inputs, targets = recall_example(config, 5, 40, 64, np.random.default_rng(1), block=16)
    assert inputs.shape == targets.shape == (64, 64)  # 4·5 + 40 = 60, padded to 64
    scored = targets != IGNORE_INDEX
    assert scored.sum(1).tolist() == [5] * 64  # one per query
    assert scored[:, -10::2].all()  # the query positions, and only them
    for row_in, row_tg in zip(inputs, targets, strict=True):
        pairs = row_in[4:14]  # after a pad of 4
        table = dict(zip(pairs[::2].tolist(), pairs[1::2].tolist(), strict=True))
        assert len(table) == 5 and sorted(table) == sorted(row_in[-10::2].tolist())
        assert [table[q] for q in row_in[-10::2]] == row_tg[-10::2].tolist()
        assert (row_in[14:54] >= 14).all()  # the gap is filler only
    # values are uniform over the 6, whatever the key: chance is 1/6
    assert chance_accuracy(config) == pytest.approx(1 / 6)
    counts = np.bincount(targets[scored] - 8, minlength=6)
    assert counts.min() > 0.1 * scored.sum() and counts.max() < 0.25 * scored.sum()


def test_dataset_is_a_pure_function_of_seed_split_and_index() -> None:
    config = RecallConfig(num_pairs=(2, 3), gap=(0, 5, 30))
    data = RecallDataset(config, batch_size=4, block=8, split="train", seed=3)
    a, b = data.batch(7), data.batch(7)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(data.batch(8)[0][:, -4:], a[0][:, -4:])
    test = RecallDataset(config, batch_size=4, block=8, split="test", seed=3)
    assert not torch.equal(test.batch(7)[0][:, -4:], a[0][:, -4:])
    layouts = {data.layout(i) for i in range(60)}
    assert layouts == {(p, g) for p in (2, 3) for g in (0, 5, 30)}  # the lists are mixed
    for i in range(10):
        P, G = data.layout(i)
        inputs, targets = data.batch(i)
        assert inputs.shape[1] % 8 == 0 and inputs.shape[1] - 4 * P - G < 8
        assert int((targets != IGNORE_INDEX).sum()) == 4 * P


def test_config_normalises_and_validates() -> None:
    config = RecallConfig(num_pairs=3, gap=[10, 20])
    assert config.num_pairs == (3,) and config.gap == (10, 20)
    assert RecallConfig.from_dict(config.to_dict()) == config  # as stored in a checkpoint
    assert config.vocab_size == 48
    with pytest.raises(ValueError, match="num_keys"):
        RecallConfig(num_pairs=5, num_keys=4)
    with pytest.raises(ValueError, match="gap"):
        RecallConfig(gap=(-1,))
    with pytest.raises(TypeError, match="num_pairs"):
        RecallConfig(num_pairs=())
    with pytest.raises(TypeError, match="gap"):
        RecallConfig(gap="12")


def test_check_refuses_queries_longer_than_a_segment() -> None:
    config = RecallConfig(num_pairs=(2, 5))
    with pytest.raises(ValueError, match="last segment"):
        RecallTask.check(config, tiny("xl", vocab_size=48))  # 10 tokens > segment_len 8
    with pytest.raises(ValueError, match="vocab_size"):
        RecallTask.check(RecallConfig(num_pairs=2), tiny("xl"))


class _Counting(torch.nn.Module):
    """Counts the calls of a model (forwarding its config and state)."""

    def __init__(self, model: MemoryLM) -> None:
        super().__init__()
        self.inner, self.calls = model, []
        self.config = model.config

    def init_state(self, *args, **kwargs):
        return self.inner.init_state(*args, **kwargs)

    def forward(self, tokens, **kwargs):
        self.calls.append((tokens.shape[1], torch.is_grad_enabled()))
        return self.inner(tokens, **kwargs)


def test_every_block_is_streamed_and_only_the_last_scored() -> None:
    config = RecallConfig(num_pairs=2, gap=30, num_keys=4, num_values=4, num_fillers=4)
    model_cfg = tiny("xl", **RecallTask.model_overrides(config))
    task = get_task("recall")(config, model_cfg, RunContext(batch_size=4, seed=0))
    model = _Counting(MemoryLM(model_cfg))
    out = task.loss(model, task.batch(0), slice(0, 4), 0)
    # 4·2 + 30 = 38 tokens, padded to 40: four memory blocks without gradient, then the last
    assert model.calls == [(8, False)] * 4 + [(8, True)]
    assert out.sums["count"] == 4 * 2 and out.loss.requires_grad
    evaluation = task.evaluate(model.inner, "test", 3, Shard())
    assert task.eval_metrics(evaluation.sums)["queries"] == 3 * 4 * 2
    assert task.chance() == {"uniform": 0.25}


def test_train_then_evaluate_at_another_gap(tmp_path) -> None:
    config = RecallConfig(num_pairs=(1, 2), gap=(0, 8), num_keys=4, num_values=4, num_fillers=2)
    model_cfg = tiny("infty", **RecallTask.model_overrides(config))
    run = tiny_train(tmp_path, task="recall", steps=3, eval_every=3)
    result = Trainer(run, config, model_cfg, echo=lambda s: None).fit()
    assert result.finished and 0 <= result.test["accuracy"] <= 1
    metrics, _, task = evaluate_run(tmp_path, "test", 2, task_settings={"gap": 50, "num_pairs": 2})
    assert task.config.gap == (50,) and task.config.num_pairs == (2,)
    assert metrics["queries"] == 2 * 4 * 2


def test_prompt_ends_at_the_first_query() -> None:
    config = RecallConfig(num_pairs=3, gap=20)
    task = RecallTask(config, tiny("xl", vocab_size=48), RunContext(batch_size=2, seed=0))
    tokens, expected = task.encode_prompt("random:10")
    assert tokens.shape == (4 * 3 + 10 - 2 * 3 + 1,) and len(expected) == 1
    pairs = tokens[:6].tolist()
    assert dict(zip(pairs[::2], pairs[1::2], strict=True))[int(tokens[-1])] == expected[0]
    assert task.decode([0, 16, 40]) == "k0 v0 ."
    with pytest.raises(ValueError, match="random"):
        task.encode_prompt("3 4 5")


def test_inspection_stream_is_one_long_example() -> None:
    config = RecallConfig(num_pairs=(2, 3), gap=8)
    task = RecallTask(config, tiny("xl", vocab_size=48), RunContext(batch_size=2, seed=0))
    stream = task.inspection_stream("valid", 100)
    assert stream.shape == (104,)  # 4·3 + 88 filler, padded to whole segments of 8
    assert (stream[-6::2] < 16).all()  # ends with the 3 queries
