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
    checkpoint: Path | None,
    *,
    prompt: str,
    prompt_file: Path | None,
    max_new_tokens: int | None,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    seed: int,
    device: str,
    base_model: str | None,
    threads: int,
    preset: str | None = None,
) -> None:
    """Continue `prompt` (see `inftyformer generate --help`)."""
    if checkpoint is None and base_model is None:  # before torch is imported: at once
        raise ValueError(
            "give a checkpoint, or --base-model DIR to continue text with the base reading "
            "its own past (a retrieval preset, training-free)"
        )
    import torch

    from ..native.streaming import check_sampling
    from ..training import load_run

    if threads < 0:
        raise ValueError(f"--threads must be >= 0, got {threads}")
    if threads:
        torch.set_num_threads(threads)

    names = ("--temperature", "--top-k", "--top-p")
    check_sampling(temperature or 0.0, top_k, top_p, names=names)
    if prompt_file is not None:
        text = read_user_text(prompt_file, "--prompt-file")
        if not text.strip():
            raise ValueError(f"{prompt_file} holds no text")
        prompt = text if prompt == "random" else text + prompt
    if checkpoint is None:  # no trained run: the base reads its own past (training-free)
        options = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        return _generate_by_retrieval(base_model, preset, prompt, max_new_tokens, device, options)
    memory = None
    if preset is not None:  # the preset's settings that differ from the run's
        from ..training import read_configs
        from .evaluate import preset_memory

        memory = preset_memory(preset, read_configs(checkpoint, base_model)[2])
    run = load_run(checkpoint, device, memory_settings=memory, base_model=base_model)
    model, dev = run.model, run.device
    task = run.task()
    if temperature is None:  # the task's way: sampling for text, greedy for one right answer
        defaults = task.default_sampling()
        temperature = defaults["temperature"]
        top_k = top_k if top_k is not None else defaults.get("top_k")
        top_p = top_p if top_p is not None else defaults.get("top_p")
    tokens, expected = task.encode_prompt(prompt)
    n_new = max_new_tokens if max_new_tokens is not None else task.default_new_tokens()
    if n_new < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {n_new}")
    torch.manual_seed(seed)  # pretrained models sample from torch's global generator
    gen = torch.Generator(device=dev).manual_seed(seed)
    start = time.perf_counter()
    segment = run.model_config.segment_len
    state, rest = _read_prompt(model, tokens[None].to(dev), segment)
    out = model.generate(
        rest,
        max_new_tokens=n_new,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        state=state,
        generator=gen,
    )
    seconds = time.perf_counter() - start
    new_tokens = _new_tokens(out)
    typer.echo(
        f"prompt: {tokens.numel():,} tokens, streamed in {-(-tokens.numel() // segment):,} "
        f"segments of {segment} ({seconds:.1f} s with generation)"
    )
    typer.echo(f"decoding: {_decoding(temperature, top_k, top_p, seed)}")
    typer.echo(f"memory: {_memory_summary(out[1])}")
    typer.echo(f"output:   {visible_text(task.decode(new_tokens))}")
    if expected:
        typer.echo(f"expected: {visible_text(task.decode(expected))}")
        hits = sum(a == b for a, b in zip(new_tokens, expected, strict=False))
        typer.echo(f"{hits}/{len(expected)} positions right (free-running, no teacher forcing)")


def _generate_by_retrieval(
    base_model: str,
    preset: str | None,
    prompt: str,
    max_new_tokens: int | None,
    device: str,
    sampling: dict[str, Any],
) -> None:
    """Continue `prompt` with a pretrained base reading its own past by a retrieval preset
    (`inftyformer.retrieval`; default: the default preset), stopping at its end-of-sequence
    token: greedy unless --temperature is given."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..presets import retrieval_settings
    from ..retrieval import RetrievalLM
    from ..retrieval.prompts import stop_tokens
    from ..training.distributed import resolve_device

    preset = preset or "retrieval"
    retrieval_settings(preset)  # a named error before any weight is read
    if prompt == "random":
        raise ValueError("give the text to continue: --prompt TEXT or --prompt-file FILE")
    dev = resolve_device(device)
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    base = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32).to(dev)
    model = RetrievalLM(base, preset=preset).eval()
    ids = torch.tensor([tokenizer(prompt).input_ids], device=dev)
    temperature = sampling["temperature"] or 0.0
    gen = torch.Generator(device=dev).manual_seed(sampling["seed"])
    ends = sorted(stop_tokens(tokenizer, base))
    start = time.perf_counter()
    state, rest = _read_prompt(model, ids, model.config.segment_len)
    new, _ = model.generate(
        rest, max_new_tokens or 64, temperature, sampling["top_k"], sampling["top_p"],
        state=state, generator=gen, end_ids=ends, with_state=False,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    tokens = [t for t in new[0].tolist() if t not in ends]
    typer.echo(f"prompt: {ids.shape[1]:,} tokens, read with preset {preset} ({seconds:.1f} s "
               "with generation)")  # fmt: skip
    typer.echo(f"decoding: {_decoding(temperature, sampling['top_k'], sampling['top_p'], 0)}")
    typer.echo(f"output:   {visible_text(tokenizer.decode(tokens))}")


LONG_PROMPT_SEGMENTS = 4  # a prompt of more segments is read into the memory with a bar


def _read_prompt(model: Any, prompt: Any, segment_len: int) -> tuple[Any, Any]:
    """(state, rest): a long prompt [1, T] streamed into the memory segment by segment with a
    progress bar (the time left), all but its last 1 … L tokens, as `generate` itself would
    stream it (so the continuation is the same), and those last tokens; a short one untouched."""
    from .._progress import progress

    cut = (prompt.shape[1] - 1) // segment_len * segment_len
    if cut < LONG_PROMPT_SEGMENTS * segment_len:
        return None, prompt
    state = None
    starts = progress(
        range(0, cut, segment_len), desc="reading the prompt", unit=" segments", leave=False
    )
    for start in starts:
        state = model.push(prompt[:, start : start + segment_len], state)
    return state, prompt[:, cut:]


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


def _decoding(temperature: float, top_k: int | None, top_p: float | None, seed: int) -> str:
    if temperature == 0:
        return "greedy (--temperature T > 0 samples)"
    parts = [f"sampling at temperature {temperature:g}"]
    parts += [f"top-k {top_k}"] if top_k is not None else []
    parts += [f"top-p {top_p:g}"] if top_p is not None else []
    return ", ".join(parts) + f" (seed {seed}; --temperature 0: greedy)"


def _memory_summary(state: Any) -> str:
    """What a MemoryState holds in batch row 0, in tokens of the stream: the long-term memory
    (its S tokens, or empty), the short-term memory (on a pretrained model: the inputs waiting to
    enter the long-term memory), compressed slots, the window; then what is allocated for it."""
    from ..core.state import UNKNOWN_STORED

    layers = state.layers
    numbers = sum(
        t[0].numel() for layer in layers for t in layer.tensors().values() if t.is_floating_point()
    )
    parts = []
    long_terms = [layer.long_term for layer in layers if layer.long_term is not None]
    if long_terms:
        stored = [
            int(lt.stored[0]) if lt.stored is not None else UNKNOWN_STORED for lt in long_terms
        ]
        if all(bool(lt.empty[0]) for lt in long_terms):
            where = "the window" if state.window is not None else "the short-term memory"
            parts.append(f"long-term memory empty (text enters it once it has left {where})")
        elif max(stored) < UNKNOWN_STORED:
            parts.append(
                f"long-term memory {max(stored):,} tokens of the stream "
                f"({len(long_terms)} layer{'s' if len(long_terms) > 1 else ''})"
            )
        else:
            parts.append("long-term memory holding text (a state saved before it counted tokens)")
    short = max(int(layer.short_term.length[0]) for layer in layers)
    label = "waiting to enter it" if state.window is not None else "short-term memory"
    parts.append(f"{label} {short:,} tokens")
    compressed = [int(layer.compressed.length[0]) for layer in layers if layer.compressed]
    if compressed:
        parts.append(f"compressed memory {max(compressed):,} slots")
    if state.window is not None:
        parts.append(f"window {int(state.window.length[0]):,} tokens")
    return (
        "; ".join(parts) + f" ({numbers:,} numbers allocated, {numbers * 4 / 2**20:.1f} MiB, over "
        f"{len(layers)} layers)"
    )


def _new_tokens(out: Any) -> list[int]:
    """The first row of the generated continuation ((tokens [B, n], state) from `generate`)."""
    tokens = out[0] if isinstance(out, tuple) else out
    return [int(t) for t in tokens[0].tolist()]
