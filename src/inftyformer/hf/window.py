"""The short-term window of a pretrained model with long-term memory (`model.py`, step 0;
`docs/hf.md`): each call recomputes the previous W tokens of its stream before its own, as
context whose logits are not returned, so every position sees at least one segment of real text
(the paper's short-term memory, §3) while the long-term memory holds what left the window.

    WindowedInputs.build   the ids, mask and positions the base runs on in one call
    WindowedInputs.advance which positions left the window (their inputs wait for the long-term
                           memory) and the window for the next call
    pack                   flagged positions of a batch, right-aligned per row (ragged layout,
                           `ragged.py`)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..native.state import TokenWindow
from ..ragged import valid_mask


def pack(x: torch.Tensor, keep: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions of x [batch, S, ...] flagged by keep [batch, S] (None: all), right-aligned
    per row, oldest first, zeros before them: (packed [batch, max count, ...], count [batch])."""
    batch, length = x.shape[:2]
    if keep is None:
        return x, torch.full((batch,), length, dtype=torch.long, device=x.device)
    count = keep.sum(1)
    if bool((keep == keep[:1]).all()):  # every row keeps the same positions: one selection
        return x[:, keep[0].nonzero().squeeze(1)], count
    # flagged positions last, in their order (stable sort of 0/1)
    order = torch.sort(keep.to(torch.int8), dim=1, stable=True).indices  # [batch, S]
    index = order.view(batch, length, *([1] * (x.dim() - 2))).expand_as(x)
    width = int(count.max())
    packed = torch.gather(x, 1, index)[:, length - width :]
    flags = valid_mask(count, width).view(batch, width, *([1] * (x.dim() - 2)))
    return packed * flags.to(x.dtype), count


@dataclass
class WindowedInputs:
    """What the base model runs on in one call: the window's tokens (`context` of them, the
    previous text, right-aligned, padded where a row holds fewer) before this call's, with the
    validity mask and positions counted over the valid tokens from 0 (`position_ids`, when
    given as generation does, count from the first token after the window)."""

    ids: torch.Tensor  # [batch, context + T]
    attention_mask: torch.Tensor | None
    position_ids: torch.Tensor | None
    context: int  # window positions before this call's tokens (0: none run in this call)
    valid: torch.Tensor | None  # [batch, context + T] bool, None: all valid

    @classmethod
    def build(cls, window, ids, valid, attention_mask, position_ids, past, limit):
        held = 0 if window is None else int(window.length.max())
        if not held:  # no window: the call's own inputs, as given
            return cls(ids, attention_mask, position_ids, 0, valid)
        batch, length = ids.shape
        before = valid_mask(window.length, held)  # [batch, held]
        if past:  # continuing a cache that holds the window, then earlier tokens of this text
            if attention_mask is None:
                mask = torch.ones(batch, past - held + length, dtype=torch.bool, device=ids.device)
            else:
                mask = attention_mask.to(ids.device) != 0
            full = torch.cat([before, mask], dim=1)
            if full.shape[1] != past + length:
                raise ValueError(
                    f"attention_mask must cover the {past - held} cached tokens after the window "
                    f"and this call's {length}, got {mask.shape[1]} columns"
                )
            context, run_ids = 0, ids
        else:
            current = torch.ones_like(ids, dtype=torch.bool) if valid is None else valid
            full = torch.cat([before, current], dim=1)
            context = held
            run_ids = torch.cat([window.tokens[:, window.tokens.shape[1] - held :], ids], dim=1)
        if limit is not None and full.shape[1] > limit:
            raise ValueError(
                f"the window's {held} tokens and this call's would take {full.shape[1]} "
                f"positions, more than the base's {limit} (max_position_embeddings): shorten "
                "the call or the window"
            )
        positions = (full.long().cumsum(1) - 1).clamp(min=0)[:, -run_ids.shape[1] :]
        if position_ids is not None:  # given from the first token after the window
            own = position_ids.to(ids.device)[:, -length:] + window.length[:, None]
            positions = torch.cat([positions[:, :context], own.expand(batch, -1)], dim=1)
        if bool(full.all()):  # no padding anywhere: no mask, as for the base on plain text
            return cls(run_ids, None, positions, context, None)
        return cls(run_ids, full.long(), positions, context, full[:, -run_ids.shape[1] :])

    def logits_to_keep(
        self, keep: int | torch.Tensor, first: bool = False
    ) -> tuple[int | torch.Tensor, int]:
        """The base's `logits_to_keep` for a call asked for `keep` (0: all of its tokens): the
        window's positions are context only, their logits never computed; with `first`
        (keep_salient) the window's last one too, which scores the call's first token (the
        surprisal of every token). Returns (what the base computes, how many extra first)."""
        if self.context and isinstance(keep, torch.Tensor):
            return keep + self.context, 0  # indices into this call's positions
        if self.context and keep == 0:
            return self.ids.shape[1] - self.context + int(first), int(first)
        return keep, 0

    def advance(
        self,
        size: int,
        surprisal: torch.Tensor | None = None,
        salience: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor | None, TokenWindow | None]:
        """After a call that ran `ids`: which positions leave the window (bool [batch, S], None:
        all; their normalised inputs wait for the long-term memory) and the window of the last
        `size` valid tokens (None when the model has no window), with their `surprisal` and
        `salience` [batch, S] when given."""
        if not size:
            return self.valid, None
        valid = (
            self.valid if self.valid is not None else torch.ones_like(self.ids, dtype=torch.bool)
        )
        count = valid.sum(1, keepdim=True)  # [batch, 1]
        rank = valid.long().cumsum(1) - 1  # position among the row's valid tokens
        leaving = valid & (rank < count - size)
        tokens, held = pack(self.ids, valid & ~leaving)
        scores = [
            None if t is None else pack(t, valid & ~leaving)[0] for t in (surprisal, salience)
        ]
        return leaving, TokenWindow(tokens, held, *scores)


__all__ = ["WindowedInputs", "pack"]
