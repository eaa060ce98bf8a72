"""Gaussian radial basis functions ψ(t) ∈ ℝ^N over t ∈ [0, 1] (paper §3.2).

    ψ_j(t) = 𝒩(t; c_j, w_j²) = exp(−(t − c_j)² / (2 w_j²)) / (w_j √(2π))

C = N / |widths| centres are spread with `linspace(0, 1, C)` (end points included) and each centre
is paired with every width, so N must be a multiple of the number of widths. Order: width-major
(all centres with the first width, then all with the second, …).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
from torch import nn

from .._checks import check_finite, check_floating, check_positive_int, check_tensor

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def gaussian_density(t: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    """𝒩(t; mean, var), broadcasting over all arguments."""
    return torch.exp(-0.5 * (t - mean) ** 2 / var - 0.5 * torch.log(var) - _LOG_SQRT_2PI)


MIN_WIDTH, MAX_WIDTH = 1e-6, 1e3  # ψ is evaluated in float32: w² must stay a normal number


def check_widths(widths: Sequence[float], num_basis: int | None = None) -> tuple[float, ...]:
    """The widths as floats: at least one, each a real number in [1e-6, 1e3] (narrower or wider
    functions underflow or overflow w² in float32 and give a basis of zeros or NaN), and (given
    N) N a multiple of their number (every centre is paired with every width)."""
    if isinstance(widths, (str, bytes)) or not isinstance(widths, Sequence):
        raise TypeError(f"widths must be a sequence of numbers, got {widths!r}")
    for w in widths:
        if isinstance(w, bool) or not isinstance(w, numbers.Real):
            raise TypeError(f"widths must be a sequence of numbers, got {widths!r}")
    widths = tuple(float(w) for w in widths)
    if not widths:
        raise ValueError("widths must hold at least one width")
    if any(not (MIN_WIDTH <= w <= MAX_WIDTH) for w in widths):
        raise ValueError(
            f"widths must be finite numbers in [{MIN_WIDTH:g}, {MAX_WIDTH:g}], got {widths}"
        )
    if num_basis is not None and num_basis % len(widths):
        raise ValueError(
            f"num_basis (N={num_basis}) must be a multiple of the number of widths "
            f"({len(widths)}: {widths})"
        )
    return widths


class GaussianBasis(nn.Module):
    """N fixed, normalised Gaussian RBFs. Holds no parameters, only the constant buffers
    `centers` [N] and `widths` [N] (not saved in state dicts: they follow from the config)."""

    centers: torch.Tensor
    widths: torch.Tensor
    center_grid: torch.Tensor
    width_grid: torch.Tensor

    def __init__(self, num_basis: int, widths: Sequence[float] = (0.01, 0.05)) -> None:
        super().__init__()
        check_positive_int("num_basis", num_basis)
        widths = check_widths(widths, num_basis)
        self.num_basis = num_basis
        self.width_values = widths
        self.num_centers = num_basis // len(widths)
        c, w = self._grid()
        # width-major order: ψ_j with j = l·C + k pairs width l with centre k (C = N / |widths|),
        # so that the centre axis is innermost and the hot loops vectorise
        self.register_buffer("centers", c.repeat(len(widths)).float(), persistent=False)
        self.register_buffer(
            "widths", w.repeat_interleave(self.num_centers).float(), persistent=False
        )
        self.register_buffer("center_grid", c.float(), persistent=False)  # [N / |widths|]
        self.register_buffer("width_grid", w.float(), persistent=False)  # [|widths|]

    def _grid(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The distinct centres and widths, in float64."""
        centers = torch.linspace(0.0, 1.0, self.num_centers, dtype=torch.float64)
        return centers, torch.tensor(self.width_values, dtype=torch.float64)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        """ψ(t): t [...] → [..., N], in t's dtype. t must be floating point and finite (checked
        here, with one host synchronisation)."""
        check_tensor("t", t)
        check_floating("t", t)
        check_finite("t", t)
        return self._psi(t)

    def _psi(self, t: torch.Tensor) -> torch.Tensor:
        """ψ(t) for a floating-point t [...] → [..., N] (`forward` without the checks, for the
        library's callers that built t).

        Values below the smallest normal number of t's dtype (far in a narrow function's tail:
        2^-126 ≈ 1.2e-38 in float32) are 0. A matrix product that meets subnormal operands runs
        several times slower on x86 CPUs: at cpu-small (N = 128, widths 0.01 and 0.05) ψ at the
        resampling positions holds ~3% of them, and the old signal's resampling x̃ = B_pastᵀ ψ(u)
        took ~5× its time (docs/results/benchmarks/step_profile.md). No product changes by more
        than 1.2e-38 times the largest coefficient."""
        c = self.centers.to(device=t.device, dtype=t.dtype)  # c_j  [N]
        w = self.widths.to(device=t.device, dtype=t.dtype)  # w_j  [N]
        psi = gaussian_density(t.unsqueeze(-1), c, w * w)  # ≥ 0
        return psi.masked_fill(psi < torch.finfo(psi.dtype).tiny, 0.0)

    def float64(self, t: torch.Tensor) -> torch.Tensor:
        """ψ(t) in float64 (for building the design matrices)."""
        check_tensor("t", t)
        c, w = self._grid()
        c, w = c.repeat(len(w)), w.repeat_interleave(self.num_centers)
        return gaussian_density(t.double().unsqueeze(-1), c, w * w)

    def extra_repr(self) -> str:
        return f"num_basis={self.num_basis}, widths={self.width_values}"
