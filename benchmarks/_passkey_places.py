"""A probe for benchmarks/passkey_variant.py (`--rows variant-positions`): the heads read of a
squeeze="fill" memory with every place at its own stream position, on rotary bases.

The heads read turns each query as if the whole memory sat just beyond the window (W^Q rotated
by Δ = W, `inftyformer.hf.head_read`): every place is read at one distance. Here, as in the
ceiling row `exact-positions` (`_passkey_exact.py`), query and key are rotated by their own
stream positions instead, the keys by where each place's run of tokens lies:

    S ≤ K tokens stored     place k holds token k                           p_k = k
    S > K                   places k < keep hold tokens k                   p_k = k
                            the others equal runs of r = (S − keep)/(K − keep) tokens
                                                        p_k = keep + (k − keep + ½) r − ½
    query j of the block    after S stored tokens and the window of W       S + W + j

A probe, not a library feature: it patches the model in place, and only for the layout of
passkey.py's rows (every row's stream starts together, blocks of C tokens after a window of W).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from _passkey_exact import _rotate
from torch import nn


def place_positions(stored: torch.Tensor, num_places: int, keep: int) -> torch.Tensor:
    """p_k of each place (module doc), float64 [batch, K] for S = `stored` [batch]."""
    S = stored.to(torch.float64)[:, None]  # [batch, 1]
    k = torch.arange(num_places, dtype=torch.float64, device=stored.device)  # [K]
    r = (S - keep) / (num_places - keep)
    merged = keep + (k - keep + 0.5) * r - 0.5
    return torch.where((S <= num_places) | (k < keep), k, merged)


class _RotatedQuery(nn.Module):
    """W^Q h, then each query turned on by S + j (W^Q already holds the window's Δ = W)."""

    def __init__(self, query: nn.Module, rotary, num_heads: int) -> None:
        super().__init__()
        self.query, self.rotary, self.num_heads = query, rotary, num_heads
        self.stored: torch.Tensor | None = None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        q = self.query(h)  # [b, Q, H·d]
        b, Q, _ = q.shape
        q = q.view(b, Q, self.num_heads, -1).transpose(1, 2)  # [b, H, Q, d]
        pos = self.stored.to(q.device, torch.float64)[:, None] + torch.arange(Q, device=q.device)
        return _rotate(q, self.rotary, pos).transpose(1, 2).reshape(b, Q, -1)


def read_at_place_positions(model) -> None:
    """Patch each memory layer of `model` (memory_read="heads", squeeze="fill") in place."""
    rotary = getattr(getattr(model.lm.base, "model", None), "rotary_emb", None)
    if rotary is None:
        raise ValueError("place positions need a base with rotary positions (Llama family)")
    for layer in model.lm.long_term:
        attention = layer.attention
        c = attention.config
        if c.squeeze != "fill" or c.density != "mixture" or len(c.widths) != 1:
            raise ValueError("place positions need squeeze='fill', density='mixture', one width")
        _patch(attention, rotary)


def _patch(attention, rotary) -> None:
    c = attention.config
    prepare, read_heads = attention.prepare, attention.read_heads
    query = _RotatedQuery(attention.query, rotary, c.num_heads)

    def positioned_prepare(state, dtype):
        prepared = prepare(state, dtype)
        pos = place_positions(state.stored, c.num_basis, c.keep_first)  # [b, K]
        return replace(prepared, keys=_rotate(prepared.keys, rotary, pos.to(torch.float32)))

    def positioned_read_heads(h, state, prepared=None):
        query.stored = state.stored
        return read_heads(h, state, positioned_prepare(state, h.dtype))

    attention.query = query
    attention.prepare = positioned_prepare
    attention.read_heads = positioned_read_heads


__all__ = ["place_positions", "read_at_place_positions"]
