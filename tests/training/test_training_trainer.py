"""The trainer end to end on a tiny sorting model: files written, exact resumption (halt, Ctrl-C),
errors on runs that do not fit, gradient accumulation equivalence."""

import dataclasses
import json
import signal

import pytest
import torch
from tiny_models import SORT, tiny, tiny_sorting, tiny_train

from inftyformer.tasks import SortingConfig
from inftyformer.training import (
    CheckpointError,
    Trainer,
    evaluate_run,
    load_checkpoint,
    read_metrics,
)


def train_losses(run_dir):
    return [
        r["value"] for r in read_metrics(run_dir) if r["split"] == "train" and r["metric"] == "loss"
    ]


def test_tiny_sorting_run_end_to_end(tmp_path):
    result = Trainer(
        tiny_train(tmp_path, tensorboard=True), SORT, tiny_sorting(), echo=lambda s: None
    ).fit()
    assert result.finished and result.step == 6 and not result.interrupted
    assert 0.0 <= result.test["accuracy"] <= 1.0
    assert result.chance["uniform"] == pytest.approx(0.05)
    names = {p.name for p in tmp_path.iterdir()}
    assert {"best.safetensors", "best.json", "last.safetensors", "metrics.csv"} <= names
    assert "results.json" in names and (tmp_path / "tensorboard").is_dir()
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows if r["metric"] == "loss" and r["split"] == "train"] == [
        1,
        2,
        3,
        4,
        5,
        6,
    ]
    assert {r["split"] for r in rows} == {"train", "valid", "test"}
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["test"]["accuracy"] == result.test["accuracy"]
    meta = load_checkpoint(tmp_path / "last").meta
    assert meta["step"] == 6 and meta["model_config"]["model_type"] == "infty"
    assert set(meta["ranks"][0]["rng"]) >= {"python", "numpy", "torch"}
    # evaluating the saved best model again gives the same test metrics
    again, _, task = evaluate_run(tmp_path, "test", 1)
    assert again["accuracy"] == result.test["accuracy"]
    assert task.headline().name == "accuracy"


@pytest.mark.parametrize("model_type", ["infty", "compressive"])
def test_resume_gives_exactly_the_uninterrupted_losses(tmp_path, model_type):
    # dropout and sticky sampling draw random numbers: the RNG states must be restored too
    model_cfg = tiny_sorting(model_type, dropout=0.1, sticky=model_type == "infty")
    full = Trainer(tiny_train(tmp_path / "full"), SORT, model_cfg, echo=lambda s: None).fit()
    part = tiny_train(tmp_path / "part", halt_after=3)
    first = Trainer(part, SORT, model_cfg, echo=lambda s: None).fit()
    assert first.interrupted and first.step == 3 and first.test is None
    second = Trainer(
        dataclasses.replace(part, halt_after=0), SORT, model_cfg, resume=True, echo=lambda s: None
    ).fit()
    assert second.step == 6
    assert train_losses(tmp_path / "part") == train_losses(tmp_path / "full")
    assert len(train_losses(tmp_path / "full")) == 6
    assert second.test == full.test
    a = load_checkpoint(tmp_path / "full" / "last").section("model")
    b = load_checkpoint(tmp_path / "part" / "last").section("model")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_sigint_saves_a_checkpoint_at_a_step_boundary_and_resume_continues(tmp_path, monkeypatch):
    model_cfg = tiny_sorting(dropout=0.1)
    Trainer(tiny_train(tmp_path / "full"), SORT, model_cfg, echo=lambda s: None).fit()
    trainer = Trainer(tiny_train(tmp_path / "run"), SORT, model_cfg, echo=lambda s: None)
    real_step = trainer.train_step

    def step_then_ctrl_c():
        metrics = real_step()
        if trainer.step == 2:
            signal.raise_signal(signal.SIGINT)  # as if the user pressed Ctrl-C mid-run
        return metrics

    monkeypatch.setattr(trainer, "train_step", step_then_ctrl_c)
    result = trainer.fit()
    assert result.interrupted and result.step == 2
    assert load_checkpoint(tmp_path / "run" / "last").meta["step"] == 2
    Trainer(tiny_train(tmp_path / "run"), SORT, model_cfg, resume=True, echo=lambda s: None).fit()
    assert train_losses(tmp_path / "run") == train_losses(tmp_path / "full")


def test_keyboard_interrupt_mid_step_saves_the_last_complete_step(tmp_path, monkeypatch):
    model_cfg = tiny_sorting()
    trainer = Trainer(tiny_train(tmp_path), SORT, model_cfg, echo=lambda s: None)
    real = trainer.task.batch

    def interrupt_at_step_4(step):
        if step == 3:
            raise KeyboardInterrupt
        return real(step)

    monkeypatch.setattr(trainer.task, "batch", interrupt_at_step_4)
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    assert load_checkpoint(tmp_path / "last").meta["step"] == 3


def test_runs_that_do_not_fit_are_refused(tmp_path):
    Trainer(tiny_train(tmp_path, steps=2, eval_every=2), SORT, tiny_sorting(), echo=print).fit()
    with pytest.raises(FileExistsError, match="--resume"):
        Trainer(tiny_train(tmp_path, steps=2), SORT, tiny_sorting())
    with pytest.raises(CheckpointError, match="holds a 'infty' model, not a 'xl' one"):
        Trainer(tiny_train(tmp_path, steps=4), SORT, tiny_sorting("xl"), resume=True)
    with pytest.raises(CheckpointError, match="differs"):
        Trainer(tiny_train(tmp_path, steps=4), SORT, tiny_sorting(d_model=32), resume=True)
    with pytest.raises(CheckpointError, match="no checkpoint 'last'"):
        Trainer(tiny_train(tmp_path / "empty"), SORT, tiny_sorting(), resume=True)
    with pytest.raises(ValueError, match="longer than the sequence"):
        Trainer(tiny_train(tmp_path / "x"), SortingConfig(seq_len=24), tiny_sorting())
    weights = tmp_path / "last.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        Trainer(tiny_train(tmp_path, steps=4), SORT, tiny_sorting(), resume=True)
    # --overwrite starts over
    result = Trainer(
        tiny_train(tmp_path, steps=2, eval_every=2),
        SORT,
        tiny_sorting(),
        overwrite=True,
        echo=print,
    ).fit()
    assert result.finished


def test_gradient_accumulation_matches_the_full_batch(tmp_path):
    model_cfg = tiny_sorting(dropout=0.0)
    a = Trainer(tiny_train(tmp_path / "a", steps=2, grad_accum=1), SORT, model_cfg, echo=print)
    a.fit()
    b = Trainer(tiny_train(tmp_path / "b", steps=2, grad_accum=2), SORT, model_cfg, echo=print)
    b.fit()
    for (name, p), q in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert torch.allclose(p, q, atol=2e-5), name


def test_accumulation_weighs_micro_batches_by_their_scored_tokens(tmp_path):
    """Language modelling: documents end at different places, so the rows of a step score
    different numbers of tokens. Cutting the batch into micro-batches must not change the
    update (each micro-batch's mean loss weighs by its share of the scored tokens). Weighing the
    micro-batches equally instead moves most weights by ~2e-3 here; the tolerance is Adam's
    amplification of round-off in the near-zero gradients of the long-term attention's keys (the
    logged gradient norms and losses are compared tightly). The KL regulariser is on, and
    strong: it is weighed per scored token like the NLL (`kl_term.py`), so the split reproduces
    it too (as a mean over each micro-batch's rows it could not: ~1% of the keys' gradients)."""
    from inftyformer.tasks import LMConfig

    for split, lengths in (("train", (5, 23, 41, 9, 60, 14)), ("valid", (30,)), ("test", (30,))):
        (tmp_path / "corpus" / split).mkdir(parents=True)
        for i, n in enumerate(lengths):
            text = "".join(chr(97 + (7 * i + 3 * k) % 26) for k in range(n))
            (tmp_path / "corpus" / split / f"{i}.txt").write_text(text, encoding="utf-8")
    task = LMConfig(data_dir=str(tmp_path / "corpus"), tokenizer="bytes")
    model_cfg = tiny("infty", vocab_size=257, segment_len=8, dropout=0.0, kl_weight=0.1)
    probe = Trainer(tiny_train(tmp_path / "probe", task="lm", batch_size=4), task, model_cfg)
    counts = []
    for step in range(3):
        counts.append((probe.task.batch(step).targets >= 0).sum(1).tolist())
        probe.task.end_step(step)
    assert any(len(set(c)) > 1 for c in counts), counts  # rows score different numbers of tokens
    params, logged = [], []
    for accum in (1, 2, 4):
        run = tiny_train(tmp_path / f"a{accum}", task="lm", steps=3, batch_size=4,
                         grad_accum=accum, eval_every=3, test_batches=0)  # fmt: skip
        trainer = Trainer(run, task, model_cfg, echo=lambda s: None)
        trainer.fit()
        params.append(dict(trainer.model.named_parameters()))
        rows = read_metrics(run.out_dir)
        logged.append({(r["step"], r["metric"]): r["value"] for r in rows if r["split"] == "train"})
    for other, other_logged in zip(params[1:], logged[1:], strict=True):
        # the first step whose rows are uneven (logged as step 2), from the same weights: the
        # same loss and global gradient norm, before Adam
        for metric in ("loss", "grad_norm"):
            a, b = logged[0][2, metric], other_logged[2, metric]
            assert b == pytest.approx(a, rel=1e-6), metric
        for name, p in params[0].items():
            torch.testing.assert_close(p, other[name], rtol=0, atol=2e-4, msg=name)
