"""Continuous attention over the long-term memory (paper §3.1–3.2).

Keys and values come from the memory's coefficients, one per basis function:

    K = B W^K,  V = B W^V ∈ ℝ^{N×e}                                   (split into H heads)
    s = K q / √d ∈ ℝ^N                                                 (per head and query)
    μ = sigmoid(w_μᵀ s),  σ² = softplus(w_σᵀ s) ≥ 1e-4                 (the query's density)

`density="normalized"` (the default) standardises the scores over the N basis keys first,
ŝ = (s − mean(s)) / std(s), and feeds ŝ to w_μ, w_σ. The paper's form ("paper") depends on the
query only through s itself, which starts near zero (small W^K and queries, normalised stored
states), so every query's density starts, and in practice stays, where the biases put it: the same
flat read for every query. ŝ has unit spread at any scale of s, so μ and σ depend on the query
from the first step. `sigma_init` sets σ at initialisation (the bias of w_σ).

`density="content"` (ours, not the paper's) turns the scores into a discrete attention over the
basis centres c_n and matches the density's moments to it, so that a query reads *where its
content matches* — retrieval — rather than where a linear function of its scores points. Its keys
are the signal's content at the centres, x̄(c_n) = Bᵀ ψ(c_n), which has the scale of the stored
states (the coefficients B are far smaller: a narrow ψ peaks at 1/(w√2π)):

    s_n = (x̄(c_n) W^K) · q / √d
    p_n = softmax_n(s_n + w_μ,n)                       (w_μ ∈ ℝ^N: a learned prior over places)
    μ = Σ_n p_n c_n,  σ² = Σ_n p_n (c_n − μ)² + softplus(w_σᵀ s + b_σ)

The extra variance starts at `sigma_init`², or at the floor `min_sigma_sq` when it is not given,
so a query that matches one place reads that place at the basis' resolution. `sharpness` β
sharpens the discrete attention, p_n = softmax_n(β s_n + w_μ,n), so that a query whose best match
stands out reads there rather than at the mean of its matches; centres before `sink_edge` are
not read. `density="mixture"` (ours) reads the discrete attention itself instead of a Gaussian
matched to its moments: p(t) = Σ_n p_n δ(t − c_n), a mixture of the signal at the centres,

    z = E_p[v(t)] = Σ_n p_n x̄(c_n) W^V

so a query whose attention is spread over several places (ordinary text) reads their values
rather than the signal between them, and a query that matches one place reads the signal there
exactly (μ, σ² are still its moments: the KL term, sticky memories and the diagnostics use them).
`read_heads` returns each head's read before the heads are merged, with the read's
log-mass log Σ_n exp(s_n) (the unnormalised weight a softmax over the signal's places would give
the memory), for a read merged into a pretrained model's own heads (`hf/head_read.py`).
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import NonFiniteError, ValueChecks, check_dtype, check_tensor
from ._init import init_projection
from .basis import GaussianBasis
from .continuous_softmax import _variance_kl
from .fused_attention import expected_values
from .long_term_config import CONTENT_DENSITIES
from .long_term_memory import LongTermConfig, LongTermState, allowed_dtypes
from .long_term_state import stream_extent
from .precision import at_least_float32, full_precision, wide_dtype

# added to the scores' variance before standardising them ("normalized"): far below the variance
# of the scores of any memory that holds something, so that ŝ keeps unit spread at any scale
SCORE_EPS = 1e-12


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


@dataclass
class PreparedMemory:
    """The parts of a read that depend on the memory only (`LongTermAttention.prepare`)."""

    values: torch.Tensor  # V = B W^V  [batch, H, N, d]
    # W^Kᵀ Bᵀ [w_μ, w_σ] / √d (B centred over the basis if normalized) [b, H, d, 2];
    # "content": the keys themselves, x̄(c) W^K / √d  [b, H, N, d]
    keys: torch.Tensor
    # "normalized" only: the second moment of the centred scores, K̃ᵀK̃ / (N d)  [batch, H, d, d]
    gram: torch.Tensor | None = None
    # squeeze="fill" only: the centres that hold the stream, c_n ≤ e  bool [batch, N]
    readable: torch.Tensor | None = None

    def repeat_interleave(self, repeats: int) -> PreparedMemory:
        def rows(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.repeat_interleave(repeats, 0)

        return PreparedMemory(
            rows(self.values), rows(self.keys), rows(self.gram), rows(self.readable)
        )


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
        """The bias of w_σ from the config (`sigma_init`, or the floor for "content"); anything
        that re-initialises w_σ (a model's weight initialisation) calls this after it."""
        # softplus(b) = σ_init²: b = log(exp(σ_init²) − 1); draws nothing from the RNG
        c = self.config
        if c.sigma_init is not None:
            self.sigma_head.bias.fill_(math.log(math.expm1(c.sigma_init**2)))
        elif c.density in CONTENT_DENSITIES:  # the extra variance starts at the floor
            self.sigma_head.bias.fill_(math.log(math.expm1(c.min_sigma_sq)))

    def reset_projections(self, std: float) -> None:
        """The projections (W^Q when present, W^K, W^V, the output) ~ N(0, std²), so that the
        read starts at the scale of the backbone it is added to. The density heads w_μ, w_σ keep
        PyTorch's default initialisation: they set how spread the first densities are."""
        for projection in (self.query, self.key, self.value, self.out):
            if projection is not None:
                init_projection(projection, std)

    def prepare(self, state: LongTermState, dtype: torch.dtype) -> PreparedMemory:
        """What every read of `state` shares, computed once: V = B W^V and the folded keys.

        The scores s = K q / √d [batch, H, Q, N], K = B W^K, only ever enter through w_μᵀ s and
        w_σᵀ s, and w_μᵀ s = qᵀ (Kᵀ w_μ) / √d = qᵀ W^Kᵀ (Bᵀ w_μ) / √d (W^K has no bias): the two
        heads are folded into B first, so that neither s nor K [batch, N, e] is ever built.
        Normalized: the same with B centred over the basis (s − mean s), which needs K̃ once to
        give var_N(s) = qᵀ (K̃ᵀ K̃ / (N d)) q through a d×d matrix per head; s is never built."""
        c = self.config
        batch, H, d = state.batch_size, c.num_heads, c.head_dim
        B = state.coefficients.to(wide_dtype(dtype))  # [batch, N, e]
        with full_precision(B):
            B32 = at_least_float32(B)
            if c.density in CONTENT_DENSITIES:  # every score is needed  [b, H, N, d]
                psi = self.basis._psi(self.basis.centers.to(B32.dtype))  # ψ_j(c_n) [N, N]
                signal = torch.matmul(psi, B32)  # x̄(c_n) = Bᵀ ψ(c_n)  [b, N, e]
                K = self.key(signal).view(batch, -1, H, d).transpose(1, 2) / math.sqrt(d)
                readable = None
                if c.squeeze == "fill":  # the signal holds the stream on [0, e] only
                    K_c = self.basis.num_centers
                    e = stream_extent(state.stored, c.squeeze, K_c)
                    # at least one centre past the sink edge, so that a read is defined
                    e = e.clamp(min=c.sink_edge + 1.0 / max(K_c - 1, 1))
                    centers = self.basis.centers.to(device=e.device, dtype=torch.float64)
                    half = 0.5 / max(K_c - 1, 1)  # the last token's centre, not the next
                    readable = (centers <= e[:, None] + half) | state.empty[:, None]
                if c.density == "mixture":  # v(c_n) = x̄(c_n) W^V  [b, H, N, d]
                    v = self.value(signal.to(B.dtype)).view(batch, -1, H, d).transpose(1, 2)
                    return PreparedMemory(values=v, keys=K, readable=readable)
                keys, gram = K, None
            else:
                w = torch.cat([self.mu_head.weight, self.sigma_head.weight])  # [2, N]
                if c.density == "paper":
                    k_folded = self.key(torch.matmul(w, B32))  # (wᵀ B) W^K  [b, 2, e]
                    gram = None
                else:
                    # s − mean(s) = K̃ q / √d with K̃ = (B − mean_N B) W^K: centre B over the basis
                    K = self.key(B32 - B32.mean(dim=1, keepdim=True))  # K̃  [b, N, e]
                    k_folded = torch.matmul(w, K)  # wᵀ K̃  [b, 2, e]
                    K = K.view(batch, -1, H, d).transpose(1, 2)  # [b, H, N, d]
                    # mean_N (s − mean s)² = qᵀ (K̃ᵀ K̃ / (N d)) q
                    gram = torch.matmul(K.transpose(-1, -2), K) / (K.shape[2] * d)  # [b,H,d,d]
                keys = k_folded.view(batch, 2, H, d).permute(0, 2, 3, 1) / math.sqrt(d)  # [b,H,d,2]
        v = self.value(B).view(batch, -1, H, d).transpose(1, 2)  # V = B W^V  [batch, H, N, d]
        return PreparedMemory(values=v, keys=keys, gram=gram)

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
        turn_query: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> LongTermAttentionOutput | HeadsRead:
        """query [batch, Q, e] (already projected unless `config.query_projection`), read from
        `state`, both as the library builds them (a block's queries, a state the model checked;
        `attend` checks inputs from outside first). `prepared`: `prepare(state, query.dtype)`
        computed once for many reads of an unchanging state (generation), instead of at every
        call; `heads`: each head's read before the heads are merged (`read_heads`, which
        `turn_query` goes to), for a caller that merges them into its own."""
        c = self.config
        if heads:
            return self.read_heads(query, state, prepared, turn_query)
        batch, num_q, _ = query.shape
        H, d = c.num_heads, c.head_dim
        if prepared is None:
            prepared = self.prepare(state, query.dtype)
        z, mu, sigma_sq, _ = self._read(query, prepared, with_mass=False)  # z [b, H, Q, d]
        z = z.transpose(1, 2).reshape(batch, num_q, H * d)  # [batch, Q, e]

        filled = (~state.empty).to(device=query.device, dtype=query.dtype)  # [batch]
        context = self.out(z) * filled[:, None, None]  # [batch, Q, out_dim]
        return LongTermAttentionOutput(
            context=context, kl=self._kl(sigma_sq, filled), mu=mu, sigma_sq=sigma_sq
        )

    def read_heads(
        self,
        query: torch.Tensor,
        state: LongTermState,
        prepared: PreparedMemory | None = None,
        turn_query: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> HeadsRead:
        """Each head's read before the heads are merged and projected (content density only):
        query [batch, Q, e] (projected by W^Q here when the config has it). The caller merges
        z into its own heads by the log-mass (`hf/head_read.py`); rows whose memory is empty
        get log-mass −inf (no weight) and z = 0. `turn_query` maps the projected queries
        [batch, H, Q, d] before they are scored (a pretrained model's rotary positions, with
        `prepared` keys turned to match, `hf/head_read.py`)."""
        if self.config.density not in CONTENT_DENSITIES:
            raise ValueError("read_heads needs a content density (density='mixture' or 'content')")
        if prepared is None:
            prepared = self.prepare(state, query.dtype)
        z, mu, sigma_sq, log_mass = self._read(query, prepared, True, turn_query)
        filled = ~state.empty.to(query.device)  # [batch]
        if self.config.token_mass:  # each place read stands for S / (places read) tokens
            r = prepared.readable  # "fill": the filled centres only
            places = self.config.num_basis if r is None else r.sum(-1).to(torch.float64)
            per_place = (state.stored.to(torch.float64) / places).clamp(min=1e-30)
            log_mass = log_mass + per_place.log().to(log_mass)[:, None, None]
        log_mass = log_mass.masked_fill(~filled[:, None, None], -math.inf)
        z = z * filled[:, None, None, None].to(z.dtype)
        kl = self._kl(sigma_sq, filled.to(query.dtype))
        return HeadsRead(z=z, log_mass=log_mass, mu=mu, sigma_sq=sigma_sq, kl=kl)

    def _read(
        self,
        query: torch.Tensor,
        prepared: PreparedMemory,
        with_mass: bool,
        turn_query: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """query [batch, Q, e] → z = E_p[v(t)] [batch, H, Q, d], μ, σ² [batch, H, Q] and, for
        the content density `with_mass`, the log-mass log Σ_n exp(s_n) [batch, H, Q] (else
        None)."""
        c = self.config
        batch, num_q, _ = query.shape
        q = self.query(query) if self.query is not None else query
        q = q.view(batch, num_q, c.num_heads, c.head_dim).transpose(1, 2)  # [batch, H, Q, d]
        if turn_query is not None:
            q = turn_query(q)
        log_mass = None
        with full_precision(query):  # μ, σ² in float32 also under autocast (precision.py)
            q32 = at_least_float32(q)
            if c.density in CONTENT_DENSITIES:
                p, mu, sigma_sq, log_mass = self._content_density(
                    q32, prepared.keys, with_mass, prepared.readable
                )
            else:
                mu, sigma_sq = self._linear_density(q32, prepared)  # [batch, H, Q] each
        if c.density == "mixture":  # z = Σ_n p_n v(c_n)  [b, H, Q, d]
            return (
                torch.matmul(p.to(prepared.values.dtype), prepared.values),
                mu,
                sigma_sq,
                log_mass,
            )
        z = self._expected_values(mu, sigma_sq, prepared.values)  # E_p[v(t)]  [b, H, Q, d]
        return z, mu, sigma_sq, log_mass

    def _kl(self, sigma_sq: torch.Tensor, filled: torch.Tensor) -> torch.Tensor:
        """Mean variance-KL over the rows whose memory holds something (filled [batch])."""
        kl_rows = _variance_kl(sigma_sq, self.config.sigma_0).mean(dim=(1, 2))
        return (kl_rows * filled).sum() / filled.sum().clamp(min=1.0)

    def _linear_density(
        self, q: torch.Tensor, prepared: PreparedMemory
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ "paper"/"normalized": μ = sigmoid(w_μᵀ s), σ² = softplus(w_σᵀ s) (paper §3.2), s
        standardised over the basis when normalized. q [b, H, Q, d] → μ, σ² [b, H, Q]."""
        if prepared.gram is None:
            logits = torch.matmul(q, prepared.keys)  # [w_μᵀ s, w_σᵀ s]  [b, H, Q, 2]
        else:  # [w_μᵀ ŝ, w_σᵀ ŝ], ŝ = (s − mean s) / std s
            # ŝ does not change when q is scaled by a ≥ 1 (ε scaled by 1/a²): q / a keeps qᵀGq
            # finite for any finite q (the result does not depend on a: a needs no gradient)
            a = q.detach().abs().amax(-1, keepdim=True).clamp(min=1.0)  # [b, H, Q, 1]
            q = q / a
            logits = torch.matmul(q, prepared.keys)
            var = (torch.matmul(q, prepared.gram) * q).sum(-1, keepdim=True)  # var_N(s) / a²
            denominator = (var.clamp(min=0.0) + SCORE_EPS / a.square()).clamp(
                min=torch.finfo(var.dtype).tiny
            )
            logits = logits * torch.rsqrt(denominator)
        mu = torch.sigmoid(logits[..., 0] + self.mu_head.bias)  # μ ∈ (0, 1)
        sigma_sq = F.softplus(logits[..., 1] + self.sigma_head.bias)
        return mu, sigma_sq.clamp(min=self.config.min_sigma_sq)

    def _content_density(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        with_mass: bool = False,
        readable: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """ "content"/"mixture": a discrete attention over the basis centres and its moments
        (module doc). q [b, H, Q, d], keys K / √d [b, H, N, d] → p [b, H, Q, N], μ, σ² and
        (`with_mass`, else None) log Σ_n exp(s_n)  [b, H, Q]; `readable` [b, N]: the centres
        that may be read (squeeze="fill")."""
        c = self.config
        s = torch.matmul(q, keys.transpose(-1, -2))  # s = K q / √d  [b, H, Q, N]
        centers = self.basis.centers.to(s.dtype)  # c_n  [N]
        w_sigma = self.sigma_head.weight[0]  # [N]
        scores = s  # w_σᵀ s over the centres that are read
        if readable is not None:  # centres beyond the stream: no mass, no σ² contribution
            beyond = ~readable[:, None, None, :]
            s, scores = s.masked_fill(beyond, -math.inf), scores.masked_fill(beyond, 0.0)
        if c.sink_edge > 0.0:  # the oldest edge is not read
            unread = centers < c.sink_edge
            s = s.masked_fill(unread, -math.inf)
            w_sigma = w_sigma.masked_fill(unread, 0.0)
        prior = self.mu_head.weight[0] + self.mu_head.bias  # w_μ (the bias cancels)  [N]
        p = torch.softmax(c.sharpness * s + prior, dim=-1)  # p_n  [b, H, Q, N]
        mu = torch.matmul(p, centers)  # Σ p_n c_n  [b, H, Q]
        spread = (p * (centers - mu.unsqueeze(-1)).square()).sum(-1)  # Σ p_n (c_n − μ)²
        extra = F.softplus(torch.matmul(scores, w_sigma) + self.sigma_head.bias)
        log_mass = torch.logsumexp(s, dim=-1) if with_mass else None  # log Σ_n exp(s_n)
        return p, mu, (spread + extra).clamp(min=c.min_sigma_sq), log_mass

    def _expected_values(
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
