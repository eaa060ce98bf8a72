"""Our densities, behind the core's `Density` seam (`core/seams.py`; the paper's form is
`core/density.py`).

"normalized" standardises the scores over the N basis keys before the heads,
ŝ = (s − mean(s)) / std(s), and feeds ŝ to w_μ, w_σ. The paper's form depends on the query only
through s itself, which starts near zero (small W^K and queries, normalised stored states), so
every query's density starts, and in practice stays, where the biases put it: the same flat read
for every query. ŝ has unit spread at any scale of s, so μ and σ depend on the query from the
first step.

"content" turns the scores into a discrete attention over the basis centres c_n and matches the
density's moments to it, so that a query reads *where its content matches* — retrieval — rather
than where a linear function of its scores points. Its keys are the signal's content at the
centres, x̄(c_n) = Bᵀ ψ(c_n), which has the scale of the stored states (the coefficients B are far
smaller: a narrow ψ peaks at 1/(w√2π)):

    s_n = (x̄(c_n) W^K) · q / √d
    p_n = softmax_n(β s_n + w_μ,n)                     (w_μ ∈ ℝ^N: a learned prior over places)
    μ = Σ_n p_n c_n,  σ² = Σ_n p_n (c_n − μ)² + softplus(w_σᵀ s + b_σ)

The extra variance starts at `sigma_init`², or at the floor `min_sigma_sq` when it is not given,
so a query that matches one place reads that place at the basis' resolution. `sharpness` β
sharpens the discrete attention, so that a query whose best match stands out reads there rather
than at the mean of its matches; centres before `sink_edge` are not read (the oldest edge holds
the document's first tokens, where a pretrained model parks attention it does not need).

"mixture" reads the discrete attention itself instead of a Gaussian matched to its moments:
p(t) = Σ_n p_n δ(t − c_n), a mixture of the signal at the centres,

    z = E_p[v(t)] = Σ_n p_n x̄(c_n) W^V

so a query whose attention is spread over several places (ordinary text) reads their values
rather than the signal between them, and a query that matches one place reads the signal there
exactly (μ, σ² are still its moments: the KL term, sticky memories and the diagnostics use them).

The discrete densities also give each read's log-mass log Σ_n exp(s_n), the unnormalised weight a
softmax over the signal's places would give the memory: a read merged into a pretrained model's
own heads weighs itself against the window with it (`hf/head_read.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from .._checks import check_range
from ..core.density import (
    DensityRead,
    PreparedMemory,
    check_sigma_init,
    linear_heads,
)
from ..core.seams import Strategy, register
from ..precision import at_least_float32, full_precision, wide_dtype

# added to the scores' variance before standardising them ("normalized"): far below the variance
# of the scores of any memory that holds something, so that ŝ keeps unit spread at any scale
SCORE_EPS = 1e-12


@register
@dataclass(frozen=True)
class NormalizedDensity(Strategy):
    """The paper's heads over standardised scores ŝ (module doc); `sigma_init` as the paper's."""

    seam: ClassVar[str] = "density"
    kind: ClassVar[str] = "normalized"
    discrete: ClassVar[bool] = False

    sigma_init: float | None = None

    def __post_init__(self) -> None:
        check_sigma_init(self.sigma_init)

    def initial_sigma_sq(self, config: Any) -> float | None:
        return None if self.sigma_init is None else self.sigma_init**2

    def prepare(self, attention: Any, state: Any, dtype: torch.dtype) -> PreparedMemory:
        """V = B W^V, the folded heads over centred scores and the scores' second moment: with
        K̃ = (B − mean_N B) W^K, s − mean(s) = K̃ q / √d and var_N(s) = qᵀ (K̃ᵀK̃ / (N d)) q, so
        s is never built. K̃ and V are formed transposed, K̃ᵀ = W^K (B − mean B)ᵀ [b, e, N]: split
        into heads that is [b, H, d, N] as it lies in memory, so the Gram matrices, the folded
        heads and the read's Vᵀ take it without a copy."""
        c = attention.config
        batch, H, d = state.batch_size, c.num_heads, c.head_dim
        B = state.coefficients.to(wide_dtype(dtype))  # [batch, N, e]
        with full_precision(B):
            B32 = at_least_float32(B)
            N = B32.shape[1]
            w = torch.cat([attention.mu_head.weight, attention.sigma_head.weight])  # [2, N]
            # K̃ = (B − mean B) W^K  [b, N, e], split into heads [b, H, N, d]: formed as the
            # key projection's own product (formed transposed, K̃ᵀ = W^K (B − mean B)ᵀ, its
            # gradient through the Gram matrix came out 4e-4 off (relative) between two float32
            # orders of the same loss, tests/hf/test_hf_loss.py)
            K = attention.key(B32 - B32.mean(dim=1, keepdim=True))
            K_t = K.view(batch, N, H, d).permute(0, 2, 3, 1)  # K̃ᵀ per head  [b, H, d, N]
            # the folded heads K̃ᵀ [w_μ, w_σ] / √d and, in one product, mean_N (s − mean s)² =
            # qᵀ (K̃ᵀ K̃ / (N d)) q: [b, H, d, 2 + d]
            keys = torch.cat(
                [
                    torch.matmul(K_t, w.t()) / math.sqrt(d),  # [b, H, d, 2]
                    torch.matmul(K_t, K_t.transpose(-1, -2)) / (N * d),  # [b, H, d, d]
                ],
                dim=-1,
            )
        # Vᵀ = W^V Bᵀ [b, H, d, N]; V [b, H, N, d] is its transposed view
        v_t = _times_transposed(attention.value.weight, B).view(batch, H, d, N)
        return PreparedMemory(values=v_t.transpose(-1, -2), keys=keys)

    def read(
        self, attention: Any, q: torch.Tensor, prepared: PreparedMemory, with_mass: bool
    ) -> DensityRead:
        """q [b, H, Q, d] → [w_μᵀ ŝ, w_σᵀ ŝ], ŝ = (s − mean s) / std s, then the paper's heads."""
        with full_precision(q):
            q = at_least_float32(q)
            # ŝ does not change when q is scaled by a ≥ 1 (ε scaled by 1/a²): q / a keeps qᵀGq
            # finite for any finite q (the result does not depend on a: a needs no gradient)
            a = q.detach().abs().amax(-1, keepdim=True).clamp(min=1.0)  # [b, H, Q, 1]
            q = q / a
            # [w_μᵀ s, w_σᵀ s] and q G in one product  [b, H, Q, 2 + d]
            products = torch.matmul(q, prepared.keys)
            logits, q_gram = products[..., :2], products[..., 2:]
            var = (q_gram * q).sum(-1, keepdim=True)  # var_N(s) / a²
            denominator = (var.clamp(min=0.0) + SCORE_EPS / a.square()).clamp(
                min=torch.finfo(var.dtype).tiny
            )
            mu, sigma_sq = linear_heads(attention, logits * torch.rsqrt(denominator))
        return DensityRead(attention.expected_values(mu, sigma_sq, prepared.values), mu, sigma_sq)


def _times_transposed(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """W xᵀ per row: weight [out, e], x [b, N, e] → [b, out, N], contiguous. A batched product
    with W broadcast over the rows: torch.matmul(W, xᵀ) would copy x (and its gradient) to fold
    the batch into one matrix product."""
    return torch.bmm(weight.to(x.dtype).expand(x.shape[0], -1, -1), x.transpose(1, 2))


@dataclass(frozen=True)
class DiscreteDensity(Strategy):
    """A discrete attention over the basis centres (module doc: "content", "mixture")."""

    seam: ClassVar[str] = "density"
    discrete: ClassVar[bool] = True
    changeable: ClassVar[tuple[str, ...]] = ("sharpness", "sink_edge")

    sharpness: float = 1.0  # β of p_n = softmax(β s_n + w_μ,n)
    sink_edge: float = 0.0  # the centres c_n < sink_edge are not read
    sigma_init: float | None = None  # None: the extra variance starts at the floor

    def __post_init__(self) -> None:
        check_sigma_init(self.sigma_init)
        check_range("sharpness", self.sharpness, 0.0, 1e6, low_open=True)
        check_range("sink_edge", self.sink_edge, 0.0, 0.5)

    def initial_sigma_sq(self, config: Any) -> float | None:
        return config.min_sigma_sq if self.sigma_init is None else self.sigma_init**2

    def prepare(self, attention: Any, state: Any, dtype: torch.dtype) -> PreparedMemory:
        """The keys at the centres, x̄(c_n) W^K / √d (every score is needed), the values (at
        the centres for "mixture", V = B W^V for "content"), and the centres that hold the
        stream when the memory's squeeze holds it on part of [0, 1]."""
        c = attention.config
        basis = attention.basis
        batch, H, d = state.batch_size, c.num_heads, c.head_dim
        B = state.coefficients.to(wide_dtype(dtype))  # [batch, N, e]
        with full_precision(B):
            B32 = at_least_float32(B)
            psi = basis._psi(basis.centers.to(B32.dtype))  # ψ_j(c_n) [N, N]
            signal = torch.matmul(psi, B32)  # x̄(c_n) = Bᵀ ψ(c_n)  [b, N, e]
            K = attention.key(signal).view(batch, -1, H, d).transpose(1, 2) / math.sqrt(d)
            readable = None
            if c.squeeze.partial:  # the signal holds the stream on [0, e] only
                K_c = basis.num_centers
                e = c.squeeze.extent(state.stored, K_c)
                # at least one centre past the sink edge, so that a read is defined
                e = e.clamp(min=self.sink_edge + 1.0 / max(K_c - 1, 1))
                centers = basis.centers.to(device=e.device, dtype=torch.float64)
                half = 0.5 / max(K_c - 1, 1)  # the last token's centre, not the next
                readable = (centers <= e[:, None] + half) | state.empty[:, None]
            if self.reads_places:  # v(c_n) = x̄(c_n) W^V  [b, H, N, d]
                v = attention.value(signal.to(B.dtype)).view(batch, -1, H, d).transpose(1, 2)
                return PreparedMemory(values=v, keys=K, readable=readable)
        v = attention.value(B).view(batch, -1, H, d).transpose(1, 2)  # V = B W^V  [b, H, N, d]
        return PreparedMemory(values=v, keys=K, readable=readable)

    def read(
        self, attention: Any, q: torch.Tensor, prepared: PreparedMemory, with_mass: bool
    ) -> DensityRead:
        with full_precision(q):
            p, mu, sigma_sq, log_mass = self.attend(
                attention, at_least_float32(q), prepared.keys, with_mass, prepared.readable
            )
        if self.reads_places:  # z = Σ_n p_n v(c_n)  [b, H, Q, d]
            z = torch.matmul(p.to(prepared.values.dtype), prepared.values)
        else:
            z = attention.expected_values(mu, sigma_sq, prepared.values)
        return DensityRead(z, mu, sigma_sq, log_mass)

    def attend(
        self,
        attention: Any,
        q: torch.Tensor,
        keys: torch.Tensor,
        with_mass: bool = False,
        readable: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The discrete attention over the centres and its moments (module doc). q [b, H, Q, d],
        keys K / √d [b, H, N, d] → p [b, H, Q, N], μ, σ² and (`with_mass`, else None)
        log Σ_n exp(s_n) [b, H, Q]; `readable` [b, N]: the centres that may be read."""
        c = attention.config
        s = torch.matmul(q, keys.transpose(-1, -2))  # s = K q / √d  [b, H, Q, N]
        centers = attention.basis.centers.to(s.dtype)  # c_n  [N]
        w_sigma = attention.sigma_head.weight[0]  # [N]
        scores = s  # w_σᵀ s over the centres that are read
        if readable is not None:  # centres beyond the stream: no mass, no σ² contribution
            beyond = ~readable[:, None, None, :]
            s, scores = s.masked_fill(beyond, -math.inf), scores.masked_fill(beyond, 0.0)
        if self.sink_edge > 0.0:  # the oldest edge is not read
            unread = centers < self.sink_edge
            s = s.masked_fill(unread, -math.inf)
            w_sigma = w_sigma.masked_fill(unread, 0.0)
        prior = attention.mu_head.weight[0] + attention.mu_head.bias  # w_μ (bias cancels)  [N]
        p = torch.softmax(self.sharpness * s + prior, dim=-1)  # p_n  [b, H, Q, N]
        mu = torch.matmul(p, centers)  # Σ p_n c_n  [b, H, Q]
        spread = (p * (centers - mu.unsqueeze(-1)).square()).sum(-1)  # Σ p_n (c_n − μ)²
        extra = F.softplus(torch.matmul(scores, w_sigma) + attention.sigma_head.bias)
        log_mass = torch.logsumexp(s, dim=-1) if with_mass else None  # log Σ_n exp(s_n)
        return p, mu, (spread + extra).clamp(min=c.min_sigma_sq), log_mass


@register
@dataclass(frozen=True)
class ContentDensity(DiscreteDensity):
    """A Gaussian at the moments of the discrete attention over the centres (module doc)."""

    kind: ClassVar[str] = "content"
    reads_places: ClassVar[bool] = False


@register
@dataclass(frozen=True)
class MixtureDensity(DiscreteDensity):
    """The discrete attention over the centres itself: z = Σ_n p_n x̄(c_n) W^V (module doc)."""

    kind: ClassVar[str] = "mixture"
    reads_places: ClassVar[bool] = True


__all__ = ["ContentDensity", "DiscreteDensity", "MixtureDensity", "NormalizedDensity", "SCORE_EPS"]
