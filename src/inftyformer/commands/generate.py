"""`inftyformer generate`: stream a prompt through a saved model segment by segment, continue
it, and show the continuation (whitespace a terminal would hide described) and the memory."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import typer

from .._files import read_user_text


def run_generate(
    checkpoint: Path,
    *,
    prompt: str,
    prompt_file: Path | None,
    max_new_tokens: int | None,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    seed: int,
    device: str,
    base_model: str | None,
    threads: int,
) -> None:
    """Continue `prompt` (see `inftyformer generate --help`)."""
    import torch

    from ..streaming import check_sampling
    from ..training import load_run

    if threads < 0:
        raise ValueError(f"--threads must be >= 0, got {threads}")
    if threads:
        torch.set_num_threads(threads)

    check_sampling(temperature, top_k, top_p, names=("--temperature", "--top-k", "--top-p"))
    if prompt_file is not None:
        text = read_user_text(prompt_file, "--prompt-file")
        if not text.strip():
            raise ValueError(f"{prompt_file} holds no text")
        prompt = text if prompt == "random" else text + prompt
    run = load_run(checkpoint, device, base_model=base_model)
    model, dev = run.model, run.device
    task = run.task()
    tokens, expected = task.encode_prompt(prompt)
    n_new = max_new_tokens if max_new_tokens is not None else task.default_new_tokens()
    if n_new < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {n_new}")
    torch.manual_seed(seed)  # pretrained models sample from torch's global generator
    gen = torch.Generator(device=dev).manual_seed(seed)
    start = time.perf_counter()
    out = model.generate(
        tokens[None].to(dev),
        max_new_tokens=n_new,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        generator=gen,
    )
    seconds = time.perf_counter() - start
    new_tokens = _new_tokens(out)
    segment = run.model_config.segment_len
    typer.echo(
        f"prompt: {tokens.numel():,} tokens, streamed in {-(-tokens.numel() // segment):,} "
        f"segments of {segment} ({seconds:.1f} s with generation)"
    )
    typer.echo(f"memory: {_memory_summary(out[1])}")
    typer.echo(f"output:   {visible_text(task.decode(new_tokens))}")
    if expected:
        typer.echo(f"expected: {visible_text(task.decode(expected))}")
        hits = sum(a == b for a, b in zip(new_tokens, expected, strict=False))
        typer.echo(f"{hits}/{len(expected)} positions right (free-running, no teacher forcing)")


_WHITESPACE_NAMES = {" ": "space", "\n": "newline", "\t": "tab", "\r": "carriage return"}
_LONG_WHITESPACE = re.compile(r"\s{10,}")


def _count_whitespace(text: str) -> str:
    """'180 spaces, 20 newlines'."""
    counts: dict[str, int] = {}
    for ch in text:
        counts[ch] = counts.get(ch, 0) + 1
    parts = []
    for ch, n in sorted(counts.items(), key=lambda item: -item[1]):
        name = _WHITESPACE_NAMES.get(ch, f"U+{ord(ch):04X}")
        parts.append(f"{n} {name}{'s' if n > 1 else ''}")
    return ", ".join(parts)


def visible_text(text: str) -> str:
    """Generated text as a terminal can show it: whitespace that would look like nothing (a
    byte-level model's output of 200 spaces) is described, long runs of it inside text too."""
    if not text:
        return "(no text: the tokens decode to nothing)"
    if not text.strip():
        return f"(only whitespace: {_count_whitespace(text)})"
    return _LONG_WHITESPACE.sub(lambda m: f"[{_count_whitespace(m.group())}]", text)


def _memory_summary(state: Any) -> str:
    """What a MemoryState holds, by kind, in numbers and KiB (batch row 0's share)."""
    kinds: dict[str, int] = {}
    for layer in state.layers:
        for name, tensor in layer.tensors().items():
            if tensor.is_floating_point():
                kind = name.split(".")[0]
                kinds[kind] = kinds.get(kind, 0) + tensor[0].numel()
    total = sum(kinds.values())
    parts = ", ".join(f"{k} {v:,}" for k, v in kinds.items())
    return (
        f"{total:,} numbers ({total * 4 / 1024:,.0f} KiB) over {len(state.layers)} layers: {parts}"
    )


def _new_tokens(out: Any) -> list[int]:
    """The first row of the generated continuation ((tokens [B, n], state) from `generate`)."""
    tokens = out[0] if isinstance(out, tuple) else out
    return [int(t) for t in tokens[0].tolist()]
