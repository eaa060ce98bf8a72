"""Single-token calls of a retrieval memory (`retrieval.py`) without rebuilding the context.

A call reads its context packed right before its first token's position P0: the slot j at
P0 − (the valid slots from j on). Rotary attention scores depend only on the distance between
a query and a key, so a run of one-token calls can keep the context turned once, at the first
call's layout, and move the queries instead: the i-th call of the run puts its token at P0 + i
and finds the run's earlier tokens, turned when they came, at P0 … P0 + i − 1. Every distance is
the one the packed layout gives (a window that grew by i tokens pushes each older slot i further
back), so the scores are those of rebuilding the context each call (to float rounding).

A run ends, and the next call starts another, when that stops being true:
  - a block left the window, the sink filled or a block was stored (the state's counters
    differ from those the run started from, plus its tokens),
  - the blocks a layer reads changed which of its slots are valid (a row with fewer stored
    blocks than it may read); a change of which blocks only re-reads and turns those slots,
  - the run reached `segment_len` tokens (no position passes P0 + segment_len − 1),
  - another state already extended the run from this point (a state read twice, e.g. two
    continuations of one prompt: the buffers are shared, so the second starts a new run).
The cache is derived data: dropping it (`RetrievalState.select_rows`, a longer call) only costs
one rebuild; a reset row ends the run through its counters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .state import turn


@dataclass
class _Layer:
    k: torch.Tensor  # the context in the run's layout, then its tokens  [b, Hkv, P0 + n, d]
    v: torch.Tensor
    mask: torch.Tensor | None  # [b, 1, 1, P0 + n] bool, None: every slot valid
    reads: bool  # the layer reads stored blocks
    ids: torch.Tensor | None  # [b, k] the blocks its slots hold
    chosen: torch.Tensor | None  # [b, k] which of them are valid
    cos: torch.Tensor | None  # the block slots' angles in the run's layout  [b, R, d]
    sin: torch.Tensor | None


@dataclass
class DecodeRun:
    """A run of single-token calls (module doc) over one batch of states."""

    start: dict[str, torch.Tensor]  # the state's counters when the run began
    capacity: int  # tokens the run may hold
    used: int = 0  # tokens written so far (by whichever state extended it last)
    stale: bool = False  # a layer fell back to a rebuilt context: the next call starts anew
    layers: dict[int, _Layer] = field(default_factory=dict)
    masks: dict = field(default_factory=dict)  # id(valid) → (valid, its mask buffer)
    window: tuple[torch.Tensor, torch.Tensor] | None = None  # [L, b, Hkv, Wc + capacity, d]

    @staticmethod
    def counters(state) -> dict[str, torch.Tensor]:
        return {
            "window_len": state.window_len,
            "sink_len": state.sink_len,
            "blocks": state.blocks,
        }

    def continues(self, state, at: int) -> bool:
        """Whether `state`, `at` tokens into this run, may extend it with one more token."""
        if self.stale or at != self.used or at >= self.capacity:
            return False
        now = self.counters(state)
        if now["window_len"].shape != self.start["window_len"].shape:
            return False
        return (
            torch.equal(now["window_len"], self.start["window_len"] + at)
            and torch.equal(now["sink_len"], self.start["sink_len"])
            and torch.equal(now["blocks"], self.start["blocks"])
        )

    def moved_window(self, state, new_k, new_v, at: int):
        """The window after the run's token `at` joined it, no block leaving: views
        [L, b, Hkv, Wc, d] of one buffer the run's tokens are written into in place, instead
        of a copy of the whole window per token. A state's view ends before any slot a later
        token writes, so the states of a run stay as they were."""
        Wc = state.window_k.shape[3]
        if self.window is None:  # the run's first token: the window copied once
            L, b, H, _, d = state.window_k.shape
            shape = (L, b, H, Wc + self.capacity, d)
            self.window = tuple(x.new_empty(shape) for x in (state.window_k, state.window_v))
            self.window[0][:, :, :, :Wc] = state.window_k
            self.window[1][:, :, :, :Wc] = state.window_v
        k, v = self.window
        k[:, :, :, Wc + at] = new_k[:, :, :, 0].to(k.dtype)
        v[:, :, :, Wc + at] = new_v[:, :, :, 0].to(v.dtype)
        return k[:, :, :, at + 1 : at + 1 + Wc], v[:, :, :, at + 1 : at + 1 + Wc]

    def attend(self, call, layer: int, query, key, value, scaling):
        """The layer's attention for the call's one token at P0 + i (i = `call.at`), or None
        when the layer cannot read the run's layout (the caller rebuilds its context)."""
        model, i = call.model, call.at
        P0 = model.config.context
        entry = self.layers.get(layer)
        if entry is None:
            if i:  # a layer that joins a run late: it has no layout of the run's start
                self.stale = True
                return None
            entry = self.layers[layer] = self._build(call, layer, query)
        else:
            ids, chosen, reads = model.choice(call, layer, query)
            if reads != entry.reads or (reads and not torch.equal(chosen, entry.chosen)):
                self.stale = True  # other slots valid: another layout
                return None
            if reads and not torch.equal(ids, entry.ids):  # other blocks, same slots
                k, v = model.read_blocks(call.state, layer, ids)
                S = model.config.sink_blocks * model.config.block_size
                R = k.shape[2]
                entry.k[:, :, S : S + R] = turn(k.to(entry.k.dtype), entry.cos, entry.sin)
                entry.v[:, :, S : S + R] = v.to(entry.v.dtype)
                entry.ids = ids
        entry.k[:, :, P0 + i] = key[:, :, 0].to(entry.k.dtype)  # turned at P0 + i by the base
        entry.v[:, :, P0 + i] = value[:, :, 0].to(entry.v.dtype)
        n = P0 + i + 1
        mask = None if entry.mask is None else entry.mask[..., :n]
        out = F.scaled_dot_product_attention(
            query,
            entry.k[:, :, :n].to(query.dtype),
            entry.v[:, :, :n].to(query.dtype),
            attn_mask=mask,
            scale=scaling,
            enable_gqa=query.shape[1] != key.shape[1],
        )
        return out.transpose(1, 2).contiguous()

    def _build(self, call, layer: int, query) -> _Layer:
        """The layer's context turned to the run's layout (the first call's), with room for
        the run's tokens."""
        model = call.model
        c = model.config
        P0 = c.context
        ctx_k, ctx_v, valid = model.context(call, layer, query)  # [b, Hkv, P0, d], [b, P0]
        cos, sin = model.layout_angles(ctx_k, valid, 0)  # [b, P0, d]
        b, H, _, d = ctx_k.shape
        k = ctx_k.new_empty(b, H, P0 + self.capacity, d)
        v = ctx_v.new_empty(b, H, P0 + self.capacity, d)
        k[:, :, :P0] = turn(ctx_k, cos, sin)
        v[:, :, :P0] = ctx_v
        ids, chosen, reads = model.choice(call, layer, query, choose=False)
        S, R = c.sink_blocks * c.block_size, c.blocks * c.block_size
        got = self.masks.get(id(valid))
        if got is None:
            mask = None
            if not bool(valid.all()):
                mask = torch.ones(b, 1, 1, P0 + self.capacity, dtype=torch.bool, device=k.device)
                mask[:, 0, 0, :P0] = valid
            got = self.masks[id(valid)] = (valid, mask)  # valid kept: its id stays
        return _Layer(k, v, got[1], reads, ids, chosen, cos[:, S : S + R], sin[:, S : S + R])


__all__ = ["DecodeRun"]
