"""Right-aligned ragged batches: how every memory stores a different number of valid states
per batch row without Python loops over rows.

A memory tensor `memory [batch, width, d]` comes with `length [batch]`: row b's valid states are
the LAST `length[b]` positions, oldest first; the positions before them are padding (zeros) that
attention masks out. Right alignment keeps the newest state of every row next to the segment, so
relative distances between a query and a valid key are the same as in a fresh, unpadded stream:
a row whose document just ended (length 0) behaves exactly like a new stream.

The width of a memory tensor is kept at `max(length)`, so a batch whose rows are all in the same
phase carries no padding at all and takes the fast paths below.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._checks import STATE_MAGNITUDE, ValueChecks, check_dtype, check_floating, check_shape


@dataclass
class RaggedState:
    """memory [batch, S, d] right-aligned, length [batch] int64 (valid states per row)."""

    memory: torch.Tensor
    length: torch.Tensor

    def __post_init__(self) -> None:
        for name in ("memory", "length"):
            value = getattr(self, name)
            if not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"{type(self).__name__}.{name} must be a torch.Tensor, got "
                    f"{type(value).__name__}"
                )

    @property
    def batch_size(self) -> int:
        return self.memory.shape[0]

    def detach(self):
        return type(self)(self.memory.detach(), self.length.detach())

    def to(self, device: torch.device | str):
        return type(self)(self.memory.to(device), self.length.to(device))

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"memory": self.memory, "length": self.length}

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]):
        missing = [k for k in ("memory", "length") if k not in tensors]
        if missing:
            raise ValueError(f"{cls.__name__} is missing tensors {missing}")
        return cls(tensors["memory"], tensors["length"])

    @classmethod
    def empty(cls, batch_size: int, dim: int, device=None, dtype=torch.float32):
        return cls(
            torch.zeros(batch_size, 0, dim, device=device, dtype=dtype),
            torch.zeros(batch_size, dtype=torch.long, device=device),
        )

    def reset(self, rows: torch.Tensor):
        """Forget everything in the rows flagged by the bool mask `rows` [batch]."""
        rows = rows.to(self.memory.device)
        keep = (~rows).to(self.memory.dtype)[:, None, None]
        return type(self)(self.memory * keep, torch.where(rows, 0, self.length))

    def check(
        self,
        name: str,
        batch: int,
        dim: int,
        max_width: int,
        dtypes: tuple[torch.dtype, ...] | None = None,
        values: ValueChecks | None = None,
    ) -> None:
        """Shapes, dtypes (memory floating, one of `dtypes` when given; length int64), one
        device, at most `max_width` states; then, in `values` (read by the caller with one
        synchronisation) or here, lengths in [0, width] and finite memory."""
        check_shape(f"{name}.memory", self.memory, (batch, None, dim))
        check_shape(f"{name}.length", self.length, (batch,))
        check_floating(f"{name}.memory", self.memory)
        if dtypes is not None:
            check_dtype(f"{name}.memory", self.memory, *dtypes)
        check_dtype(f"{name}.length", self.length, torch.long)
        if self.length.device != self.memory.device:
            raise ValueError(
                f"{name}.length is on {self.length.device}, {name}.memory on "
                f"{self.memory.device}: a state lives on one device"
            )
        width = self.memory.shape[1]
        if width > max_width:
            raise ValueError(
                f"{name}.memory holds {width} states, more than the {max_width} a state of this "
                "model can hold (was it made by a model with another memory configuration?)"
            )
        own = values is None
        values = ValueChecks() if own else values
        values.require(
            (self.length >= 0) & (self.length <= width),
            f"{name}.length must be in [0, {width}] (the memory's width)",
        )
        values.bounded(f"{name}.memory", self.memory, STATE_MAGNITUDE)
        if own:
            values.run()


def valid_mask(length: torch.Tensor, width: int) -> torch.Tensor:
    """[batch, width] bool: True at the last `length[b]` positions of row b."""
    positions = torch.arange(width, device=length.device)  # [width]
    return positions[None, :] >= (width - length)[:, None]


def concat(
    older: torch.Tensor,
    older_length: torch.Tensor,
    newer: torch.Tensor,
    newer_length: torch.Tensor,
    *,
    newer_left_aligned: bool = False,
    max_length: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Append `newer` after `older`, row by row, and keep at most `max_length` (the newest).

    older [batch, Sa, d] right-aligned; newer [batch, Sb, d] right-aligned, or left-aligned
    (valid prefix) when `newer_left_aligned`. Returns (right-aligned [batch, W, d], length [batch])
    with W = max(length).
    """
    batch, Sa, d = older.shape
    Sb = newer.shape[1]
    length = older_length + newer_length
    if max_length is not None:
        length = length.clamp(max=max_length)
    W = int(length.max()) if batch else 0
    dense = bool((older_length == Sa).all()) and bool((newer_length == Sb).all())
    if dense:  # every row full: a plain concatenation
        return torch.cat([older, newer], dim=1)[:, Sa + Sb - W :], length
    r = (W - 1 - torch.arange(W, device=older.device))[None, :]  # distance from the end [1, W]
    nb = newer_length[:, None]
    from_newer = r < nb  # [batch, W]
    newer_index = (nb - 1 - r) if newer_left_aligned else (Sb - 1 - r)
    older_index = Sa - 1 - (r - nb)
    index = torch.where(from_newer, Sa + newer_index, older_index)
    index = torch.where(r < length[:, None], index, Sa + Sb)  # padding → the zero row
    source = torch.cat([older, newer, older.new_zeros(batch, 1, d)], dim=1)  # [batch, Sa+Sb+1, d]
    out = torch.gather(source, 1, index[..., None].expand(batch, W, d))
    return out, length


def split_oldest(
    memory: torch.Tensor, length: torch.Tensor, count: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Take the oldest `count[b]` valid states out of each row.

    memory [batch, S, d] right-aligned with `length`. Returns (taken [batch, F, d] left-aligned,
    zero-padded, F = max(count); remaining [batch, W, d] right-aligned; remaining_length)."""
    batch, S, d = memory.shape
    remaining_length = length - count
    F = int(count.max()) if batch else 0
    W = int(remaining_length.max()) if batch else 0
    if bool((length == S).all()) and bool((count == F).all()):  # every row alike
        return memory[:, :F], memory[:, S - W :], remaining_length
    j = torch.arange(F, device=memory.device)[None, :]  # [1, F]
    index = ((S - length)[:, None] + j).clamp(max=max(S - 1, 0))  # oldest valid first
    taken = torch.gather(memory, 1, index[..., None].expand(batch, F, d))
    taken = taken * (j < count[:, None])[..., None].to(memory.dtype)
    remaining = memory[:, S - W :] * valid_mask(remaining_length, W)[..., None].to(memory.dtype)
    return taken, remaining, remaining_length


__all__ = ["RaggedState", "concat", "split_oldest", "valid_mask"]
