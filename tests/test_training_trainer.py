"""The trainer end to end on a tiny sorting model: files written, exact resumption (halt, Ctrl-C),
errors on runs that do not fit, gradient accumulation equivalence."""

import dataclasses
import json
import signal

import pytest
import torch

from inftyformer import ModelConfig
from inftyformer.training import (
    CheckpointError,
    TrainConfig,
    Trainer,
    evaluate_checkpoint,
    load_checkpoint,
    read_metrics,
)


def tiny_model(model_type="infty", **kw) -> ModelConfig:
    base = dict(
        d_model=16,
        n_layers=1,
        n_heads=2,
        d_ff=32,
        segment_len=32,
        mem_len=32,
        num_basis=8,
        num_samples=16,
        compressed_len=8,
        compression_rate=2,
    )
    base.update(kw)
    return ModelConfig.preset("cpu-small", model_type=model_type, **base)


def tiny_train(out_dir, **kw) -> TrainConfig:
    base = dict(
        seq_len=96,
        steps=6,
        batch_size=4,
        warmup_steps=2,
        eval_every=3,
        eval_batches=1,
        test_batches=1,
        log_every=1,
        progress=False,
        tensorboard=False,
        threads=1,
        out_dir=str(out_dir),
    )
    base.update(kw)
    return TrainConfig(**base)


def train_losses(run_dir):
    return [
        r["value"] for r in read_metrics(run_dir) if r["split"] == "train" and r["metric"] == "loss"
    ]


def test_tiny_sorting_run_end_to_end(tmp_path):
    result = Trainer(
        tiny_train(tmp_path, tensorboard=True), tiny_model(), echo=lambda s: None
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
    again, task = evaluate_checkpoint(tmp_path, "test", 1)
    assert again["accuracy"] == result.test["accuracy"]
    assert task.metric == "accuracy"


@pytest.mark.parametrize("model_type", ["infty", "compressive"])
def test_resume_gives_exactly_the_uninterrupted_losses(tmp_path, model_type):
    # dropout and sticky sampling draw random numbers: the RNG states must be restored too
    model_cfg = tiny_model(model_type, dropout=0.1, sticky=model_type == "infty")
    full = Trainer(tiny_train(tmp_path / "full"), model_cfg, echo=lambda s: None).fit()
    part = tiny_train(tmp_path / "part", halt_after=3)
    first = Trainer(part, model_cfg, echo=lambda s: None).fit()
    assert first.interrupted and first.step == 3 and first.test is None
    second = Trainer(
        dataclasses.replace(part, halt_after=0), model_cfg, resume=True, echo=lambda s: None
    ).fit()
    assert second.step == 6
    assert train_losses(tmp_path / "part") == train_losses(tmp_path / "full")
    assert len(train_losses(tmp_path / "full")) == 6
    assert second.test == full.test
    a = load_checkpoint(tmp_path / "full" / "last").section("model")
    b = load_checkpoint(tmp_path / "part" / "last").section("model")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_sigint_saves_a_checkpoint_at_a_step_boundary_and_resume_continues(tmp_path, monkeypatch):
    model_cfg = tiny_model(dropout=0.1)
    Trainer(tiny_train(tmp_path / "full"), model_cfg, echo=lambda s: None).fit()
    trainer = Trainer(tiny_train(tmp_path / "run"), model_cfg, echo=lambda s: None)
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
    Trainer(tiny_train(tmp_path / "run"), model_cfg, resume=True, echo=lambda s: None).fit()
    assert train_losses(tmp_path / "run") == train_losses(tmp_path / "full")


def test_keyboard_interrupt_mid_step_saves_the_last_complete_step(tmp_path, monkeypatch):
    model_cfg = tiny_model()
    trainer = Trainer(tiny_train(tmp_path), model_cfg, echo=lambda s: None)
    real = trainer.task.train_micro_batch

    def interrupt_at_step_4(model, raw, step, micro, num_micro):
        if step == 3:
            raise KeyboardInterrupt
        return real(model, raw, step, micro, num_micro)

    monkeypatch.setattr(trainer.task, "train_micro_batch", interrupt_at_step_4)
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    assert load_checkpoint(tmp_path / "last").meta["step"] == 3


def test_runs_that_do_not_fit_are_refused(tmp_path):
    Trainer(tiny_train(tmp_path, steps=2, eval_every=2), tiny_model(), echo=print).fit()
    with pytest.raises(FileExistsError, match="--resume"):
        Trainer(tiny_train(tmp_path, steps=2), tiny_model())
    with pytest.raises(CheckpointError, match="holds a 'infty' model, not a 'xl' one"):
        Trainer(tiny_train(tmp_path, steps=4), tiny_model("xl"), resume=True)
    with pytest.raises(CheckpointError, match="differs"):
        Trainer(tiny_train(tmp_path, steps=4), tiny_model(d_model=32), resume=True)
    with pytest.raises(CheckpointError, match="no checkpoint 'last'"):
        Trainer(tiny_train(tmp_path / "empty"), tiny_model(), resume=True)
    with pytest.raises(ValueError, match="longer than the sequence"):
        Trainer(tiny_train(tmp_path / "x", seq_len=24), tiny_model())
    weights = tmp_path / "last.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        Trainer(tiny_train(tmp_path, steps=4), tiny_model(), resume=True)
    # --overwrite starts over
    result = Trainer(
        tiny_train(tmp_path, steps=2, eval_every=2), tiny_model(), overwrite=True, echo=print
    ).fit()
    assert result.finished


def test_gradient_accumulation_matches_the_full_batch(tmp_path):
    model_cfg = tiny_model(dropout=0.0)
    a = Trainer(tiny_train(tmp_path / "a", steps=2, grad_accum=1), model_cfg, echo=print)
    a.fit()
    b = Trainer(tiny_train(tmp_path / "b", steps=2, grad_accum=2), model_cfg, echo=print)
    b.fit()
    for (name, p), q in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert torch.allclose(p, q, atol=2e-5), name
