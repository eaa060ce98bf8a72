"""What the memory holds and where the reads go: measurements over a model streaming real input.

Everything here is a pure function of a model and a token stream (or of what was recorded while
streaming); nothing draws (`inspection_plots.py` draws, the `inftyformer inspect` command calls
both). One stream of tokens [batch, T] goes through the model in calls of C = `segment_len`
tokens from a fresh memory, in evaluation mode (sticky memories then resample at deterministic
quantiles), with `MemoryLM.forward(..., return_trace=True)`:

* `record_stream`: per call and layer, the long-term reads' μ, σ² [batch, H, C], the long-term
  updates (vectors stored, where the old signal was sampled) and the coefficients B after the
  call; for the compressive model the states compressed and their slots.

Where things sit in the continuous memory (`position_history`). Block j of the stream (tokens
jC .. jC + C − 1) enters a layer's long-term memory as its j-th update (calls never cross block
boundaries and there are no resets, so that holds exactly). A first fit places its vectors at
(i + ½)/C. Every later update samples the old signal at u_1 < … < u_M and refits those values at
τ·i/M, then places the new block at τ + (1 − τ)(i + ½)/C. So a stored vector at t moves to

    φ(t) = τ · P̂(t),   P̂ the piecewise-linear map through (u_i, i/M).

Content before the first sample or after the last one is not resampled at all: it is lost, and
φ puts it on the nearest sample (τ/M or τ), where the new signal holds that sample's value.
Without sticky memories u_i = i/M, so φ(t) = τt for t ≥ 1/M: after k updates a vector stored at
t sits at τᵏt, until τᵏt < 1/M, after ≈ ln M / ln(1/τ) updates for a new vector; from then on
it has collapsed onto τ/M with everything older (the "first-sample horizon"). With sticky
memories the samples crowd where the queries attended, so those regions keep more of [0, τ]
(P̂ is steep there) and the others are squeezed harder or dropped.

* `origin_history`: the other way round, which stream position the signal at each t holds
  (composing the inverse maps); it also covers what no stored vector marks any more.
* `read_map`: each query's density 𝒩(μ, σ²) over t, mapped back to absolute positions of the
  past through the origin map. Mass outside [0, 1] reads nothing stored and is reported apart.
* `sigma_values`: σ = √σ² of every read, per layer and head (the KL prior is σ₀).
* `sample_history`: where each update's resampling points u went, over [0, 1] and mapped back to
  absolute positions (sticky memories).
* `memory_fidelity`: for vectors that entered the memory k updates ago, the cosine and the
  relative error ‖x̄(t) − x‖/‖x‖ between the stored vector x (as fitted: after the CNN gate) and
  the signal x̄(t) = Bᵀψ(t) read back at its current position t. k = 0 measures the fit alone;
  larger k what the squeezes and refits leave.
* `compressed_fidelity`: the Compressive Transformer's analogue: the cosine and relative error
  between each state and the slot that replaced it (both through a LayerNorm without parameters,
  as the attention sees them up to its affine part), while the slot is kept; a slot that fell
  out of the n_cm kept ones holds nothing (reported as the fraction still present).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from ._checks import check_positive_int, check_range, check_tensor
from .basis import GaussianBasis
from .long_term_attention import density_statistics
from .model import MemoryLM
from .ridge import evaluate_signal

DEFAULT_AGES = (0, 1, 2, 3, 5, 10, 20, 30, 50, 75, 100, 150, 200)


# --------------------------------------------------------------------------- recording
@dataclass
class LayerRecord:
    """What one layer's memories did over a stream (lists are per call unless noted).

    reads        (call, mu [batch, H, C], sigma_sq [batch, H, C]) for the calls whose long-term
                 memory was not empty
    updates      (call, stored [batch, C, e], samples [M] | [batch, M] | None) per long-term
                 update, in order (update j stores block j)
    coefficients B [batch, N, e] after each call (∞-former), index = call
    compressions (call, source [batch, F, d], count [batch], slots [batch, F/c, d]) per call that
                 compressed something (compressive)
    """

    reads: list[tuple[int, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    updates: list[tuple[int, torch.Tensor, torch.Tensor | None]] = field(default_factory=list)
    coefficients: list[torch.Tensor] = field(default_factory=list)
    compressions: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = field(
        default_factory=list
    )


@dataclass
class StreamRecord:
    model_type: str
    segment_len: int  # C: tokens per call, and per long-term update
    num_tokens: int  # T
    batch_size: int
    layers: list[LayerRecord]


@torch.no_grad()
def record_stream(model: MemoryLM, tokens: torch.Tensor) -> StreamRecord:
    """Stream `tokens` [batch, T] through `model` in calls of `segment_len` from a fresh memory,
    in evaluation mode, and record what every layer's memories did (see the module docstring)."""
    if not isinstance(model, MemoryLM):
        raise TypeError(
            f"model must be a MemoryLM (the native transformer, xl, compressive or infty), got "
            f"{type(model).__name__}: inspection does not follow a pretrained model's memory yet "
            "(benchmarks/compare_pretrained.py measures its reads' σ, μ and size)"
        )
    check_tensor("tokens", tokens, 2)
    c = model.config
    C = c.segment_len
    batch, total = tokens.shape
    if total < 1:
        raise ValueError("tokens must hold at least one token per row")
    was_training = model.training
    model.eval()
    layers = [LayerRecord() for _ in range(c.n_layers)]
    try:
        state = model.init_state(batch)
        for call, start in enumerate(range(0, total, C)):
            out = model(tokens[:, start : start + C], state=state, return_trace=True)
            state = out.state
            assert out.trace is not None
            for layer, trace, record in zip(state.layers, out.trace, layers, strict=True):
                if trace.mu is not None and not bool(trace.read_empty.any()):
                    record.reads.append((call, trace.mu.cpu(), trace.sigma_sq.cpu()))
                for update, rows in trace.updates:
                    if not bool(rows.all()):
                        raise RuntimeError("rows of one stream updated their memory apart")
                    samples = None if update.samples is None else update.samples.cpu()
                    record.updates.append((call, update.stored.cpu(), samples))
                if layer.long_term is not None:
                    record.coefficients.append(layer.long_term.coefficients.cpu())
                if trace.compressed is not None:
                    record.compressions.append(
                        (
                            call,
                            trace.compressed_from.cpu(),
                            trace.compressed_count.cpu(),
                            trace.compressed.cpu(),
                        )
                    )
    finally:
        model.train(was_training)
    for record in layers:
        calls = [call for call, *_ in record.updates]
        if len(set(calls)) != len(calls):
            raise RuntimeError("a call made two long-term updates: calls must be whole blocks")
    return StreamRecord(c.model_type, C, total, batch, layers)


# --------------------------------------------------------------------------- positions
def block_positions(length: int, tau: float, first: bool) -> torch.Tensor:
    """Where a block of `length` vectors is placed: (i + ½)/L by a first fit, else
    τ + (1 − τ)(i + ½)/L. float64 [L]."""
    check_positive_int("length", length)
    check_range("tau", tau, 0.0, 1.0, low_open=True, high_open=True)
    cells = (torch.arange(length, dtype=torch.float64) + 0.5) / length
    return cells if first else tau + (1 - tau) * cells


def squeeze_positions(t: torch.Tensor, samples: torch.Tensor, tau: float) -> torch.Tensor:
    """φ(t) = τ · P̂(t): where old content at t [batch, P] sits after an update that sampled the
    old signal at `samples` u ([M] or [batch, M], ascending) and refitted the values at τ·i/M,
    i = 1..M. P̂ interpolates (u_i, i/M) linearly and is clamped to [1/M, 1] (content outside
    [u_1, u_M] is not resampled: it collapses onto the nearest sample); for u_i = i/M,
    φ(t) = τt when t ≥ 1/M. float64 [batch, P]."""
    check_tensor("t", t, 2)
    check_tensor("samples", samples)
    check_range("tau", tau, 0.0, 1.0, low_open=True, high_open=True)
    t = t.double()
    u = samples.double()
    if u.dim() == 1:
        u = u.expand(t.shape[0], -1)
    if u.dim() != 2 or u.shape[0] != t.shape[0]:
        raise ValueError(
            f"samples must be [M] or [batch={t.shape[0]}, M], got {tuple(samples.shape)}"
        )
    M = u.shape[1]
    if M == 1:
        return torch.full_like(t, tau)
    level = torch.arange(1, M + 1, dtype=torch.float64) / M  # i/M  [M]
    idx = torch.searchsorted(u.contiguous(), t.contiguous()).clamp(1, M - 1)  # [batch, P]
    u_lo, u_hi = u.gather(1, idx - 1), u.gather(1, idx)
    lo, hi = level[idx - 1], level[idx]
    frac = ((t - u_lo) / (u_hi - u_lo).clamp(min=1e-12)).clamp(0, 1)  # clamped outside [u_1, u_M]
    return tau * (lo + frac * (hi - lo))


def position_history(record: LayerRecord, batch_size: int, tau: float) -> list[torch.Tensor]:
    """Where every stored vector sits after each update: element j is float64
    [batch, (j + 1)·C], the positions of blocks 0..j (in stream order) after update j."""
    history: list[torch.Tensor] = []
    positions = torch.zeros(batch_size, 0, dtype=torch.float64)
    for _, stored, samples in record.updates:
        length = stored.shape[1]
        first = samples is None
        if not first:
            positions = squeeze_positions(positions, samples, tau)
        new = block_positions(length, tau, first).expand(batch_size, -1)
        positions = torch.cat([positions, new], dim=1)
        history.append(positions)
    return history


def _lerp(x: torch.Tensor, xp: torch.Tensor, fp: torch.Tensor) -> torch.Tensor:
    """Piecewise-linear interpolation through (xp, fp), clamped to the end values: x [batch, P],
    xp and fp [batch, K] (xp ascending, K ≥ 2) → [batch, P]."""
    K = xp.shape[1]
    idx = torch.searchsorted(xp.contiguous(), x.contiguous()).clamp(1, K - 1)
    x_lo, x_hi = xp.gather(1, idx - 1), xp.gather(1, idx)
    f_lo, f_hi = fp.gather(1, idx - 1), fp.gather(1, idx)
    frac = ((x - x_lo) / (x_hi - x_lo).clamp(min=1e-300)).clamp(0, 1)
    return f_lo + frac * (f_hi - f_lo)


def origin_history(
    record: LayerRecord, batch_size: int, tau: float, grid: int = 4096
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Where the signal at each point of [0, 1] came from in the stream, after each update.

    Returns the grid t_g = (g + ½)/G [G] and, per update j, O_j [batch, G]: the stream position
    (in tokens, fractional: token p covers [p, p + 1)) whose content the signal at t_g holds. A
    first fit of block 0 holds token t·C at t; block j enters (τ, 1] as jC + C(t − τ)/(1 − τ);
    the squeezed part [0, τ] holds what the old signal held at P̂⁻¹(t/τ) (the inverse of
    `squeeze_positions`' map; below the first sample, the first sample's content). This answers
    "which part of the past does a read at t see" also where no stored vector sits any more,
    e.g. a region sticky memories keep stretching (its content comes from an ever thinner slice
    of the past, held at the resolution of the basis)."""
    check_positive_int("grid", grid, minimum=2)
    t = (torch.arange(grid, dtype=torch.float64) + 0.5) / grid  # [G]
    tb = t.expand(batch_size, -1)
    out: list[torch.Tensor] = []
    origin = None
    for j, (_, stored, samples) in enumerate(record.updates):
        C = stored.shape[1]
        if samples is None:  # first fit (a fresh memory)
            origin = (tb * C).clone()
        else:
            u = samples.double()
            u = u.expand(batch_size, -1) if u.dim() == 1 else u  # [batch, M]
            M = u.shape[1]
            level = (torch.arange(1, M + 1, dtype=torch.float64) / M).expand(batch_size, -1)
            old_t = _lerp(tb / tau, level, u) if M > 1 else u.expand_as(tb)  # P̂⁻¹(t/τ)
            squeezed = _lerp(old_t, tb, origin)  # what the old signal held there
            new = j * C + C * (tb - tau) / (1 - tau)
            origin = torch.where(tb <= tau, squeezed, new)
        out.append(origin)
    return t, out


# --------------------------------------------------------------------------- reads
@dataclass
class ReadMap:
    """Where a layer's long-term reads land in the past, per call (one row per call with a
    non-empty memory).

    calls      [S]              the calls (segments) whose queries read the memory
    bin_edges  [B + 1]          absolute token positions of the bins
    mass       [S, H, B]        read mass per bin, averaged over the call's queries and rows
    outside    [S, H]           mass of the densities outside [0, 1] (reads nothing stored)
    mean_distance [S, H]        mass-weighted mean distance in tokens from the call's first
                                query back to what is read (over the mass inside [0, 1])
    first_segment [S, H]        mass on the stream's first segment (tokens 0 .. C − 1)
    """

    calls: torch.Tensor
    bin_edges: torch.Tensor
    mass: torch.Tensor
    outside: torch.Tensor
    mean_distance: torch.Tensor
    first_segment: torch.Tensor


def read_map(
    record: StreamRecord, layer: int, tau: float, bins: int = 256, grid: int = 4096
) -> ReadMap:
    """The read densities of layer `layer` mapped back to absolute positions through
    `origin_history`: the mass of 𝒩(μ, σ²) on each of `grid` cells of [0, 1] goes to the stream
    position the cell holds. `bins` equal bins over the stream [0, T)."""
    check_positive_int("bins", bins)
    rec = record.layers[layer]
    if not rec.reads:
        raise ValueError(f"layer {layer} has no long-term reads (no ∞-former memory, or empty)")
    _, origins = origin_history(rec, record.batch_size, tau, grid)
    update_call = [call for call, *_ in rec.updates]
    C = record.segment_len
    edges_abs = torch.linspace(0, record.num_tokens, bins + 1, dtype=torch.float64)
    t_edges = torch.linspace(0, 1, grid + 1, dtype=torch.float64)  # the grid's cells
    calls, masses, outsides, distances, firsts = [], [], [], [], []
    for call, mu, sigma_sq in rec.reads:
        done = sum(1 for u in update_call if u <= call)  # updates made before these reads
        origin = origins[done - 1]  # [batch, G]
        sigma = sigma_sq.double().sqrt()  # [batch, H, Q]
        cdf = torch.special.ndtr((t_edges - mu.double()[..., None]) / sigma[..., None])
        cell = (cdf[..., 1:] - cdf[..., :-1]).mean(2)  # mean over queries  [batch, H, G]
        inside = cell.sum(-1)  # [batch, H]
        where = torch.bucketize(origin, edges_abs[1:-1])  # bin of each cell  [batch, G]
        mass = torch.zeros(*cell.shape[:2], bins, dtype=torch.float64)
        mass.scatter_add_(2, where[:, None].expand_as(cell), cell)  # [batch, H, B]
        distance = (call * C - origin).clamp(min=0)[:, None]  # [batch, 1, G]
        calls.append(call)
        masses.append(mass.mean(0))  # [H, B]
        outsides.append((1.0 - inside).mean(0))
        distances.append(((cell * distance).sum(-1) / inside.clamp(min=1e-12)).mean(0))
        firsts.append((cell * (origin < C)[:, None]).sum(-1).mean(0))
    return ReadMap(
        calls=torch.tensor(calls),
        bin_edges=edges_abs,
        mass=torch.stack(masses),
        outside=torch.stack(outsides),
        mean_distance=torch.stack(distances),
        first_segment=torch.stack(firsts),
    )


def sigma_values(record: StreamRecord, layer: int) -> torch.Tensor:
    """σ of every long-term read of layer `layer`: [H, reads] (all calls, rows and queries)."""
    rec = record.layers[layer]
    if not rec.reads:
        raise ValueError(f"layer {layer} has no long-term reads (no ∞-former memory, or empty)")
    sigma = [s.sqrt().transpose(0, 1).reshape(s.shape[1], -1) for _, _, s in rec.reads]
    return torch.cat(sigma, dim=1)  # [H, n]


def mu_values(record: StreamRecord, layer: int) -> torch.Tensor:
    """μ of every long-term read of layer `layer`: [H, reads]."""
    rec = record.layers[layer]
    if not rec.reads:
        raise ValueError(f"layer {layer} has no long-term reads (no ∞-former memory, or empty)")
    return torch.cat([m.transpose(0, 1).reshape(m.shape[1], -1) for _, m, _ in rec.reads], dim=1)


def mu_spread(record: StreamRecord, layer: int) -> float:
    """μ's standard deviation across the queries of a head, averaged over rows, heads and the
    reads of layer `layer` (`density_statistics`, as the trainer logs it)."""
    rec = record.layers[layer]
    if not rec.reads:
        raise ValueError(f"layer {layer} has no long-term reads (no ∞-former memory, or empty)")
    spreads = [
        density_statistics(mu, s, torch.zeros(mu.shape[0], dtype=torch.bool))[1]
        for _, mu, s in rec.reads
    ]
    return float(torch.stack(spreads).mean())


# --------------------------------------------------------------------------- sticky samples
@dataclass
class SampleHistory:
    """Where each update's resampling points went (updates with an old signal to sample).

    calls       [U]          the call of each update
    t_hist      [U, Bt]      fraction of the M samples in each of Bt equal bins of [0, 1]
    abs_edges   [Ba + 1]     absolute token positions of the bins of `abs_hist`
    abs_hist    [U, Ba]      the same samples mapped back to the stream positions they read
    first_segment [U]        fraction of them reading the stream's first segment
    """

    calls: torch.Tensor
    t_hist: torch.Tensor
    abs_edges: torch.Tensor
    abs_hist: torch.Tensor
    first_segment: torch.Tensor


def sample_history(
    record: StreamRecord, layer: int, tau: float, t_bins: int | None = None, abs_bins: int = 128
) -> SampleHistory:
    """The resampling points of layer `layer`'s updates (uniform i/M without sticky memories),
    in `t_bins` bins of [0, 1] (default M: one sample per bin when they are uniform)."""
    rec = record.layers[layer]
    grid, origins = origin_history(rec, record.batch_size, tau)
    abs_edges = torch.linspace(0, record.num_tokens, abs_bins + 1, dtype=torch.float64)
    calls, t_rows, abs_rows, firsts = [], [], [], []
    for j, (call, _, samples) in enumerate(rec.updates):
        if samples is None:
            continue
        u = samples.double()
        u = u.expand(record.batch_size, -1) if u.dim() == 1 else u  # [batch, M]
        t_bins = t_bins or u.shape[1]
        t_rows.append(torch.histogram(u.flatten().clamp(0, 1), t_bins, range=(0.0, 1.0))[0])
        # what the old signal held where it was sampled (before this update)
        where = _lerp(u, grid.expand_as(origins[j - 1]), origins[j - 1])
        abs_rows.append(torch.histogram(where.flatten(), abs_edges)[0])
        firsts.append(float((where < record.segment_len).double().mean()))
        calls.append(call)
    if not calls:
        raise ValueError(f"layer {layer} made no update that resampled an old signal")
    t_hist = torch.stack(t_rows)
    abs_hist = torch.stack(abs_rows)
    return SampleHistory(
        calls=torch.tensor(calls),
        t_hist=t_hist / t_hist.sum(-1, keepdim=True),
        abs_edges=abs_edges,
        abs_hist=abs_hist / abs_hist.sum(-1, keepdim=True),
        first_segment=torch.tensor(firsts, dtype=torch.float64),
    )


# --------------------------------------------------------------------------- fidelity
@dataclass
class Fidelity:
    """Per age k (in updates = segments): how well what went in comes back.

    ages            [K]
    cosine          [K]  mean cosine between the read-back and the stored vector (NaN where no
                         vector of that age was seen or kept)
    centred_cosine  [K]  the same after subtracting the row's mean stored vector from both: what
                         is specific to the vector (0 for a memory that returns only the mean)
    rel_error       [K]  mean ‖read − x‖/‖x‖
    count           [K]  vectors measured at that age
    present         [K]  fraction of them still held (1 for the ∞-former; compressive: slots kept)
    baseline_cosine, baseline_rel_error: the same scores for a memory that returns the row's mean
                         stored vector whatever is asked (a cosine below it keeps nothing specific)
    """

    ages: list[int]
    cosine: list[float]
    centred_cosine: list[float]
    rel_error: list[float]
    count: list[int]
    present: list[float]
    baseline_cosine: float = math.nan
    baseline_rel_error: float = math.nan

    def at(self, age: int) -> dict[str, float]:
        i = self.ages.index(age)
        return {
            "cosine": self.cosine[i],
            "centred_cosine": self.centred_cosine[i],
            "rel_error": self.rel_error[i],
            "count": self.count[i],
            "present": self.present[i],
        }

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class _Tally:
    """Sums of the fidelity scores per age."""

    def __init__(self, ages: Sequence[int]) -> None:
        self.ages = sorted({int(a) for a in ages})
        if any(a < 0 for a in self.ages):
            raise ValueError(f"ages must be >= 0, got {self.ages}")
        self.sums = {a: [0.0, 0.0, 0.0, 0] for a in self.ages}  # cos, centred cos, rel, n
        self.seen = {a: 0 for a in self.ages}
        self.base = [0.0, 0.0, 0]

    def add(self, age: int, read: torch.Tensor, x: torch.Tensor, mean: torch.Tensor) -> None:
        """read, x [batch, n, e]; mean [batch, 1, e] (the row's mean stored vector)."""
        cos, rel = _agreement(read, x)
        centred, _ = _agreement(read - mean, x - mean)
        entry = self.sums[age]
        entry[0] += float(cos.sum())
        entry[1] += float(centred.sum())
        entry[2] += float(rel.sum())
        entry[3] += cos.numel()

    def add_baseline(self, x: torch.Tensor, mean: torch.Tensor) -> None:
        cos, rel = _agreement(mean.expand_as(x), x)
        self.base[0] += float(cos.sum())
        self.base[1] += float(rel.sum())
        self.base[2] += cos.numel()

    def result(self, present: dict[int, float] | None = None) -> Fidelity:
        def mean(a: int, k: int) -> float:
            n = self.sums[a][3]
            return self.sums[a][k] / n if n else math.nan

        n_base = max(self.base[2], 1)
        return Fidelity(
            ages=self.ages,
            cosine=[mean(a, 0) for a in self.ages],
            centred_cosine=[mean(a, 1) for a in self.ages],
            rel_error=[mean(a, 2) for a in self.ages],
            count=[self.sums[a][3] for a in self.ages],
            present=[
                (present or {}).get(a, 1.0 if self.sums[a][3] else math.nan) for a in self.ages
            ],
            baseline_cosine=self.base[0] / n_base if self.base[2] else math.nan,
            baseline_rel_error=self.base[1] / n_base if self.base[2] else math.nan,
        )


def _pick(length: int, per_block: int | None) -> torch.Tensor:
    """Evenly spread indices of `per_block` of `length` vectors (all when None or larger)."""
    if per_block is None or per_block >= length:
        return torch.arange(length)
    return torch.linspace(0, length - 1, per_block).round().long().unique()


def _agreement(read: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cosine, relative error) between rows of `read` and `x` [..., e] → [...] each."""
    read, x = read.double(), x.double()
    cos = F.cosine_similarity(read, x, dim=-1, eps=1e-12)
    rel = (read - x).norm(dim=-1) / x.norm(dim=-1).clamp(min=1e-12)
    return cos, rel


def signal_fidelity(
    stored: Sequence[torch.Tensor],
    coefficients: Sequence[torch.Tensor],
    history: Sequence[torch.Tensor],
    basis: GaussianBasis,
    ages: Sequence[int] = DEFAULT_AGES,
    per_block: int | None = 32,
) -> Fidelity:
    """Fidelity of a continuous memory by age. Update j stored `stored[j]` [batch, L, e]; after
    update j the coefficients were `coefficients[j]` [batch, N, e] and the vectors of blocks
    0..j sat at `history[j]` [batch, (j + 1)·L] (`position_history`). For each age k and block
    j with j + k < #updates, read x̄(t) = Bᵀψ(t) with B = coefficients[j + k] at the current
    positions of `per_block` evenly spread vectors of block j and compare with them."""
    if not (len(stored) == len(coefficients) == len(history)):
        raise ValueError(
            f"stored ({len(stored)}), coefficients ({len(coefficients)}) and history "
            f"({len(history)}) must have one entry per update"
        )
    tally = _Tally(ages)
    if not stored:
        return tally.result()
    mean = torch.cat(list(stored), dim=1).double().mean(1, keepdim=True)  # [batch, 1, e]
    offsets = [0]
    for block in stored[:-1]:
        offsets.append(offsets[-1] + block.shape[1])
    for j, block in enumerate(stored):
        idx = _pick(block.shape[1], per_block)
        x = block[:, idx].double()  # [batch, n, e]
        tally.add_baseline(x, mean)
        for a in tally.ages:
            if j + a >= len(stored):
                continue
            t = history[j + a][:, offsets[j] + idx]  # [batch, n]
            read = evaluate_signal(coefficients[j + a].double(), basis, t)  # [batch, n, e]
            tally.add(a, read, x, mean)
    return tally.result()


def memory_fidelity(
    record: StreamRecord,
    layer: int,
    basis: GaussianBasis,
    tau: float,
    ages: Sequence[int] = DEFAULT_AGES,
    per_block: int | None = 32,
) -> Fidelity:
    """`signal_fidelity` of layer `layer`'s long-term memory over the recorded stream."""
    rec = record.layers[layer]
    if not rec.updates:
        raise ValueError(f"layer {layer} made no long-term update")
    history = position_history(rec, record.batch_size, tau)
    coefficients = [rec.coefficients[call] for call, *_ in rec.updates]
    stored = [s for _, s, _ in rec.updates]
    return signal_fidelity(stored, coefficients, history, basis, ages, per_block)


def compressed_fidelity(
    record: StreamRecord,
    layer: int,
    rate: int,
    capacity: int,
    ages: Sequence[int] = DEFAULT_AGES,
) -> tuple[Fidelity, float]:
    """The compressive memory's fidelity by age (module docstring) and, for reference, the mean
    cosine between each state and the plain average of its group of `rate` (what an average
    pool would keep). Ages count calls since the compression; a slot is kept while fewer than
    `capacity` slots are newer."""
    check_positive_int("rate", rate)
    check_positive_int("capacity", capacity)
    rec = record.layers[layer]
    if not rec.compressions:
        raise ValueError(f"layer {layer} compressed nothing")
    tally = _Tally(ages)
    num_calls = math.ceil(record.num_tokens / record.segment_len)
    made = torch.zeros(num_calls, dtype=torch.long)  # slots made per call
    pooled_sum, pooled_n = 0.0, 0
    groups = []  # (call, first global slot index, slots [b, n, 1, d], states [b, n, c, d])
    total = 0
    for call, source, count, slots in rec.compressions:
        n = int(count[0]) // rate
        if n == 0:
            continue
        if not bool((count == count[0]).all()):
            raise RuntimeError("rows of one stream compressed different numbers of states")
        d = source.shape[-1]
        raw = source[:, : n * rate].double().view(source.shape[0], n, rate, d)  # [b, n, c, d]
        states = F.layer_norm(raw, (d,))
        slot = F.layer_norm(slots[:, :n].double(), (d,))[:, :, None]  # [batch, n, 1, d]
        pooled = F.layer_norm(raw.mean(2, keepdim=True), (d,))  # an average pool instead
        pooled_cos, _ = _agreement(pooled.expand_as(states), states)
        pooled_sum += float(pooled_cos.sum())
        pooled_n += pooled_cos.numel()
        groups.append((call, total, slot, states))
        made[call] += n
        total += n
    if not groups:
        raise ValueError(f"layer {layer} compressed nothing")
    d = groups[0][3].shape[-1]
    mean = torch.cat([g[3].reshape(g[3].shape[0], -1, d) for g in groups], 1).mean(1, True)
    made_by = torch.cumsum(made, 0)  # slots made up to and including each call
    seen = {a: 0 for a in tally.ages}
    kept = {a: 0 for a in tally.ages}
    for call, first, slot, states in groups:
        batch, n, c, _ = states.shape
        flat = states.reshape(batch, n * c, d)
        tally.add_baseline(flat, mean)
        index = first + torch.arange(n)  # global slot indices
        for a in tally.ages:
            if call + a >= num_calls:
                continue
            alive = index >= int(made_by[call + a]) - capacity  # [n]
            seen[a] += batch * n * c
            kept[a] += batch * int(alive.sum()) * c
            if bool(alive.any()):
                read = slot[:, alive].expand(-1, -1, c, -1).reshape(batch, -1, d)
                tally.add(a, read, states[:, alive].reshape(batch, -1, d), mean)
    present = {a: kept[a] / seen[a] for a in tally.ages if seen[a]}
    return tally.result(present), pooled_sum / max(pooled_n, 1)


# --------------------------------------------------------------------------- all of it
@dataclass
class Inspection:
    """Everything `inspect_stream` measured (per layer; None where it does not apply)."""

    model_type: str
    num_tokens: int
    segment_len: int
    sigma_0: float | None
    sticky: bool
    tau: float | None  # τ and M of the long-term memory (∞-former)
    num_samples: int | None
    reads: list[ReadMap | None]
    sigmas: list[torch.Tensor | None]  # [H, n] per layer
    mus: list[torch.Tensor | None]
    # μ's spread across the queries of a head, averaged over the reads (the trainer's
    # density/L{i}/mu_spread: ≈ 0 when every query reads the same place)
    mu_spreads: list[float | None]
    samples: list[SampleHistory | None]
    fidelity: list[Fidelity | None]
    compressed: list[Fidelity | None]
    pooled_reference: list[float | None]

    def summary(self) -> dict[str, Any]:
        """The few numbers that summarise the pictures (JSON-able)."""

        def quantiles(x: torch.Tensor) -> dict[str, float]:
            q = torch.quantile(
                x.double().flatten(), torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9], dtype=torch.float64)
            )
            return dict(zip(("p10", "p25", "median", "p75", "p90"), map(float, q), strict=True))

        layers = []
        for i in range(len(self.reads)):
            entry: dict[str, Any] = {"layer": i}
            if self.sigmas[i] is not None:
                s = self.sigmas[i]
                entry["sigma"] = quantiles(s)
                entry["sigma_median_per_head"] = [float(v) for v in s.median(dim=1).values]
                entry["mu"] = quantiles(self.mus[i])
                entry["mu_spread"] = self.mu_spreads[i]
                if self.sigma_0 is not None:
                    entry["fraction_sigma_below_2_sigma0"] = float(
                        (s < 2 * self.sigma_0).double().mean()
                    )
            if self.reads[i] is not None:
                r = self.reads[i]
                entry["read_mass_outside"] = float(r.outside.mean())
                entry["read_mean_distance_tokens"] = float(r.mean_distance.mean())
                entry["read_mass_first_segment"] = float(r.first_segment.mean())
            if self.samples[i] is not None and self.sticky:
                h = self.samples[i].t_hist.double().clamp(min=1e-12)
                entropy = -(h * h.log()).sum(-1) / math.log(h.shape[-1])
                entry["sample_entropy_vs_uniform"] = float(entropy.mean())
                entry["samples_on_first_segment"] = float(self.samples[i].first_segment.mean())
            for name, fid in (
                ("fidelity", self.fidelity[i]),
                ("compressed_fidelity", self.compressed[i]),
            ):
                if fid is not None:
                    entry[name] = {str(a): fid.at(a) for a in fid.ages}
                    # the oldest age (of those measured) up to which every age keeps half of
                    # what is specific to the vectors (centred cosine ≥ 0.5)
                    horizon = None
                    for a, c in zip(fid.ages, fid.centred_cosine, strict=True):
                        if math.isnan(c) or c < 0.5:
                            break
                        horizon = a
                    entry[name + "_horizon"] = horizon
                    entry[name + "_mean_baseline"] = {
                        "cosine": fid.baseline_cosine,
                        "rel_error": fid.baseline_rel_error,
                    }
            if self.pooled_reference[i] is not None:
                entry["compressed_pooled_reference_cosine"] = self.pooled_reference[i]
            layers.append(entry)
        return {
            "model_type": self.model_type,
            "num_tokens": self.num_tokens,
            "segment_len": self.segment_len,
            "segments": math.ceil(self.num_tokens / self.segment_len),
            "sigma_0": self.sigma_0,
            "sticky": self.sticky,
            "tau": self.tau,
            "num_samples": self.num_samples,
            # a vector entering at t ≥ τ falls below the first sample point 1/M after this many
            # updates without sticky memories (τᵏ < 1/M); beyond it the old signal there is
            # never sampled again
            "first_sample_horizon": None
            if self.tau is None
            else math.log(self.num_samples) / math.log(1 / self.tau),
            "layers": layers,
        }


def inspect_stream(
    model: MemoryLM,
    tokens: torch.Tensor,
    ages: Sequence[int] = DEFAULT_AGES,
    bins: int = 256,
    per_block: int | None = 32,
) -> Inspection:
    """Stream `tokens` [batch, T] through `model` and measure everything the module docstring
    lists, per layer."""
    record = record_stream(model, tokens)
    c = model.config
    L = c.n_layers
    none = [None] * L
    out = Inspection(
        model_type=c.model_type,
        num_tokens=record.num_tokens,
        segment_len=record.segment_len,
        sigma_0=c.sigma_0 if c.has_long_term else None,
        sticky=c.has_long_term and c.sticky,
        tau=c.tau if c.has_long_term else None,
        num_samples=c.num_samples if c.has_long_term else None,
        reads=list(none),
        sigmas=list(none),
        mus=list(none),
        mu_spreads=list(none),
        samples=list(none),
        fidelity=list(none),
        compressed=list(none),
        pooled_reference=list(none),
    )
    for i, block in enumerate(model.blocks):
        rec = record.layers[i]
        if block.long_term_memory is not None:
            if rec.reads:
                out.reads[i] = read_map(record, i, c.tau, bins)
                out.sigmas[i] = sigma_values(record, i)
                out.mus[i] = mu_values(record, i)
                out.mu_spreads[i] = mu_spread(record, i)
            if any(s is not None for _, _, s in rec.updates):
                out.samples[i] = sample_history(record, i, c.tau)
            if rec.updates:
                basis = block.long_term_memory.basis
                out.fidelity[i] = memory_fidelity(record, i, basis, c.tau, ages, per_block)
        if block.compressive is not None and rec.compressions:
            fid, ref = compressed_fidelity(record, i, c.compression_rate, c.compressed_len, ages)
            out.compressed[i], out.pooled_reference[i] = fid, ref
    return out


__all__ = [
    "DEFAULT_AGES",
    "Fidelity",
    "Inspection",
    "LayerRecord",
    "ReadMap",
    "SampleHistory",
    "StreamRecord",
    "block_positions",
    "origin_history",
    "compressed_fidelity",
    "inspect_stream",
    "memory_fidelity",
    "mu_values",
    "position_history",
    "read_map",
    "record_stream",
    "sample_history",
    "sigma_values",
    "signal_fidelity",
    "squeeze_positions",
]
