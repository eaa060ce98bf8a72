"""The short-term (Transformer-XL) memory: the m most recent inputs of a layer, detached
(Dai et al. 2019, §3.2).

Block semantics, shared by all four models
------------------------------------------
The stream of a batch row is cut into blocks of C = `segment_len` tokens, counted from its last
reset. States leave the short-term memory only in whole blocks: as soon as a row holds at least
m + C states, its oldest whole blocks leave. XL and the vanilla transformer drop them and the
compressive model compresses them at the end of the call; the ∞-former keeps them until the start
of the next call and fits them into its long-term memory there, inside that call's graph. For any
query both moments are the same.

A query sees the memory as it was at the start of its call plus the call's earlier tokens, as in
Transformer-XL. When no call crosses a block boundary (full segments from the start of a stream,
then a shorter tail, then single tokens...), that is the memory at the start of the query's
block plus the block's earlier tokens, however the block was split into calls. Two consequences:

* Token-by-token decoding (one token per call) builds each block's states with exactly the
  context a one-call forward of that block would use, so greedy generation with a carried state
  equals a from-scratch recomputation that feeds the same tokens in calls of C (`streaming.py`).
* When m is not a multiple of C, the memory at a block start holds m + ((−m) mod C) states.

Within a call, rows may be in different phases (after per-row resets), so lengths are per row
(right-aligned ragged tensors, see `ragged.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .. import ragged
from .._checks import check_positive_int
from ..ragged import RaggedState


@dataclass
class ShortTermState(RaggedState):
    """memory [batch, S, d]: the layer's recent inputs, detached, right-aligned;
    length [batch]: how many are valid in each row (0 after a reset)."""


class ShortTermMemory(nn.Module):
    """No parameters: decides what leaves the short-term memory and appends the new inputs."""

    def __init__(self, mem_len: int, block_len: int, unit: int = 1) -> None:
        super().__init__()
        check_positive_int("mem_len", mem_len, minimum=0)
        check_positive_int("block_len", block_len)
        check_positive_int("unit", unit)
        self.mem_len = mem_len  # m
        self.block_len = block_len  # C
        self.unit = unit  # what leaves is also a multiple of this (the compression rate c)

    def init_state(self, batch_size: int, dim: int, device=None, dtype=torch.float32):
        return ShortTermState.empty(batch_size, dim, device, dtype)

    def leaving_count(self, length: torch.Tensor) -> torch.Tensor:
        """How many of the oldest states leave each row at the start of a call [batch]: whole
        blocks of C beyond m, rounded down to a multiple of `unit` (the rest waits)."""
        excess = (length - self.mem_len).clamp(min=0)
        blocks = torch.div(excess, self.block_len, rounding_mode="floor") * self.block_len
        return torch.div(blocks, self.unit, rounding_mode="floor") * self.unit

    def flush(self, state: ShortTermState) -> tuple[ShortTermState, torch.Tensor, torch.Tensor]:
        """→ (remaining state, leaving [batch, F, d] left-aligned oldest first, count [batch])."""
        count = self.leaving_count(state.length)
        leaving, memory, length = ragged.split_oldest(state.memory, state.length, count)
        return ShortTermState(memory, length), leaving, count

    def append(self, state: ShortTermState, x: torch.Tensor) -> ShortTermState:
        """Add this call's layer inputs x [batch, L, d] (detached) after the memory."""
        x = x.detach()
        full = torch.full_like(state.length, x.shape[1])
        memory, length = ragged.concat(state.memory, state.length, x, full)
        return ShortTermState(memory, length)


__all__ = ["ShortTermMemory", "ShortTermState"]
