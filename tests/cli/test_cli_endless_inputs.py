"""Inputs that never end: a text option reads only regular files, at most `MAX_TEXT_BYTES`
(a FIFO would block forever, /dev/zero grow without end); an input longer than a pretrained
base's positions is refused by name, not an IndexError inside the base."""

from __future__ import annotations

import os
import re

import pytest
import torch
from typer.testing import CliRunner

from inftyformer._files import read_user_text
from inftyformer.cli import EXIT_USAGE, app

runner = CliRunner()


def assert_one_line_error(result, pattern: str) -> None:
    assert result.exit_code == EXIT_USAGE, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert re.search(pattern, lines[0]), lines[0]


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)  # nobody writes to it: opening it for reading would block forever
    return path


def bad_inputs(tmp_path, fifo):
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "big.txt").write_text("x" * 2000)
    return [
        ("/dev/zero", "is a device or socket, not a regular file"),
        (fifo, "is a FIFO"),
        (tmp_path, "is a directory"),
        (tmp_path / "big.txt", "holds more than"),
        (tmp_path / "latin1.txt", r"is not UTF-8 text \(byte 3\)"),
        (tmp_path / "absent.txt", "No such file or directory"),
    ]


def test_read_user_text_refuses_every_endless_or_bad_source(tmp_path, fifo):
    for path, pattern in bad_inputs(tmp_path, fifo):
        with pytest.raises((ValueError, OSError), match=pattern):
            read_user_text(path, "--prompt-file", limit=1000)
    (tmp_path / "ok.txt").write_text("ok ünïcode")
    assert read_user_text(tmp_path / "ok.txt", "--prompt-file", limit=1000) == "ok ünïcode"


@pytest.mark.parametrize("command", ["generate", "inspect"])
def test_the_text_options_refuse_them_in_one_line(tmp_path, fifo, monkeypatch, command):
    monkeypatch.setattr(read_user_text, "__defaults__", (1000,))
    option = "--prompt-file" if command == "generate" else "--text"
    for path, pattern in bad_inputs(tmp_path, fifo):
        result = runner.invoke(app, [command, str(tmp_path / "no-run"), option, str(path)])
        assert_one_line_error(result, pattern)


def test_a_file_growing_past_the_limit_while_read_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "growing.txt"
    path.write_text("x" * 10)
    real_open = open

    def grows(p, mode="r", *args, **kwargs):  # the file gains bytes after its size was read
        if str(p) == str(path):
            path.write_text("x" * 5000)
        return real_open(p, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", grows)
    with pytest.raises(ValueError, match="holds more than"):
        read_user_text(path, "--prompt-file", limit=1000)


def test_inputs_beyond_a_pretrained_bases_positions_are_streamed_or_refused_by_name(tmp_path):
    pytest.importorskip("transformers")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hf"))
    from tiny_hf import MEMORY, tiny_base

    from inftyformer.hf import add_long_term_memory
    from inftyformer.hf.streaming import stream_loss

    for arch in ("gpt2", "llama"):  # 64 positions each
        model = add_long_term_memory(tiny_base(arch), **MEMORY).eval()
        with torch.no_grad():
            # longer than the positions: streamed through the memory by the call itself
            assert model(torch.zeros(1, 65, dtype=torch.long)).logits.shape[1] == 65
            ids = torch.zeros(1, 60, dtype=torch.long)
            assert model.generate(ids, max_new_tokens=10, do_sample=False).shape[1] == 70
            # generation goes on from the prompt's last part (here all 8 tokens): 8 + 57 = 65
            # fit (the last token needs no step), one more would reach position 65
            prompt = torch.zeros(1, 8, dtype=torch.long)
            assert model.generate(prompt, max_new_tokens=57, do_sample=False).shape[1] == 65
            with pytest.raises(ValueError, match="reaches position 65.*64 positions"):
                model.generate(prompt, max_new_tokens=58, do_sample=False)
            with pytest.raises(ValueError, match="reaches position 65.*64 positions"):
                model(prompt, position_ids=torch.arange(57, 65)[None])
            # streamed in segments, a text of any length goes in
            assert stream_loss(model, torch.zeros(1, 300, dtype=torch.long)).segments > 1


@pytest.mark.parametrize("memory", [True, False])
def test_generating_past_the_bases_positions_names_the_new_tokens(tmp_path, memory):
    pytest.importorskip("transformers")
    from tiny_pretrained import write_tiny_model

    from inftyformer.model_kinds import PretrainedMemoryConfig, build_model

    base = write_tiny_model(tmp_path / "base", "gpt2", max_positions=64)
    model = build_model(
        PretrainedMemoryConfig(
            base_model=str(base), segment_len=16, num_basis=16, num_samples=16, memory=memory
        )  # fmt: skip
    ).eval()
    prompt = torch.randint(0, 50, (1, 100))  # streamed: its last segment is the context
    new, _ = model.generate(prompt, 48)  # 4 + 48 ≤ 64 positions
    assert new.shape[1] <= 48
    with pytest.raises(ValueError, match="max_new_tokens=61 is too many.*at most 60"):
        model.generate(prompt, 61)


def test_standard_input_is_read_up_to_the_limit(monkeypatch):
    import io
    import sys

    from inftyformer.data import corpus
    from inftyformer.data.tokenizer import ByteTokenizer

    monkeypatch.setattr(corpus, "MAX_TEXT_BYTES", 1000)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"x" * 1001)))
    with pytest.raises(ValueError, match="standard input holds more than"):
        corpus.load_split("-", "test", ByteTokenizer())
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"x" * 1000)))
    assert corpus.load_split("-", "test", ByteTokenizer()).num_tokens == 1000
