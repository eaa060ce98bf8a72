"""The ∞-former's long-term memory: a continuous signal x̄(t) = Bᵀ ψ(t) over t ∈ [0, 1] that
costs N×e however long the past is (paper §3.2–3.4).

Everything about the *stream* lives in `LongTermState` (core/state.py), passed in and
returned; the module holds only parameters (the CNN gate) and caches of constants (the design
matrices G).

    first fit after a reset         B = G_Lᵀ X                                  (eq. 9)
    unbounded update (each segment) x̃ = B_pastᵀ ψ(u),  u = sample positions
                                    B = G_infᵀ [x̃ at τ·i/M ; X at (τ, 1)]
    sticky memories                 u drawn from the histogram of past attention, and B
                                    scaled so that it holds no more than its data
    smoothing (the CNN gate)        X ← X ⊙ sigmoid(Conv1d(X))

How the old signal makes room (the update and the sticky sampling, the paper's "unbounded
memory" and "sticky memories") is the config's squeeze strategy (`squeeze.py`, the `Squeeze`
seam); the memory gates the new vectors, hands them to it and records where reads attended. The
settings are `config.py`.

The public methods (`update`, `update_traced`, `observe`, `sample_positions`, `signal`) check what
they are handed and call private ones that hold only the computation (`_update`, `_observe`,
`_sample_positions`); the transformer block and the pretrained adapter, whose states the model
validated where they entered, call the private ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import (
    ValueChecks,
    check_floating,
    check_generator,
    check_positive_int,
    check_shape,
    check_tensor,
)
from ..precision import allowed_dtypes, wide_dtype
from .basis import GaussianBasis
from .config import LongTermConfig
from .ridge import RidgeRegression, evaluate_signal, supremum_grid
from .state import LongTermState


@dataclass
class LongTermUpdate:
    """What one `LongTermMemory.update` did, for inspection (`inftyformer.inspection`).

    stored     [batch, L, e]        the vectors fitted (after the CNN gate), placed at
                                    (i + ½)/L by a first fit, else at τ + (1 − τ)(i + ½)/L
    samples    [M] or [batch, M]    where the old signal was read before it was squeezed to
                                    τ·i/M, i = 1..M (None when every row got a first fit;
                                    a squeeze that does not resample: where it read the old
                                    signal, e.g. the K centres)
    first_fit  bool [batch]         rows whose memory was empty (first fit, nothing squeezed)
    """

    stored: torch.Tensor
    samples: torch.Tensor | None
    first_fit: torch.Tensor

    def detach(self) -> LongTermUpdate:
        return LongTermUpdate(
            self.stored.detach(),
            None if self.samples is None else self.samples.detach(),
            self.first_fit,
        )


class LongTermMemory(nn.Module):
    """Fits, updates and resamples the continuous long-term memory. Holds no stream state."""

    def __init__(self, config: LongTermConfig, designs: dict | None = None) -> None:
        """`designs`: a dict of design matrices to share with the other layers' memories (see
        `RidgeRegression`); each memory keeps its own when None."""
        super().__init__()
        config.check_sized()
        self.config = config
        self.basis = GaussianBasis(config.num_basis, config.widths)
        self.ridge = RidgeRegression(
            self.basis, config.ridge_lambda, config.edge_padding, cache=designs
        )
        # X ← X ⊙ sigmoid(Conv1d(X)): a gate that smooths the vectors over time before fitting
        self.gate = (
            nn.Conv1d(config.dim, config.dim, kernel_size=3, padding=1)
            if config.conv_gate
            else None
        )
        self._grid_basis: dict[tuple, torch.Tensor] = {}  # ψ on `supremum_grid` (sticky)

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
                (batch_size, c.squeeze.bins), 1.0 / c.squeeze.bins, device=device, dtype=dtype
            ),
            observed=torch.zeros(batch_size, device=device, dtype=dtype),
            empty=torch.ones(batch_size, dtype=torch.bool, device=device),
            stored=torch.zeros(batch_size, dtype=torch.int64, device=device),
            # the squeeze's own records of the stream (none for most squeezes)
            records=c.squeeze.initial_records(batch_size, c.num_centers, device),
        )

    def reset(self, state: LongTermState, rows: torch.Tensor) -> LongTermState:
        """Clear the rows whose document ended (bool mask [batch])."""
        return state.reset(rows)

    def state_dtypes(self) -> tuple[torch.dtype, ...] | None:
        """The floating dtypes a state may have: the CNN gate's (under autocast also the autocast
        dtype), any when there is no gate."""
        if self.gate is None:
            return None
        return allowed_dtypes(self.gate.weight)

    def check_state(
        self, state: LongTermState, name: str = "state", values: ValueChecks | None = None
    ) -> None:
        """Validate `state` for this memory (see `LongTermState.check`); values are read here
        with one synchronisation unless `values` collects them for the caller."""
        if not isinstance(state, LongTermState):
            raise TypeError(f"{name} must be a LongTermState, got {type(state).__name__}")
        state.check(self.config, name, self.state_dtypes(), values)

    # ---------------------------------------------------------------- sticky memories
    def grid_basis(self, device, dtype) -> torch.Tensor:
        """ψ on `ridge.supremum_grid` [T, N], at least float32, cached per device and dtype."""
        key = (str(device), wide_dtype(dtype))
        if key not in self._grid_basis:
            psi = self.basis.float64(supremum_grid(self.basis))
            self._grid_basis[key] = psi.to(device=device, dtype=key[1])
        return self._grid_basis[key]

    def attention_histogram(self, mu: torch.Tensor, sigma_sq: torch.Tensor) -> torch.Tensor:
        """p_b ∝ Σ_{h,q} [Φ((b₊ − μ)/σ) − Φ((b₋ − μ)/σ)] over equal bins of [0, 1], normalised
        per row. mu, sigma_sq [batch, ...] → [batch, bins]."""
        bins = self.config.squeeze.bins
        # at least float32: in float16/bfloat16 the normalised histogram is off by ~1e-2
        dtype = torch.promote_types(torch.promote_types(mu.dtype, sigma_sq.dtype), torch.float32)
        edges = torch.linspace(0, 1, bins + 1, device=mu.device, dtype=dtype)  # [bins + 1]
        mu = mu.detach().to(dtype).flatten(1).unsqueeze(-1)  # [batch, H·Q, 1]
        sigma = sigma_sq.detach().to(dtype).flatten(1).sqrt().unsqueeze(-1)
        cdf = torch.special.ndtr((edges - mu) / sigma)  # [batch, H·Q, bins + 1]
        mass = (cdf[..., 1:] - cdf[..., :-1]).sum(1)  # [batch, bins]
        # a little uniform mass keeps every bin reachable and the histogram defined when all
        # the attention fell outside [0, 1]
        mass = mass + 1e-6 * mass.sum(-1, keepdim=True) + 1e-12
        return mass / mass.sum(-1, keepdim=True)

    def observe(
        self, state: LongTermState, mu: torch.Tensor, sigma_sq: torch.Tensor
    ) -> LongTermState:
        """Sticky memories: record where a call's queries attended (μ, σ² [batch, heads,
        queries]) for the next resampling. The histogram is averaged over every call since the
        last update, weighted by its number of queries, so that one call of C queries and C calls
        of one query give about the same histogram. Rows with an empty memory read nothing and
        record nothing. A no-op unless `config.sticky`. Checks its arguments (one host
        synchronisation); the transformer block calls the unchecked `_observe`."""
        values = ValueChecks()
        self.check_state(state, values=values)
        check_shape("mu", mu, (state.batch_size, None, None))
        check_shape("sigma_sq", sigma_sq, tuple(mu.shape))
        check_floating("mu", mu)
        check_floating("sigma_sq", sigma_sq)
        values.finite("mu", mu)
        values.require(
            (sigma_sq.detach() > 0) & torch.isfinite(sigma_sq.detach()),
            "sigma_sq must be positive and finite everywhere",
        )
        values.run()
        return self._observe(state, mu, sigma_sq)

    def _observe(
        self, state: LongTermState, mu: torch.Tensor, sigma_sq: torch.Tensor
    ) -> LongTermState:
        """`observe` on valid arguments."""
        # no sticky memories, or nothing attended: nothing recorded
        if not self.config.squeeze.sticky or mu.shape[-1] == 0:
            return state
        hist = self.attention_histogram(mu, sigma_sq).to(state.attention_mass.dtype)  # [b, bins]
        queries = mu.shape[-1]
        seen = state.observed[:, None]  # [batch, 1]
        mass = (seen * state.attention_mass + queries * hist) / (seen + queries)
        observed = replace(state, attention_mass=mass, observed=state.observed + queries)
        return observed.select(~state.empty, state)

    def sample_positions(
        self, state: LongTermState, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Where a squeeze that resamples reads the old signal before squeezing it: u [M]
        (uniform grid i/M) or [batch, M] (sticky: drawn from the attention histogram, sorted).
        Checks the state."""
        if not self.config.squeeze.resamples:
            raise ValueError(
                f"squeeze {self.config.squeeze.kind!r} does not resample the old signal"
            )
        self.check_state(state)
        check_generator(generator)
        return self._sample_positions(state, generator)

    def _sample_positions(
        self, state: LongTermState, generator: torch.Generator | None
    ) -> torch.Tensor:
        """`sample_positions` for a valid state (the squeeze's, `squeeze.py`)."""
        return self.config.squeeze.sample_positions(self, state, generator)

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
        salience: torch.Tensor | None = None,
    ) -> LongTermState:
        """Put the new vectors x [batch, L, e] into memory and return the new state.

        Empty rows get the first fit; the others the unbounded update (old signal resampled,
        squeezed into [0, τ], refitted with x). B_past is detached; the returned coefficients
        carry the graph of this step only (through the CNN gate and x), so callers detach the
        state before keeping it across segments. Checks its arguments (one host
        synchronisation); the transformer block calls the unchecked `_update`.
        """
        return self.update_traced(state, x, generator, salience)[0]

    def update_traced(
        self,
        state: LongTermState,
        x: torch.Tensor,
        generator: torch.Generator | None = None,
        salience: torch.Tensor | None = None,
    ) -> tuple[LongTermState, LongTermUpdate]:
        """`update`, and what it did (`LongTermUpdate`: the vectors fitted after the gate, where
        the old signal was read before the squeeze, which rows got a first fit): the same
        computation, the record only keeps references to tensors it made anyway."""
        c = self.config
        values = ValueChecks()
        self.check_state(state, values=values)
        check_tensor("x", x, 3)
        if x.shape[0] != state.batch_size or x.shape[2] != c.dim:
            raise ValueError(
                f"x must have shape (batch={state.batch_size}, length, e={c.dim}), "
                f"got {tuple(x.shape)}"
            )
        if x.shape[1] == 0:
            raise ValueError("x must hold at least one vector (got a zero-length segment)")
        check_floating("x", x)
        if x.device != state.coefficients.device:
            raise ValueError(
                f"x is on {x.device}, the state on {state.coefficients.device}: "
                "use state.to(device)"
            )
        check_generator(generator)
        values.finite("x", x)
        if c.squeeze.wants_salience:  # the squeeze keeps places by the tokens' salience
            if salience is None:
                raise ValueError(
                    f"squeeze {c.squeeze.describe()} keeps places by the new tokens' salience: "
                    "it needs salience [batch, L]"
                )
            check_shape("salience", salience, tuple(x.shape[:2]))
            check_floating("salience", salience)
            values.require(~torch.isnan(salience), "salience must not be NaN")
        values.run()
        return self._update(state, x, generator, salience)

    def _update(
        self,
        state: LongTermState,
        x: torch.Tensor,
        generator: torch.Generator | None,
        salience: torch.Tensor | None = None,
    ) -> tuple[LongTermState, LongTermUpdate]:
        """`update_traced` on valid arguments (`salience` [batch, L]: a squeeze that
        `wants_salience` only)."""
        c = self.config
        x = self.smooth(x.to(state.coefficients.dtype))
        length = x.shape[1]
        empty = state.empty.to(x.device)
        # the squeeze: first fit, or the old signal made room for x and refitted  [batch, N, e]
        B_new, u, records = c.squeeze.fit(self, state, x, generator, salience)
        new_state = LongTermState(
            coefficients=B_new,
            attention_mass=torch.full_like(state.attention_mass, 1.0 / c.squeeze.bins),
            observed=torch.zeros_like(state.observed),
            empty=torch.zeros_like(state.empty),
            stored=state.stored + length,
            records=records,
        )
        return new_state, LongTermUpdate(stored=x, samples=u, first_fit=empty)

    def signal(self, state: LongTermState, t: torch.Tensor) -> torch.Tensor:
        """Read the stored signal x̄(t) back at positions t [T] → [batch, T, e]."""
        self.check_state(state)
        return evaluate_signal(state.coefficients, self.basis, t)


__all__ = ["LongTermMemory", "LongTermUpdate"]
