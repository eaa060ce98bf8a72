"""What stays in float32 under `torch.autocast` (bf16 or fp16 on CPU or CUDA).

Autocast runs matrix products in the low precision. That suits the projections, but not the
parts of the ∞-former whose numbers bf16 (8 significant bits, ~2–3 decimal digits) cannot hold:

- the ridge fit B = Gᵀ X and the read-back x̄(t) = Bᵀ ψ(t): G comes from a solve that float32
  already needs care for (core/ridge.py), and the coefficients are the memory carried across every
  segment, where rounding would accumulate;
- the density parameters μ, σ² of the continuous attention: a bf16 μ ∈ (0, 1) is only known to
  ~1/256, a large fraction of a basis width (0.01 in the paper);
- the Gaussian integrals r = 𝒩(μ; c, σ² + w²) and their contraction with V (core/fused_read.py).

Inside `full_precision(t)` autocast is off and `at_least_float32` lifts bf16/fp16 tensors to
float32 (float64 stays float64), so the same code runs with and without autocast.
"""

from __future__ import annotations

import torch


def full_precision(like: torch.Tensor) -> torch.autocast:
    """A context in which autocast is off for `like`'s device type."""
    return torch.autocast(like.device.type, enabled=False)


def wide_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for a lower-precision float dtype, otherwise `dtype` itself."""
    if dtype.is_floating_point and torch.finfo(dtype).bits < 32:
        return torch.float32
    return dtype


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """x in float32 if it is a lower-precision float, otherwise unchanged."""
    return x.to(wide_dtype(x.dtype))


def allowed_dtypes(parameter: torch.Tensor) -> tuple[torch.dtype, ...]:
    """The floating dtypes of tensors meeting a module whose parameters are `parameter`'s: that
    dtype, and under autocast on its device also the autocast dtype."""
    device = parameter.device.type
    dtypes = (parameter.dtype,)
    try:
        if torch.is_autocast_enabled(device):
            dtypes += (torch.get_autocast_dtype(device),)
    except (RuntimeError, TypeError):  # a device type autocast does not know
        pass
    return dtypes


__all__ = ["allowed_dtypes", "at_least_float32", "full_precision", "wide_dtype"]
