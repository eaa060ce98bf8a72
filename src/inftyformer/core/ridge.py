"""Fitting a sequence of vectors to the basis by ridge regression (paper eq. 9).

A sequence X ∈ ℝ^{P×e} sits at positions t_1..t_P ∈ [0, 1]. With F ∈ ℝ^{N×P}, F_{ji} = ψ_j(t_i),

    Bᵀ = Xᵀ Fᵀ (F Fᵀ + λ I)⁻¹ = Xᵀ G,     G = Fᵀ (F Fᵀ + λ I)⁻¹ ∈ ℝ^{P×N},

so B = Gᵀ X ∈ ℝ^{N×e} and the continuous signal is x̄(t) = Bᵀ ψ(t).

Edge padding (the authors' trick, on by default): ⌊P/2⌋ extra positions with target 0 are added
on each side, in (−½, 0) and (1, 1½); only the rows of G belonging to real positions are kept.
It stops the fitted signal from blowing up at the ends of [0, 1].

G is built in float64 with a linear solve (never an explicit inverse: in float32 that is ~1% off at
N = 512) and depends only on (positions, N, widths, λ, padding), so callers cache it.

`fit_coefficients` and `evaluate_signal` check what they are handed and call `_fit_coefficients`
and `_evaluate_signal`, which hold only the math; the long-term memory calls those directly on
the tensors it built.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from .._checks import (
    ValueChecks,
    check_finite,
    check_floating,
    check_positive_int,
    check_range,
    check_shape,
    check_tensor,
)
from ..precision import at_least_float32, full_precision
from .basis import GaussianBasis


def segment_positions(length: int) -> torch.Tensor:
    """t_i = (i + ½) / L for i = 0..L−1, in float64. [L]"""
    check_positive_int("length", length)
    return (torch.arange(length, dtype=torch.float64) + 0.5) / length


def edge_padding_positions(count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` evenly spread positions in (−½, 0) and as many in (1, 1½). ([count], [count])"""
    check_positive_int("count", count, minimum=0)
    offsets = (torch.arange(count, dtype=torch.float64) + 0.5) * (0.5 / max(count, 1))
    return -0.5 + offsets, 1.0 + offsets


def infinite_positions(num_samples: int, tau: float, length: int) -> torch.Tensor:
    """The positions of the unbounded update's regression (paper §3.3), float64 [M + L]: the M old
    samples squeezed to τ·i/M (i = 1..M), then the L new vectors at τ + (1 − τ)(i + ½)/L."""
    check_positive_int("num_samples", num_samples)
    check_positive_int("length", length)
    i = torch.arange(1, num_samples + 1, dtype=torch.float64)
    old = tau * i / num_samples
    new = tau + (1 - tau) * (torch.arange(length, dtype=torch.float64) + 0.5) / length
    return torch.cat([old, new])


def squeezed_position(
    cell: torch.Tensor, first: torch.Tensor, age: torch.Tensor, tau: float
) -> torch.Tensor:
    """Where a vector of a fitted segment lies in [0, 1] after `age` further unbounded updates
    without sticky sampling (paper §3.3): its segment placed it at (i + ½)/L (`cell`) when the
    memory was empty (`first`), else at τ + (1 − τ)(i + ½)/L (`infinite_positions`), and every
    update since squeezed the old signal linearly into [0, τ]. Tensors of one shape."""
    placed = torch.where(first, cell, tau + (1 - tau) * cell)
    return placed * tau ** age.to(placed.dtype)


def ridge_design_matrix(
    basis: GaussianBasis, positions: torch.Tensor, ridge_lambda: float, edge_padding: bool = True
) -> torch.Tensor:
    """G = Fᵀ (F Fᵀ + λ I)⁻¹ restricted to the real positions. Returns float64 [P, N] on CPU."""
    _check_basis(basis)
    check_tensor("positions", positions, 1)
    check_floating("positions", positions)
    if positions.numel() == 0:
        raise ValueError("positions must not be empty: a segment needs at least one vector")
    check_finite("positions", positions)
    check_range("ridge_lambda", ridge_lambda, 0.0, low_open=True)
    if not isinstance(edge_padding, bool):
        raise TypeError(f"edge_padding must be a bool, got {type(edge_padding).__name__}")
    t = positions.detach().double().cpu()
    num_real = t.numel()
    if edge_padding:
        left, right = edge_padding_positions(num_real // 2)
        t = torch.cat([left, t, right])
    F = basis.float64(t).T  # [N, P_padded]
    gram = F @ F.T + ridge_lambda * torch.eye(basis.num_basis, dtype=torch.float64)  # [N, N]
    # G = Fᵀ (F Fᵀ + λI)⁻¹  ⇔  (F Fᵀ + λI) Gᵀ = F   (the Gram matrix is symmetric)
    try:
        G = torch.linalg.solve(gram, F).T  # [P_padded, N]
    except torch.linalg.LinAlgError:
        G = None
    if G is None or not bool(torch.isfinite(G).all()):
        raise ValueError(
            f"ridge_lambda={ridge_lambda:g} is too small for {num_real} position(s) and "
            f"N={basis.num_basis}: F Fᵀ + λI is numerically singular; use a larger ridge_lambda"
        )
    start = num_real // 2 if edge_padding else 0
    return G[start : start + num_real].contiguous()


def _check_basis(basis: object) -> None:
    if not isinstance(basis, GaussianBasis):
        raise TypeError(f"basis must be a GaussianBasis, got {type(basis).__name__}")


def _fit_coefficients(x: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """B = Gᵀ X: x [batch, P, e], G [P, N] (or one per row [batch, P, N]) → B [batch, N, e], in
    float32 at least, also under autocast (precision.py)."""
    with full_precision(x):
        x = at_least_float32(x)
        G = G.to(dtype=x.dtype, device=x.device)
        # a batched product: B comes out contiguous, and x is read where it lies (an einsum
        # copied x to [P, batch, e] and returned B as a strided view of [N, batch, e])
        return torch.matmul(G.transpose(-1, -2), x)


def _evaluate_signal(
    B: torch.Tensor, basis: GaussianBasis, t: torch.Tensor, psi: torch.Tensor | None = None
) -> torch.Tensor:
    """x̄(t) = Bᵀ ψ(t): B [batch, N, e], t [T] or [batch, T] → [batch, T, e], in float32 at
    least, also under autocast (precision.py). `psi`: ψ(t) when the caller has it (a constant
    grid's, `RidgeRegression.basis_at`)."""
    with full_precision(B):
        B = at_least_float32(B)
        if psi is None:
            psi = basis._psi(t.to(dtype=B.dtype, device=B.device))  # [T, N] or [batch, T, N]
        return torch.matmul(psi.to(B.dtype), B)


def fit_coefficients(x: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """`_fit_coefficients` for arguments from outside: x [batch, P, e] and G [P, N] floating
    point and finite (one host synchronisation)."""
    check_tensor("x", x, 3)
    check_floating("x", x)
    check_shape("G", G, (x.shape[1], None))
    check_floating("G", G)
    values = ValueChecks()
    values.finite("x", x)
    values.finite("G", G)
    values.run()
    return _fit_coefficients(x, G)


def evaluate_signal(B: torch.Tensor, basis: GaussianBasis, t: torch.Tensor) -> torch.Tensor:
    """`_evaluate_signal` for arguments from outside: B [batch, N, e] and t [T] or [batch, T]
    floating point and finite (one host synchronisation)."""
    _check_basis(basis)
    check_shape("B", B, (None, basis.num_basis, None))
    check_floating("B", B)
    check_tensor("t", t)
    check_floating("t", t)
    if t.dim() not in (1, 2) or (t.dim() == 2 and t.shape[0] != B.shape[0]):
        raise ValueError(f"t must have shape [T] or [batch={B.shape[0]}, T], got {tuple(t.shape)}")
    values = ValueChecks()
    values.finite("B", B)
    values.finite("t", t)
    values.run()
    return _evaluate_signal(B, basis, t)


def spectral_radius_bound(A: torch.Tensor, squarings: int = 12) -> float:
    """‖A^k‖_F^{1/k} for k = 2^squarings: an upper bound on the spectral radius ρ(A) that tends to
    it as k grows (Gelfand's formula), computed by repeated squaring with rescaling. Unlike an
    eigenvalue solver it cannot fail to converge (rank-deficient A with many zero eigenvalues)."""
    A = A.double()
    log_scale = 0.0
    for _ in range(squarings):
        norm = float(torch.linalg.matrix_norm(A))
        if norm == 0.0:
            return 0.0
        A = A / norm
        log_scale = 2.0 * (log_scale + math.log(norm))
        A = A @ A
    norm = float(torch.linalg.matrix_norm(A))
    return 0.0 if norm == 0.0 else math.exp((log_scale + math.log(norm)) / 2**squarings)


@lru_cache(maxsize=256)
def update_gain(
    num_basis: int,
    widths: tuple[float, ...],
    ridge_lambda: float,
    tau: float,
    num_samples: int,
    length: int,
    edge_padding: bool = True,
) -> float:
    """How much the unbounded update (paper §3.3) can multiply what the memory holds, per update.

    Read the old signal at u_i = i/M, squeeze it to τ·i/M and refit it by ridge regression
    together with L new vectors: the new coefficients are B' = A B + G_newᵀ X with

        A = G_oldᵀ Ψ(u) ∈ ℝ^{N×N},    Ψ(u)_{ij} = ψ_j(u_i),   G_old the M old rows of G_inf,

    linear in the old coefficients B. Streaming applies A once per update, so the memory stays
    bounded for every input iff the spectral radius ρ(A) < 1; at ρ(A) > 1 the coefficients grow
    by about ρ(A) per segment whatever the input. Returns an upper bound on ρ(A), within ~1%.
    Depends on N, the widths, λ, τ, M, the edge padding and L. Sticky memories read the old
    signal elsewhere (u from the attention histogram, A = A(u)): for a u concentrated where the
    refit overshoots, ρ(A(u)) > 1 at every setting; `limit_to_data` bounds their update."""
    basis = GaussianBasis(num_basis, widths)
    G = ridge_design_matrix(
        basis, infinite_positions(num_samples, tau, length), ridge_lambda, edge_padding
    )
    u = torch.arange(1, num_samples + 1, dtype=torch.float64) / num_samples
    A = G[:num_samples].T @ basis.float64(u)  # [N, N]
    return spectral_radius_bound(A)


def supremum_grid(basis: GaussianBasis) -> torch.Tensor:
    """float64 [T]: where `limit_to_data` reads a signal to bound it: [0, 1] at a spacing of at
    most half the narrowest width (at most 8N + 1 points), and every centre (narrower functions
    peak there)."""
    _check_basis(basis)
    count = min(math.ceil(2.0 / min(basis.width_values)), 8 * basis.num_basis)
    grid = torch.linspace(0.0, 1.0, count + 1, dtype=torch.float64)
    return torch.cat([grid, basis.center_grid.double()]).unique()  # sorted


def limit_to_data(
    B: torch.Tensor, B_past: torch.Tensor, x: torch.Tensor, psi: torch.Tensor
) -> torch.Tensor:
    """Sticky memories' refit, made non-expansive (paper §3.3–3.4): B = G_infᵀ [x̃ ; X] with
    x̃ = B_pastᵀ ψ(u) read where the queries attended. The refit overshoots its data (by up to
    ~1.2 next to a jump), and with u on that overshoot every update multiplies the memory by it,
    whatever `update_gain` says of uniform reading. Per row and channel, B is scaled down so that
    on the grid (ψ there: `psi` [T, N], `supremum_grid`) the new signal never exceeds the larger
    of the old signal's peak and the new vectors' peak:

        max_grid |x̄_new| ≤ max(max_grid |x̄_past|, max_i |X_i|).

    So the memory never holds more than the largest value it was given; a refit that does not
    overshoot is returned unchanged. B, B_past [batch, N, e], x [batch, L, e] → [batch, N, e]."""
    with full_precision(B):
        B_wide = at_least_float32(B)
        psi = psi.to(dtype=B_wide.dtype, device=B.device)
        past = torch.matmul(psi, B_past.to(B_wide.dtype)).abs().amax(1)  # [batch, e]
        bound = torch.maximum(past, x.to(B_wide.dtype).abs().amax(1))
        peak = torch.matmul(psi, B_wide).abs().amax(1)  # [batch, e]
        scale = (bound / peak.clamp_min(torch.finfo(peak.dtype).tiny)).clamp(max=1.0)
        return (B_wide * scale.unsqueeze(1)).to(B.dtype)


class RidgeRegression:
    """Caches G per set of positions so that it is computed once, never per step.

    Keys are (name, sizes…) chosen by the caller; each entry is built in float64 and cast once
    per (device, dtype). This is a cache of constants, not stream state. `cache`: a dict to
    share with other regressions (a model's layers fit with equal bases: one G for all of them,
    not one per layer); its keys hold the basis and λ, so different settings never mix.
    """

    def __init__(
        self,
        basis: GaussianBasis,
        ridge_lambda: float,
        edge_padding: bool = True,
        cache: dict | None = None,
    ):
        _check_basis(basis)
        check_range("ridge_lambda", ridge_lambda, 0.0, low_open=True)
        if cache is not None and not isinstance(cache, dict):
            raise TypeError(f"cache must be a dict or None, got {type(cache).__name__}")
        self.basis = basis
        self.ridge_lambda = float(ridge_lambda)
        self.edge_padding = bool(edge_padding)
        self._cache: dict[tuple, torch.Tensor] = {} if cache is None else cache
        self._settings = (
            basis.num_basis,
            tuple(basis.width_values),
            self.ridge_lambda,
            self.edge_padding,
        )

    def design(
        self, key: tuple, positions_fn, device: torch.device, dtype: torch.dtype
    ) -> torch.Tensor:
        key = (self._settings, key)
        full_key = (key, str(device), dtype)
        G = self._cache.get(full_key)
        if G is None:
            G64 = self._cache.get((key, "cpu", torch.float64))
            if G64 is None:
                G64 = ridge_design_matrix(
                    self.basis, positions_fn(), self.ridge_lambda, self.edge_padding
                )
                self._cache[(key, "cpu", torch.float64)] = G64
            G = G64.to(device=device, dtype=dtype)
            self._cache[full_key] = G
        return G

    def design_with_gap(
        self, key: tuple, positions_fn, at: int, gap: int, device, dtype
    ) -> torch.Tensor:
        """`design` with `gap` zero rows inserted before row `at`: inputs there do not count."""
        full_key = ((self._settings, "gap", key, at, gap), str(device), dtype)
        G = self._cache.get(full_key)
        if G is None:
            G = self.design(key, positions_fn, device, dtype)
            G = torch.cat([G[:at], G.new_zeros(gap, G.shape[1]), G[at:]])
            self._cache[full_key] = G
        return G

    def basis_at(self, key: tuple, positions_fn, device, dtype: torch.dtype) -> torch.Tensor:
        """ψ(t) [T, N] in `dtype` at positions t = positions_fn() that depend only on `key` (the
        resampling grid i/M), as `_evaluate_signal` evaluates it, cached like the designs."""
        full_key = ((self._settings, "basis", key), str(device), dtype)
        psi = self._cache.get(full_key)
        if psi is None:
            psi = self.basis._psi(positions_fn().to(device=device, dtype=dtype))
            self._cache[full_key] = psi
        return psi

    def segment(self, length: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """G_L [L, N] for a segment placed at (i + ½)/L."""
        check_positive_int("length", length)
        return self.design(("segment", length), lambda: segment_positions(length), device, dtype)
