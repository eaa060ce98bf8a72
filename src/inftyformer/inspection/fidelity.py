"""Fidelity by age: how well a vector that entered the memory k updates ago comes back (the
∞-former's continuous signal, and the Compressive Transformer's slots)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .._checks import check_positive_int
from ..core.basis import GaussianBasis
from ..core.ridge import evaluate_signal
from .positions import position_history
from .record import StreamRecord

DEFAULT_AGES = (0, 1, 2, 3, 5, 10, 20, 30, 50, 75, 100, 150, 200)


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
