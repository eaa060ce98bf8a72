"""The unbounded update as the paper makes it (§3.3) with sticky memories (§3.4), behind the
`Squeeze` seam (`seams.py`):

    first fit after a reset         B = G_Lᵀ X                                  (eq. 9)
    unbounded update (each segment) x̃ = B_pastᵀ ψ(u),  u = sample positions
                                    B = G_infᵀ [x̃ at τ·i/M ; X at (τ, 1)]
    sticky memories                 u drawn from the histogram of past attention, and B
                                    scaled so that it holds no more than its data

`ResamplingSqueeze` holds the part every squeeze that resamples the old signal at M points
shares: the first fit, the sampling (uniform or sticky), the refit and the update's gain check
(`ridge.update_gain`); `squeeze_ratios` is where a squeeze chooses τ per row. `FixedSqueeze`
is the paper's: τ every update.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch

from .._checks import check_bool, check_positive_int, check_range
from ..precision import wide_dtype
from .ridge import (
    _evaluate_signal,
    _fit_coefficients,
    infinite_positions,
    limit_to_data,
    update_gain,
)
from .seams import Strategy, register

# The largest gain (`ridge.update_gain`) of the unbounded update accepted: below 1 with a margin,
# so that the memory stays bounded (a constant input accumulates to at most 1 / (1 − 0.95) = 20×)
# and the ~1% error of the estimate cannot matter.
MAX_UPDATE_GAIN = 0.95


def check_update_gain(config: Any, lengths: tuple[int, ...]) -> None:
    """Refuse settings whose unbounded update expands the memory (paper §3.3, `ridge.update_gain`)
    for segments of the given lengths: a ValueError naming the settings, the gain and single
    changes that bring it below `MAX_UPDATE_GAIN`. `config`: a `LongTermConfig` whose squeeze
    resamples."""
    c, s = config, config.squeeze
    for length in sorted(set(lengths)):
        gain = _gain(c, length)
        if gain <= MAX_UPDATE_GAIN:
            continue
        fixes = []
        for name, value in _candidate_fixes(c):
            try:
                fixed = _gain(replace(c, segment_len=None, **{name: value}), length)
            except ValueError:
                continue
            if fixed <= MAX_UPDATE_GAIN:
                fixes.append(f"{name}={value!r} (gain {fixed:.2f})")
        hint = "; e.g. " + " or ".join(fixes[:3]) if fixes else ""
        raise ValueError(
            f"the long-term memory's update expands what it stores: with num_basis={c.num_basis}, "
            f"widths={c.widths}, ridge_lambda={c.ridge_lambda:g}, tau={s.tau:g}, "
            f"num_samples={s.num_samples}, edge_padding={c.edge_padding} and segments of length "
            f"{length} its gain is {gain:.2f} > {MAX_UPDATE_GAIN} (the memory would grow about "
            f"{gain:.2f}x per segment); use wider widths, more num_samples, a smaller tau or "
            f"fewer basis functions per width{hint}"
        )


def _gain(c: Any, length: int) -> float:
    s = c.squeeze
    return update_gain(
        c.num_basis, c.widths, c.ridge_lambda, s.tau, s.num_samples, length, c.edge_padding
    )


def _candidate_fixes(c: Any):
    """Single changes to try when the update expands (for the error message)."""
    for factor in (2, 4, 8):
        yield "widths", tuple(min(w * factor, 1.0) for w in c.widths)
    for factor in (2, 4):
        yield "num_samples", c.squeeze.num_samples * factor
    yield "tau", round(c.squeeze.tau * 2 / 3, 3)
    yield "tau", round(c.squeeze.tau / 2, 3)
    if c.num_basis % (2 * len(c.widths)) == 0:
        yield "num_basis", c.num_basis // 2


def per_row(cases: torch.Tensor, make, device) -> torch.Tensor:
    """`make(value)` of each row's case [batch] (one call per distinct value): that matrix when
    every row has the same case, else the rows' matrices stacked [batch, ...] on `device`."""
    unique, row_case = torch.unique(cases, return_inverse=True)
    designs = [make(v) for v in unique.tolist()]
    if len(designs) == 1:
        return designs[0]
    return torch.stack(designs)[row_case.to(device)]


@dataclass(frozen=True)
class ResamplingSqueeze(Strategy):
    """A squeeze that reads the old signal at M points, puts them on [0, τ_t] and refits them
    with the new vectors (module doc); τ_t is `squeeze_ratios`."""

    seam: ClassVar[str] = "squeeze"
    resamples: ClassVar[bool] = True
    ordered: ClassVar[bool] = False  # places are resampled, not runs of the stream in order
    partial: ClassVar[bool] = False  # the stream always fills [0, 1]
    wants_salience: ClassVar[bool] = False
    changeable: ClassVar[tuple[str, ...]] = ("num_samples", "tau", "sticky", "sticky_bins")

    tau: float = 0.75  # τ: the old signal is squeezed into [0, τ]
    num_samples: int = 512  # M: points at which the old signal is resampled
    sticky: bool = False  # u drawn from where past reads attended (sticky memories, §3.4)
    sticky_bins: int = 128  # bins of that histogram over [0, 1]

    def __post_init__(self) -> None:
        check_range("tau", self.tau, 0.0, 1.0, low_open=True, high_open=True)
        check_positive_int("num_samples", self.num_samples)
        check_bool("sticky", self.sticky)
        check_positive_int("sticky_bins", self.sticky_bins)

    @property
    def bins(self) -> int:
        """The width of a state's attention histogram."""
        return self.sticky_bins

    def initial_records(self, batch: int, num_centers: int, device) -> dict[str, torch.Tensor]:
        """None: the signal is all it keeps."""
        return {}

    def check_records(self, state: Any, name: str, values: Any) -> None:
        """No records, nothing to check."""

    def extent(self, stored: torch.Tensor, num_centers: int) -> torch.Tensor:
        """The stream fills the whole of [0, 1]."""
        return torch.ones_like(stored, dtype=torch.float64)

    def squeeze_ratios(self, stored: torch.Tensor, length: int) -> torch.Tensor:
        """τ_t of each row's next update, float64 [batch], for `stored` tokens [batch] and
        `length` new ones."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the update
    def infinite_design(
        self, memory: Any, length: int, device, dtype, tau: float | None = None
    ) -> torch.Tensor:
        """G_inf [M + L, N]: M old samples at τ·i/M (i = 1..M), then L new vectors at
        τ + (1 − τ)(i + ½)/L, all in one regression (τ: this squeeze's unless given)."""
        squeeze = self if tau is None else replace(self, tau=tau)
        M, t = squeeze.num_samples, squeeze.tau

        def positions() -> torch.Tensor:
            # once per (τ, L), with the matrix it makes
            check_update_gain(replace(memory.config, squeeze=squeeze), (length,))
            return infinite_positions(M, t, length)

        return memory.ridge.design(("infinite", M, t, length), positions, device, dtype)

    def infinite_designs(self, memory: Any, state: Any, length: int, device, dtype) -> torch.Tensor:
        """G_inf of the update: [M + L, N] when every row updates alike, else one per row
        [batch, M + L, N] (a matrix per distinct τ_t, cached)."""
        stored, empty = state.stored.cpu(), state.empty.cpu()
        tau_t = self.squeeze_ratios(stored, length)  # [batch]
        # empty rows get a first fit instead: they take a design that is made anyway
        tau_t = torch.where(empty, tau_t[~empty][0], tau_t)
        return per_row(
            tau_t, lambda v: self.infinite_design(memory, length, device, dtype, v), device
        )

    def fit(
        self,
        memory: Any,
        state: Any,
        x: torch.Tensor,
        generator: torch.Generator | None,
        salience: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Empty rows: the first fit; the others: x̃ = B_pastᵀ ψ(u) at M samples, squeezed to
        [0, τ_t], refitted with the L new vectors (sticky: B limited to its data)."""
        length = x.shape[1]
        empty = state.empty.to(x.device)
        B_past = state.coefficients.detach()  # no backprop through time
        B_new, u = None, None
        if bool(empty.any()):
            # first fit: B = G_Lᵀ X                                        [batch, N, e]
            B_new = _fit_coefficients(x, memory.ridge.segment(length, x.device, x.dtype))
        if not bool(empty.all()):
            u = self.sample_positions(memory, state, generator)  # [M] or [batch, M]
            # x̃ = B_pastᵀ ψ(u)  [batch, M, e]
            psi = None
            if self._samples_on_grid():  # ψ(u) at the grid i/M: a constant of the shapes
                psi = memory.ridge.basis_at(
                    ("grid", u.numel(), u.dtype), lambda: u, u.device, wide_dtype(B_past.dtype)
                )
            x_old = _evaluate_signal(B_past, memory.basis, u, psi)
            G_inf = self.infinite_designs(memory, state, length, x.device, x.dtype)
            # B = G_infᵀ [x̃ ; X]  [batch, N, e], as the sum of its two parts: x̃ carries no
            # gradient, so the backward reaches only the new vectors' rows of G_inf
            M = x_old.shape[1]
            B_upd = _fit_coefficients(x, G_inf[..., M:, :]) + _fit_coefficients(
                x_old, G_inf[..., :M, :]
            )
            # sticky: u follows the attention and no config check bounds A(u) (ridge.py), so
            # B is scaled to max_grid |x̄| ≤ max(max_grid |x̄_past|, max |X|)  (§3.3–3.4)
            if self.sticky:
                B_upd = limit_to_data(B_upd, B_past, x, memory.grid_basis(x.device, x.dtype))
            B_new = B_upd if B_new is None else torch.where(empty[:, None, None], B_new, B_upd)
        return B_new, u, state.records

    def _samples_on_grid(self) -> bool:
        """Whether `sample_positions` is the grid i/M (not sticky, and not overridden)."""
        return not self.sticky and type(self).sample_positions is ResamplingSqueeze.sample_positions

    def sample_positions(
        self, memory: Any, state: Any, generator: torch.Generator | None
    ) -> torch.Tensor:
        """Where to read the old signal before squeezing it: u [M] (uniform grid i/M) or
        [batch, M] (sticky: drawn from the attention histogram in training, its quantiles in
        evaluation; sorted)."""
        M = self.num_samples
        B = state.coefficients
        if not self.sticky:
            return torch.arange(1, M + 1, device=B.device, dtype=B.dtype) / M
        p = state.attention_mass.to(B.dtype)  # [batch, bins]
        bins = p.shape[-1]
        if memory.training:
            # bin by p_b, then uniformly inside it (the authors' code always took the left edge)
            idx = torch.multinomial(p, M, replacement=True, generator=generator)
            offset = torch.rand(idx.shape, generator=generator, device=B.device, dtype=B.dtype)
            u = (idx.to(B.dtype) + offset) / bins
            return u.sort(dim=-1).values
        # evaluation: deterministic quantiles u_i = P⁻¹((i − ½)/M) of the piecewise-uniform density
        cdf = torch.cumsum(p, -1)  # [batch, bins]: P at the right edge of each bin
        q = (torch.arange(M, device=B.device, dtype=B.dtype) + 0.5) / M
        q = q.expand(p.shape[0], -1).contiguous()  # [batch, M]
        idx = torch.searchsorted(cdf, q, right=True).clamp_(max=bins - 1)  # bin holding q
        left = torch.gather(cdf, 1, idx) - torch.gather(p, 1, idx)
        frac = ((q - left) / torch.gather(p, 1, idx)).clamp_(0, 1)
        return (idx.to(B.dtype) + frac) / bins


@register
@dataclass(frozen=True)
class FixedSqueeze(ResamplingSqueeze):
    """The paper's unbounded update (§3.3): the old signal squeezed into [0, τ] every update."""

    kind: ClassVar[str] = "fixed"
    even: ClassVar[bool] = False  # older tokens get less of [0, 1] at every update

    def squeeze_ratios(self, stored: torch.Tensor, length: int) -> torch.Tensor:
        return torch.full(stored.shape, self.tau, dtype=torch.float64, device=stored.device)

    def infinite_designs(self, memory: Any, state: Any, length: int, device, dtype) -> torch.Tensor:
        return self.infinite_design(memory, length, device, dtype)


__all__ = [
    "MAX_UPDATE_GAIN",
    "FixedSqueeze",
    "ResamplingSqueeze",
    "check_update_gain",
    "per_row",
]
