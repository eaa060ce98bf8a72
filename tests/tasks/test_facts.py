"""The facts task: a fact written into a real book window d tokens before its question, the
answer scored; evaluation facts differ from training ones in wording, key format and books."""

import re

import pytest
import torch
from tiny_models import tiny, tiny_train

from inftyformer.data import load_split, load_tokenizer
from inftyformer.native.model import IGNORE_INDEX
from inftyformer.tasks import FactsConfig, FactsTask, RunContext
from inftyformer.tasks.facts import FactsDataset, _answer_sums
from inftyformer.training import Trainer, read_metrics

BOOK = "It was a bright cold day in April, and the clocks were striking thirteen. " * 40


@pytest.fixture
def corpus(tmp_path):
    for split, n in (("train", 3), ("valid", 1), ("test", 2)):
        (tmp_path / "books" / split).mkdir(parents=True)
        for i in range(n):
            text = f"{split} book {i}. " + BOOK[: 900 + 300 * i]
            (tmp_path / "books" / split / f"{i}.txt").write_text(text, encoding="utf-8")
    return tmp_path / "books"


def _dataset(corpus, split, distance=(120,), batch=3, block=64):
    tokenizer = load_tokenizer("bytes")
    books = load_split(corpus, split, tokenizer)
    config = FactsConfig(data_dir=str(corpus), tokenizer="bytes", distance=distance)
    return FactsDataset(config, tokenizer, books, batch, block, split, seed=0), tokenizer


@pytest.mark.parametrize("split", ["train", "test"])
def test_the_fact_lies_d_tokens_before_the_end_of_its_question(corpus, split):
    data, tok = _dataset(corpus, split)
    inputs, answer, lm, d, key_at = data.batch(5)
    assert d == 120 and inputs.shape[1] % 64 == 0
    for row in range(inputs.shape[0]):
        text = tok.decode(inputs[row].tolist())
        scored = answer[row] != IGNORE_INDEX
        key = tok.decode(answer[row][scored].tolist()).strip()
        assert key.isdigit() and text.endswith(" " + key)
        # the statement ends (with its newline) exactly d tokens before the question's end
        end_of_question = inputs.shape[1] - len(tok.encode(" " + key))
        before = tok.decode(inputs[row, : end_of_question - d].tolist())
        assert key in before.splitlines()[-1] and before.endswith("\n")
        # key_at: where the key's tokens begin, inside the statement
        at = int(key_at[row])
        assert tok.decode(inputs[row, at : at + len(key) + 1].tolist()).strip() == key
        if split == "train":
            assert len(key) != 5 and "pass key" not in text
        else:
            assert len(key) == 5 and text.rstrip(" 0123456789").endswith("The pass key is")
        # the answer is scored once: the language-model targets skip it, and cover the rest
        assert not bool((lm[row][scored] != IGNORE_INDEX).any())
        assert int((lm[row] != IGNORE_INDEX).sum()) == inputs.shape[1] - 1 - int(scored.sum())


def test_batches_are_a_function_of_seed_split_and_index(corpus):
    data, _ = _dataset(corpus, "train", distance=(100, 200))
    a, b = data.batch(3), data.batch(3)
    assert all(torch.equal(x, y) for x, y in zip(a[:3], b[:3], strict=True)) and a[3] == b[3]
    assert {data.batch(i)[3] for i in range(20)} == {100, 200}
    test, _ = _dataset(corpus, "test", distance=(100, 200))
    assert not torch.equal(test.batch(3)[0], a[0]) or test.batch(3)[3] != a[3]


def test_exact_answers_by_hand():
    targets = torch.full((2, 4), IGNORE_INDEX)
    targets[0, 1:3] = torch.tensor([3, 1])
    targets[1, 2:4] = torch.tensor([2, 2])
    logits = torch.zeros(2, 4, 5)
    logits[0, 1, 3] = logits[0, 2, 1] = 5.0  # row 0: both answer tokens right
    logits[1, 2, 2] = logits[1, 3, 4] = 5.0  # row 1: one of two right
    sums = _answer_sums(logits, targets)
    assert sums["examples"] == 2 and sums["exact"] == 1
    assert sums["count"] == 4 and sums["correct"] == 3


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="distance"):
        FactsConfig(distance=(0,))
    with pytest.raises(TypeError, match="distance"):
        FactsConfig(distance="300")
    with pytest.raises(ValueError, match="lm_weight"):
        FactsConfig(lm_weight=-1.0)


def test_a_distance_shorter_than_the_question_is_refused(corpus):
    data, _ = _dataset(corpus, "test", distance=(4,))
    with pytest.raises(ValueError, match="shorter than the question"):
        data.batch(0)


def test_an_answer_is_scored_whole_or_the_setting_refused(corpus, tmp_path):
    """Only the last segment is scored: an answer of A tokens needs A + 1 <= segment_len. The
    pass key ' 48213' is 6 byte tokens: at segment_len 4 three of them were scored and exact
    match counted the rest as right; refused now, naming the segment length it needs. Where
    it fits, every answer token is scored; a run whose answers may not fit is refused before
    it starts."""
    data, tok = _dataset(corpus, "test", distance=(60,), block=4)
    with pytest.raises(ValueError, match=r"' \d{5}' is 6 tokens.*segment_len=4.*>= 7"):
        data.batch(0)
    data, tok = _dataset(corpus, "test", distance=(60,), block=7)
    inputs, answer, *_ = data.batch(0)
    assert inputs.shape[1] % 7 == 0
    last = answer[:, -7:]
    assert ((last != IGNORE_INDEX).sum(1) == 6).all()  # " " + five digits, all in the block
    assert ((answer != IGNORE_INDEX).sum(1) == 6).all()
    task = FactsConfig(data_dir=str(corpus), tokenizer="bytes", distance=(60,))
    model = tiny("infty", vocab_size=257, segment_len=8, dropout=0.0)
    run = tiny_train(tmp_path / "run", task="facts", steps=1, batch_size=2)
    with pytest.raises(ValueError, match=r"up to 8 tokens.*segment_len=8.*>= 9"):
        Trainer(run, task, model, echo=lambda s: None)


def test_trains_and_evaluates_through_the_trainer(corpus, tmp_path):
    task = FactsConfig(data_dir=str(corpus), tokenizer="bytes", distance=(80, 150))
    model = tiny("infty", vocab_size=257, segment_len=32, dropout=0.0)
    run = tiny_train(tmp_path / "run", task="facts", steps=3, batch_size=2, eval_every=3)
    result = Trainer(run, task, model, echo=lambda s: None).fit()
    assert result.finished
    rows = read_metrics(run.out_dir)
    test = {r["metric"]: r["value"] for r in rows if r["split"] == "test"}
    assert 0.0 <= test["exact"] <= 1.0 and 0.0 <= test["accuracy"] <= 1.0
    assert test["examples"] == run.test_batches * run.batch_size
    assert {r["metric"] for r in rows if r["split"] == "train"} >= {"lm_loss", "exact"}


def test_a_pretrained_base_trains_its_memory_on_facts(corpus, tmp_path):
    pytest.importorskip("transformers")
    from tiny_pretrained import write_tiny_model

    from inftyformer.model_kinds import PretrainedMemoryConfig

    base = write_tiny_model(tmp_path / "base", "llama", max_positions=64)
    model = PretrainedMemoryConfig(
        base_model=str(base), freeze_base=True, segment_len=32, num_basis=16, num_samples=32
    )
    task = FactsConfig(data_dir=str(corpus), tokenizer=str(base), distance=(60,))
    run = tiny_train(tmp_path / "run", task="facts", steps=2, batch_size=2, eval_every=2)
    assert Trainer(run, task, model, echo=lambda s: None).fit().finished
    fresh = FactsTask(task, model, RunContext(batch_size=2, seed=0))
    inputs, answer, *_ = fresh.dataset("test").batch(0)
    key = fresh.tokenizer.decode(answer[0][answer[0] != IGNORE_INDEX].tolist())
    assert re.fullmatch(r" ?\d{5}", key)


def test_the_heads_read_trains_on_facts_through_the_trainer(corpus, tmp_path):
    """memory_read="heads" through the trainer and a checkpoint: the run finishes, the read's
    projections (copied from the base's heads) moved, and the run loads with its read."""
    pytest.importorskip("transformers")
    from tiny_pretrained import write_tiny_model

    from inftyformer.model_kinds import PretrainedMemoryConfig, build_model
    from inftyformer.training import load_run

    base = write_tiny_model(tmp_path / "base", "llama", max_positions=64)
    model = PretrainedMemoryConfig(
        base_model=str(base), freeze_base=True, segment_len=32, window=16, num_basis=16,
        num_samples=32, density="content", memory_read="heads", sharpness=10.0, sink_edge=0.01,
    )  # fmt: skip
    torch.manual_seed(0)
    start = build_model(model).lm.long_term[0].attention.key.weight.detach().clone()
    task = FactsConfig(data_dir=str(corpus), tokenizer=str(base), distance=(60,))
    run = tiny_train(tmp_path / "run", task="facts", steps=2, batch_size=2, eval_every=2)
    assert Trainer(run, task, model, echo=lambda s: None).fit().finished
    loaded = load_run(tmp_path / "run" / "last").model
    assert loaded.lm.config.adapter.memory_read.kind == "heads"
    trained = loaded.lm.long_term[0].attention.key.weight
    assert not torch.equal(trained, start) and (trained - start).abs().max() < 0.1


def test_read_targets_follow_the_memory_updates():
    """The key's place in [0, 1] as the unbounded update moves it: a memory fed one spike at the
    key's position (zeros elsewhere), segment by segment, peaks where `read_targets` says."""
    from inftyformer.core.memory import LongTermConfig, LongTermMemory
    from inftyformer.tasks.facts import read_targets

    C, tau, blocks = 32, 0.5, 6
    memory = LongTermMemory(
        LongTermConfig(dim=1, num_heads=1, num_basis=256, widths=(0.005,), tau=tau,
                       num_samples=256, conv_gate=False, ridge_lambda=1e-3)
    )  # fmt: skip
    grid = torch.linspace(0, 1, 4001, dtype=torch.float64)
    for window in (0, C):
        for key in (5, 40, 70, 100):
            t, known = read_targets(torch.tensor([key]), blocks * C, C, window, tau)
            fitted = blocks - 1 - window // C
            assert bool(known) == (key // C < fitted)
            if not bool(known):
                continue
            x = torch.zeros(1, fitted * C, 1, dtype=torch.float64)
            x[0, key, 0] = 1.0
            state = memory.init_state(1, "cpu", torch.float64)
            for b in range(fitted):
                state = memory.update(state, x[:, b * C : (b + 1) * C])
            signal = memory.basis(grid) @ state.coefficients[0, :, 0].double()  # [grid]
            assert (
                abs(float(grid[signal.argmax()]) - float(t))
                < 0.6 * tau ** (fitted - 1 - key // C) / C + 2e-3
            )


def test_each_answer_query_reads_its_key_token():
    from inftyformer.tasks.facts import read_positions

    scored = torch.zeros(2, 8, dtype=torch.bool)
    scored[0, 4:7] = True  # the queries predicting the answer's 3 tokens
    scored[1, 5:8] = True
    key_at = torch.tensor([100, 40])
    per_token = read_positions(scored, key_at, per_token=True)
    assert per_token[0, 4:7].tolist() == [100, 101, 102]
    assert per_token[1, 5:8].tolist() == [40, 41, 42]
    assert read_positions(scored, key_at, per_token=False)[0, 4:7].tolist() == [100] * 3


def test_stream_positions_invert_read_targets():
    from inftyformer.tasks.facts import read_targets, stream_positions, tokens_per_unit

    C, S = 32, 8 * 32
    for window in (0, C):
        keys = torch.arange(0, S - 2 * C)
        t, known = read_targets(keys, S, C, window, 0.5)
        back = stream_positions(t, S, C, window, 0.5)
        assert torch.allclose(back[known], keys[known].double(), atol=1e-6)
        # one token further on moves t by 1 / tokens_per_unit (within a block)
        t1, _ = read_targets(keys + 1, S, C, window, 0.5)
        same = known & ((keys + 1) // C == keys // C)
        step = (t1 - t) * tokens_per_unit(keys, S, C, window, 0.5)
        assert torch.allclose(step[same], torch.ones_like(step[same]))


@pytest.mark.parametrize("read_target", ["token", "start"])
def test_read_supervision_pulls_the_answers_reads_to_the_key(corpus, tmp_path, read_target):
    """With read_weight the loss holds the NLL of the key's place under the answer's reads, and
    its gradient moves μ there: a few steps on one batch lower it."""
    pytest.importorskip("transformers")
    from tiny_pretrained import write_tiny_model

    from inftyformer.model_kinds import PretrainedMemoryConfig, build_model

    base = write_tiny_model(tmp_path / "base", "llama", max_positions=64)
    config = PretrainedMemoryConfig(
        base_model=str(base), freeze_base=True, segment_len=32, num_basis=16, num_samples=32,
        memory_lr=1e-2,
    )  # fmt: skip
    task_config = FactsConfig(
        data_dir=str(corpus), tokenizer=str(base), distance=(100,), read_weight=1.0, lm_weight=0,
        read_target=read_target,
    )  # fmt: skip
    FactsTask.check(task_config, config)
    task = FactsTask(task_config, config, RunContext(batch_size=2, seed=0))
    model = build_model(config)
    batch = task.batch(0)
    optimiser = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    first = task.loss(model, batch, slice(None), 0)
    for _ in range(15):
        optimiser.zero_grad()
        out = task.loss(model, batch, slice(None), 0)
        out.loss.backward()
        optimiser.step()
    assert out.means["read_nll"] < first.means["read_nll"] - 0.3
    with pytest.raises(ValueError, match="sticky=false"):
        FactsTask.check(task_config, config.replace(sticky=True))
    with pytest.raises(ValueError, match="window is 0 or one segment"):
        FactsTask.check(task_config, config.replace(window=16))
    with pytest.raises(ValueError, match="needs a pretrained model"):
        FactsTask.check(task_config, tiny("infty", vocab_size=257, segment_len=32))
