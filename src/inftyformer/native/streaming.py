"""Streaming any length through a `MemoryLM`, and generation with a carried memory (the
functions behind `MemoryLM.push` and `MemoryLM.generate`; `model` is a `MemoryLM`).

Visible context
---------------
Every model processes its stream in blocks of C = `segment_len` tokens counted from the last
reset (block semantics: `short_term_memory.py`). A token sees

* the short-term memory as it was when its block started, and the block's earlier tokens;
* the ∞-former: the long-term memory, i.e. every whole block that left the short-term memory
  before its block started (fitted block by block into the continuous signal);
* the compressive model: the compressed slots of the states that left before its block started.

This is a property of the stream, not of how the calls cut it, as long as no call crosses a block
boundary. Both functions here cut their input so that no call does (the first piece completes the
block the state is in), so:

* `stream_loss` gives the per-token losses of the block-wise forward, whatever the length;
* `generate` pushes the prompt through in such pieces, then decodes one token per call with the
  short-term memory as the KV cache. The states a block leaves behind are computed with exactly
  the context of a one-call forward of that block, and a completed block leaves the short-term
  memory (into the long-term memory, for the ∞-former) only when the next block starts; so greedy
  decoding with the carried state gives the tokens of recomputing, from scratch, the block-wise
  forward over prompt + generated tokens (up to float rounding;
  `tests/models/test_model_streaming.py`).
  Sticky memories average the attention histograms of the calls since the last update, which
  matches the block-wise histogram only approximately.

The alignment needs the block phase of the state: the short-term length modulo C, the same for
every row. When rows are in different phases (after per-row resets), or for a compressive model
whose C is not a multiple of c, the input is cut into plain pieces of `segment_len`: still
correct streaming, but the equality with a block-wise recomputation no longer holds exactly.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .._checks import check_positive_int, check_segment_len
from .state import MemoryState


def block_phase(model: nn.Module, state: MemoryState | None) -> int | None:
    """How many tokens of the current block the state holds (0 at a block boundary), or None
    when that is not the same for every row or cannot be told."""
    if state is None:
        return 0
    c = model.config
    if c.has_compressive and c.segment_len % c.compression_rate:
        # states leave in multiples of c, not of C: the short-term memory's start drifts
        return None
    phase = state.layers[0].short_term.length % c.segment_len  # [batch]
    if not bool((phase == phase[0]).all()):
        return None
    return int(phase[0])


def _apply_reset(state: MemoryState | None, reset: torch.Tensor | None) -> MemoryState | None:
    """Apply a [batch] bool reset up front, so that the block phase is the reset rows' too."""
    if reset is None or state is None:
        return state
    if not isinstance(reset, torch.Tensor) or reset.dtype != torch.bool or reset.dim() != 1:
        raise ValueError("reset must be a bool tensor of shape [batch]")
    if bool(reset.all()):
        return None  # every row starts over (possibly with another batch size)
    return state.reset(reset.to(state.device))


def cut_points(
    total: int, segment_len: int, block_len: int, phase: int | None
) -> list[tuple[int, int]]:
    """Pieces [start, end) of at most `segment_len` that never cross a block boundary (blocks of
    `block_len` with the stream `phase` tokens into one), or plain pieces when phase is None."""
    pieces, pos = [], 0
    while pos < total:
        n = min(segment_len, total - pos)
        if phase is not None:
            n = min(n, block_len - (phase + pos) % block_len)
        pieces.append((pos, pos + n))
        pos += n
    return pieces


def _segment_len(model: nn.Module, segment_len: int | None) -> int:
    """The tokens per call: the model's `segment_len` (its config's; None asks for it), or a
    shorter cap for this stream only (the blocks stay the model's: `cut_points`)."""
    limit = model.config.segment_len
    return limit if segment_len is None else check_segment_len(segment_len, limit)


def stream_loss(
    model: nn.Module,
    tokens: torch.Tensor,
    targets: torch.Tensor,
    state: MemoryState | None = None,
    segment_len: int | None = None,
    reset: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, MemoryState]:
    """Per-token NLL [batch, T] (0 where targets are −100) of a stream of any length T, cut into
    block-aligned calls of at most `segment_len` (default: the model's), carrying `state`.
    `reset` [batch] is applied before the first call. Runs under the caller's grad mode."""
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        raise ValueError("tokens must be a tensor of shape [batch, T]")
    if not isinstance(targets, torch.Tensor) or targets.shape != tokens.shape:
        raise ValueError(
            f"targets must have the shape of tokens {tuple(tokens.shape)}, got "
            f"{tuple(targets.shape) if isinstance(targets, torch.Tensor) else type(targets)}"
        )
    if tokens.shape[1] == 0:
        raise ValueError("tokens must hold at least one token")
    seg = _segment_len(model, segment_len)
    state = _apply_reset(state, reset)
    phase = block_phase(model, state)
    losses = []
    for start, end in cut_points(tokens.shape[1], seg, model.config.segment_len, phase):
        out = model(tokens[:, start:end], state, targets=targets[:, start:end], generator=generator)
        losses.append(out.token_loss)
        state = out.state
    return torch.cat(losses, dim=1), state


def push(
    model: nn.Module,
    tokens: torch.Tensor,
    state: MemoryState | None = None,
    segment_len: int | None = None,
    reset: torch.Tensor | None = None,
) -> tuple[torch.Tensor, MemoryState]:
    """Feed tokens [batch, T] into the memory in block-aligned calls; returns the logits of the
    last position [batch, V] and the new state. No gradients."""
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.shape[1] == 0:
        raise ValueError("tokens must be a tensor of shape [batch, T] with T >= 1")
    seg = _segment_len(model, segment_len)
    state = _apply_reset(state, reset)
    phase = block_phase(model, state)
    with torch.no_grad():
        for start, end in cut_points(tokens.shape[1], seg, model.config.segment_len, phase):
            out = model(tokens[:, start:end], state)
            state = out.state
    return out.logits[:, -1], state


SAMPLING_NAMES = ("temperature", "top_k", "top_p")


def check_sampling(
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
    names: tuple[str, str, str] = SAMPLING_NAMES,
) -> None:
    """Refuse sampling options `sample_next` cannot use, naming each by `names` (the command
    line passes its option names): temperature a finite number >= 0 (0: greedy), top_k None or
    an int >= 1, top_p None or in (0, 1]."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ValueError(f"{names[0]} must be a number, got {type(temperature).__name__}")
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise ValueError(f"{names[0]} must be a finite number >= 0, got {temperature}")
    if top_k is not None:
        check_positive_int(names[1], top_k)
    if top_p is not None and not (0 < top_p <= 1):  # (NaN fails too)
        raise ValueError(f"{names[2]} must be in (0, 1], got {top_p}")


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One token per row from logits [batch, V]: greedy when temperature is 0, otherwise
    softmax(logits / temperature) restricted to the top k and/or the nucleus of mass top_p."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # [batch, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the tokens before it already hold top_p (the first always stays)
        drop = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop).scatter(-1, order, drop)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def generate(
    model: nn.Module,
    prompt: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    state: MemoryState | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, MemoryState]:
    """Continue prompt [batch, T0] (any length ≥ 1, pushed through in block-aligned calls) by
    `max_new_tokens` tokens, decoding one token per call with the carried memory.

    Returns (new tokens [batch, max_new_tokens], state after prompt AND all new tokens, ready to
    continue the stream). temperature 0 is greedy. Put the model in eval mode first (dropout)."""
    check_positive_int("max_new_tokens", max_new_tokens, minimum=0)
    check_sampling(temperature, top_k, top_p)
    logits, state = push(model, prompt, state)
    new = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            token = sample_next(logits, temperature, top_k, top_p, generator)  # [batch]
            new.append(token)
            out = model(token[:, None], state)  # one token per call: the memory is the cache
            logits, state = out.logits[:, -1], out.state
    if not new:
        return prompt.new_zeros(prompt.shape[0], 0), state
    return torch.stack(new, dim=1), state


__all__ = [
    "block_phase",
    "check_sampling",
    "cut_points",
    "generate",
    "push",
    "sample_next",
    "stream_loss",
]
