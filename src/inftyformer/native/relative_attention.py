"""Transformer-XL relative positional attention (Dai et al. 2019, §3.3).

Queries come from the segment, keys and values from [memory ; segment]. With E the inputs,
R the sinusoidal encoding of a distance and u, v learned biases, the score of query i and key j is

    A_ij = (W_q E_i + u)ᵀ W_k E_j   +   (W_q E_i + v)ᵀ W_r R_{i−j}           (XL eq. for A^rel)
           (a) content + (c) global content bias   (b) position + (d) global position bias

The position term is computed once for every distance and moved into place with the "relative
shift" (pad, reshape, drop: no gather, no [L, K, d] tensor). Keys are masked causally and where
the memory is padding (per-row ragged memories, see `ragged.py`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .. import ragged
from .._init import init_projection


def sinusoidal_encoding(
    length: int, dim: int, device=None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """R [length, dim] for the distances length−1, …, 1, 0 (descending, as XL):
    R_{k, 2i} = sin(k / 10000^{2i/dim}), R_{k, dim/2 + i} = cos(…)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    distance = torch.arange(length - 1, -1, -1, device=device, dtype=torch.float32)
    angle = distance[:, None] * inv_freq[None, :]  # [length, dim / 2]
    return torch.cat([angle.sin(), angle.cos()], dim=-1).to(dtype)


def relative_shift(x: torch.Tensor) -> torch.Tensor:
    """x [..., L, K] indexed by (query i, encoding row r = distance K−1−r) →
    out [..., L, K] indexed by (query i, key j) with out[i, j] = x[i, j + L − 1 − i]: the
    distance between query i (absolute index K − L + i) and key j. Entries with j > K − L + i
    (future keys) are meaningless and must be masked."""
    *lead, L, K = x.shape
    padded = F.pad(x, (1, 0))  # [..., L, K + 1]
    padded = padded.reshape(*lead, K + 1, L)
    return padded[..., 1:, :].reshape(*lead, L, K)


class RelativeMultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.query = nn.Linear(d_model, d_model, bias=False)  # W_q
        self.key = nn.Linear(d_model, d_model, bias=False)  # W_k (content keys)
        self.value = nn.Linear(d_model, d_model, bias=False)  # W_v
        self.position = nn.Linear(d_model, d_model, bias=False)  # W_r (position keys)
        self.u = nn.Parameter(torch.zeros(n_heads, self.head_dim))  # global content bias
        self.v = nn.Parameter(torch.zeros(n_heads, self.head_dim))  # global position bias
        self.out = nn.Linear(d_model, d_model, bias=False)  # W_o
        self.dropout = dropout

    def reset_projections(self, std: float) -> None:
        """W_q, W_k, W_v, W_r, W_o ~ N(0, std²); the biases u, v are drawn by
        `reset_position_biases`."""
        for projection in (self.query, self.key, self.value, self.position, self.out):
            init_projection(projection, std)

    def reset_position_biases(self, std: float) -> None:
        """u, v ~ N(0, std²)."""
        nn.init.normal_(self.u, std=std)
        nn.init.normal_(self.v, std=std)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, T, d_model] → [batch, heads, T, head_dim]"""
        return x.view(x.shape[0], x.shape[1], self.n_heads, self.head_dim).transpose(1, 2)

    def _merge(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, heads, T, head_dim] → [batch, T, d_model]"""
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], self.d_model)

    def forward(
        self, h: torch.Tensor, memory: torch.Tensor, memory_length: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """h [batch, L, d] (normalised segment), memory [batch, W, d] (normalised, right-aligned
        with `memory_length` [batch] valid). Returns (output [batch, L, d] after W_o,
        projected queries W_q h [batch, L, d] — reused by the long-term attention)."""
        batch, L, _ = h.shape
        W = memory.shape[1]
        K = W + L
        q_proj = self.query(h)  # W_q E  [batch, L, d]
        kv_in = torch.cat([memory, h], dim=1) if W else h  # [batch, K, d]
        q = self._heads(q_proj)  # [batch, H, L, d_h]
        k = self._heads(self.key(kv_in))  # [batch, H, K, d_h]
        v = self._heads(self.value(kv_in))  # [batch, H, K, d_h]
        R = sinusoidal_encoding(K, self.d_model, h.device, h.dtype)  # [K, d]
        r = self.position(R).view(K, self.n_heads, self.head_dim).transpose(0, 1)  # [H, K, d_h]

        scale = 1.0 / math.sqrt(self.head_dim)
        # (b) + (d): (W_q E_i + v)ᵀ W_r R / √d_h, one column per distance, shifted into place
        position_scores = relative_shift(
            torch.matmul((q + self.v[:, None]) * scale, r.transpose(-1, -2))
        )  # [batch, H, L, K]
        # mask: causal over [memory ; segment] and padding inside the ragged memory
        query_index = torch.arange(L, device=h.device)[:, None] + W  # absolute index [L, 1]
        key_index = torch.arange(K, device=h.device)[None, :]  # [1, K]
        allowed = (key_index <= query_index)[None]  # [1, L, K]
        if W and not bool((memory_length == W).all()):
            key_valid = torch.cat(
                [ragged.valid_mask(memory_length, W), memory_length.new_ones(batch, L).bool()], 1
            )  # [batch, K]
            allowed = allowed & key_valid[:, None, :]  # [batch, L, K]
        bias = position_scores.masked_fill_(~allowed[:, None], float("-inf"))
        # (a) + (c): softmax((q + u)ᵀ k / √d_h + bias) v, fused                [batch, H, L, d_h]
        z = F.scaled_dot_product_attention(
            q + self.u[:, None],
            k,
            v,
            attn_mask=bias,
            dropout_p=self.dropout if self.training else 0.0,
            scale=scale,
        )
        return self.out(self._merge(z)), q_proj

    def content_attention(
        self, h: torch.Tensor, keys: torch.Tensor, key_valid: torch.Tensor
    ) -> torch.Tensor:
        """Content-only attention with every parameter of this layer detached (for the
        Compressive Transformer's attention-reconstruction loss): softmax(q kᵀ/√d_h) v with
        q = W_q h, k = W_k keys, v = W_v keys. h [batch, L, d], keys [batch, S, d],
        key_valid [batch, S] bool (every row needs a valid key). → [batch, L, d]."""
        q = self._heads(F.linear(h, self.query.weight.detach()))  # [batch, H, L, d_h]
        k = self._heads(F.linear(keys, self.key.weight.detach()))  # [batch, H, S, d_h]
        v = self._heads(F.linear(keys, self.value.weight.detach()))  # [batch, H, S, d_h]
        mask = key_valid[:, None, None, :]  # [batch, 1, 1, S]
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self._merge(z)


__all__ = ["RelativeMultiHeadAttention", "relative_shift", "sinusoidal_encoding"]
