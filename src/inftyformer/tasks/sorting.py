"""The paper's sorting task (∞-former §4.1).

A sequence of T symbols from {0..19} is drawn from a mixture whose weights move linearly from
`p_start` (at the first position) to `p_end` (at the last); both are ∝ randint(1, 10) over the 20
symbols, drawn afresh for every sequence. After a separator the model must emit the 20 symbols
sorted by decreasing count in the sequence (ties: earlier first occurrence first; symbols that never
occur come last, in ascending order). Because the mixture drifts, the answer depends on the whole
sequence, not on any recent window: that is what makes it a long-memory task.

Layout of one example, S = T + 20 positions, teacher forcing::

    inputs  = [x_1 .. x_T, SEP, y_1 .. y_19]
    targets = [-100] * T  +     [y_1 .. y_20]

The SEP position predicts y_1, the position of y_k predicts y_{k+1}; -100 is the ignore index, so
loss and accuracy only see the 20 target positions (the last 20 positions of the example).

As a training task (``inftyformer train sorting``): each step draws a fresh global batch (a pure
function of seed and step), streams every segment but the last without gradients to build the
memory (fresh state per batch), then the last segment with gradients; loss and accuracy only on the
20 target positions, with teacher forcing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._checks import check_positive_int
from ..data import SPLITS, check_split
from ..native.model import IGNORE_INDEX
from .base import (
    Metric,
    RunContext,
    TaskConfig,
    register_task,
)
from .streamed import LastBlockTask

NUM_SYMBOLS = 20
SEP = 20
PAD = 21
SORTING_VOCAB = 22
NUM_TARGETS = 20
MAX_PROMPT_LEN = 1_000_000  # a longer random prompt would need gigabytes to draw
# Split-specific entropy mixed into every batch's SeedSequence: splits draw from disjoint streams.
_SPLIT_ENTROPY = {"train": 0x5EED_0001, "valid": 0x5EED_0002, "test": 0x5EED_0003}


def _check_seed(name: str, value: object) -> int:
    check_positive_int(name, value, minimum=0)
    return value  # type: ignore[return-value]


def sorting_targets(symbols: np.ndarray) -> np.ndarray:
    """The answer for each row of `symbols` [B, T] (ints in 0..19) -> [B, 20] int64.

    Sorted by decreasing count, ties by first occurrence, absent symbols last in ascending order.
    """
    x = np.asarray(symbols)
    if x.ndim != 2:
        raise ValueError(f"symbols must have 2 dimensions [batch, length], got shape {x.shape}")
    if x.size and (x.min() < 0 or x.max() >= NUM_SYMBOLS):
        raise ValueError(f"symbols must be in [0, {NUM_SYMBOLS - 1}]")
    batch, length = x.shape
    x = x.astype(np.int64)
    rows = np.broadcast_to(np.arange(batch)[:, None], x.shape)  # [B, T]
    counts = np.zeros((batch, NUM_SYMBOLS), dtype=np.int64)  # [B, 20]
    np.add.at(counts, (rows, x), 1)
    first = np.full((batch, NUM_SYMBOLS), length, dtype=np.int64)  # [B, 20]; T = "never"
    positions = np.broadcast_to(np.arange(length)[None, :], x.shape)  # [B, T]
    np.minimum.at(first, (rows, x), positions)
    symbol = np.broadcast_to(np.arange(NUM_SYMBOLS)[None, :], counts.shape)  # [B, 20]
    # lexsort: the last key is the primary one. Present symbols have distinct first occurrences;
    # absent ones all have first = T and are then ordered by symbol (ascending).
    order = np.lexsort((symbol, first, -counts), axis=-1)  # [B, 20]
    return order.astype(np.int64)


def sample_symbols(seq_len: int, batch_size: int, rng: np.random.Generator) -> np.ndarray:
    """Draw [B, T] symbols from the drifting mixture (vectorised inverse-CDF sampling)."""
    check_positive_int("seq_len", seq_len)
    check_positive_int("batch_size", batch_size)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    p_start = rng.integers(1, 11, size=(batch_size, NUM_SYMBOLS)).astype(np.float64)  # [B, 20]
    p_end = rng.integers(1, 11, size=(batch_size, NUM_SYMBOLS)).astype(np.float64)  # [B, 20]
    p_start /= p_start.sum(axis=1, keepdims=True)
    p_end /= p_end.sum(axis=1, keepdims=True)
    # Mixing weight of p_end moves linearly from 0 (first position) to 1 (last position).
    alpha = np.linspace(0.0, 1.0, seq_len) if seq_len > 1 else np.zeros(1)  # [T]
    cdf_start = np.cumsum(p_start, axis=1)[:, None, :]  # [B, 1, 20]
    cdf_end = np.cumsum(p_end, axis=1)[:, None, :]  # [B, 1, 20]
    cdf = (1.0 - alpha)[None, :, None] * cdf_start + alpha[None, :, None] * cdf_end  # [B, T, 20]
    u = rng.random((batch_size, seq_len, 1))  # [B, T, 1]
    symbols = (u >= cdf).sum(axis=-1)  # [B, T]: number of CDF steps below u
    return np.minimum(symbols, NUM_SYMBOLS - 1).astype(np.int64)


def sorting_example(symbols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lay out given symbols [B, T] as (inputs [B, S], targets [B, S]) int64 (see module doc)."""
    x = np.asarray(symbols, dtype=np.int64)
    y = sorting_targets(x)  # [B, 20]
    batch, length = x.shape
    sep = np.full((batch, 1), SEP, dtype=np.int64)
    inputs = np.concatenate([x, sep, y[:, :-1]], axis=1)  # [B, T + 20]
    ignore = np.full((batch, length), IGNORE_INDEX, dtype=np.int64)
    targets = np.concatenate([ignore, y], axis=1)  # [B, T + 20]
    return inputs, targets


def sorting_batch(
    seq_len: int, batch_size: int, rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch: (inputs [B, T+20], targets [B, T+20]) LongTensors, drawn from `rng`."""
    inputs, targets = sorting_example(sample_symbols(seq_len, batch_size, rng))
    return torch.from_numpy(inputs), torch.from_numpy(targets)


@dataclass(frozen=True)
class SortingDataset:
    """An endless, indexable stream of sorting batches.

    `batch(index)` is a pure function of (seed, split, index): it seeds a fresh generator with
    ``SeedSequence([seed, split entropy], spawn_key=(index,))``. The data position is therefore just
    the batch index, which makes resuming trivial, and the three splits draw from disjoint streams.
    Iterating starts at `start` and never ends; use :meth:`iterate` for a bounded range.
    """

    seq_len: int
    batch_size: int
    split: str = "train"
    seed: int = 0
    start: int = 0

    def __post_init__(self) -> None:
        check_positive_int("seq_len", self.seq_len)
        check_positive_int("batch_size", self.batch_size)
        check_split(self.split)
        _check_seed("seed", self.seed)
        _check_seed("start", self.start)

    @property
    def total_len(self) -> int:
        return self.seq_len + NUM_TARGETS

    def rng(self, index: int) -> np.random.Generator:
        _check_seed("index", index)
        seq = np.random.SeedSequence([self.seed, _SPLIT_ENTROPY[self.split]], spawn_key=(index,))
        return np.random.default_rng(seq)

    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs [B, S], targets [B, S]) for batch number `index`."""
        return sorting_batch(self.seq_len, self.batch_size, self.rng(index))

    def iterate(
        self, start: int = 0, stop: int | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches start, start+1, ... (up to `stop`, exclusive, or forever)."""
        _check_seed("start", start)
        if stop is not None:
            _check_seed("stop", stop)
        index = start
        while stop is None or index < stop:
            yield self.batch(index)
            index += 1

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self.iterate(self.start)


def chance_accuracy(exclude_seen: bool = False) -> float:
    """Target-position accuracy of a guesser that ignores the symbol counts.

    - ``exclude_seen=False``: a uniform guess over the 20 symbols, 1/20 = 0.05.
    - ``exclude_seen=True``: a uniform guess over the symbols not yet in the teacher-forced answer
      prefix (the answer is a permutation, so at the k-th target 21 - k candidates remain):
      (1/20) Σ_{k=1..20} 1/(21 - k) = H_20 / 20 ≈ 0.180. A model that only learns the format
      (never repeat a symbol) reaches this without using the memory at all.
    """
    if exclude_seen:
        return sum(1.0 / k for k in range(1, NUM_SYMBOLS + 1)) / NUM_SYMBOLS
    return 1.0 / NUM_SYMBOLS


def segment_bounds(total_len: int, segment_len: int) -> list[tuple[int, int]]:
    """Cut [0, total_len) into segments of `segment_len` whose LAST one is full length.

    The first segment takes the remainder (it may be shorter), so the 20 target positions (the last
    20 of an example) all fall in the last segment, where the loss is computed; earlier segments
    only build memory. A sequence shorter than `segment_len` is one segment.

    >>> segment_bounds(50, 21)
    [(0, 8), (8, 29), (29, 50)]
    """
    check_positive_int("total_len", total_len)
    check_positive_int("segment_len", segment_len)
    if segment_len < NUM_TARGETS + 1:
        raise ValueError(
            f"segment_len must be >= {NUM_TARGETS + 1} so the {NUM_TARGETS} target positions fit "
            f"in the last segment, got {segment_len}"
        )
    num_segments = math.ceil(total_len / segment_len)
    first_end = total_len - (num_segments - 1) * segment_len  # in [1, segment_len]
    bounds = [(0, first_end)]
    for start in range(first_end, total_len, segment_len):
        bounds.append((start, start + segment_len))
    return bounds


# --------------------------------------------------------------------------- the task
@dataclass(frozen=True)
class SortingConfig(TaskConfig):
    """Settings of the sorting task."""

    seq_len: int = 512  # T: symbols before the separator

    def __post_init__(self) -> None:
        check_positive_int("seq_len", self.seq_len)


@register_task("sorting")
class SortingTask(LastBlockTask):
    """See the module docstring. Each process takes its rows of the global batch, so the data of a
    step does not depend on the number of processes or micro-batches."""

    summary = "the paper's sorting task (§4.1): sort 20 symbols by their count in a long sequence"
    Config = SortingConfig
    metrics = (
        Metric("accuracy", ".4f", higher_is_better=True),
        Metric("loss", ".4f"),
        Metric("examples", ".0f"),
    )
    progress_metrics = ("accuracy",)

    def __init__(self, config: SortingConfig, model_config: Any, context: RunContext) -> None:
        super().__init__(config, model_config, context)
        self.datasets = {
            split: SortingDataset(
                seq_len=config.seq_len,
                batch_size=context.batch_size,
                split=split,
                seed=context.seed,
            )
            for split in SPLITS
        }
        self.bounds = segment_bounds(config.seq_len + NUM_TARGETS, model_config.segment_len)

    @classmethod
    def model_overrides(cls, config: SortingConfig) -> dict[str, Any]:
        # Every step draws fresh sequences, so there is nothing to overfit: dropout only slows
        # learning down (and costs ~15% of a CPU step). `--set dropout=...` still applies.
        return {"vocab_size": SORTING_VOCAB, "dropout": 0.0}

    @classmethod
    def check(cls, config: SortingConfig, model_config: Any) -> None:
        if model_config.vocab_size < SORTING_VOCAB:
            raise ValueError(
                f"the sorting task needs vocab_size >= {SORTING_VOCAB}, "
                f"got {model_config.vocab_size}"
            )
        seg = model_config.segment_len
        if seg > config.seq_len:
            raise ValueError(
                f"segment_len ({seg}) is longer than the sequence (seq_len T = {config.seq_len}): "
                "nothing would be left for the memory; use a longer --seq-len or a shorter "
                "segment (--set segment_len=...)"
            )
        if seg < NUM_TARGETS + 1:
            raise ValueError(
                f"segment_len must be >= {NUM_TARGETS + 1} so that the {NUM_TARGETS} answer "
                f"positions fit in the last segment, got {seg}"
            )

    def blocks(self, length: int, segment_len: int) -> list[tuple[int, int]]:
        return self.bounds  # every example has the same length

    def eval_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        return {**self.scored_metrics(sums), "examples": sums.get("count", 0.0) / NUM_TARGETS}

    def chance(self) -> dict[str, float]:
        return {
            "uniform": chance_accuracy(),
            "format-only": chance_accuracy(exclude_seen=True),
        }

    # ---- inspection: one sequence of the split, its separator and answer included
    def inspection_stream(self, split: str, length: int) -> torch.Tensor:
        check_positive_int("length", length, minimum=NUM_TARGETS + 1)
        seq_len = length - NUM_TARGETS
        data = SortingDataset(seq_len, batch_size=1, split=check_split(split), seed=0)
        return data.batch(0)[0][0]

    # ---- generation: the prompt is the symbols; the model answers after the separator
    def encode_prompt(self, text: str) -> tuple[torch.Tensor, list[int] | None]:
        """`text`: symbols 0–19 separated by spaces/commas, or "random" / "random:T" for a test
        sequence of length T (default: the training T). The separator is appended."""
        text = text.strip()
        match = re.fullmatch(r"random(?::(\d+))?", text)
        if match:
            length = int(match.group(1) or self.config.seq_len)
            if not 1 <= length <= MAX_PROMPT_LEN:
                raise ValueError(
                    f"--prompt random:T needs 1 <= T <= {MAX_PROMPT_LEN:,} symbols, got {length:,}"
                )
            data = SortingDataset(seq_len=length, batch_size=1, split="test", seed=0)
            inputs, targets = data.batch(0)
            return inputs[0, : length + 1], targets[0, -NUM_TARGETS:].tolist()
        parts = [p for p in re.split(r"[\s,]+", text) if p]
        if len(parts) > MAX_PROMPT_LEN:
            raise ValueError(f"a sorting prompt holds at most {MAX_PROMPT_LEN:,} symbols")
        try:
            symbols = [int(p) for p in parts]
        except ValueError:
            raise ValueError(
                f"a sorting prompt is symbols 0-{NUM_SYMBOLS - 1} separated by spaces, or "
                f"'random[:T]'; got {text[:40]!r}"
            ) from None
        if not symbols or min(symbols) < 0 or max(symbols) >= NUM_SYMBOLS:
            raise ValueError(f"sorting symbols must be in 0..{NUM_SYMBOLS - 1} (at least one)")
        return torch.tensor(symbols + [SEP], dtype=torch.long), None

    def default_new_tokens(self) -> int:
        return NUM_TARGETS
