"""A tiny random chat model folder for the ask and chat tests (`inftyformer.retrieval.ask`):
a Llama with a ChatML template whose answers are readable ASCII (the rows of its output layer
for the other tokens are zero, so a random model's best token is never one of them: its
answers decode to the same text however they are cut, as a streamer cuts them)."""

from __future__ import annotations

import string
from pathlib import Path

import torch
from tiny_pretrained import write_tiny_model
from typer.testing import CliRunner

from inftyformer.cli import app
from inftyformer.commands import ask as ask_command
from inftyformer.retrieval.ask import DocumentReader
from inftyformer.retrieval.model import RetrievalLM

POSITIONS = 512
QUESTION = "when did the letter come?"
NEW = 12
# blocks of 8, the sink and 2 chosen blocks, a window of 32, calls of 16: a document of a few
# hundred tokens leaves most of itself in the store
SMALL = dict(block_size=8, blocks=2, sink_blocks=1, window=32, segment_len=16)
# a window holding the whole stream: the retrieval is the base itself
WHOLE = dict(block_size=8, blocks=2, sink_blocks=1, window=320, segment_len=16)
TEXT = "the memory of a long book, said the signal. the letter came on a monday. "
DOCUMENT = TEXT * 8  # 166 tokens


def settings_args(settings: dict) -> list[str]:
    """--set KEY=VALUE for each setting."""
    return [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]


def write_chat_model(directory: Path, seed: int = 0, chat: bool = True) -> Path:
    """The tiny ChatML Llama of `write_tiny_model` whose best token is always printable
    (`chat=False`: no chat template)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    write_tiny_model(directory, chat=chat, max_positions=POSITIONS, seed=seed,
                     corpus=(TEXT,) * 20)  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
    allowed = set(string.ascii_letters + string.digits + " .,")
    with torch.no_grad():
        weight = model.get_output_embeddings().weight  # [V, hidden]
        for token in range(weight.shape[0]):
            text = tokenizer.decode([token], skip_special_tokens=False)
            if not text or not set(text) <= allowed or token in tokenizer.all_special_ids:
                weight[token] = 0
    model.save_pretrained(directory)
    return directory


def write_document(folder: Path) -> Path:
    path = folder / "book.txt"
    path.write_text(DOCUMENT, encoding="utf-8")
    return path


class Recorder:
    """A streamer keeping what it is given: the token ids of each put, and whether it ended."""

    def __init__(self):
        self.tokens, self.ended = [], 0

    def put(self, value):
        assert value.dim() == 1  # one row, as TextStreamer takes it
        self.tokens += value.tolist()

    def end(self):
        self.ended += 1


def python_answer(base_dir, document=DOCUMENT, question=QUESTION, settings=SMALL, **options):
    reader = DocumentReader.from_base(base_dir, **settings)
    reader.read(document)
    return reader.answer_tokens(question, max_new_tokens=NEW, **options), reader


def run_cli(args, input=None):
    return CliRunner().invoke(app, args, input=input)


def cli_args(base_dir, document, *extra, settings=SMALL, question=QUESTION):
    return ["ask", "--base-model", str(base_dir), str(document), question,
            "--max-new-tokens", str(NEW), *settings_args(settings), *extra]  # fmt: skip


def record_streams(monkeypatch) -> list[list[int]]:
    """The CLI's streamer records the tokens it prints (and prints them)."""
    from transformers import TextStreamer

    streams = []

    class Recording(TextStreamer):
        def put(self, value):
            streams[-1].append(int(value[-1]))
            super().put(value)

    def make(tokenizer):
        streams.append([])
        return Recording(tokenizer, skip_special_tokens=True)

    monkeypatch.setattr(ask_command, "_streamer", make)
    return streams


def count_reads(monkeypatch) -> list[int]:
    """How many tokens the model reads (its base's calls, by tokens)."""
    counts = [0]
    call = RetrievalLM._call

    def counting(self, ids, *args, **kwargs):
        counts[0] += ids.shape[1]
        return call(self, ids, *args, **kwargs)

    monkeypatch.setattr(RetrievalLM, "_call", counting)
    return counts


__all__ = [
    "DOCUMENT",
    "NEW",
    "POSITIONS",
    "QUESTION",
    "SMALL",
    "TEXT",
    "WHOLE",
    "Recorder",
    "cli_args",
    "count_reads",
    "python_answer",
    "record_streams",
    "run_cli",
    "settings_args",
    "write_chat_model",
    "write_document",
]
