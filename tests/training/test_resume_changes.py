"""Resume refuses silent changes: a train setting that changes what the run is (RUN_SETTINGS),
any task setting or a memory setting of the model differing from the checkpoint's is refused with
the diff, unless allowed explicitly; allowed changes are recorded in the run's history. Settings
of how the run is executed (EXECUTION_SETTINGS) change freely."""

from __future__ import annotations

import dataclasses

import pytest
from tiny_models import SORT, tiny_sorting, tiny_train

from inftyformer.tasks import SortingConfig
from inftyformer.training import CheckpointError, Trainer, load_checkpoint
from inftyformer.training.config import EXECUTION_SETTINGS, RUN_SETTINGS, TrainConfig
from inftyformer.training.run_lock import LOCK_NAME


def quiet(text: str) -> None:
    return None


@pytest.fixture()
def finished(tmp_path):
    """A 2-step run whose `last` checkpoint is at step 2."""
    cfg = tiny_train(tmp_path / "run", steps=2, eval_every=2)
    Trainer(cfg, SORT, tiny_sorting(), echo=quiet).fit()
    return cfg


def test_every_train_setting_is_either_what_or_how():
    names = {f.name for f in dataclasses.fields(TrainConfig)} - {"task"}
    assert set(RUN_SETTINGS) | set(EXECUTION_SETTINGS) == names
    assert not set(RUN_SETTINGS) & set(EXECUTION_SETTINGS)


CHANGES = {
    "seed": 1, "steps": 3, "batch_size": 2, "grad_accum": 2, "lr": 2e-3, "min_lr_ratio": 0.5,
    "warmup_steps": 1, "weight_decay": 0.0, "beta1": 0.8, "beta2": 0.9, "adam_eps": 1e-6,
    "grad_clip": 0.5, "eval_every": 1, "eval_batches": 2, "test_batches": 2, "patience": 3,
}  # fmt: skip


def test_the_changes_table_covers_every_run_setting():
    assert set(CHANGES) == set(RUN_SETTINGS)


@pytest.mark.parametrize("name", RUN_SETTINGS)
def test_a_changed_run_setting_is_refused_with_the_diff(finished, name):
    changed = dataclasses.replace(finished, **{name: CHANGES[name]})
    old = getattr(finished, name)
    with pytest.raises(CheckpointError, match=rf"train\.{name}: {old!r} -> {CHANGES[name]!r}"):
        Trainer(changed, SORT, tiny_sorting(), resume=True, echo=quiet)


def test_allowed_changes_run_and_are_recorded_in_the_history(finished):
    changed = dataclasses.replace(finished, steps=3, lr=2e-3, seed=5)
    trainer = Trainer(changed, SORT, tiny_sorting(), resume=True, allow_changes=True, echo=quiet)
    result = trainer.fit()
    assert result.step == 3
    meta = load_checkpoint(finished.out_dir + "/last").meta
    assert meta["train_config"]["lr"] == 2e-3  # the run is now what was asked
    (entry,) = meta["history"]
    assert entry["step"] == 2 and entry["at"]
    assert entry["changes"] == {
        "train.lr": [1e-3, 2e-3], "train.seed": [0, 5], "train.steps": [2, 3],
    }  # fmt: skip
    # a later resume without changes keeps the history as it is
    again = dataclasses.replace(changed, steps=3)
    Trainer(again, SORT, tiny_sorting(), resume=True, echo=quiet).fit()
    assert load_checkpoint(finished.out_dir + "/last").meta["history"] == meta["history"]


def test_execution_settings_change_freely(finished):
    how = dict(threads=2, log_every=5, progress=False, tensorboard=False, save_every=1,
               halt_after=0, device="cpu")  # fmt: skip
    trainer = Trainer(
        dataclasses.replace(finished, **how), SORT, tiny_sorting(), resume=True, echo=quiet
    )
    assert trainer.history == []


def test_task_and_memory_settings_are_refused_unless_allowed(finished):
    with pytest.raises(CheckpointError, match=r"task\.seq_len: 96 -> 128"):
        Trainer(finished, SortingConfig(seq_len=128), tiny_sorting(), resume=True, echo=quiet)
    with pytest.raises(CheckpointError, match=r"model\.mem_len: 32 -> 64"):
        Trainer(finished, SORT, tiny_sorting(mem_len=64), resume=True, echo=quiet)
    trainer = Trainer(finished, SortingConfig(seq_len=128), tiny_sorting(mem_len=64), resume=True,
                      allow_changes=True, echo=quiet)  # fmt: skip
    assert trainer.history[-1]["changes"] == {
        "task.seq_len": [96, 128], "model.mem_len": [32, 64],
    }  # fmt: skip
    trainer.close()  # the run directory is free for the next one
    # settings that fix the weights are refused even when changes are allowed
    with pytest.raises(CheckpointError, match="d_model: 16 -> 32.*fix the weights"):
        Trainer(finished, SORT, tiny_sorting(d_model=32), resume=True, allow_changes=True)


def test_a_checkpoint_without_the_settings_added_since_resumes_unchanged(finished):
    """A checkpoint saved before a model setting existed (here the memory's sharpness and
    sink_edge) resumes as it was: the settings it lacks are at their defaults, not changes."""
    from pathlib import Path

    from inftyformer.training import save_checkpoint

    path = Path(finished.out_dir) / "last"
    ckpt = load_checkpoint(path)
    meta = dict(ckpt.meta)
    old = {k: v for k, v in meta["model_config"].items() if k not in ("sharpness", "sink_edge")}
    save_checkpoint(path.parent, "last", ckpt.tensors, {**meta, "model_config": old})
    trainer = Trainer(finished, SORT, tiny_sorting(), resume=True, echo=quiet)
    assert trainer.history == []
    trainer.close()
    with pytest.raises(CheckpointError, match=r"model\.tau: 0\.75 -> 0\.5"):  # a real change
        Trainer(finished, SORT, tiny_sorting(tau=0.5), resume=True, echo=quiet)


def test_a_run_start_cleans_what_a_kill_left(finished):
    from pathlib import Path

    out = Path(finished.out_dir)
    (out / ".last.manifest.json.tmp777").write_text("{")
    (out / ".best.safetensors.pending").write_bytes(b"x")
    Trainer(finished, SORT, tiny_sorting(), resume=True, echo=quiet).close()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [LOCK_NAME]


@pytest.mark.parametrize(
    "damage",
    [
        lambda m: m.pop("optimizer"),
        lambda m: m.update(step="two"),
        lambda m: m["ranks"][0].update(rng={"python": 3}),
        lambda m: m.update(trainer=[]),
    ],
)
def test_restore_errors_name_the_checkpoint(finished, damage):
    from pathlib import Path

    from inftyformer.training import save_checkpoint

    path = Path(finished.out_dir) / "last"
    ckpt = load_checkpoint(path)
    meta = dict(ckpt.meta)
    damage(meta)
    save_checkpoint(path.parent, "last", ckpt.tensors, meta)
    with pytest.raises(CheckpointError, match=r"last\.manifest\.json: cannot restore"):
        Trainer(finished, SORT, tiny_sorting(), resume=True, echo=quiet)


def test_a_checkpoint_with_non_finite_weights_is_refused_by_name(finished):
    from pathlib import Path

    from inftyformer.training import load_run, save_checkpoint

    path = Path(finished.out_dir) / "best"
    ckpt = load_checkpoint(path)
    tensors = dict(ckpt.tensors)
    name = next(k for k in tensors if k.startswith("model/") and tensors[k].is_floating_point())
    tensors[name] = tensors[name] * float("nan")
    save_checkpoint(path.parent, "best", tensors, ckpt.meta)
    with pytest.raises(CheckpointError, match=r"best\.manifest\.json: the weights hold NaN"):
        load_run(path)


def test_a_damaged_newest_checkpoint_says_whether_best_can_be_used(tmp_path):
    import subprocess
    from pathlib import Path

    cfg = tiny_train(tmp_path / "run", steps=4, eval_every=2, halt_after=3)
    Trainer(cfg, SORT, tiny_sorting(), echo=quiet).fit()
    out = Path(cfg.out_dir)
    best_step = load_checkpoint(out / "best").meta["step"]
    data = bytearray((out / "last.safetensors").read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the newest checkpoint
    (out / "last.safetensors").write_bytes(bytes(data))
    resume = dataclasses.replace(cfg, halt_after=0)
    with pytest.raises(CheckpointError) as caught:
        Trainer(resume, SORT, tiny_sorting(), resume=True, echo=quiet)
    message = str(caught.value)
    assert f"The 'best' checkpoint (step {best_step}) is intact" in message
    assert "\n" not in message
    # the command it gives works: the run continues from best
    command = message.split("copy it over the newest (")[1].split(") and resume")[0]
    subprocess.run(command, shell=True, check=True)
    trainer = Trainer(resume, SORT, tiny_sorting(), resume=True, echo=quiet)
    assert trainer.step == best_step
    assert trainer.fit().step == 4

    # the best one damaged too: nothing to resume, said so
    for name in ("last", "best"):
        data = bytearray((out / f"{name}.safetensors").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (out / f"{name}.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="'best' checkpoint is damaged too.*--overwrite"):
        Trainer(resume, SORT, tiny_sorting(), resume=True, echo=quiet)
