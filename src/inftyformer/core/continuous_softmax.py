"""Continuous softmax: the expectation of the basis functions under a Gaussian density
(paper §3.1–3.2).

A query predicts p = 𝒩(t; μ, σ²) over the real line. For normalised Gaussian RBFs the expectation
has a closed form (the product of two Gaussians integrates to a Gaussian in the difference of
their means):

    r_j = E_p[ψ_j(t)] = ∫ 𝒩(t; μ, σ²) 𝒩(t; c_j, w_j²) dt = 𝒩(μ; c_j, σ² + w_j²)

Gradients are plain autograd of this expression, exact in (μ, σ²): no custom backward through
natural parameters (the authors' version costs half an update step and loses precision). The
attention itself reads E_p[ψ]ᵀ V through core/fused_read.py, the same closed form contracted with
V block by block, so that the [..., N] tensor of r is never materialised.

Validation at the boundary: the public functions check what they are handed and call the private
`_continuous_softmax` / `_variance_kl`, which hold only the math; the library's own callers, whose
arguments the model already validated, call those directly.
"""

from __future__ import annotations

import math

import torch

from .._checks import ValueChecks, check_floating, check_range, check_tensor
from .basis import GaussianBasis


def continuous_softmax(
    mu: torch.Tensor, sigma_sq: torch.Tensor, basis: GaussianBasis
) -> torch.Tensor:
    """E_p[ψ(t)] for p = 𝒩(μ, σ²): mu, sigma_sq [...] → [..., N].

    mu and sigma_sq must be floating-point tensors that broadcast together (the result has their
    promoted dtype); mu must be finite and sigma_sq positive and finite (checked here, with one
    host synchronisation: this is the entry point for tensors from outside the library)."""
    check_tensor("mu", mu)
    check_tensor("sigma_sq", sigma_sq)
    check_floating("mu", mu)
    check_floating("sigma_sq", sigma_sq)
    if not isinstance(basis, GaussianBasis):
        raise TypeError(f"basis must be a GaussianBasis, got {type(basis).__name__}")
    try:
        torch.broadcast_shapes(mu.shape, sigma_sq.shape)
    except RuntimeError as err:
        raise ValueError(
            f"mu {tuple(mu.shape)} and sigma_sq {tuple(sigma_sq.shape)} do not broadcast"
        ) from err
    values = ValueChecks()
    values.finite("mu", mu)
    _require_variance(values, sigma_sq)
    values.run()
    return _continuous_softmax(mu, sigma_sq, basis)


def _continuous_softmax(
    mu: torch.Tensor, sigma_sq: torch.Tensor, basis: GaussianBasis
) -> torch.Tensor:
    """r = E_p[ψ(t)] = 𝒩(μ; c, σ² + w²): mu, sigma_sq [...] → [..., N] (`continuous_softmax`
    without the checks)."""
    # The basis is a grid of widths × centres: only the squared distance depends on the centre and
    # only the variance on the width, so the full [..., N] tensor is touched by two kernels.
    c = basis.center_grid.to(device=mu.device, dtype=mu.dtype)  # [C]
    w_sq = basis.width_grid.to(device=mu.device, dtype=mu.dtype) ** 2  # [W]
    var = sigma_sq.unsqueeze(-1) + w_sq  # σ² + w_l²  [..., W]
    coef = (-0.5 / var).unsqueeze(-1)  # [..., W, 1]
    log_norm = (-0.5 * torch.log(2.0 * math.pi * var)).unsqueeze(-1)  # [..., W, 1]
    dist_sq = ((mu.unsqueeze(-1) - c) ** 2).unsqueeze(-2)  # (μ − c_k)²  [..., 1, C]
    # r_{l,k} = 𝒩(μ; c_k, σ² + w_l²) = exp(log_norm_l − (μ − c_k)² / (2(σ² + w_l²)))  [..., W, C]
    # exp in place: the addcmul result is not saved for backward, so this spares one full-size
    # [..., N] allocation (same values, same autograd graph)
    r = torch.addcmul(log_norm, coef, dist_sq).exp_()
    return r.flatten(-2)  # [..., N] in the basis' width-major order


def variance_kl(sigma_sq: torch.Tensor, sigma_0: float) -> torch.Tensor:
    """The variance part of KL(𝒩(μ, σ²) ‖ 𝒩(μ₀, σ₀²)), the paper's regulariser on
    the variance, elementwise:

        ½ (σ²/σ₀² − log(σ²/σ₀²) − 1)

    It is zero at σ = σ₀ and keeps the attention densities from collapsing or spreading out.
    sigma_sq: a floating-point tensor, positive and finite (checked here, with one host
    synchronisation); sigma_0 > 0."""
    check_tensor("sigma_sq", sigma_sq)
    check_floating("sigma_sq", sigma_sq)
    check_range("sigma_0", sigma_0, 0.0, low_open=True)
    values = ValueChecks()
    _require_variance(values, sigma_sq)
    values.run()
    return _variance_kl(sigma_sq, sigma_0)


def _variance_kl(sigma_sq: torch.Tensor, sigma_0: float) -> torch.Tensor:
    """½ (σ²/σ₀² − log(σ²/σ₀²) − 1) elementwise, in sigma_sq's dtype (`variance_kl` without the
    checks)."""
    # at least float32: near σ = σ₀ the three terms cancel, and in bfloat16 their rounding
    # (~4e-3 each) made the KL negative; the result has the input's dtype
    wide = sigma_sq.float() if sigma_sq.dtype in (torch.float16, torch.bfloat16) else sigma_sq
    ratio = wide / (sigma_0 * sigma_0)
    # log(σ²/σ₀²) from the logarithms, not from the ratio: in a narrow dtype the ratio may
    # overflow to inf (or underflow to 0), and inf − log(inf) would be NaN where the KL is inf
    log_ratio = torch.log(wide) - 2.0 * math.log(sigma_0)
    return (0.5 * (ratio - log_ratio - 1.0)).to(sigma_sq.dtype)


def _require_variance(values: ValueChecks, sigma_sq: torch.Tensor) -> None:
    sigma_sq = sigma_sq.detach()
    values.require(
        (sigma_sq > 0) & torch.isfinite(sigma_sq), "sigma_sq must be positive and finite everywhere"
    )
