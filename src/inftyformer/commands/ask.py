"""`inftyformer ask` and `inftyformer chat`: a pretrained chat model with the retrieval memory
reads a long document and answers a question on it, or keeps a conversation whose memory
persists across turns and restarts (`inftyformer.retrieval.ask`; docs/ask.md).

Registered on the command line by `register(app)`; nothing here imports torch at import time
(`--help` answers at once)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import typer

from ..errors import user_errors

DEFAULT_PRESET = "retrieval"


def document_text(source: str) -> tuple[str, str]:
    """(text, what it is) of the DOCUMENT argument: a UTF-8 text file; a folder, its files
    (not hidden ones) in sorted order, each after its name on a line of its own, joined with a
    blank line; or "-", standard input."""
    from .._files import MAX_TEXT_BYTES, read_user_text

    if source == "-":
        raw = sys.stdin.buffer.read(MAX_TEXT_BYTES + 1)
        if len(raw) > MAX_TEXT_BYTES:
            raise ValueError(f"standard input holds more than {MAX_TEXT_BYTES / 2**20:g} MiB")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"standard input is not UTF-8 text (byte {err.start})") from None
        what = "standard input"
    elif Path(source).is_dir():
        folder = Path(source)
        files = sorted(
            p for p in folder.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
        )  # fmt: skip
        if not files:
            raise ValueError(f"DOCUMENT {folder} holds no files")
        parts = [f"{p.relative_to(folder).as_posix()}\n{read_user_text(p, 'DOCUMENT')}"
                 for p in files]  # fmt: skip
        text, what = "\n\n".join(parts), f"{len(files)} files of {folder}"
    else:
        text, what = read_user_text(source, "DOCUMENT"), source
    if not text.strip():
        raise ValueError(f"DOCUMENT {what} holds no text")
    return text, what


def parse_settings(items: list[str]) -> dict[str, Any]:
    """--set KEY=VALUE retrieval settings: ints, floats, true/false, none, or text (the
    model's config checks names and values); a strategy's kind by name (``choice=none``)."""
    from ..retrieval.config import SEAMS

    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set takes KEY=VALUE, got {item!r}")
        value: Any = text
        low = text.strip().lower()
        if key.strip() in SEAMS:  # a strategy's kind, by name ("none" is a choice's kind)
            value = text.strip()
        elif low in ("none", "null"):
            value = None
        elif low in ("true", "false"):
            value = low == "true"
        else:
            for kind in (int, float):
                try:
                    value = kind(text)
                    break
                except ValueError:
                    continue
        out[key.strip()] = value
    return out


def _setup(threads: int, temperature: float, max_new_tokens: int) -> None:
    import torch

    if threads < 0:
        raise ValueError(f"--threads must be ≥ 0, got {threads}")
    if threads:
        torch.set_num_threads(threads)
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be ≥ 1, got {max_new_tokens}")
    if not temperature >= 0:
        raise ValueError(f"--temperature must be ≥ 0, got {temperature}")


def _generator(talk, seed: int):
    """The sampling generator, on the model's device."""
    import torch

    return torch.Generator(device=talk.model._param().device).manual_seed(seed)


def _load(talk_class, base_model: str, preset: str, settings: list[str], device: str):
    from ..retrieval.ask import load_model
    from ..training.distributed import resolve_device

    dev = resolve_device(device)
    model, tokenizer, key = load_model(base_model, preset or None, str(dev),
                                       **parse_settings(settings))  # fmt: skip
    return talk_class(model, tokenizer, key)


def _streamer(tokenizer):
    from transformers import TextStreamer

    return TextStreamer(tokenizer, skip_special_tokens=True)


def run_ask(
    base_model: str, document: str, question: str, *, preset: str, settings: list[str],
    session: Path | None, max_new_tokens: int, temperature: float, seed: int, threads: int,
    device: str,
) -> None:  # fmt: skip
    """`inftyformer ask` (its --help)."""
    from ..retrieval import session as sessions
    from ..retrieval.ask import DocumentReader

    _setup(threads, temperature, max_new_tokens)
    if not question.strip():
        raise ValueError("QUESTION is empty")
    text, what = document_text(document)
    reader = _load(DocumentReader, base_model, preset, settings, device)
    generator = _generator(reader, seed)
    start = time.perf_counter()
    if session is not None and sessions.is_session(session):
        reader.load(session)  # refuses another base, preset or settings
        if not reader.holds(text):
            raise ValueError(
                f"session {session} holds another document ({reader.info.document['tokens']:,} "
                f"tokens, sha256 {reader.info.document['sha256'][:16]}…) than {what}: give "
                "another --session folder"
            )
        typer.echo(f"{what}: {reader.info.tokens:,} tokens, from session {session} (not read "
                   "again)", err=True)  # fmt: skip
    else:
        reader.read(text, progress=True, session=session)
        saved = f", saved to {session}" if session is not None else ""
        typer.echo(f"{what}: read {reader.info.tokens:,} tokens in "
                   f"{time.perf_counter() - start:.1f} s{saved}", err=True)  # fmt: skip
    reader.answer_tokens(question, max_new_tokens=max_new_tokens, temperature=temperature,
                         generator=generator, streamer=_streamer(reader.tokenizer))  # fmt: skip


def run_chat(
    base_model: str, *, session: Path, document: str | None, preset: str, settings: list[str],
    max_new_tokens: int, temperature: float, seed: int, threads: int, device: str,
) -> None:  # fmt: skip
    """`inftyformer chat` (its --help)."""
    from ..retrieval import session as sessions
    from ..retrieval.ask import Chat

    _setup(threads, temperature, max_new_tokens)
    if document == "-":
        raise ValueError("chat reads its messages from standard input: --document must be a file")
    text, what = document_text(document) if document is not None else (None, "")
    chat = _load(Chat, base_model, preset, settings, device)
    generator = _generator(chat, seed)
    if sessions.is_session(session):
        chat.load(session)
        if text is not None:
            raise ValueError(f"session {session} holds a conversation already: a --document "
                             "opens a new one (give another --session folder)")  # fmt: skip
        typer.echo(f"session {session}: {chat.info.turns} turns, {chat.info.tokens:,} tokens",
                   err=True)  # fmt: skip
    elif text is not None:
        chat.read(text, progress=True, session=session)
        typer.echo(f"{what}: read {chat.info.tokens:,} tokens into session {session}", err=True)
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            typer.echo("> ", nl=False)
        line = sys.stdin.readline()
        if not line:
            break
        message = line.rstrip("\n")
        if not message.strip():
            continue
        chat.say_tokens(message, session=session, max_new_tokens=max_new_tokens,
                        temperature=temperature, generator=generator,
                        streamer=_streamer(chat.tokenizer))  # fmt: skip


def register(app: typer.Typer) -> None:
    """Add `ask` and `chat` to the command line `app`."""
    app.command("ask")(user_errors("choose another --session folder")(ask))
    app.command("chat")(user_errors("choose another --session folder")(chat))


_BASE = typer.Option(
    ..., "--base-model", help="A pretrained chat model's folder (Hugging Face, Llama family, "
    "with its tokenizer; its chat template frames the turns when it has one)."
)  # fmt: skip
_PRESET = typer.Option(
    DEFAULT_PRESET, "--preset", help="The retrieval preset (`inftyformer presets`): what the "
    "model reads of its past; --set settings go on top."
)  # fmt: skip
_SET = typer.Option(
    [], "--set", "-s", help="A retrieval setting on top of the preset, e.g. --set window=448 "
    "(repeatable)."
)  # fmt: skip
_NEW = typer.Option(256, "--max-new-tokens", help="The most tokens an answer has.")
_TEMPERATURE = typer.Option(
    0.0, "--temperature", help="0: greedy (the most likely token each time); > 0 samples."
)
_SEED = typer.Option(0, "--seed", help="Seed of the sampling (with --temperature > 0).")
_THREADS = typer.Option(
    1, "--threads", help="torch CPU threads; 0: one per core (1 by default: on a shared CPU, "
    "multi-threaded torch spins)."
)  # fmt: skip
_DEVICE = typer.Option("cpu", "--device", help="cpu, cuda, cuda:N or auto.")


def ask(
    document: str = typer.Argument(
        ...,
        help="A UTF-8 text file, a folder of them (read in sorted order, each after its "
        "name) or - for standard input.",
    ),  # fmt: skip
    question: str = typer.Argument(..., help="The question, asked after the whole document."),
    base_model: str = _BASE,
    preset: str = _PRESET,
    settings: list[str] = _SET,  # noqa: B008
    session: Path | None = typer.Option(  # noqa: B008
        None,
        "--session",
        help="A folder keeping what was read of the document: the next "
        "ask with it and the same document reads only the question.",
    ),  # fmt: skip
    max_new_tokens: int = _NEW,
    temperature: float = _TEMPERATURE,
    seed: int = _SEED,
    threads: int = _THREADS,
    device: str = _DEVICE,
) -> None:
    """Read a long document into the retrieval memory (a bar shows the tokens and the time
    left), then answer a question on it, streamed to standard output."""
    run_ask(base_model, document, question, preset=preset, settings=settings, session=session,
            max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, threads=threads,
            device=device)  # fmt: skip


def chat(
    base_model: str = _BASE,
    session: Path = typer.Option(  # noqa: B008
        ...,
        "--session",
        help="The conversation's folder, new or existing: its memory is "
        "saved after every turn (the blocks on disk; fixed-size window and sink).",
    ),  # fmt: skip
    document: str | None = typer.Option(
        None,
        "--document",
        help="Open a new conversation with this text file or folder (the "
        "start of the first message).",
    ),  # fmt: skip
    preset: str = _PRESET,
    settings: list[str] = _SET,  # noqa: B008
    max_new_tokens: int = _NEW,
    temperature: float = _TEMPERATURE,
    seed: int = _SEED,
    threads: int = _THREADS,
    device: str = _DEVICE,
) -> None:
    """A conversation, one message a line on standard input (a "> " prompt on a terminal),
    each answer streamed to standard output; the memory goes on across turns and restarts."""
    run_chat(base_model, session=session, document=document, preset=preset, settings=settings,
             max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
             threads=threads, device=device)  # fmt: skip


__all__ = ["document_text", "parse_settings", "register", "run_ask", "run_chat"]
