"""One error path for the command line: every failure a user can cause or meet (bad input,
corrupt files, a full or read-only disk, a diverged run) is one line ``error: ...`` on stderr
and a documented exit code, never a traceback; real bugs keep theirs, and --debug (or
INFTYFORMER_DEBUG=1) shows the traceback of any error."""

from __future__ import annotations

import errno
import json
import os

import pytest
from typer.testing import CliRunner

from inftyformer.cli import EXIT_DIVERGED, EXIT_USAGE, app
from inftyformer.commands import evaluate as evaluate_command

runner = CliRunner()

TINY = [
    "--set", "d_model=16", "--set", "n_layers=1", "--set", "n_heads=2", "--set", "d_ff=32",
    "--set", "segment_len=32", "--set", "mem_len=32", "--set", "num_basis=8",
    "--set", "num_samples=16", "--set", "warmup_steps=1", "--set", "eval_batches=1",
    "--set", "test_batches=1", "--set", "log_every=1", "--set", "tensorboard=false",
    "--seq-len", "64", "--batch-size", "2", "--threads", "1", "--no-progress",
]  # fmt: skip


def run(*args, **kwargs):
    return runner.invoke(app, [str(a) for a in args], **kwargs)


def assert_one_line_error(result, code: int, pattern: str) -> None:
    import re

    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in result.output


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished tiny sorting run (2 steps)."""
    out = tmp_path_factory.mktemp("cli") / "run"
    result = run("train", "sorting", *TINY, "--steps", 2, "--eval-every", 2, "--out-dir", out)
    assert result.exit_code == 0, result.output
    return out


def test_every_command_goes_through_the_one_error_path():
    for command in app.registered_commands:
        assert getattr(command.callback, "__wrapped__", None) is not None, command.callback


@pytest.mark.parametrize(
    "args, pattern",
    [
        (["demo", "--segment-len", "0"], "segment_len must be >= 1"),
        (["demo", "--length", "10000000000000"], "use a shorter --length"),
        (["bench", "--script", "../../etc/passwd"], "takes the name of one of the project's"),
        (["bench", "--script", "/tmp/evil"], "takes the name of one of the project's"),
        (["train", "sorting", "--set", "model_type=xl"], "choose the model with --model"),
        (["train", "sorting", "--allow-changes"], "only applies with --resume"),
        (["train", "sorting", "--set", "ridge_lambda=0"], "ridge_lambda must be"),
        (["train", "sorting", "--set", "kl_weight=inf"], "kl_weight must be"),
        (["train", "sorting", "--set", "lr=nan"], "lr must be"),
    ],
)
def test_user_mistakes_are_one_line_on_stderr(tmp_path, args, pattern):
    assert_one_line_error(run(*args, "--out-dir", tmp_path / "x")
                          if args[0] == "train" else run(*args), EXIT_USAGE, pattern)  # fmt: skip
    assert not (tmp_path / "x").exists()


def test_a_checkpoint_manifest_of_the_wrong_shape(tmp_path):
    manifest = tmp_path / "c.manifest.json"
    for body in ('{"format": "inftyformer-checkpoint", "version": 1, "files": {"tensors": 3}}',
                 '{"format": "inftyformer-checkpoint", "version": 1, "files": []}',
                 "[1, 2]", "{"):  # fmt: skip
        manifest.write_text(body)
        for command in ("evaluate", "generate"):
            result = run(command, manifest)
            assert_one_line_error(result, EXIT_USAGE, f"{manifest}")


def test_a_tokenizer_file_that_is_not_a_tokenizer(tmp_path):
    from inftyformer.data import load_tokenizer

    bad = tmp_path / "tokenizer.json"
    bad.write_text("this is not a tokenizer")
    with pytest.raises(ValueError, match=f"{bad} is not a tokenizer file"):
        load_tokenizer(str(bad))
    corpus = tmp_path / "corpus"
    for split in ("train", "valid", "test"):
        (corpus / split).mkdir(parents=True)
        (corpus / split / "a.txt").write_text("some words " * 50)
    result = run("train", "lm", "--tokenizer", bad, "--data-dir", corpus, "--out-dir",
                 tmp_path / "run", "--no-progress")  # fmt: skip
    assert_one_line_error(result, EXIT_USAGE, "is not a tokenizer file")


def test_generate_refuses_absurd_prompts(run_dir):
    for prompt in ("random:99999999999999", "random:0"):
        result = run("generate", run_dir, "--prompt", prompt)
        assert_one_line_error(result, EXIT_USAGE, r"random:T needs 1 <= T <=")
    assert_one_line_error(run("generate", run_dir, "--temperature", "nan"), EXIT_USAGE, "finite")
    for option, value, error in (
        ("--temperature", -1, r"--temperature must be a finite number >= 0, got -1"),
        ("--top-k", 0, r"--top-k must be >= 1, got 0"),
        ("--top-p", 0, r"--top-p must be in \(0, 1\], got 0"),
        ("--top-p", 1.5, r"--top-p must be in \(0, 1\], got 1.5"),
    ):
        assert_one_line_error(run("generate", run_dir, option, value), EXIT_USAGE, error)


def test_evaluate_json_to_a_directory_fails_before_evaluating(run_dir, tmp_path, monkeypatch):
    def never(*a, **k):
        raise AssertionError("evaluated although --json cannot be written")

    monkeypatch.setattr("inftyformer.training.evaluate_run", never)
    result = run("evaluate", run_dir, "--json", tmp_path)
    assert_one_line_error(result, EXIT_USAGE, "is a directory; give a file name")
    (tmp_path / "file").write_text("")
    result = run("evaluate", run_dir, "--json", tmp_path / "file" / "x.json")
    assert_one_line_error(result, EXIT_USAGE, "is a file, not a directory")


def test_evaluate_json_write_failure_keeps_the_result_on_stdout(run_dir, tmp_path, monkeypatch):
    def disk_full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(evaluate_command, "write_atomic", disk_full)
    target = tmp_path / "out.json"
    result = run("evaluate", run_dir, "--json", target, "--batches", 1)
    assert_one_line_error(result, EXIT_USAGE, "no space left.*written to stdout instead")
    document = result.stdout[result.stdout.index("{") :]
    assert json.loads(document)["metrics"]["accuracy"] >= 0
    result = run("evaluate", run_dir, "--json", "-", "--batches", 1)
    assert result.exit_code == 0 and '"metrics"' in result.stdout


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_evaluate_json_to_a_full_device(run_dir):
    """/dev/full answers every write with ENOSPC: a real full disk, end to end (and the device
    is written to, never replaced by a temporary file)."""
    result = run("evaluate", run_dir, "--json", "/dev/full", "--batches", 1)
    assert_one_line_error(result, EXIT_USAGE, "no space left on the device: free some space")
    assert json.loads(result.stdout[result.stdout.index("{") :])["split"] == "test"
    assert not os.path.isfile("/dev/full")


@pytest.mark.parametrize(
    "code, pattern",
    [
        (errno.ENOSPC, "no space left on the device to write .*choose another --out-dir"),
        (errno.EROFS, "read-only; choose another --out-dir"),
        (errno.EACCES, "permission denied"),
    ],
)
def test_a_full_or_read_only_disk_is_one_line(tmp_path, monkeypatch, code, pattern):
    def fail(path, data, shown):
        raise OSError(code, "simulated", str(path))

    monkeypatch.setattr("inftyformer.training.checkpoint._write_bytes", fail)
    result = run("train", "sorting", *TINY, "--steps", 2, "--out-dir", tmp_path / "run")
    assert_one_line_error(result, EXIT_USAGE, pattern)


def test_a_file_size_limit_names_the_file_and_leaves_no_partial_file(tmp_path):
    """Under `ulimit -f` a write fails with EFBIG, whose error names no file ("[Errno 27] File
    too large"): the one line names the file that could not be written, and the partial file
    is removed."""
    import resource
    import subprocess
    import sys

    out = tmp_path / "run"
    limit = 40 * 1024  # bytes: the metrics fit, the first checkpoint's weights do not

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run(
        [sys.executable, "-m", "inftyformer.cli", "train", "sorting", *TINY,
         "--steps", "2", "--eval-every", "2", "--out-dir", str(out)],
        capture_output=True, text=True, timeout=600, preexec_fn=limited,
    )  # fmt: skip
    assert done.returncode == EXIT_USAGE, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"error: file too large: {out / 'best.safetensors'}: "), lines
    assert "ulimit -f" in lines[0] and "choose another --out-dir" in lines[0]
    assert not [p.name for p in out.iterdir() if p.name.endswith(".pending")]


def test_a_diverging_run_says_so_with_the_step_and_what_to_try(tmp_path):
    result = run("train", "sorting", *TINY, "--lr", "1e30", "--set", "grad_clip=0",
                 "--steps", 4, "--eval-every", 4, "--out-dir", tmp_path / "run")  # fmt: skip
    assert_one_line_error(result, EXIT_DIVERGED, r"training diverged at step \d+ .*Try a lower")
    assert "--lr" in result.stderr and "grad_clip" in result.stderr


def test_debug_shows_the_traceback(monkeypatch):
    result = run("--debug", "demo", "--segment-len", "0")
    assert isinstance(result.exception, ValueError)
    monkeypatch.setenv("INFTYFORMER_DEBUG", "1")
    result = run("demo", "--segment-len", "0")
    assert isinstance(result.exception, ValueError)


def test_real_bugs_keep_their_traceback(monkeypatch):
    def bug(**kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr("inftyformer.demo.run_demo", bug)
    result = run("demo", "--length", 1024)
    assert isinstance(result.exception, KeyError)
