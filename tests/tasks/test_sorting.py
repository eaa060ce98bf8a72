"""The sorting task: answers on hand-built examples, the drifting mixture, layout, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inftyformer.native.model import IGNORE_INDEX
from inftyformer.tasks.sorting import (
    NUM_SYMBOLS,
    NUM_TARGETS,
    SEP,
    SortingConfig,
    SortingDataset,
    chance_accuracy,
    sample_symbols,
    segment_bounds,
    sorting_batch,
    sorting_example,
    sorting_targets,
)


def _absent_ascending(present: list[int]) -> list[int]:
    return [s for s in range(NUM_SYMBOLS) if s not in present]


def test_target_ties_by_first_occurrence_and_absent_last() -> None:
    # counts: 7 -> 3, 3 -> 2, 1 -> 2, 5 -> 1; 3 occurs before 1, so it wins the tie.
    x = np.array([[3, 7, 1, 7, 3, 1, 5, 7]])  # [1, 8]
    got = sorting_targets(x)[0].tolist()
    assert got == [7, 3, 1, 5] + _absent_ascending([7, 3, 1, 5])


def test_target_tie_order_follows_first_occurrence_not_symbol() -> None:
    x = np.array([[19, 0, 0, 19], [0, 19, 19, 0]])  # [2, 4]: two-way ties, opposite order
    got = sorting_targets(x)
    assert got[0].tolist()[:2] == [19, 0]
    assert got[1].tolist()[:2] == [0, 19]
    assert got[0].tolist()[2:] == list(range(1, 19))


def test_target_single_symbol_and_all_symbols() -> None:
    assert sorting_targets(np.array([[12] * 5]))[0].tolist() == [12] + _absent_ascending([12])
    every = np.arange(NUM_SYMBOLS)[::-1][None, :]  # each symbol once, 19 first
    assert sorting_targets(every)[0].tolist() == list(range(19, -1, -1))


def test_targets_match_brute_force_on_random_rows() -> None:
    rng = np.random.default_rng(3)
    x = rng.integers(0, 6, size=(20, 15))  # few symbols -> many ties and absences
    got = sorting_targets(x)
    for row, answer in zip(x.tolist(), got.tolist(), strict=True):
        first = {s: row.index(s) if s in row else len(row) for s in range(NUM_SYMBOLS)}
        expected = sorted(range(NUM_SYMBOLS), key=lambda s: (-row.count(s), first[s], s))
        assert answer == expected


def test_sorting_targets_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="symbols"):
        sorting_targets(np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="symbols"):
        sorting_targets(np.array([[1, SEP]]))


def test_batch_layout_and_shapes() -> None:
    seq_len, batch = 50, 4
    inputs, targets = sorting_batch(seq_len, batch, np.random.default_rng(0))
    assert inputs.shape == targets.shape == (batch, seq_len + NUM_TARGETS)
    assert inputs.dtype == targets.dtype == torch.long
    assert bool((inputs[:, :seq_len] < NUM_SYMBOLS).all()) and bool((inputs >= 0).all())
    assert bool((inputs[:, seq_len] == SEP).all())
    assert bool((targets[:, :seq_len] == IGNORE_INDEX).all())
    answer = targets[:, seq_len:]  # [B, 20]
    # teacher forcing: the input after SEP is the answer shifted right by one
    assert torch.equal(inputs[:, seq_len + 1 :], answer[:, :-1])
    assert torch.equal(answer.sort(dim=1).values, torch.arange(20).expand(batch, 20))
    expected = sorting_targets(inputs[:, :seq_len].numpy())
    assert torch.equal(answer, torch.from_numpy(expected))


def test_sorting_example_uses_given_symbols() -> None:
    x = np.array([[2, 2, 4]])  # [1, 3]
    inputs, targets = sorting_example(x)
    assert inputs[0].tolist()[:4] == [2, 2, 4, SEP]
    assert targets[0].tolist()[:5] == [IGNORE_INDEX] * 3 + [2, 4]


def test_mixture_drifts_within_a_sequence() -> None:
    # Per sequence, symbol frequencies in the first and last windows must differ far more than
    # sampling noise (measured on the same symbols with positions shuffled).
    rng = np.random.default_rng(11)
    seq_len, window = 8000, 1000
    drift, noise = [], []
    for _ in range(4):
        x = sample_symbols(seq_len, 16, rng)  # [16, T]
        shuffled = rng.permuted(x, axis=1)

        def tv(a: np.ndarray) -> np.ndarray:
            early = np.stack([np.bincount(r, minlength=20) for r in a[:, :window]]) / window
            late = np.stack([np.bincount(r, minlength=20) for r in a[:, -window:]]) / window
            return 0.5 * np.abs(early - late).sum(axis=1)  # [16]

        drift.append(tv(x))
        noise.append(tv(shuffled))
    drift_tv, noise_tv = np.concatenate(drift).mean(), np.concatenate(noise).mean()
    assert drift_tv > 2.0 * noise_tv, (drift_tv, noise_tv)
    assert drift_tv > 0.12


def test_mixture_weights_are_randint_1_to_10() -> None:
    # T = 1 samples only p_start. With p ∝ randint(1, 10), no symbol can be rarer than 1/(1+19*10)
    # of the draws or more common than 10/(10+19); over many rows every symbol appears.
    x = sample_symbols(1, 20000, np.random.default_rng(5))[:, 0]  # [20000]
    freq = np.bincount(x, minlength=20) / x.size
    assert freq.min() > 0.03 and freq.max() < 0.07  # marginal is uniform: 1/20 each


def test_dataset_is_a_pure_function_of_seed_split_index() -> None:
    ds = SortingDataset(seq_len=30, batch_size=3, split="train", seed=7)
    a = ds.batch(5)
    b = SortingDataset(seq_len=30, batch_size=3, split="train", seed=7).batch(5)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(ds.batch(6)[0], a[0])
    assert not torch.equal(SortingDataset(30, 3, "train", seed=8).batch(5)[0], a[0])
    # iteration from a start index = indexing (resuming is just the batch index)
    started = SortingDataset(30, 3, "train", seed=7, start=5)
    assert torch.equal(next(iter(started))[0], a[0])
    firsts = [x for x, _ in ds.iterate(4, 7)]
    assert len(firsts) == 3 and torch.equal(firsts[1], a[0])


def test_splits_do_not_overlap() -> None:
    seen: dict[bytes, str] = {}
    for split in ("train", "valid", "test"):
        ds = SortingDataset(seq_len=40, batch_size=4, split=split, seed=0)
        for index in range(10):
            for row in ds.batch(index)[0]:
                key = row.numpy().tobytes()
                assert key not in seen, f"{split} batch {index} repeats a {seen.get(key)} row"
                seen[key] = split


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"seq_len": 0}, ValueError, "seq_len"),
        ({"seq_len": 2.5}, TypeError, "seq_len"),
        ({"seq_len": True}, TypeError, "seq_len"),
        ({"seq_len": None}, TypeError, "seq_len"),
    ],
)
def test_config_validation(kwargs: dict, error: type, name: str) -> None:
    with pytest.raises(error, match=name):
        SortingConfig(**kwargs)


def test_dataset_validation() -> None:
    with pytest.raises(ValueError, match="split"):
        SortingDataset(10, 2, split="dev")
    with pytest.raises(ValueError, match="batch_size"):
        SortingDataset(10, 0)
    with pytest.raises(TypeError, match="rng"):
        sorting_batch(10, 2, rng=0)  # type: ignore[arg-type]


def test_chance_accuracy() -> None:
    assert chance_accuracy() == pytest.approx(0.05)
    harmonic = sum(1 / k for k in range(1, 21))
    assert chance_accuracy(exclude_seen=True) == pytest.approx(harmonic / 20)


def test_segment_bounds_examples() -> None:
    assert segment_bounds(4116, 1024)[0] == (0, 20)
    assert segment_bounds(4116, 1024)[-1] == (3092, 4116)
    assert segment_bounds(42, 21) == [(0, 21), (21, 42)]
    assert segment_bounds(10, 21) == [(0, 10)]
    with pytest.raises(ValueError, match="segment_len"):
        segment_bounds(100, NUM_TARGETS)


@settings(max_examples=100, deadline=None)
@given(total=st.integers(1, 5000), seg=st.integers(NUM_TARGETS + 1, 600))
def test_segment_bounds_cover_and_last_is_full(total: int, seg: int) -> None:
    bounds = segment_bounds(total, seg)
    assert bounds[0][0] == 0 and bounds[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    assert all(0 < end - start <= seg for start, end in bounds)
    assert len(bounds) == math.ceil(total / seg)
    if total >= seg:
        assert bounds[-1][1] - bounds[-1][0] == seg
        assert bounds[-1][0] <= total - NUM_TARGETS  # every target position in the last one


def test_inspection_stream_is_one_sequence_with_its_answer() -> None:
    from tiny_models import tiny_sorting

    from inftyformer.tasks import RunContext, SortingTask
    from inftyformer.tasks.sorting import SORTING_VOCAB

    task = SortingTask(SortingConfig(seq_len=96), tiny_sorting(), RunContext(batch_size=2, seed=0))
    stream = task.inspection_stream("test", 300)
    assert stream.shape == (300,) and int(stream[280]) == SEP
    assert int(stream.max()) < SORTING_VOCAB
