"""Position maps: where stored vectors sit in [0, 1] after each update's squeeze, and which
stream position the signal at each t holds (the package docstring derives φ(t) = τ · P̂(t))."""

from __future__ import annotations

import torch

from .._checks import check_positive_int, check_range, check_tensor
from .record import LayerRecord


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
