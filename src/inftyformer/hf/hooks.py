"""The forward hooks that put the long-term memory into a pretrained model's blocks (`model.py`,
step 2), and the call-scoped context they read.

    h_i = norm_i(x)                  the normalised attention input, recorded
                                     (`record_attention_input`)
    a_i = W_o Attn(h_i) + LTM_i(h_i) the continuous read added to the output projection's output
                                     (`add_long_term_read`; memory_read="heads": merged into
                                     the base's own heads instead, `head_read.py`)

Hooks and call-scoped context. The hooks hold no state: they are `functools.partial`s of a
module-level function and the block index. What they need for one call (the layers' long-term
states, the recorded h_i, the reads) lives in a `Call` object that `forward` puts in a
`contextvars.ContextVar` for the duration of the base model's forward and removes in a `finally`
(`active`). This is safe because (a) a ContextVar is private to its thread (and asyncio task), so
concurrent calls on other threads never see it; (b) nested calls restore the outer value on exit;
(c) a hook acts only when the active call lists the very module it is attached to, so the base
model called on its own (`model.base(...)`) or another model's modules run unchanged. Gradient
checkpointing would recompute the blocks outside the call, so it is refused.

This module does not import `model.py` (the model imports it).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from ..core.attention import HeadsRead, LongTermAttentionOutput
from ..core.density import PreparedMemory
from ..core.state import LongTermState
from .head_read import (
    WindowMass,
    add_token_mass,
    merge_into_heads,
    read_at_places,
    recording,
    stop_recording,
    value_bias,
)


@dataclass
class Call:
    owner: int  # the model whose hooks act in this call
    norms: list[nn.Module]  # per memory layer: the module whose output is h_i
    outputs: list[nn.Module]  # per memory layer: the attention output projection
    layers: nn.ModuleList  # per memory layer: LayerMemory
    long_term: list[LongTermState]  # per memory layer: the memory this call reads
    normed: list[torch.Tensor | None]  # per memory layer: h_i [batch, T, d]
    reads: list[LongTermAttentionOutput | HeadsRead | None]
    prepared: tuple[PreparedMemory, ...] | None = None  # per memory layer, unchanging memory
    # memory_read="heads": per memory layer the attention module, and log Z_W of this call
    attentions: list[nn.Module] | None = None
    window_mass: WindowMass | None = None
    # memory_positions="places": the base's position ids of this call's tokens [batch, T] (None:
    # past, past + 1, …), its rotary embedding and number of positions (head_read.read_at_places)
    positions: torch.Tensor | None = None
    past: int = 0
    rotary: nn.Module | None = None
    limit: int | None = None
    ranks: bool = False  # memory_positions="ranks": each place at its rank, not its stream position
    token_mass: bool = False  # the heads read's mass counts the tokens each place stands for


_OWNERS = itertools.count()
_ACTIVE: contextvars.ContextVar[Call | None] = contextvars.ContextVar(
    "inftyformer_hf_call", default=None
)


def new_owner() -> int:
    """A number of its own for each model: a base wrapped twice has only the calling model's
    hooks act."""
    return next(_OWNERS)


def record_attention_input(owner: int, index: int, module: nn.Module, args, output):
    call = _ACTIVE.get()
    if call is not None and call.owner == owner and call.norms[index] is module:
        call.normed[index] = output  # h_i = norm_i(x)  [batch, T, d]
    return None


def add_long_term_read(owner: int, index: int, module: nn.Module, args, output):
    call = _ACTIVE.get()
    if call is None or call.owner != owner or call.outputs[index] is not module:
        return None
    h = call.normed[index]
    if h is None:
        raise RuntimeError(
            f"block {index}: the attention output ran before its normalised input was seen; "
            "the architecture adapter names the wrong modules"
        )
    prepared = None if call.prepared is None else call.prepared[index]
    if call.attentions is not None:  # memory_read="heads": merged into the base's heads
        attention = call.attentions[index]
        read, state = call.layers[index].attention, call.long_term[index]
        if prepared is None:
            prepared = read.prepare(state, h.dtype)
        q = read.project_queries(h)  # each head's query  [batch, H, T, d]
        if call.rotary is not None:  # every place at its own position
            positions = call.positions
            if positions is None:
                positions = torch.arange(call.past, call.past + h.shape[1], device=h.device)
                positions = positions.expand(h.shape[0], -1)
            heads = read_at_places(
                read, q, state, prepared, positions, call.rotary, call.limit, ranks=call.ranks
            )
        else:
            heads = read(q, state, prepared=prepared, heads=True)
        if call.token_mass:  # each place read stands for S / (places read) tokens
            heads = add_token_mass(heads, state, prepared)
        call.reads[index] = heads
        bias = value_bias(attention, heads.z.shape[1])
        log_window = call.window_mass.log_mass[id(attention)]
        return merge_into_heads(output, args[0], heads, log_window, module, bias)
    read = call.layers[index].attention(h, call.long_term[index], prepared=prepared)
    call.reads[index] = read
    return output + read.context.to(output.dtype)  # W_o Attn(h) + LTM(h)


def attach(owner: int, norms: list[nn.Module], outputs: list[nn.Module]) -> list:
    """Register the two hooks on each memory block's modules; returns their handles."""
    handles = []
    for i, (norm, out) in enumerate(zip(norms, outputs, strict=True)):
        handles.append(
            norm.register_forward_hook(functools.partial(record_attention_input, owner, i))
        )
        handles.append(out.register_forward_hook(functools.partial(add_long_term_read, owner, i)))
    return handles


@contextlib.contextmanager
def active(call: Call) -> Iterator[Call]:
    """`call` is the active call (and, memory_read="heads", the window's attention mass is
    recorded) for the duration of the block."""
    token = _ACTIVE.set(call)
    mass = None if call.window_mass is None else recording(call.window_mass)
    try:
        yield call
    finally:
        if mass is not None:
            stop_recording(mass)
        _ACTIVE.reset(token)


__all__ = ["Call", "active", "add_long_term_read", "attach", "new_owner", "record_attention_input"]
