"""experiments/passkey_salient.py: with no place kept for salient tokens its places are the
library's equal runs; with some, the most salient tokens keep a place each at their own index,
as the library's `pool_salient` keeps them; the quick run writes its lines."""

import json

import pytest
import torch
from passkey_salient import SalientPlaces

from inftyformer.extensions.places import (
    TOKENS,
    initial_records,
    place_positions,
    pool_by_length,
    pool_salient,
)


def stream(places: SalientPlaces, steps: int, L: int, e: int = 3, keep=4, keep_last=10):
    """Feed random segments to the library's pooling and to `places`; yield both each step."""
    g = torch.Generator().manual_seed(0)
    K, batch = places.K, places.salience.shape[0]
    ours = theirs = torch.zeros(batch, K, e, dtype=torch.float64)
    S = 0
    for _ in range(steps):
        x = torch.randn(batch, L, e, generator=g, dtype=torch.float64)
        stored = torch.full((batch,), S)
        theirs, n = pool_by_length(theirs, stored, x, keep, keep_last)
        ours, m = places.pool(ours, stored, x)
        assert n.tolist() == m.tolist()
        S += L
        yield S, ours, theirs


def test_without_a_budget_the_places_are_the_librarys():
    K, keep, keep_last = 40, 4, 10
    places = SalientPlaces(K, keep, keep_last, budget=0)
    places.salience = torch.randn(2, 300, generator=torch.Generator().manual_seed(1))
    for S, ours, theirs in stream(places, 18, 16):
        assert (ours - theirs).abs().max() < 1e-12
        want = place_positions(torch.full((2,), S), K, keep, keep_last)
        assert (places.positions(torch.full((2,), S), K) - want).abs().max() < 1e-9, S


def test_the_most_salient_tokens_keep_a_place_each_at_their_index():
    K, keep, keep_last, budget = 40, 4, 10, 5
    places = SalientPlaces(K, keep, keep_last, budget)
    sal = torch.zeros(2, 300)
    sal[0, [30, 31, 32, 150, 151]] = 5.0  # row 0: five salient tokens, long merged
    sal[1, 100] = 5.0
    places.salience = sal
    *_, (S, ours, theirs) = stream(places, 18, 16)
    singles = places.singles(S)
    assert {30, 31, 32, 150, 151} <= singles[0] and 100 in singles[1]
    positions = places.positions(torch.full((2,), S), K)
    assert {30.0, 31.0, 32.0, 150.0, 151.0} <= set(positions[0].tolist())
    assert bool((positions.diff(dim=1) > 0).all())  # the places in stream order
    assert (ours - theirs).abs().max() > 1e-3  # other places than the library's


def test_with_a_budget_the_places_are_the_librarys_salient_pooling():
    """The library's vectorised `pool_salient` against this loop-by-loop reference: the same
    values in every place, the same tokens kept whole."""
    K, keep, keep_last, budget = 40, 4, 10, 5
    places = SalientPlaces(K, keep, keep_last, budget)
    places.salience = torch.randn(2, 300, generator=torch.Generator().manual_seed(2))
    g = torch.Generator().manual_seed(3)
    ours = theirs = torch.zeros(2, K, 3, dtype=torch.float64)
    records, S = initial_records(2, K), 0
    for L in [16, 16, 7, 16, 30, 16, 16, 16, 16, 16, 16, 16, 16]:
        x = torch.randn(2, L, 3, generator=g, dtype=torch.float64)
        stored = torch.full((2,), S)
        ours, _ = places.pool(ours, stored, x)
        sal = places.salience[:, S : S + L]
        theirs, records, _ = pool_salient(theirs, records, stored, x, sal, keep, keep_last, budget)
        S += L
        assert (ours - theirs).abs().max() < 1e-12, S
        whole = records[..., TOKENS] == 1
        mine = [{int(lo) for lo in records[b, whole[b], 0].tolist()} for b in range(2)]
        assert mine == places.singles(S), S


def test_the_quick_probe_writes_its_lines(tmp_path):
    pytest.importorskip("transformers")
    import passkey_salient

    out = tmp_path / "lines.jsonl"
    passkey_salient.main(["--quick", "--jsonl", str(out)])
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [("d" in line, "books" in line) for line in lines] == [(True, False), (False, True)]
    assert lines[0]["budget"] == 8 and len(lines[0]["key_kept"]) == 2
    assert lines[1]["books"]["buckets"]
