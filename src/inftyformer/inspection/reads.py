"""Reads mapped back to the stream: each query's density 𝒩(μ, σ²) placed on the stream positions
the memory holds, the σ and μ of every read, and where sticky memories' resampling points went."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._checks import check_positive_int
from ..core.attention import density_statistics
from .positions import _lerp, origin_history
from .record import StreamRecord


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
