"""Whatever raises inside a command ends on the one error path: corrupt or incomplete GGUF files
(parse errors of any type), a Rust library's panic (a BaseException), SIGTERM (handled like
Ctrl-C: clean-up, one line, exit 130); a killed conversion's temporary folder is removed by the
next run."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from inftyformer.cli import EXIT_INTERRUPTED, EXIT_USAGE, app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def assert_one_line_error(result, code: int, pattern: str) -> None:
    import re

    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in result.output


def write_gguf(path, *, scores: bool = True, all_weights: bool = True) -> None:
    """A tiny Llama GGUF (d 8, one layer, 5 tokens, zero weights)."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    d, ff, vocab = 8, 16, 5
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(d)
    w.add_block_count(1)
    w.add_feed_forward_length(ff)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(4)
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>", "a", "b"])
    if scores:
        w.add_token_scores([0.0] * vocab)
    w.add_token_types([2, 3, 3, 1, 1])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_tensor("token_embd.weight", np.zeros((vocab, d), np.float32))
    if all_weights:
        shapes = {"attn_norm": (d,), "attn_q": (d, d), "attn_k": (d, d), "attn_v": (d, d),
                  "attn_output": (d, d), "ffn_norm": (d,), "ffn_gate": (ff, d),
                  "ffn_up": (ff, d), "ffn_down": (d, ff)}  # fmt: skip
        for name, shape in shapes.items():
            w.add_tensor(f"blk.0.{name}.weight", np.zeros(shape, np.float32))
        w.add_tensor("output_norm.weight", np.zeros(d, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture
def hf():
    pytest.importorskip("transformers")


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"GGUF",
        b"GGUF" + struct.pack("<IQQ", 3, 0, 5),  # promises 5 metadata entries, holds none
        b"not a gguf file at all, just text\n" * 10,
    ],
    ids=["empty", "magic-only", "truncated-header", "text"],
)
def test_convert_gguf_refuses_truncated_files_in_one_line(hf, tmp_path, content):
    (tmp_path / "model.gguf").write_bytes(content)
    result = run("convert-gguf", tmp_path / "model.gguf", tmp_path / "out")
    assert_one_line_error(result, EXIT_USAGE, "model.gguf is not a complete GGUF")
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]  # nothing left behind


def test_convert_gguf_refuses_a_file_truncated_anywhere(hf, tmp_path):
    write_gguf(tmp_path / "full.gguf")
    data = (tmp_path / "full.gguf").read_bytes()
    for cut in (24, 100, len(data) // 2, len(data) - 8):
        (tmp_path / "model.gguf").write_bytes(data[:cut])
        result = run("convert-gguf", tmp_path / "model.gguf", tmp_path / "out")
        assert_one_line_error(result, EXIT_USAGE, "model.gguf")
        assert not (tmp_path / "out").exists()


def test_convert_gguf_refuses_a_tokenizer_without_scores_and_missing_weights(hf, tmp_path):
    write_gguf(tmp_path / "noscores.gguf", scores=False)
    result = run("convert-gguf", tmp_path / "noscores.gguf", tmp_path / "out")
    assert_one_line_error(result, EXIT_USAGE, "noscores.gguf is not a complete GGUF.*scores")
    write_gguf(tmp_path / "partial.gguf", all_weights=False)
    result = run("convert-gguf", tmp_path / "partial.gguf", tmp_path / "out")
    assert_one_line_error(result, EXIT_USAGE, r"partial.gguf lacks 10 weight\(s\).*at random")
    assert not (tmp_path / "out").exists()
    write_gguf(tmp_path / "ok.gguf")
    result = run("convert-gguf", tmp_path / "ok.gguf", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "model.safetensors").is_file()
    # each stage is said as it starts, and the tensors are counted as they are dequantised
    lines = result.stdout.splitlines()
    assert lines[0].startswith("reading ok.gguf (0 MiB) and dequantising it to float32")
    assert any(line.startswith("dequantising: 11/11 (100%)") for line in lines), lines
    assert lines[-2].startswith(f"writing {tmp_path / 'out'} (safetensors, ")


class PanicException(BaseException):  # what pyo3 raises when Rust code panics
    __module__ = "pyo3_runtime"


class OtherBaseException(BaseException):
    pass


def _raising(error):
    def command(**kwargs):
        raise error

    return command


def test_a_native_panic_is_one_line_other_base_exceptions_keep_their_meaning(monkeypatch):
    monkeypatch.setattr("inftyformer.demo.run_demo", _raising(PanicException("index out of range")))
    result = run("demo", "--length", 1024)
    assert_one_line_error(result, EXIT_USAGE, "native library failed .*index out of range")
    monkeypatch.setattr("inftyformer.demo.run_demo", _raising(OtherBaseException("bug")))
    with pytest.raises(OtherBaseException):  # a bug: its traceback is kept
        run("demo", "--length", 1024)
    monkeypatch.setattr("inftyformer.demo.run_demo", _raising(SystemExit(7)))
    assert run("demo", "--length", 1024).exit_code == 7
    monkeypatch.setenv("INFTYFORMER_DEBUG", "1")
    monkeypatch.setattr("inftyformer.demo.run_demo", _raising(PanicException("x")))
    with pytest.raises(PanicException):
        run("demo", "--length", 1024)


SLOW_CONVERSION = textwrap.dedent(
    """
    import os, sys, time
    import inftyformer.hf.convert as convert

    def slow(path, say=None):  # as if the conversion had begun writing its temporary folder
        out = sys.argv[2]
        os.makedirs(os.path.join(os.path.dirname(out), f".out.tmp{os.getpid()}", "partial"))
        print("reading", flush=True)
        time.sleep(60)

    convert._read_gguf = slow
    from inftyformer.cli import app
    app(["convert-gguf", sys.argv[1], sys.argv[2]])
    """
)


def test_sigterm_during_convert_gguf_cleans_up_in_one_line(hf, tmp_path):
    write_gguf(tmp_path / "ok.gguf")
    script = tmp_path / "slow.py"
    script.write_text(SLOW_CONVERSION)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "ok.gguf"), str(tmp_path / "out")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().startswith("reading ok.gguf")  # the stage is said first
    assert proc.stdout.readline().strip() == "reading"  # inside the temporary folder's block
    assert any(p.name.startswith(".out.tmp") for p in tmp_path.iterdir())
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert err.strip().splitlines() == ["terminated (SIGTERM): stopped, temporary files removed"], (
        err
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.gguf", "slow.py"]


def test_a_killed_conversions_temporary_folder_is_removed_by_the_next_run(hf, tmp_path):
    write_gguf(tmp_path / "ok.gguf")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a process id that no longer runs
    stale = tmp_path / f".out.tmp{dead.pid}"
    (stale / "sub").mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    alive = tmp_path / f".out.tmp{os.getppid()}"  # a running process: not touched
    alive.mkdir()
    result = run("convert-gguf", tmp_path / "ok.gguf", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert not stale.exists() and alive.is_dir()


SLOW_DEMO = textwrap.dedent(
    """
    import time
    import inftyformer.demo

    def slow(**kwargs):
        print("running", flush=True)
        time.sleep(60)

    inftyformer.demo.run_demo = slow
    from inftyformer.cli import app
    app(["demo", "--length", "1024"])
    """
)


def test_sigterm_in_other_long_commands_is_ctrl_c(tmp_path):
    script = tmp_path / "slow.py"
    script.write_text(SLOW_DEMO)
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "running"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert err.strip().splitlines() == ["terminated (SIGTERM): stopped, temporary files removed"]
