"""Our squeezes, behind the core's `Squeeze` seam (`core/seams.py`; the paper's is
`core/squeeze.py`).

"by_length" leaves the old signal τ_t = min(τ, S / (S + L)) of [0, 1] for S tokens stored and L
new ones, so that every stored token keeps the same share of the signal until the memory holds
L·τ/(1 − τ) tokens, and τ from then on (the paper's τ shrinks the oldest tokens geometrically).

"fill" keeps the stream on the K distinct centres c_j = j/(K − 1) (K = N / number of widths): one
token per centre until the memory holds K tokens (the reads skip the centres not yet filled),
then neighbouring places merged so that each stands for an equal run of S / K tokens
(`places.pool_by_length`). It never resamples between the centres, so the update's gain does not
apply; with a width below the centres' spacing the signal at the centres is the stored vectors
themselves. Places can be kept out of the merge, one token each: the stream's first tokens
(`keep_first`: where a pretrained model parks attention it does not need, its attention sink),
its most recent ones (`keep_last`), and the most salient tokens between them (`keep_salient`, by
a pretrained model's surprisal, `places.salience`; `salient_before` widens a burst of surprise
to the words just before it). With `keep_salient` the places' records (span, tokens, salience)
are kept in the state (`LongTermState.records["places"]`), as they no longer follow from S alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .._checks import check_positive_int
from ..core.ridge import _evaluate_signal, _fit_coefficients
from ..core.seams import Strategy, register
from ..core.squeeze import ResamplingSqueeze, per_row
from .places import (
    HI,
    LO,
    TOKENS,
    initial_records,
    place_positions,
    pool_by_length,
    pool_salient,
    record_positions,
)


@register
@dataclass(frozen=True)
class ByLengthSqueeze(ResamplingSqueeze):
    """τ_t = min(τ, S / (S + L)): every stored token an equal share of [0, 1] until τ caps it."""

    kind: ClassVar[str] = "by_length"
    even: ClassVar[bool] = True  # (until τ caps the share)

    def squeeze_ratios(self, stored: torch.Tensor, length: int) -> torch.Tensor:
        S = stored.to(torch.float64)
        return (S / (S + length)).clamp(max=self.tau)


@register
@dataclass(frozen=True)
class FillSqueeze(Strategy):
    """The stream on the K centres, equal runs of tokens merged per place once full, some
    places kept for single tokens (module doc)."""

    seam: ClassVar[str] = "squeeze"
    kind: ClassVar[str] = "fill"
    resamples: ClassVar[bool] = False
    ordered: ClassVar[bool] = True  # each place a run of the stream, in order (`positions`)
    partial: ClassVar[bool] = True  # one token per centre until K are stored
    even: ClassVar[bool] = True
    sticky: ClassVar[bool] = False  # the places follow the stream, not the reads
    bins: ClassVar[int] = 128  # the state's (unused) attention histogram
    changeable: ClassVar[tuple[str, ...]] = (
        "keep_first",
        "keep_last",
        "keep_salient",
        "salient_before",
    )

    keep_first: int = 0  # the stream's first tokens keep a place each, never merged
    keep_last: int = 0  # its most recent tokens keep the last places, never merged
    keep_salient: int = 0  # places for the most salient tokens between those
    salient_before: int = 0  # a token up to this many before a burst of surprisal is salient too

    def __post_init__(self) -> None:
        for name in ("keep_first", "keep_last", "keep_salient", "salient_before"):
            check_positive_int(name, getattr(self, name), minimum=0)
        if self.salient_before and not self.keep_salient:
            raise ValueError(
                "salient_before widens the salience that chooses keep_salient's places: it "
                f"needs keep_salient > 0, got salient_before={self.salient_before}, keep_salient=0"
            )

    @property
    def wants_salience(self) -> bool:
        """Its update needs the new tokens' salience (`keep_salient`)."""
        return self.keep_salient > 0

    def check(self, config: Any) -> None:
        """Its reads skip the centres not yet filled: a discrete density; the kept places leave
        one at least for the merged tokens."""
        if not config.density.discrete:
            raise ValueError(
                "squeeze='fill' keeps the stream in order on its centres and its reads skip the "
                "centres not yet filled: it needs a density that reads places ('mixture' or "
                f"'content'), got density={config.density.kind!r}"
            )
        K = config.num_basis // len(config.widths)
        kept = self.keep_first + self.keep_last + self.keep_salient
        if kept >= K:
            raise ValueError(
                "keep_first + keep_last + keep_salient must leave one of the K = num_basis / "
                f"len(widths) = {K} places for the merged tokens, got keep_first="
                f"{self.keep_first}, keep_last={self.keep_last}, keep_salient={self.keep_salient}"
            )

    def initial_records(self, batch: int, num_centers: int, device) -> dict[str, torch.Tensor]:
        """Under keep_salient, "places": each place's record (`places.pool_salient`: its span
        of token indices, how many tokens, their salience; float64 [batch, K, 4]); none
        otherwise (the places follow from S alone)."""
        if not self.keep_salient:
            return {}
        return {"places": initial_records(batch, num_centers, device)}

    def check_records(self, state: Any, name: str, values: Any) -> None:
        """The places' records count each row's stored tokens, and their spans lie within the
        stream."""
        places = state.records["places"]
        tokens, stored = places[..., TOKENS], state.stored
        values.require(
            (tokens >= 0).all(-1)
            & ((tokens.sum(-1) - stored.double()).abs() <= 1e-6 * (stored + 1)),
            f"{name}.records['places'] must count each row's stored tokens (tokens >= 0, "
            f"summing to {name}.stored)",
        )
        # each filled place's span ends (token indices) lie within the stream
        ends, held = places[..., LO : HI + 1], (tokens > 0)[..., None]
        last = stored.double()[:, None, None] * (1 + 1e-9) + 1e-6  # (runs' rounding)
        values.require(
            ~held | ((ends >= -1e-6) & (ends <= last)),
            f"{name}.records['places'] must hold spans of token indices within the stream: lo "
            f"and hi in [0, {name}.stored] for each place that holds tokens",
        )

    def extent(self, stored: torch.Tensor, num_centers: int) -> torch.Tensor:
        """The signal of S = `stored` tokens holds the stream on [0, e], float64 [batch]:
        (S − 1)/(K − 1) while S ≤ K (one token per centre), then 1."""
        S = stored.to(torch.float64)
        return torch.where(S <= num_centers, (S - 1).clamp(min=0) / max(num_centers - 1, 1), 1.0)

    def positions(self, state: Any, num_centers: int) -> torch.Tensor:
        """Where each place lies in the stream, float64 [batch, K] (`places.place_positions`,
        or the places' records under keep_salient)."""
        if self.keep_salient:
            return record_positions(state.records["places"])
        return place_positions(state.stored, num_centers, self.keep_first, self.keep_last)

    def fill_design(self, memory: Any, places: int, device, dtype) -> torch.Tensor:
        """G [K, N] of a fit on the centres: the first P = `places` values on the centres
        j/(K − 1), j < P; zero rows for the K − P centres not yet filled (they do not count)."""
        K, P = memory.basis.num_centers, places
        positions = lambda: torch.arange(P, dtype=torch.float64) / (K - 1)  # noqa: E731
        return memory.ridge.design_with_gap(("fill", P), positions, P, K - P, device, dtype)

    def fit(
        self,
        memory: Any,
        state: Any,
        x: torch.Tensor,
        generator: torch.Generator | None,
        salience: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """The old places, read at the K centres, and the new tokens merged so that every place
        stands for as many tokens (`pool_by_length`, or `pool_salient` with the places kept for
        salient tokens), then fitted on the centres."""
        empty = state.empty.to(x.device)
        B_past = state.coefficients.detach()  # no backprop through time
        u = memory.basis.center_grid.to(x)  # [K]
        x_old = _evaluate_signal(B_past, memory.basis, u)  # [batch, K, e]
        stored = torch.where(empty, 0, state.stored)
        records = state.records
        if self.keep_salient:  # the places chosen by salience, their records in the state
            old = torch.where(empty[:, None, None], 0.0, records["places"])  # [b, K, 4]
            V, new, places = pool_salient(
                x_old, old, stored, x, salience, self.keep_first, self.keep_last, self.keep_salient
            )  # [b, K, e], [b, K, 4]
            records = {"places": new}
        else:
            V, places = pool_by_length(x_old, stored, x, self.keep_first, self.keep_last)
        designs = per_row(
            places.cpu(), lambda p: self.fill_design(memory, int(p), x.device, x.dtype), x.device
        )
        return _fit_coefficients(V, designs), u, records  # B = Gᵀ V  [batch, N, e]


__all__ = ["ByLengthSqueeze", "FillSqueeze"]
