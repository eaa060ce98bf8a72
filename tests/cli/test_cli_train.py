"""The `inftyformer` command line: help texts, a tiny train → evaluate → generate → resume cycle,
clear errors (non-zero exit, nothing written) on bad input, and a kill -9 in the middle of a run."""

import os
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from inftyformer.cli import app
from inftyformer.training import load_checkpoint, read_metrics

runner = CliRunner()

TINY = [
    "--set", "d_model=16", "--set", "n_layers=1", "--set", "n_heads=2", "--set", "d_ff=32",
    "--set", "segment_len=32", "--set", "mem_len=32", "--set", "num_basis=8",
    "--set", "num_samples=16", "--set", "warmup_steps=1", "--set", "eval_batches=1",
    "--set", "test_batches=1", "--set", "log_every=1", "--set", "tensorboard=false",
    "--seq-len", "64", "--batch-size", "2", "--threads", "1", "--no-progress",
]  # fmt: skip


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("command", ["train", "evaluate", "generate", "bench", "demo"])
def test_every_command_has_help(command):
    result = run(command, "--help")
    assert result.exit_code == 0
    assert "Usage" in result.output


def test_train_help_explains_every_option():
    text = run("train", "--help").output
    for option in (
        "--model",
        "--preset",
        "--set",
        "--seq-len",
        "--steps",
        "--resume",
        "--out-dir",
        "--device",
        "--lr",
        "--batch-size",
        "--overwrite",
    ):
        assert option in text, option


@pytest.mark.slow
def test_train_evaluate_generate_resume(tmp_path):
    out = tmp_path / "run"
    result = run("train", "sorting", *TINY, "--steps", 2, "--eval-every", 2, "--out-dir", out)
    assert result.exit_code == 0, result.output
    assert "test accuracy" in result.output and "chance: uniform 0.050" in result.output
    assert (out / "best.safetensors").exists() and (out / "metrics.csv").exists()

    result = run("evaluate", out / "best.safetensors", "--split", "valid", "--batches", 1)
    assert result.exit_code == 0, result.output
    assert "valid accuracy" in result.output

    result = run("generate", out, "--prompt", "3 3 1 0 5 5 5 2")
    assert result.exit_code == 0, result.output
    output = result.output.split("output:")[1].split()
    assert len(output) == 20 and all(0 <= int(t) < 22 for t in output)
    result = run("generate", out, "--prompt", "random:40", "--temperature", 1.0, "--top-k", 5)
    assert result.exit_code == 0, result.output
    assert "expected:" in result.output and "positions right" in result.output

    # a second fresh run into the same directory is refused; --resume extends it, but only
    # with --allow-changes (more steps stretch the learning-rate schedule), recorded in history
    again = run("train", "sorting", *TINY, "--steps", 3, "--out-dir", out)
    assert again.exit_code != 0 and "--resume" in again.output
    result = run("train", "sorting", "--resume", "--steps", 3, "--no-progress", "--out-dir", out)
    assert result.exit_code == 2 and "train.steps: 2 -> 3" in result.output
    result = run("train", "sorting", "--resume", "--steps", 3, "--allow-changes", "--no-progress",
                 "--out-dir", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    history = load_checkpoint(out / "last").meta["history"]
    assert [(h["step"], h["changes"]) for h in history] == [(2, {"train.steps": [2, 3]})]
    assert "resumed" in result.output and load_checkpoint(out / "last").meta["step"] == 3
    result = run("train", "sorting", "--resume", "--model", "xl", "--steps", 4, "--out-dir", out)
    assert result.exit_code != 0 and "holds a 'infty' model, not 'xl'" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "nonsense"], "unknown task 'nonsense'"),
        (["train", "sorting", "--model", "lstm"], "unknown model 'lstm'"),
        (["train", "sorting", "--preset", "huge"], "unknown native preset 'huge'"),
        (["train", "sorting", "--set", "colour=blue"], "unknown setting 'colour'"),
        (["train", "sorting", "--set", "d_model=big"], "expected an integer"),
        (["train", "sorting", "--set", "justakey"], "expected key=value"),
        (["train", "sorting", "--lr", "-0.1"], "lr must be"),
        (["train", "sorting", "--steps", "0"], "steps must be"),
        (["train", "sorting", "--seq-len", "100"], "longer than the sequence"),
        (["train", "sorting", "--set", "n_heads=5"], "divisible"),
        (["train", "sorting", "--device", "tpu"], "device"),
        (["train", "sorting", "--resume"], "nothing to resume: .*never does not exist"),
    ],
)
def test_bad_input_fails_clearly_and_writes_nothing(tmp_path, args, message):
    import re

    out = tmp_path / "never"
    result = run(*args, "--out-dir", out)
    assert result.exit_code != 0
    assert re.search(message, result.output), result.output
    assert "Traceback" not in result.output
    assert not out.exists()


def test_bad_checkpoints_fail_clearly(tmp_path):
    result = run("evaluate", tmp_path / "missing")
    assert result.exit_code != 0 and "missing does not exist" in result.output
    (tmp_path / "c.manifest.json").write_text("{")
    result = run("evaluate", tmp_path / "c.safetensors")
    assert result.exit_code != 0 and "unreadable" in result.output
    result = run("generate", tmp_path / "missing", "--prompt", "1 2")
    assert result.exit_code != 0 and "missing does not exist" in result.output


@pytest.mark.slow
def test_kill_9_mid_run_then_resume_matches_an_uninterrupted_run(tmp_path):
    """SIGKILL leaves no chance to clean up: the run must resume from its last checkpoint and
    log the same losses as a run that was never interrupted."""
    settings = ["--steps", 20, "--eval-every", 10, "--set", "save_every=1", "--set", "dropout=0.1"]
    full = run("train", "sorting", *TINY, *settings, "--out-dir", tmp_path / "full")
    assert full.exit_code == 0, full.output

    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "inftyformer.cli", "train", "sorting", *TINY, *settings,
           "--out-dir", killed]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([str(c) for c in cmd], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            csv = killed / "metrics.csv"
            if csv.exists() and any(
                r["step"] >= 3 and r["metric"] == "loss" for r in read_metrics(csv)
            ):
                break
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    steps_done = load_checkpoint(killed / "last").meta["step"]
    assert 1 <= steps_done < 20
    result = run("train", "sorting", "--resume", "--no-progress", "--out-dir", killed)
    assert result.exit_code == 0, result.output

    def losses(path):
        rows = read_metrics(path)
        return [
            (r["step"], r["value"]) for r in rows if r["split"] == "train" and r["metric"] == "loss"
        ]

    assert losses(killed) == losses(tmp_path / "full")
