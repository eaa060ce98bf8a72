"""The query's density as the paper forms it (§3.2), behind the `Density` seam (`seams.py`).

Keys and values come from the memory's coefficients, one per basis function:

    K = B W^K,  V = B W^V ∈ ℝ^{N×e}                                   (split into H heads)
    s = K q / √d ∈ ℝ^N                                                 (per head and query)
    μ = sigmoid(w_μᵀ s),  σ² = softplus(w_σᵀ s) ≥ σ²_min              (the query's density)
    r = E_p[ψ] = 𝒩(μ; c, σ² + w²)                                      (continuous softmax)
    z = rᵀ V = E_p[v(t)]

The scores only ever enter through w_μᵀ s and w_σᵀ s, and w_μᵀ s = qᵀ W^Kᵀ (Bᵀ w_μ) / √d (W^K has
no bias): the two heads are folded into B once per memory state (`prepare`), so that neither s
nor K [batch, N, e] is ever built.

`PreparedMemory` is what every read of one state shares (any density fills the fields it needs);
`DensityRead` is one read per head and query. The parameters (W^K, W^V, w_μ, w_σ) and the basis
belong to the `LongTermAttention` handed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from .._checks import check_range
from ..precision import at_least_float32, full_precision, wide_dtype
from .fused_read import expected_values
from .seams import Strategy, register


@dataclass
class PreparedMemory:
    """The parts of a read that depend on the memory only (`Density.prepare`)."""

    values: torch.Tensor  # V = B W^V  [batch, H, N, d] (a discrete density: v(c_n))
    # the paper's: W^Kᵀ Bᵀ [w_μ, w_σ] / √d  [b, H, d, 2]; standardised scores: the same of the
    # centred B, and beside it the second moment of the centred scores, K̃ᵀK̃ / (N d)
    # [b, H, d, 2 + d]; a discrete density: the keys themselves, x̄(c) W^K / √d  [b, H, N, d]
    keys: torch.Tensor
    # a memory that holds its stream on part of [0, 1]: the centres that may be read  bool [b, N]
    readable: torch.Tensor | None = None

    def repeat_interleave(self, repeats: int) -> PreparedMemory:
        def rows(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.repeat_interleave(repeats, 0)

        return PreparedMemory(rows(self.values), rows(self.keys), rows(self.readable))


@dataclass
class DensityRead:
    """One read per head and query (`Density.read`)."""

    z: torch.Tensor  # E_p[v(t)]  [batch, H, Q, d]
    mu: torch.Tensor  # [batch, H, Q]
    sigma_sq: torch.Tensor  # [batch, H, Q]
    log_mass: torch.Tensor | None = None  # a discrete density: log Σ_n exp(s_n)  [batch, H, Q]


def softplus_bias(sigma_sq: float) -> float:
    """b with softplus(b) = σ²: b = log(exp(σ²) − 1)."""
    return math.log(math.expm1(sigma_sq))


@register
@dataclass(frozen=True)
class PaperDensity(Strategy):
    """μ = sigmoid(w_μᵀ s), σ² = softplus(w_σᵀ s) (paper §3.2). `sigma_init`: σ at
    initialisation (the bias of w_σ); None: PyTorch's initialisation of the head, the paper's."""

    seam: ClassVar[str] = "density"
    kind: ClassVar[str] = "paper"
    discrete: ClassVar[bool] = False

    sigma_init: float | None = None

    def __post_init__(self) -> None:
        check_sigma_init(self.sigma_init)

    def initial_sigma_sq(self, config: Any) -> float | None:
        return None if self.sigma_init is None else self.sigma_init**2

    def prepare(self, attention: Any, state: Any, dtype: torch.dtype) -> PreparedMemory:
        """V = B W^V and the folded heads (W^Kᵀ Bᵀ [w_μ, w_σ] / √d)."""
        c = attention.config
        batch, H, d = state.batch_size, c.num_heads, c.head_dim
        B = state.coefficients.to(wide_dtype(dtype))  # [batch, N, e]
        with full_precision(B):
            B32 = at_least_float32(B)
            w = torch.cat([attention.mu_head.weight, attention.sigma_head.weight])  # [2, N]
            k_folded = attention.key(torch.matmul(w, B32))  # (wᵀ B) W^K  [b, 2, e]
            keys = k_folded.view(batch, 2, H, d).permute(0, 2, 3, 1) / math.sqrt(d)  # [b,H,d,2]
        v = attention.value(B).view(batch, -1, H, d).transpose(1, 2)  # V = B W^V  [b, H, N, d]
        return PreparedMemory(values=v, keys=keys)

    def read(
        self, attention: Any, q: torch.Tensor, prepared: PreparedMemory, with_mass: bool
    ) -> DensityRead:
        """q [b, H, Q, d] → z = E_p[v(t)], μ, σ² (no log-mass: not a discrete attention)."""
        with full_precision(q):  # μ, σ² in float32 also under autocast (precision.py)
            logits = torch.matmul(at_least_float32(q), prepared.keys)  # [w_μᵀ s, w_σᵀ s]
            mu, sigma_sq = linear_heads(attention, logits)
        return DensityRead(attention.expected_values(mu, sigma_sq, prepared.values), mu, sigma_sq)


def linear_heads(attention: Any, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """μ = sigmoid(w_μᵀ s + b_μ), σ² = softplus(w_σᵀ s + b_σ) ≥ σ²_min from the two head logits
    [b, H, Q, 2] → μ, σ² [b, H, Q]."""
    mu = torch.sigmoid(logits[..., 0] + attention.mu_head.bias)  # μ ∈ (0, 1)
    sigma_sq = F.softplus(logits[..., 1] + attention.sigma_head.bias)
    return mu, sigma_sq.clamp(min=attention.config.min_sigma_sq)


def check_sigma_init(sigma_init: object) -> None:
    if sigma_init is not None:
        check_range("sigma_init", sigma_init, 0.0, 10.0, low_open=True)


__all__ = [
    "DensityRead",
    "PaperDensity",
    "PreparedMemory",
    "check_sigma_init",
    "expected_values",
    "linear_heads",
    "softplus_bias",
]
