"""The Compressive Transformer's compressed memory (Rae et al. 2020).

States leaving the short-term memory are compressed c:1 by a per-layer Conv1d with
kernel = stride = c and appended to at most n_cm compressed slots (the oldest are dropped). The
layer then attends over [compressed ; short-term ; segment].

Leftovers: states leave the short-term memory only in whole blocks (see `short_term_memory.py`)
and, for this model, only in multiples of c; whatever is not a multiple of c stays in the
short-term memory (still attended, uncompressed) until a whole chunk of c can leave. Nothing is
padded and nothing is lost.

Training (Rae et al. §3.2): the compression network is trained ONLY by the attention-
reconstruction loss

    L_attn = ‖ attn(h, old) − attn(h, f_c(old)) ‖²                               (Rae eq. 1)

where attn is the layer's content attention with all its parameters detached, h the segment's
(detached) layer inputs and old the (detached) states being compressed. The compressed slots are
detached everywhere else: the language-model loss does not reach the Conv1d.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .. import ragged
from .._checks import check_positive_int
from ..ragged import RaggedState


@dataclass
class CompressiveState(RaggedState):
    """memory [batch, S ≤ n_cm, d]: compressed slots (detached), right-aligned, oldest first;
    length [batch]: how many are valid in each row."""


class CompressiveMemory(nn.Module):
    def __init__(self, dim: int, rate: int, capacity: int) -> None:
        super().__init__()
        check_positive_int("dim", dim)
        check_positive_int("rate", rate)
        check_positive_int("capacity", capacity)
        self.rate = rate  # c
        self.capacity = capacity  # n_cm
        self.compress_conv = nn.Conv1d(dim, dim, kernel_size=rate, stride=rate)  # f_c

    def init_state(self, batch_size: int, dim: int, device=None, dtype=torch.float32):
        return CompressiveState.empty(batch_size, dim, device, dtype)

    def compress(self, old: torch.Tensor, count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """old [batch, F, d] left-aligned (count[b] valid, multiples of c; F a multiple of c)
        → (f_c(old) [batch, F / c, d] left-aligned, count / c)."""
        compressed = self.compress_conv(old.transpose(1, 2)).transpose(1, 2)  # [batch, F/c, d]
        return compressed, torch.div(count, self.rate, rounding_mode="floor")

    def append(
        self, state: CompressiveState, compressed: torch.Tensor, count: torch.Tensor
    ) -> CompressiveState:
        """Add new slots (left-aligned, detached here) after the old ones; keep the newest n_cm."""
        memory, length = ragged.concat(
            state.memory,
            state.length,
            compressed.detach(),
            count,
            newer_left_aligned=True,
            max_length=self.capacity,
        )
        return CompressiveState(memory, length)

    @staticmethod
    def reconstruction_loss(
        attend,
        h: torch.Tensor,
        old: torch.Tensor,
        old_count: torch.Tensor,
        compressed: torch.Tensor,
        compressed_count: torch.Tensor,
    ) -> torch.Tensor:
        """Mean squared error between attend(h, old) and attend(h, compressed) over the rows that
        compressed something (scalar; 0 when none did).

        attend(h, keys, key_valid) → [batch, L, d] must detach every parameter but f_c's;
        old [batch, F, d] and compressed [batch, F/c, d] left-aligned with their counts."""
        rows = old_count > 0  # [batch]
        if not bool(rows.any()):
            return compressed.sum() * 0.0
        h, old = h.detach(), old.detach()
        F_old, F_new = old.shape[1], compressed.shape[1]
        # left-aligned valid prefixes; empty rows get one (ignored) key so softmax stays finite
        old_valid = torch.arange(F_old, device=h.device)[None] < old_count.clamp(min=1)[:, None]
        new_valid = (
            torch.arange(F_new, device=h.device)[None] < compressed_count.clamp(min=1)[:, None]
        )
        target = attend(h, old, old_valid)  # attn(h, old)  [batch, L, d]
        estimate = attend(h, compressed, new_valid)  # attn(h, f_c(old))  [batch, L, d]
        weight = rows.to(h.dtype)[:, None, None]  # [batch, 1, 1]
        squared = (estimate - target).pow(2) * weight
        return squared.sum() / (weight.sum() * target.shape[1] * target.shape[2])


__all__ = ["CompressiveMemory", "CompressiveState"]
