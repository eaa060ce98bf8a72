"""Where the chosen blocks sit in a call's context (the `layout` seam, `config.py`). Every layout
packs what a call reads right before its first token, in the order [sink; chosen blocks;
window], each slot at P0 − (the valid slots from it on), so no position ever passes the base's
(`model.py`); a layout decides the order of the chosen blocks between the sink and the window.

    kind        order of the chosen blocks
    "stream"    as in the stream (the oldest first)
    "nearest"   by rising score, the best read last, right before the window (a block's
                neighbours right after it, as in the stream)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..core.seams import Strategy, register


@register
@dataclass(frozen=True)
class StreamLayout(Strategy):
    """The chosen blocks in stream order."""

    seam: ClassVar[str] = "layout"
    kind: ClassVar[str] = "stream"

    def arrange(self, order: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
        """The chosen blocks' indices [b, k] (in stream order) in the order they are read;
        `rank` [b, n] each block's rank (unused here)."""
        return order


@register
@dataclass(frozen=True)
class NearestLayout(Strategy):
    """The chosen blocks by rising rank: the best read last, nearest the window."""

    seam: ClassVar[str] = "layout"
    kind: ClassVar[str] = "nearest"

    def check(self, config: Any) -> None:
        if not config.choice.blocks:
            raise ValueError(
                f"layout 'nearest' orders the chosen blocks, and choice {config.choice.kind!r} "
                "chooses none"
            )

    def arrange(self, order: torch.Tensor, rank: torch.Tensor) -> torch.Tensor:
        rising = torch.gather(rank, 1, order).sort(dim=1, stable=True).indices
        return torch.gather(order, 1, rising)  # ties (a lead, its neighbours): stream order


__all__ = ["NearestLayout", "StreamLayout"]
