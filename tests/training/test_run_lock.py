"""One run at a time in a run directory (`training/run_lock.py`): a second `train` on a folder
in use is refused up front, naming the process that holds it, and touches nothing; the lock of
a run killed with SIGKILL does not outlive it; a refused start leaves no folder behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from tiny_models import SORT, tiny_sorting, tiny_train
from typer.testing import CliRunner

from inftyformer.cli import EXIT_USAGE, app
from inftyformer.training import CheckpointError, Trainer
from inftyformer.training.run_lock import LOCK_NAME, RunLock, RunLockedError

TINY = [
    "--set", "d_model=16", "--set", "n_layers=1", "--set", "n_heads=2", "--set", "d_ff=32",
    "--set", "segment_len=32", "--set", "mem_len=32", "--set", "num_basis=8",
    "--set", "num_samples=16", "--set", "warmup_steps=1", "--set", "eval_batches=1",
    "--set", "test_batches=1", "--set", "tensorboard=false",
    "--seq-len", "64", "--batch-size", "2", "--threads", "1", "--no-progress",
]  # fmt: skip


def quiet(text: str) -> None:
    return None


def holder_pid(out) -> int | None:
    try:
        return int(json.loads((out / LOCK_NAME).read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def test_a_second_run_on_a_folder_in_use_is_refused_and_a_killed_run_leaves_no_lock(tmp_path):
    out = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-m", "inftyformer.cli", "train", "sorting", *TINY,
         "--steps", "100000", "--set", "log_every=1", "--out-dir", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while holder_pid(out) != first.pid or not (out / "metrics.csv").exists():
            assert first.poll() is None, first.stderr.read()
            assert time.monotonic() < deadline, "the first run did not start"
            time.sleep(0.2)
        before = sorted(p.name for p in out.iterdir())
        for extra in ([], ["--overwrite"]):
            result = CliRunner().invoke(
                app, ["train", "sorting", *TINY, "--steps", "2", "--out-dir", str(out), *extra]
            )
            assert result.exit_code == EXIT_USAGE, result.output
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1 and "Traceback" not in result.output, result.output
            assert f"{out} is in use by another training run (process {first.pid} " in lines[0]
            assert "choose another --out-dir" in lines[0]
        assert first.poll() is None  # the first run goes on, its files untouched by name
        assert sorted(p.name for p in out.iterdir()) == before
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    # killed at any point, the run's lock went with its process: the folder starts over
    result = CliRunner().invoke(
        app, ["train", "sorting", *TINY, "--steps", "2", "--out-dir", str(out), "--overwrite"]
    )
    assert result.exit_code == 0, result.output
    assert holder_pid(out) == os.getpid()  # written by the last run; no longer locked
    RunLock(out).acquire().release()


def test_a_trainer_holds_its_folder_until_it_ends_or_is_closed(tmp_path):
    cfg = tiny_train(tmp_path / "run", steps=2, eval_every=2)
    first = Trainer(cfg, SORT, tiny_sorting(), echo=quiet)
    with pytest.raises(RunLockedError, match=f"process {os.getpid()} "):
        Trainer(cfg, SORT, tiny_sorting(), echo=quiet)
    first.fit()  # the end of training frees it
    second = Trainer(cfg, SORT, tiny_sorting(), resume=True, echo=quiet)
    with pytest.raises(RunLockedError):
        Trainer(cfg, SORT, tiny_sorting(), resume=True, echo=quiet)
    second.close()
    Trainer(cfg, SORT, tiny_sorting(), resume=True, echo=quiet).close()


def test_a_refused_start_leaves_no_folder(tmp_path):
    cfg = tiny_train(tmp_path / "new" / "run", steps=2)
    with pytest.raises(CheckpointError, match="cannot resume"):
        Trainer(cfg, SORT, tiny_sorting(), resume=True, echo=quiet)
    assert not (tmp_path / "new").exists()
