"""The ∞-former's long-term memory: a continuous signal x̄(t) = Bᵀ ψ(t) over t ∈ [0, 1] that
costs N×e however long the past is (paper §3.2–3.4, SPEC §2, §4–6).

Everything about the *stream* lives in `LongTermState`, passed in and returned; the module holds
only parameters (the CNN gate) and caches of constants (the design matrices G).

    first fit after a reset         B = G_Lᵀ X                                  (SPEC §2)
    unbounded update (each segment) x̃ = B_pastᵀ ψ(u),  u = sample positions     (SPEC §4)
                                    B = G_infᵀ [x̃ at τ·i/M ; X at (τ, 1)]
    sticky memories                 u drawn from the histogram of past attention (SPEC §5)
    smoothing                       X ← X ⊙ sigmoid(Conv1d(X))                  (SPEC §6)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import (
    check_finite,
    check_positive_int,
    check_range,
    check_shape,
    check_tensor,
)
from .basis import GaussianBasis
from .ridge import RidgeRegression, evaluate_signal, fit_coefficients


@dataclass(frozen=True)
class LongTermConfig:
    """Hyper-parameters of the long-term memory and its continuous attention.

    Paper values: sorting N=512, widths (0.01, 0.05), λ=1, τ=0.75, M=512;
    GPT-2 N=512, widths (0.005, 0.01), λ=0.5, τ=0.5.
    """

    dim: int  # e: size of the stored vectors, of the queries and of W^K, W^V
    num_heads: int = 6  # H (head size d = e / H)
    num_basis: int = 256  # N
    widths: tuple[float, ...] = (0.01, 0.05)
    ridge_lambda: float = 1.0  # λ
    tau: float = 0.75  # τ: the old signal is squeezed into [0, τ]
    num_samples: int = 512  # M: points at which the old signal is resampled
    edge_padding: bool = True
    conv_gate: bool = True
    sticky: bool = False
    sticky_bins: int = 128
    sigma_0: float = 0.05  # σ₀ of the KL prior
    min_sigma_sq: float = 1e-4  # clamp on σ² (1e-6 is unsafe in float32)
    out_dim: int | None = None  # size of the context (default: dim)
    query_projection: bool = False  # own W^Q; otherwise queries come already projected

    def __post_init__(self) -> None:
        object.__setattr__(self, "widths", tuple(float(w) for w in self.widths))
        check_positive_int("dim", self.dim)
        check_positive_int("num_heads", self.num_heads)
        if self.dim % self.num_heads:
            raise ValueError(f"dim ({self.dim}) must be divisible by num_heads ({self.num_heads})")
        check_positive_int("num_basis", self.num_basis)
        if not self.widths or any(not (w > 0 and math.isfinite(w)) for w in self.widths):
            raise ValueError(f"widths must be positive and finite, got {self.widths}")
        if self.num_basis % len(self.widths):
            raise ValueError(
                f"num_basis (N={self.num_basis}) must be a multiple of the number of widths "
                f"({len(self.widths)})"
            )
        check_range("ridge_lambda", self.ridge_lambda, 0.0)
        check_range("tau", self.tau, 0.0, 1.0, low_open=True, high_open=True)
        check_positive_int("num_samples", self.num_samples)
        check_positive_int("sticky_bins", self.sticky_bins)
        check_range("sigma_0", self.sigma_0, 0.0, low_open=True)
        check_range("min_sigma_sq", self.min_sigma_sq, 0.0, low_open=True)
        if self.out_dim is not None:
            check_positive_int("out_dim", self.out_dim)

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads


@dataclass
class LongTermState:
    """The long-term memory of a batch of parallel streams.

    coefficients    B [batch, N, e]      the signal x̄(t) = Bᵀ ψ(t) of each row
    attention_mass  [batch, bins]        histogram of the last attention densities (sticky
                                         memories); uniform when there was none
    empty           bool [batch]         rows with nothing in memory (fresh stream or reset)
    """

    coefficients: torch.Tensor
    attention_mass: torch.Tensor
    empty: torch.Tensor

    @property
    def batch_size(self) -> int:
        return self.coefficients.shape[0]

    def detach(self) -> LongTermState:
        return LongTermState(*(getattr(self, f.name).detach() for f in fields(self)))

    def to(self, device: torch.device | str) -> LongTermState:
        return LongTermState(*(getattr(self, f.name).to(device) for f in fields(self)))

    def tensors(self) -> dict[str, torch.Tensor]:
        """Flat dict for saving (safetensors)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> LongTermState:
        missing = [f.name for f in fields(cls) if f.name not in tensors]
        if missing:
            raise ValueError(f"long-term state is missing tensors {missing}")
        return cls(**{f.name: tensors[f.name] for f in fields(cls)})

    def reset(self, rows: torch.Tensor) -> LongTermState:
        """Clear the rows flagged in the boolean mask `rows` [batch] (their document ended)."""
        check_shape("rows", rows, (self.batch_size,))
        if rows.dtype != torch.bool:
            raise TypeError(f"rows must be a bool mask, got dtype {rows.dtype}")
        rows = rows.to(self.coefficients.device)
        keep = (~rows).to(self.coefficients.dtype)
        bins = self.attention_mass.shape[-1]
        uniform = torch.full_like(self.attention_mass, 1.0 / bins)
        return LongTermState(
            coefficients=self.coefficients * keep[:, None, None],
            attention_mass=torch.where(rows[:, None], uniform, self.attention_mass),
            empty=self.empty | rows,
        )


class LongTermMemory(nn.Module):
    """Fits, updates and resamples the continuous long-term memory. Holds no stream state."""

    def __init__(self, config: LongTermConfig) -> None:
        super().__init__()
        self.config = config
        self.basis = GaussianBasis(config.num_basis, config.widths)
        self.ridge = RidgeRegression(self.basis, config.ridge_lambda, config.edge_padding)
        # X ← X ⊙ sigmoid(Conv1d(X)): a gate that smooths the vectors over time before fitting
        self.gate = (
            nn.Conv1d(config.dim, config.dim, kernel_size=3, padding=1)
            if config.conv_gate
            else None
        )

    # ---------------------------------------------------------------- state
    def init_state(
        self,
        batch_size: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> LongTermState:
        check_positive_int("batch_size", batch_size)
        c = self.config
        return LongTermState(
            coefficients=torch.zeros(batch_size, c.num_basis, c.dim, device=device, dtype=dtype),
            attention_mass=torch.full(
                (batch_size, c.sticky_bins), 1.0 / c.sticky_bins, device=device, dtype=dtype
            ),
            empty=torch.ones(batch_size, dtype=torch.bool, device=device),
        )

    def reset(self, state: LongTermState, rows: torch.Tensor) -> LongTermState:
        """Clear the rows whose document ended (bool mask [batch])."""
        return state.reset(rows)

    def check_state(self, state: LongTermState) -> None:
        if not isinstance(state, LongTermState):
            raise TypeError(f"state must be a LongTermState, got {type(state).__name__}")
        c = self.config
        check_shape("state.coefficients", state.coefficients, (None, c.num_basis, c.dim))
        batch = state.batch_size
        check_shape("state.attention_mass", state.attention_mass, (batch, c.sticky_bins))
        check_shape("state.empty", state.empty, (batch,))

    # ---------------------------------------------------------------- design matrices
    def infinite_design(self, length: int, device, dtype) -> torch.Tensor:
        """G_inf [M + L, N]: M old samples at τ·i/M (i = 1..M), then L new vectors at
        τ + (1 − τ)(i + ½)/L, all in one regression."""
        c = self.config

        def positions() -> torch.Tensor:
            old = c.tau * torch.arange(1, c.num_samples + 1, dtype=torch.float64) / c.num_samples
            new = c.tau + (1 - c.tau) * (torch.arange(length, dtype=torch.float64) + 0.5) / length
            return torch.cat([old, new])

        return self.ridge.design(
            ("infinite", c.num_samples, c.tau, length), positions, device, dtype
        )

    # ---------------------------------------------------------------- sticky memories
    def attention_histogram(self, mu: torch.Tensor, sigma_sq: torch.Tensor) -> torch.Tensor:
        """p_b ∝ Σ_{h,q} [Φ((b₊ − μ)/σ) − Φ((b₋ − μ)/σ)] over equal bins of [0, 1], normalised
        per row. mu, sigma_sq [batch, ...] → [batch, bins]."""
        bins = self.config.sticky_bins
        edges = torch.linspace(0, 1, bins + 1, device=mu.device, dtype=mu.dtype)  # [bins + 1]
        mu = mu.detach().flatten(1).unsqueeze(-1)  # [batch, H·Q, 1]
        sigma = sigma_sq.detach().flatten(1).sqrt().unsqueeze(-1)
        cdf = torch.special.ndtr((edges - mu) / sigma)  # [batch, H·Q, bins + 1]
        mass = (cdf[..., 1:] - cdf[..., :-1]).sum(1)  # [batch, bins]
        # a little uniform mass keeps every bin reachable and the histogram defined when all
        # the attention fell outside [0, 1]
        mass = mass + 1e-6 * mass.sum(-1, keepdim=True) + 1e-12
        return mass / mass.sum(-1, keepdim=True)

    def observe(
        self, state: LongTermState, mu: torch.Tensor, sigma_sq: torch.Tensor
    ) -> LongTermState:
        """Record where this segment's queries attended (μ, σ² [batch, heads, queries]) for the
        next sticky resampling. A no-op unless `config.sticky`."""
        if not self.config.sticky:
            return state
        check_shape("mu", mu, (state.batch_size, None, None))
        mass = self.attention_histogram(mu, sigma_sq).to(state.attention_mass.dtype)
        return replace(
            state, attention_mass=torch.where(state.empty[:, None], state.attention_mass, mass)
        )

    def sample_positions(
        self, state: LongTermState, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Where to read the old signal before squeezing it: u [M] (uniform grid i/M) or
        [batch, M] (sticky: drawn from the attention histogram, sorted)."""
        c = self.config
        B = state.coefficients
        if not c.sticky:
            return (
                torch.arange(1, c.num_samples + 1, device=B.device, dtype=B.dtype) / c.num_samples
            )
        p = state.attention_mass.to(B.dtype)  # [batch, bins]
        bins = p.shape[-1]
        if self.training:
            # bin by p_b, then uniformly inside it (the authors' code always took the left edge)
            idx = torch.multinomial(p, c.num_samples, replacement=True, generator=generator)
            offset = torch.rand(idx.shape, generator=generator, device=B.device, dtype=B.dtype)
            u = (idx.to(B.dtype) + offset) / bins
            return u.sort(dim=-1).values
        # evaluation: deterministic quantiles u_i = P⁻¹((i − ½)/M) of the piecewise-uniform density
        cdf = torch.cumsum(p, -1)  # [batch, bins]: P at the right edge of each bin
        q = (torch.arange(c.num_samples, device=B.device, dtype=B.dtype) + 0.5) / c.num_samples
        q = q.expand(p.shape[0], -1).contiguous()  # [batch, M]
        idx = torch.searchsorted(cdf, q, right=True).clamp_(max=bins - 1)  # bin holding q
        left = torch.gather(cdf, 1, idx) - torch.gather(p, 1, idx)
        frac = ((q - left) / torch.gather(p, 1, idx)).clamp_(0, 1)
        return (idx.to(B.dtype) + frac) / bins

    # ---------------------------------------------------------------- update
    def smooth(self, x: torch.Tensor) -> torch.Tensor:
        """X ← X ⊙ sigmoid(Conv1d(X)) over time: x [batch, L, e]."""
        if self.gate is None:
            return x
        # The Conv1d as a 2-D convolution of height 1 in channels-last layout: x [batch, L, e]
        # already is that layout, so the convolution reads it in place and writes the gate as
        # [batch, L, e] too, and the product and its backward run on contiguous tensors (~30%
        # faster than a Conv1d over the transposed view). Same weights, same math.
        g = F.conv2d(
            x.transpose(1, 2).unsqueeze(2),  # [batch, e, 1, L], channels-last in memory
            self.gate.weight.unsqueeze(2),  # [e, e, 1, 3]
            self.gate.bias,
            padding=(0, self.gate.padding[0]),
        )
        return x * torch.sigmoid(g.squeeze(2).transpose(1, 2))  # [batch, L, e]

    def update(
        self,
        state: LongTermState,
        x: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> LongTermState:
        """Put the new vectors x [batch, L, e] into memory and return the new state.

        Empty rows get the first fit; the others the unbounded update (old signal resampled,
        squeezed into [0, τ], refitted with x). B_past is detached; the returned coefficients
        carry the graph of this step only (through the CNN gate and x), so callers detach the
        state before keeping it across segments.
        """
        self.check_state(state)
        c = self.config
        check_tensor("x", x, 3)
        if x.shape[0] != state.batch_size or x.shape[2] != c.dim:
            raise ValueError(
                f"x must have shape (batch={state.batch_size}, length, e={c.dim}), "
                f"got {tuple(x.shape)}"
            )
        if x.shape[1] == 0:
            raise ValueError("x must hold at least one vector (got a zero-length segment)")
        check_finite("x", x)
        x = self.smooth(x.to(state.coefficients.dtype))
        length = x.shape[1]
        empty = state.empty.to(x.device)
        B_past = state.coefficients.detach()  # no backprop through time
        B_new = None
        if bool(empty.any()):
            # first fit: B = G_Lᵀ X                                        [batch, N, e]
            B_new = fit_coefficients(x, self.ridge.segment(length, x.device, x.dtype))
        if not bool(empty.all()):
            u = self.sample_positions(state, generator)  # [M] or [batch, M]
            x_old = evaluate_signal(B_past, self.basis, u)  # x̃ = B_pastᵀ ψ(u)  [batch, M, e]
            G_inf = self.infinite_design(length, x.device, x.dtype)  # [M + L, N]
            B_upd = fit_coefficients(torch.cat([x_old, x], dim=1), G_inf)  # [batch, N, e]
            B_new = B_upd if B_new is None else torch.where(empty[:, None, None], B_new, B_upd)
        bins = c.sticky_bins
        return LongTermState(
            coefficients=B_new,
            attention_mass=torch.full_like(state.attention_mass, 1.0 / bins),
            empty=torch.zeros_like(state.empty),
        )

    def signal(self, state: LongTermState, t: torch.Tensor) -> torch.Tensor:
        """Read the stored signal x̄(t) back at positions t [T] → [batch, T, e]."""
        return evaluate_signal(state.coefficients, self.basis, t)


__all__ = ["LongTermConfig", "LongTermMemory", "LongTermState"]
