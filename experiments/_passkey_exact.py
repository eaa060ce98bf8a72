"""Row `exact` of experiments/passkey.py: the ceiling of the heads read. Every memory block's heads
read the exact states its memory was given — a cache that grows with the stream, one place per
token — instead of the continuous signal of N basis functions:

    s_j = q · x_j W_k / √d,   z = Σ_j softmax(s)_j x_j W_v,   log-mass log Σ_j exp(s_j)

with the same query (rotated to just beyond the window), projections and merge by mass as the
heads read (`inftyformer.hf.head_read`). It is not a memory of fixed size and not the ∞-former:
it separates what the heads read can do from what the signal loses (the fit, the squeeze).
With `positions=True` (row `exact-positions`, rotary bases) every stored state keeps its stream
position instead: query and key rotated by their own positions, as in the base's attention.
Only for streams that start together (every batch row's memory empty at the same step) and
read in blocks of C tokens after a window of W (the layout of passkey.py's rows)."""

from __future__ import annotations

import math

import torch

from inftyformer.core.attention import HeadsRead
from inftyformer.hf.head_read import turn


def read_exact_states(model, positions: bool = False) -> None:
    """Patch each memory layer of `model` (memory_read="heads") in place, as described above."""
    lm = model.lm
    rotary, window = None, model.config.window or 0
    if positions:
        rotary = getattr(getattr(lm.base, "model", None), "rotary_emb", None)
        if rotary is None:
            raise ValueError("exact-positions needs a base with rotary positions (Llama family)")
    for layer in lm.long_term:
        _patch(layer, rotary, window)


def _patch(layer, rotary, window: int) -> None:
    memory, attention = layer.memory, layer.attention
    update, store = memory._update, {}  # the update the model calls (unchecked)

    def exact_update(state, x, generator, salience=None):
        empty = state.empty
        if bool(empty.all()):
            store["x"] = x.detach()  # [batch, L, e]
        elif bool(empty.any()):
            raise ValueError("the exact row needs streams that start together")
        else:
            store["x"] = torch.cat([store["x"], x.detach()], dim=1)  # [batch, P, e]
        return update(state, x, generator, salience)

    def exact_heads(q, state, prepared=None):
        b, H, num_q, d = q.shape  # each head's query, W^Q h (`LongTermAttention.read_heads`)
        if "x" not in store or bool(state.empty.all()):
            zeros = q.new_zeros(b, H, num_q)
            return HeadsRead(z=q.new_zeros(b, H, num_q, d), log_mass=zeros - math.inf,
                             mu=zeros, sigma_sq=zeros + 1.0, kl=q.new_zeros(()))  # fmt: skip
        x = store["x"]
        P = x.shape[1]
        k = attention.key(x).view(b, P, H, d).transpose(1, 2)  # [b, H, P, d]
        v = attention.value(x).view(b, P, H, d).transpose(1, 2)
        if rotary is not None:  # q = R_W W_q h: turn it on to its own stream position P + j
            # (query j of the run [window; block], the window's first token at stream index P)
            q = turn(q, rotary, torch.arange(P - window, P - window + num_q)[None])
            k = turn(k, rotary, torch.arange(P)[None])  # each state at its own position
        s = q @ k.transpose(-1, -2) / math.sqrt(d)  # [b, H, Q, P]
        p = torch.softmax(s, dim=-1)
        t = (torch.arange(P, dtype=s.dtype) + 0.5) / P  # the tokens' places in [0, 1]
        mu = p @ t
        sigma_sq = (p * (t - mu.unsqueeze(-1)).square()).sum(-1)
        return HeadsRead(z=p @ v, log_mass=torch.logsumexp(s, dim=-1), mu=mu,
                         sigma_sq=sigma_sq, kl=q.new_zeros(()))  # fmt: skip

    memory._update = exact_update
    attention.read_heads = exact_heads


__all__ = ["read_exact_states"]
