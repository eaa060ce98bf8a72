"""Generation with an `InftyformerForCausalLM` (`model.py`; its `generate`,
`prepare_reads` and `_expand_inputs_for_generation` call these).

Generation (`generate`): the memory is read-only. The waiting segment is fitted once before
generating; the first step runs the window before the prompt, the base's key/value cache keeps
both, and every step reads the same long-term memory, so greedy `generate` gives the tokens of
recomputing `model(prompt + tokens so far, state=m)` in one call at every step (the text
stays in the base's cache: past a segment, the reference is a model of longer segment_len). A
prompt longer than a segment goes into the memory first, all but its last part (1 … L tokens),
which generation continues. A call that continues a
non-empty cache writes nothing (its memory: the one it read, nothing waiting). Beam search and
`num_return_sequences` repeat each row's memory (window included) for its beams
(`repeat_interleave`); since all the beams of a row read the same, unchanging memory, reordering
beams needs nothing else.

This module does not import `model.py` (the model imports it): the model is passed in, and with
it HF's own `generate` / `_expand_inputs_for_generation` (the model's `super()`'s).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..core.density import PreparedMemory
from ..native.state import MemoryState, TokenWindow
from .validation import position_limit


def generate(
    model: nn.Module,
    base_generate: Callable,
    inputs: torch.Tensor | None = None,
    state=None,
    reset=None,
    **kwargs,
):
    """HF `generate` (`base_generate`) reading the memory `state`: see
    `InftyformerForCausalLM.generate`."""
    ids = inputs if inputs is not None else kwargs.pop("input_ids", None)
    if ids is None:
        raise ValueError("generate needs input_ids")
    ids = model._check_ids("input_ids", ids, allow_ignore=False)
    seg = model.config.adapter.segment_len
    cut = (ids.shape[1] - 1) // seg * seg
    head = ids[:, :cut]
    if cut:
        mask = kwargs.get("attention_mask")
        if mask is not None:
            if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != tuple(ids.shape):
                raise ValueError(
                    f"attention_mask must have the shape of input_ids {tuple(ids.shape)}"
                )
            kwargs["attention_mask"] = mask[:, cut:]
        with torch.no_grad():
            state = model(
                head,
                state=state,
                reset=reset,
                attention_mask=None if mask is None else mask[:, :cut],
                use_cache=False,
                logits_to_keep=1,  # only the state is wanted, not cut × vocabulary logits
            ).state
        reset, ids = None, ids[:, cut:]
        count_from_the_cut(model, kwargs, cut)
    if state is not None or reset is not None:
        state = model.consolidate(model.prepare_state(state, ids.shape[0], reset))
    if state is None:
        state = model.init_state(ids.shape[0])
    state = window_within_positions(model, state, ids.shape[1], kwargs)
    cache = model.prepare_reads(state)
    if kwargs.get("attention_mask") is None:  # ids without a mask are all tokens, no padding
        kwargs["attention_mask"] = torch.ones_like(ids)
    out = base_generate(ids, state=state, read_cache=cache, **kwargs)
    if not cut:
        return out
    sequences = out if isinstance(out, torch.Tensor) else out.sequences
    # beams / several sequences per prompt: each prompt's rows are together
    head = head.repeat_interleave(sequences.shape[0] // head.shape[0], dim=0)
    sequences = torch.cat([head.to(sequences.device), sequences], dim=1)
    if isinstance(out, torch.Tensor):
        return sequences
    out.sequences = sequences
    return out


def count_from_the_cut(model: nn.Module, options: dict, cut: int) -> None:
    """max_length / min_length (prompt + new tokens) counted from the part of the prompt
    generation continues, after `cut` tokens went into the memory."""
    config = options.get("generation_config") or model.generation_config
    if options.get("max_new_tokens", config.max_new_tokens) is None:
        high = options.get("max_length", config.max_length)
        if high is not None:
            options["max_length"] = high - cut
    if options.get("min_new_tokens", config.min_new_tokens) is None:
        low = options.get("min_length", config.min_length)
        if low:
            options["min_length"] = max(low - cut, 0)


def window_within_positions(
    model: nn.Module, state: MemoryState, prompt: int, options
) -> MemoryState:
    """The state with its window shortened (oldest tokens first) so that the window, the
    prompt and the new tokens fit the base's positions."""
    window, limit = state.window, position_limit(model.config)
    if window is None or limit is None or not window.tokens.shape[1]:
        return state
    config = options.get("generation_config") or model.generation_config
    new = options.get("max_new_tokens", config.max_new_tokens)
    if new is None:
        new = options.get("max_length", config.max_length) - prompt
    room = max(limit - prompt - int(new), 0)
    if window.tokens.shape[1] <= room:
        return state
    width = window.tokens.shape[1]
    short = TokenWindow(
        window.tokens[:, width - room :],
        window.length.clamp(max=room),
        window.surprisal[:, width - room :],
        window.salience[:, width - room :],
    )
    return MemoryState(state.layers, short, state.source, state.salience, state.memory)


@torch.no_grad()
def prepare_reads(model: nn.Module, state: MemoryState) -> tuple[PreparedMemory, ...]:
    """Each layer's `LongTermAttention.prepare` of a state with nothing waiting (what
    `generate` reads at every step): V = B W^V and the folded keys, computed once instead
    of per generated token."""
    if any(bool((layer.short_term.length > 0).any()) for layer in state.layers):
        raise ValueError("prepare_reads needs a consolidated state (nothing waiting)")
    dtype = model._param().dtype
    return tuple(
        layer.attention.prepare(part.long_term, dtype)
        for layer, part in zip(model.long_term, state.layers, strict=True)
    )


def expand_inputs(
    base_expand: Callable, expand_size: int, is_encoder_decoder: bool, input_ids, kwargs: dict
):
    """Beams and multiple return sequences (HF's `_expand_inputs_for_generation`,
    `base_expand`): each row's state is repeated for its copies."""
    state = kwargs.pop("state", None)
    cache = kwargs.pop("read_cache", None)
    input_ids, kwargs = base_expand(expand_size, is_encoder_decoder, input_ids, **kwargs)
    if state is not None:
        kwargs["state"] = state.repeat_rows(expand_size)
    if cache is not None:
        kwargs["read_cache"] = tuple(p.repeat_interleave(expand_size) for p in cache)
    return input_ids, kwargs


__all__ = [
    "count_from_the_cut",
    "expand_inputs",
    "generate",
    "prepare_reads",
    "window_within_positions",
]
