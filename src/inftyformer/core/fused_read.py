"""The continuous read z = E_p[ψ]ᵀ V = Σ_j r_j V_j, fused and in blocks of queries (paper
§3.1–3.2).

Per head and query the density p = 𝒩(μ, σ²) gives r_j = 𝒩(μ; c_j, σ² + w_j²) (the closed form of
core/continuous_softmax.py) and the context z = rᵀ V. Written as two autograd operations, r is a
[batch, H, Q, N] tensor that is written to memory, read back by the product with V, kept for the
backward, and streamed through memory several more times by the backward of exp and of the
exponent. Here r never exists whole: each block of queries computes its r while the block is in
cache, contracts it with V and drops it; the backward recomputes r block by block (one exp more,
nothing N-sized kept between forward and backward) and contracts the gradient in the same pass.

Backward, per query (d_k = μ − c_k, v_l = σ² + w_l², ∂L/∂r = ∂L/∂z Vᵀ, g_lk = (∂L/∂r_lk) r_lk):

    ∂L/∂V  = rᵀ ∂L/∂z
    ∂L/∂μ  = −Σ_l (1/v_l) Σ_k g_lk d_k                    (∂ log r_lk/∂μ  = −d_k / v_l)
    ∂L/∂σ² = ½ Σ_l (1/v_l) (Σ_k g_lk d_k² / v_l − Σ_k g_lk)  (∂ log r_lk/∂σ² = (d_k²/v_l − 1)/2v_l)

the exact derivatives of the closed form in (μ, σ²) — not the authors' backward through natural
parameters (README, "Deliberate departures") — checked against autograd of `continuous_softmax`
and by float64 gradcheck.

Under `torch.autocast` the read runs in float32 (r of a narrow density is 2 to the power of a large
exponent: bf16 would keep 2–3 significant digits of it); the result is float32.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict

import torch

from ..precision import full_precision, wide_dtype
from .basis import GaussianBasis

_LOG2_E = 1.0 / math.log(2.0)  # log₂ e


# Scratch tensors per thread, by (device, dtype, G, block, W, C): a cache of workspace, not state
# (every read overwrites them before reading them, and none is saved for the backward). One block
# of r holds about `block_elements` values, so each entry stays small (~2.5 MB at the default),
# and only the shapes used last are kept (a stream of calls of many lengths keeps a few).
_WORKSPACE = threading.local()
_WORKSPACE_SHAPES = 4


class _Scratch:
    """Tensors reused by every block of a call, and by the next call of the same shape in this
    thread (a shorter last block gets fresh ones). Blocks of a MB or more sit at glibc's mmap
    and trim thresholds: fresh ones every call were mapped (or the heap grown), page-faulted and
    given back, thousands of page faults per training step."""

    def __init__(self, like: torch.Tensor, groups: int, block: int, num_w: int, num_c: int):
        self.block = block
        cache = _WORKSPACE.__dict__.setdefault("tensors", OrderedDict())
        key = (like.device, like.dtype, groups, block, num_w, num_c)
        if key in cache:
            cache.move_to_end(key)
        else:
            cache[key] = (
                like.new_empty(groups, block, num_c),  # μ − c
                like.new_empty(groups, block, num_c),  # (μ − c)²
                like.new_empty(groups, block, num_w, num_c),  # r, then g
                like.new_empty(groups, block, num_w * num_c),  # ∂L/∂r
            )
            if len(cache) > _WORKSPACE_SHAPES:
                cache.popitem(last=False)  # the shape used longest ago
        self.d, self.d_sq, self.r, self.grad_r = cache[key]

    def get(self, name: str, size: int) -> torch.Tensor | None:
        return getattr(self, name) if size == self.block else None


def _densities(
    mu: torch.Tensor,
    sigma_sq: torch.Tensor,
    centers: torch.Tensor,
    widths_sq: torch.Tensor,
    scratch: _Scratch,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """r = 𝒩(μ; c_k, σ² + w_l²) for one block: mu, sigma_sq [G, q] → r [G, q, W, C], the
    differences d = μ − c [G, q, C] and the variances v = σ² + w² [G, q, W]."""
    q = mu.shape[1]
    var = sigma_sq.unsqueeze(-1) + widths_sq  # v_l = σ² + w_l²  [G, q, W]
    d = torch.sub(mu.unsqueeze(-1), centers, out=scratch.get("d", q))  # d_k = μ − c_k  [G, q, C]
    d_sq = torch.mul(d, d, out=scratch.get("d_sq", q))
    # log₂ r_lk = −log₂e · d_k² / (2 v_l) − ½ log₂(2π v_l): an outer product and a broadcast add
    # (two fast elementwise loops, unlike one addcmul broadcasting three ways) …
    coef = (-0.5 * _LOG2_E / var).unsqueeze(-1)  # [G, q, W, 1]
    r = torch.mul(d_sq.unsqueeze(-2), coef, out=scratch.get("r", q))  # [G, q, W, C]
    r.add_((-0.5 * torch.log2(2.0 * math.pi * var)).unsqueeze(-1))
    # … then 2^(·) in place. exp2, not exp: on x86 CPUs torch's float32 exp is ~4× slower, and
    # 10–30× slower again where the result underflows, as most entries of a narrow density do
    # (benchmarks/bench_core.py). Results below the smallest normal float (2^-126 in float32) are
    # raised to it, which keeps exp2 off its own slow path: an absolute change below 1.2e-38, far
    # under the round-off of any sum they enter.
    return r.clamp_(min=math.log2(torch.finfo(r.dtype).tiny)).exp2_(), d, var


def _block_size(groups: int, num_q: int, num_basis: int, block_elements: int | None) -> int:
    """Queries per block so that one block of r holds about `block_elements` values, rounded to
    a multiple of 8 (the GEMM kernels' width) and spread evenly over the queries."""
    if block_elements is None or num_q == 0:
        return max(1, num_q)
    block = max(1, block_elements // max(1, groups * num_basis))
    if block >= num_q:
        return num_q
    blocks = -(-num_q // block)
    block = -(-num_q // blocks)  # even blocks: no small remainder block
    return min(num_q, -(-block // 8) * 8)


def _blocks(num_q: int, block: int):
    """(start, stop) of each block of queries."""
    return [(start, min(num_q, start + block)) for start in range(0, num_q, block)]


def _forward(mu, sigma_sq, values_t, centers, widths_sq, block: int) -> torch.Tensor:
    """z [G, Q, d] (a transposed view) from mu, sigma_sq [G, Q] and Vᵀ [G, d, N], block by
    block. The products are taken transposed, zᵀ = Vᵀ rᵀ: MKL runs this thin shape (d ≈ 50)
    faster than r V."""
    (groups, num_q), (num_w, num_c) = mu.shape, (widths_sq.numel(), centers.numel())
    z_t = values_t.new_empty(groups, values_t.shape[1], num_q)  # zᵀ  [G, d, Q]
    scratch = _Scratch(values_t, groups, block, num_w, num_c)
    for start, stop in _blocks(num_q, block):
        r, _, _ = _densities(
            mu[:, start:stop], sigma_sq[:, start:stop], centers, widths_sq, scratch
        )
        r_t = r.view(groups, stop - start, -1).transpose(1, 2)  # rᵀ  [G, N, q]
        z_t[:, :, start:stop] = torch.bmm(values_t, r_t)  # zᵀ = Vᵀ rᵀ  [G, d, q]
    return z_t.transpose(1, 2)


class _ExpectedValues(torch.autograd.Function):
    """z = E_p[ψ]ᵀ V on flattened inputs mu, sigma_sq [G, Q], Vᵀ [G, d, N] (G = batch·H)."""

    @staticmethod
    def forward(ctx, mu, sigma_sq, values_t, centers, widths_sq, block):
        ctx.save_for_backward(mu, sigma_sq, values_t, centers, widths_sq)
        ctx.block = block
        return _forward(mu, sigma_sq, values_t, centers, widths_sq, block)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_z):
        mu, sigma_sq, values_t, centers, widths_sq = ctx.saved_tensors
        with full_precision(mu):  # the backward may run under autocast too
            grads = _backward(
                grad_z.to(mu.dtype).contiguous(),
                mu,
                sigma_sq,
                values_t,
                centers,
                widths_sq,
                ctx.block,
                ctx.needs_input_grad[:3],
            )
        return (*grads, None, None, None)


def _backward(grad_z, mu, sigma_sq, values_t, centers, widths_sq, block: int, needs):
    """(∂L/∂μ, ∂L/∂σ², ∂L/∂Vᵀ) from ∂L/∂z [G, Q, d], recomputing r block by block; None where
    `needs` (three bools) says a gradient is not wanted."""
    need_mu, need_sigma, need_values = needs
    (groups, num_q), (num_w, num_c) = mu.shape, (widths_sq.numel(), centers.numel())
    grad_mu = torch.empty_like(mu) if need_mu else None
    grad_sigma = torch.empty_like(sigma_sq) if need_sigma else None
    grad_values_t = torch.zeros_like(values_t) if need_values else None  # [G, d, N]
    grad_z_t = grad_z.transpose(1, 2)  # [G, d, Q]
    scratch = _Scratch(values_t, groups, block, num_w, num_c)
    for start, stop in _blocks(num_q, block):
        r, d, var = _densities(
            mu[:, start:stop], sigma_sq[:, start:stop], centers, widths_sq, scratch
        )
        r_flat = r.view(groups, stop - start, -1)  # [G, q, N]
        dz = grad_z[:, start:stop]  # ∂L/∂z  [G, q, d]
        if need_values:
            # ∂L/∂Vᵀ += (∂L/∂z)ᵀ r, the fast orientation of this product
            grad_values_t.baddbmm_(grad_z_t[:, :, start:stop], r_flat)
        if not (need_mu or need_sigma):
            continue
        g = torch.bmm(dz, values_t, out=scratch.get("grad_r", stop - start))  # ∂L/∂r  [G, q, N]
        g = g.mul_(r_flat).view_as(r)  # g = (∂L/∂r) r  [G, q, W, C]
        inv = var.reciprocal()  # 1 / v_l  [G, q, W]
        s0 = g.sum(-1)  # Σ_k g_lk  [G, q, W]
        s1 = g.mul_(d.unsqueeze(-2)).sum(-1)  # Σ_k g_lk d_k
        if need_mu:
            grad_mu[:, start:stop] = -(s1 * inv).sum(-1)
        if need_sigma:
            s2 = g.mul_(d.unsqueeze(-2)).sum(-1)  # Σ_k g_lk d_k²
            grad_sigma[:, start:stop] = 0.5 * ((s2 * inv - s0) * inv).sum(-1)
    return grad_mu, grad_sigma, grad_values_t


def expected_values(
    mu: torch.Tensor,
    sigma_sq: torch.Tensor,
    values: torch.Tensor,
    basis: GaussianBasis,
    block_elements: int | None = 1 << 18,
) -> torch.Tensor:
    """z = E_p[ψ]ᵀ V for p = 𝒩(μ, σ²): mu, sigma_sq [..., Q], values [..., N, d] → [..., Q, d].

    The leading dimensions (e.g. batch, heads) of the three must agree. Queries are processed in
    blocks of about `block_elements` values of r (None: all at once); the result does not depend
    on the blocking beyond float rounding.
    """
    lead = mu.shape[:-1]
    if sigma_sq.shape != mu.shape or values.shape[:-2] != lead:
        raise ValueError(
            f"mu {tuple(mu.shape)}, sigma_sq {tuple(sigma_sq.shape)} and values "
            f"{tuple(values.shape)} must be [..., Q], [..., Q] and [..., N, d] with the same "
            "leading dimensions"
        )
    if values.shape[-2] != basis.num_basis:
        raise ValueError(
            f"values must hold one row per basis function (N={basis.num_basis}), "
            f"got {tuple(values.shape)}"
        )
    num_q, dim = mu.shape[-1], values.shape[-1]
    groups = math.prod(lead)  # G = batch · H
    with full_precision(mu):
        dtype = torch.promote_types(wide_dtype(mu.dtype), wide_dtype(values.dtype))
        mu2 = mu.reshape(groups, num_q).to(dtype)
        sigma2 = sigma_sq.reshape(groups, num_q).to(dtype)
        # Vᵀ [G, d, N] contiguous: both products with it run in their fast orientation
        values_t = values.reshape(groups, -1, dim).to(dtype).transpose(1, 2).contiguous()
        centers = basis.center_grid.to(device=mu.device, dtype=dtype)
        widths_sq = basis.width_grid.to(device=mu.device, dtype=dtype).square()
        block = _block_size(groups, num_q, basis.num_basis, block_elements)
        if torch.is_grad_enabled() and (
            mu2.requires_grad or sigma2.requires_grad or values_t.requires_grad
        ):
            z = _ExpectedValues.apply(mu2, sigma2, values_t, centers, widths_sq, block)
        else:
            z = _forward(mu2, sigma2, values_t, centers, widths_sq, block)
    return z.view(*lead, num_q, dim)  # [..., Q, d], a transposed view of a [..., d, Q] tensor


__all__ = ["expected_values"]
