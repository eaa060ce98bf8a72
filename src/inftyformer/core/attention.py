"""Continuous attention over the long-term memory (paper §3.1–3.2).

Keys and values come from the memory's coefficients, one per basis function:

    K = B W^K,  V = B W^V ∈ ℝ^{N×e}                                   (split into H heads)
    s = K q / √d ∈ ℝ^N                                                 (per head and query)
    μ = sigmoid(w_μᵀ s),  σ² = softplus(w_σᵀ s) ≥ 1e-4                 (the query's density)

How the scores become the density is the config's density strategy (the `Density` seam,
`seams.py`): the paper's (`density.py`), or ours (`inftyformer.extensions.densities`:
standardised scores, or a discrete attention over the basis centres that reads *where the
content matches*). `read_heads` returns each head's read before the heads are merged, with the
read's log-mass log Σ_n exp(s_n) (a discrete density), for a read merged into a pretrained
model's own heads (`hf/head_read.py`).

    r = E_p[ψ] = 𝒩(μ; c, σ² + w²)                                      (continuous softmax)
    z = rᵀ V  = E_p[v(t)],  heads merged, then an output projection.

The KL term ½(σ²/σ₀² − log(σ²/σ₀²) − 1) keeps σ near σ₀. Rows whose memory is empty read
nothing (their context is exactly 0 and they add no KL), but every parameter stays in the graph,
so DistributedDataParallel needs no `find_unused_parameters`.

Validation at the boundary: `attention.attend(query, state)` checks a query and a state handed in
from outside, then calls the module; the module call itself (`attention(query, state)`, which the
transformer block and the pretrained adapter's hooks make, so that forward hooks see every read)
holds only the computation.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from .._checks import NonFiniteError, ValueChecks, check_dtype, check_tensor
from .._init import init_projection
from ..precision import allowed_dtypes
from .basis import GaussianBasis
from .config import LongTermConfig
from .continuous_softmax import _variance_kl
from .density import PreparedMemory, softplus_bias
from .fused_read import expected_values
from .seams import kinds_that
from .state import LongTermState


@dataclass
class LongTermAttentionOutput:
    context: torch.Tensor  # [batch, Q, out_dim]
    kl: torch.Tensor  # scalar: mean variance-KL over non-empty rows, heads and queries
    mu: torch.Tensor  # [batch, H, Q] (for sticky memories)
    sigma_sq: torch.Tensor  # [batch, H, Q]


@dataclass
class HeadsRead:
    """Each head's read before the heads are merged (`LongTermAttention.read_heads`)."""

    z: torch.Tensor  # E_p[v(t)]  [batch, H, Q, d]
    log_mass: torch.Tensor  # log Σ_n exp(s_n)  [batch, H, Q] (−inf: an empty memory)
    mu: torch.Tensor  # [batch, H, Q]
    sigma_sq: torch.Tensor  # [batch, H, Q]
    kl: torch.Tensor  # scalar, as LongTermAttentionOutput.kl


class LongTermAttention(nn.Module):
    # The continuous read runs in blocks of queries whose Gaussians [batch, H, block, N] hold
    # about this many values (1 MiB in float32: in cache, and small enough that its scratch
    # tensors are reused from the heap rather than page-faulted in every call). Measured on
    # the paper's shapes and cpu-small (benchmarks/bench_core.py); None: one block.
    query_block_elements: int | None = 1 << 18

    def __init__(self, config: LongTermConfig, basis: GaussianBasis | None = None) -> None:
        """`basis`: the ψ of the memory this attention reads (a layer's memory and attention
        share one); a new one from `config` when not given."""
        super().__init__()
        config.check_sized()
        self.config = config
        e, N = config.dim, config.num_basis
        if basis is None:
            basis = GaussianBasis(N, config.widths)
        elif basis.num_basis != N or basis.width_values != config.widths:
            raise ValueError(
                f"basis (N={basis.num_basis}, widths={basis.width_values}) does not match the "
                f"config (N={N}, widths={config.widths})"
            )
        self.basis = basis
        self.query = nn.Linear(e, e) if config.query_projection else None
        self.key = nn.Linear(e, e, bias=False)  # W^K
        self.value = nn.Linear(e, e, bias=False)  # W^V
        self.mu_head = nn.Linear(N, 1)  # w_μ, shared by the heads
        self.sigma_head = nn.Linear(N, 1)  # w_σ
        self.out = nn.Linear(e, config.out_dim or e)
        self.init_sigma_bias()

    def reset_density(self) -> None:
        """w_μ, w_σ anew: PyTorch's default initialisation, then σ at `config.sigma_init`."""
        self.mu_head.reset_parameters()
        self.sigma_head.reset_parameters()
        self.init_sigma_bias()

    @torch.no_grad()
    def init_sigma_bias(self) -> None:
        """The bias of w_σ where the density starts σ² (`Density.initial_sigma_sq`: its
        `sigma_init`, or the floor for a discrete density); anything that re-initialises w_σ (a
        model's weight initialisation) calls this after it."""
        # softplus(b) = σ²: b = log(exp(σ²) − 1); draws nothing from the RNG
        sigma_sq = self.config.density.initial_sigma_sq(self.config)
        if sigma_sq is not None:
            self.sigma_head.bias.fill_(softplus_bias(sigma_sq))

    def reset_projections(self, std: float) -> None:
        """The projections (W^Q when present, W^K, W^V, the output) ~ N(0, std²), so that the
        read starts at the scale of the backbone it is added to. The density heads w_μ, w_σ keep
        PyTorch's default initialisation: they set how spread the first densities are."""
        for projection in (self.query, self.key, self.value, self.out):
            if projection is not None:
                init_projection(projection, std)

    def prepare(self, state: LongTermState, dtype: torch.dtype) -> PreparedMemory:
        """What every read of `state` shares, computed once (the density's `prepare`: V = B W^V
        and its keys)."""
        return self.config.density.prepare(self, state, dtype)

    def attend(self, query: torch.Tensor, state: LongTermState) -> LongTermAttentionOutput:
        """The read of `forward` for a query and a state handed in from outside the library:
        both are checked first (types, shapes, dtypes, device, finite values and the state's
        invariants; one host synchronisation), then the module is called."""
        c = self.config
        if not isinstance(state, LongTermState):
            raise TypeError(f"state must be a LongTermState, got {type(state).__name__}")
        values = ValueChecks()
        state.check(c, "state", values=values)
        check_tensor("query", query, 3)
        if query.shape[0] != state.batch_size or query.shape[2] != c.dim:
            raise ValueError(
                f"query must have shape (batch={state.batch_size}, queries, e={c.dim}), "
                f"got {tuple(query.shape)}"
            )
        if query.shape[1] == 0:
            raise ValueError("query must hold at least one query vector (got 0 queries)")
        check_dtype("query", query, *allowed_dtypes(self.key.weight))
        for name, t in (("query", query), ("state.coefficients", state.coefficients)):
            if t.device != self.key.weight.device:
                raise ValueError(
                    f"{name} is on {t.device}, the attention on {self.key.weight.device}"
                )
        values.finite("query", query)
        values.run()
        out = self(query, state)
        _check_read(out, query)
        return out

    def forward(
        self,
        query: torch.Tensor,
        state: LongTermState,
        *,
        prepared: PreparedMemory | None = None,
        heads: bool = False,
    ) -> LongTermAttentionOutput | HeadsRead:
        """query [batch, Q, e] (already projected unless `config.query_projection`), read from
        `state`, both as the library builds them (a block's queries, a state the model checked;
        `attend` checks inputs from outside first). `prepared`: `prepare(state, query.dtype)`
        computed once for many reads of an unchanging state (generation), instead of at every
        call. `heads`: `query` holds each head's projected queries [batch, H, Q, d]
        (`project_queries`, turned as the caller's attention turns its own), and each head's
        read comes back before the heads are merged (`read_heads`), for a caller that merges
        them into its own; a module call either way, so that forward hooks see every read."""
        if heads:
            return self.read_heads(query, state, prepared)
        c = self.config
        batch, num_q, _ = query.shape
        H, d = c.num_heads, c.head_dim
        if prepared is None:
            prepared = self.prepare(state, query.dtype)
        read = c.density.read(self, self.project_queries(query), prepared, False)
        z = read.z.transpose(1, 2).reshape(batch, num_q, H * d)  # [batch, Q, e]

        filled = (~state.empty).to(device=query.device, dtype=query.dtype)  # [batch]
        # in place: the projection's backward does not need its output
        context = self.out(z).mul_(filled[:, None, None])  # [batch, Q, out_dim]
        return LongTermAttentionOutput(
            context=context, kl=self._kl(read.sigma_sq, filled), mu=read.mu, sigma_sq=read.sigma_sq
        )

    def project_queries(self, query: torch.Tensor) -> torch.Tensor:
        """query [batch, Q, e] → each head's query [batch, H, Q, d] (W^Q first when the config
        has its own)."""
        c = self.config
        batch, num_q, _ = query.shape
        q = self.query(query) if self.query is not None else query
        return q.view(batch, num_q, c.num_heads, c.head_dim).transpose(1, 2)  # [batch, H, Q, d]

    def read_heads(
        self, q: torch.Tensor, state: LongTermState, prepared: PreparedMemory | None = None
    ) -> HeadsRead:
        """Each head's read before the heads are merged and projected (a density that reads
        places): q [batch, H, Q, d] each head's query (`project_queries`). The caller merges z
        into its own heads by the log-mass (`hf/head_read.py`); rows whose memory is empty get
        log-mass −inf (no weight) and z = 0."""
        density = self.config.density
        if not density.discrete:
            raise ValueError(
                f"read_heads needs a density that reads places (discrete: "
                f"{', '.join(kinds_that('density', 'discrete'))}), got {density.kind!r}"
            )
        if prepared is None:
            prepared = self.prepare(state, q.dtype)
        read = self.config.density.read(self, q, prepared, True)
        filled = ~state.empty.to(q.device)  # [batch]
        log_mass = read.log_mass.masked_fill(~filled[:, None, None], -math.inf)
        z = read.z * filled[:, None, None, None].to(read.z.dtype)
        kl = self._kl(read.sigma_sq, filled.to(q.dtype))
        return HeadsRead(z=z, log_mass=log_mass, mu=read.mu, sigma_sq=read.sigma_sq, kl=kl)

    def _kl(self, sigma_sq: torch.Tensor, filled: torch.Tensor) -> torch.Tensor:
        """Mean variance-KL over the rows whose memory holds something (filled [batch])."""
        kl_rows = _variance_kl(sigma_sq, self.config.sigma_0).mean(dim=(1, 2))
        return (kl_rows * filled).sum() / filled.sum().clamp(min=1.0)

    def expected_values(
        self, mu: torch.Tensor, sigma_sq: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """z = E_p[ψ]ᵀ V per head and query: mu, sigma_sq [batch, H, Q], v [batch, H, N, d]
        → [batch, H, Q, d], fused in blocks of queries (see `query_block_elements`)."""
        return expected_values(mu, sigma_sq, v, self.basis, self.query_block_elements)


def _check_read(out: LongTermAttentionOutput, query: torch.Tensor) -> None:
    """A finite query can still read NaN: near float32's limit (entries of ~1e38) its scores
    overflow to ±inf. Named instead of returned (one host synchronisation)."""
    checks = ValueChecks()
    fields = (out.context, out.mu, out.sigma_sq, out.kl)
    ok = torch.stack([torch.isfinite(t.detach()).all() for t in fields]).all()

    def message() -> str:
        largest = float(query.detach().abs().max())
        return (
            f"query: its read is not finite (the query's largest entry, {largest:.3g}, makes "
            "its scores overflow float32's range of ±3.4e38): scale the query down"
        )

    checks.require(ok, message, NonFiniteError)
    checks.run()


@contextmanager
def record_reads(model: nn.Module) -> Iterator[list[list[LongTermAttentionOutput]]]:
    """Every read of every `LongTermAttention` in `model` while the block runs: one list per
    layer (in module order), one output per call (a `LongTermAttentionOutput`, or a `HeadsRead`
    for a read merged into a pretrained model's heads), with their graphs, for a loss on where
    the reads land (the facts task's `read_weight`)."""
    layers = [m for m in model.modules() if isinstance(m, LongTermAttention)]
    reads: list[list[LongTermAttentionOutput | HeadsRead]] = [[] for _ in layers]
    handles = [
        layer.register_forward_hook(lambda module, args, out, i=i: reads[i].append(out))
        for i, layer in enumerate(layers)
    ]
    try:
        yield reads
    finally:
        for handle in handles:
            handle.remove()


def density_statistics(
    mu: torch.Tensor, sigma_sq: torch.Tensor, empty: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """How much the reads of one call depend on the query, over the rows whose memory holds
    something: (median σ, μ's spread, rows), three 0-d float64 tensors (no host synchronisation).

    μ's spread is the standard deviation of μ across the queries of a head, averaged over rows and
    heads: ≈ 0 when every query reads the same place (a flat per-layer average, not retrieval).
    mu, sigma_sq [batch, H, Q]; empty [batch] bool. With no such row (or one query) all are 0."""
    filled = ~empty.to(mu.device)  # [batch]
    rows = filled.sum().double()
    if mu.shape[-1] < 2:
        zero = rows.new_zeros(())
        return zero, zero, zero
    mu, sigma_sq = mu.detach()[filled].double(), sigma_sq.detach()[filled].double()
    if mu.numel() == 0:
        return rows.new_zeros(()), rows.new_zeros(()), rows
    sigma_median = sigma_sq.sqrt().median()
    mu_spread = mu.std(dim=-1).mean()  # across queries, then over rows and heads
    return sigma_median, mu_spread, rows
