"""Right-aligned ragged memories (`inftyformer.ragged`) against a plain per-row reference, and the
short-term memory's block rule."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inftyformer import ragged
from inftyformer.native.short_term_memory import ShortTermMemory, ShortTermState


def rows_of(memory: torch.Tensor, length: torch.Tensor) -> list[torch.Tensor]:
    """The valid states of each row (right-aligned)."""
    width = memory.shape[1]
    return [memory[b, width - int(n) :] for b, n in enumerate(length)]


def random_ragged(draw, batch: int, d: int, max_width: int):
    width = draw(st.integers(0, max_width))
    lengths = draw(st.lists(st.integers(0, width), min_size=batch, max_size=batch))
    length = torch.tensor(lengths, dtype=torch.long)
    memory = torch.randn(batch, width, d) * ragged.valid_mask(length, width)[..., None]
    return memory, length


@st.composite
def concat_case(draw):
    batch = draw(st.integers(1, 4))
    older = random_ragged(draw, batch, 3, 6)
    newer = random_ragged(draw, batch, 3, 5)
    left = draw(st.booleans())
    cap = draw(st.one_of(st.none(), st.integers(0, 8)))
    return older, newer, left, cap


@settings(max_examples=60, deadline=None)
@given(concat_case())
def test_concat_matches_per_row_reference(case):
    (a, a_len), (b, b_len), left, cap = case
    if left:  # the same valid states, stored as a prefix instead
        b = torch.stack(
            [torch.cat([r, r.new_zeros(b.shape[1] - len(r), 3)]) for r in rows_of(b, b_len)]
        )
    out, length = ragged.concat(a, a_len, b, b_len, newer_left_aligned=left, max_length=cap)
    newer_rows = [b[i, : int(n)] for i, n in enumerate(b_len)] if left else rows_of(b, b_len)
    for i, (ra, rb) in enumerate(zip(rows_of(a, a_len), newer_rows, strict=True)):
        expected = torch.cat([ra, rb])
        if cap is not None:
            expected = expected[len(expected) - min(cap, len(expected)) :]
        assert int(length[i]) == len(expected)
        assert torch.equal(rows_of(out, length)[i], expected)
        assert bool((out[i, : out.shape[1] - int(length[i])] == 0).all())  # padding is zero
    assert out.shape[1] == (int(length.max()) if len(length) else 0)


@st.composite
def split_case(draw):
    batch = draw(st.integers(1, 4))
    memory, length = random_ragged(draw, batch, 2, 7)
    count = torch.tensor([draw(st.integers(0, int(n))) for n in length], dtype=torch.long)
    return memory, length, count


@settings(max_examples=60, deadline=None)
@given(split_case())
def test_split_oldest_matches_per_row_reference(case):
    memory, length, count = case
    taken, remaining, remaining_length = ragged.split_oldest(memory, length, count)
    for i, row in enumerate(rows_of(memory, length)):
        n = int(count[i])
        assert torch.equal(taken[i, :n], row[:n])
        assert bool((taken[i, n:] == 0).all())
        assert torch.equal(rows_of(remaining, remaining_length)[i], row[n:])
    assert torch.equal(remaining_length, length - count)


def test_short_term_memory_releases_whole_blocks_beyond_m():
    memory = ShortTermMemory(mem_len=5, block_len=4, unit=1)
    state = ShortTermState(torch.zeros(3, 12, 1), torch.tensor([8, 9, 12]))
    # excess over m: 3, 4, 7 → 0, 1, 1 whole blocks of 4
    assert memory.leaving_count(state.length).tolist() == [0, 4, 4]
    compressive = ShortTermMemory(mem_len=5, block_len=4, unit=3)
    # whole blocks (0, 4, 8, 8 states), each rounded down to a multiple of c = 3
    assert compressive.leaving_count(torch.tensor([8, 9, 13, 14])).tolist() == [0, 3, 6, 6]
    x = torch.arange(12.0).view(1, 12, 1).repeat(3, 1, 1)
    remaining, leaving, count = memory.flush(ShortTermState(x, state.length))
    assert count.tolist() == [0, 4, 4]
    assert leaving[1, :, 0].tolist() == [3.0, 4.0, 5.0, 6.0]  # the oldest valid states of row 1
    assert remaining.length.tolist() == [8, 5, 8]
    appended = memory.append(remaining, torch.ones(3, 2, 1))
    assert appended.length.tolist() == [10, 7, 10]
