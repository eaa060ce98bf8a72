"""keep_salient: a fill memory keeps B places for the most salient tokens between the kept first
and last ones (`places.pool_salient`), the places' records in the state."""

import dataclasses

import pytest
import torch

from inftyformer import LongTermConfig, LongTermMemory, LongTermState
from inftyformer.extensions.places import (
    TOKENS,
    initial_records,
    place_positions,
    pool_by_length,
    pool_salient,
    record_positions,
    salience,
)


def config(**overrides) -> LongTermConfig:
    base = dict(dim=3, num_heads=1, num_basis=24, widths=(0.005,))
    base.update(conv_gate=False, squeeze="fill", density="mixture", edge_padding=False)
    base.update(overrides)
    if base["squeeze"] != "fill":  # the resampling squeezes' τ
        base = {"tau": 0.9, **base}
    return LongTermConfig(**base)


def feed(K, keep, keep_last, budget, lengths, seed=0, batch=2):
    """Random segments (one channel: the token index) through `pool_salient` and
    `pool_by_length`: yields (T, salient places, their records, the library's places)."""
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    sal = torch.randn(batch, total, generator=g, dtype=torch.float64)
    ours = theirs = torch.zeros(batch, K, 2, dtype=torch.float64)
    records, S = initial_records(batch, K), 0
    for L in lengths:
        x = torch.cat(
            [torch.arange(S, S + L, dtype=torch.float64).expand(batch, L)[..., None],
             torch.randn(batch, L, 1, generator=g, dtype=torch.float64)], -1,
        )  # fmt: skip
        stored = torch.full((batch,), S)
        ours, records, n = pool_salient(ours, records, stored, x, sal[:, S : S + L], keep,
                                        keep_last, budget)  # fmt: skip
        theirs, m = pool_by_length(theirs, stored, x, keep, keep_last)
        assert n.tolist() == m.tolist() == [min(S + L, K)] * batch
        S += L
        yield S, ours, records, theirs, sal[:, :S]


@pytest.mark.parametrize("keep, keep_last", [(0, 0), (3, 0), (2, 6)])
def test_without_a_budget_the_places_are_the_equal_runs(keep, keep_last):
    for T, ours, records, theirs, _ in feed(24, keep, keep_last, 0, [7, 9, 16, 5, 16, 30, 16]):
        assert (ours - theirs).abs().max() < 1e-10, T
        want = place_positions(torch.full((2,), T), 24, keep, keep_last)
        assert (record_positions(records) - want).abs().max() < 1e-9, T


def test_the_most_salient_tokens_keep_their_own_places():
    """Past the first merge, the B most salient tokens between the kept first and last ones are
    places of their own, at their index, with their exact value; every other token is merged,
    nothing is lost (the places' tokens and values sum to the stream's), in stream order."""
    K, keep, keep_last, B = 24, 2, 4, 5
    *_, (T, places, records, _, sal) = feed(K, keep, keep_last, B, [8] * 12)
    assert T == 96
    middle = sal[:, keep : T - keep_last]
    for row in range(2):
        best = set((middle[row].topk(B).indices + keep).tolist())
        whole = records[row, :, TOKENS] == 1
        at = set(places[row, whole, 0].round().long().tolist())
        assert best | set(range(keep)) | set(range(T - keep_last, T)) == at
        assert torch.equal(places[row, whole, 0], record_positions(records)[row, whole])
    n = records[..., TOKENS]
    assert torch.allclose(n.sum(1), torch.full((2,), float(T), dtype=torch.float64))
    index_sum = (n * places[..., 0]).sum(1)  # Σ tokens × mean index = Σ of every index
    assert torch.allclose(index_sum, torch.full((2,), T * (T - 1) / 2, dtype=torch.float64))
    assert bool((record_positions(records).diff(dim=1) > 0).all())


def test_salience_is_the_largest_burst_mean_among_the_last_tokens():
    s = torch.tensor([[0.0, 0.0, 9.0, 0.0, 0.0, 0.0, 0.0]])
    got = salience(s, burst=2, after=3)  # means of 2 ending at j, max over j ∈ [i − 2, i]
    assert got[0].tolist() == [0.0, 0.0, 4.5, 4.5, 4.5, 4.5, 0.0]  # bursts ending at 2 and 3


def test_salience_before_a_burst_looks_ahead():
    s = torch.tensor([[0.0, 0.0, 0.0, 0.0, 9.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    # bursts of 2 ending at 4 and 5 (mean 4.5); token i: those ending at i − 2 … i (+ 1)
    assert salience(s, burst=2, after=3)[0].tolist() == [0, 0, 0, 0, 4.5, 4.5, 4.5, 4.5, 0, 0]
    ahead = salience(s, burst=2, after=3, before=1)
    assert ahead[0].tolist() == [0, 0, 0, 4.5, 4.5, 4.5, 4.5, 4.5, 0, 0]
    # cut anywhere into two overlapping spans: the larger of the two (lower bounds) is exact
    whole = salience(s, burst=2, after=3, before=2)
    for cut in range(3, 8):
        first = salience(s[:, :cut], burst=2, after=3, before=2)
        second = salience(s[:, cut - 3 :], burst=2, after=3, before=2)
        got = torch.cat([first[:, : cut - 3], torch.maximum(first[:, cut - 3 :], second[:, :3]),
                         second[:, 3:]], 1)  # fmt: skip
        assert torch.equal(got, whole), cut


def test_salient_before_needs_keep_salient():
    with pytest.raises(ValueError, match="salient_before .* needs keep_salient"):
        config(salient_before=2)
    with pytest.raises(ValueError, match="salient_before"):
        config(keep_salient=3, salient_before=-1)


def test_the_memory_keeps_the_salient_tokens_and_their_records_in_its_state():
    c = config(keep_first=2, keep_last=4, keep_salient=3)
    memory = LongTermMemory(c).eval()
    state = memory.init_state(2)
    assert state.records["places"].shape == (2, 24, 4)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 64, 3, generator=g)
    sal = torch.zeros(2, 64)
    sal[0, 10], sal[1, 40] = 5.0, 5.0
    for a in range(0, 64, 8):
        state = memory.update(state, x[:, a : a + 8], salience=sal[:, a : a + 8])
    places = state.records["places"]
    whole = places[..., TOKENS] == 1
    at = record_positions(places)
    assert 10.0 in at[0, whole[0]].tolist() and 40.0 in at[1, whole[1]].tolist()
    k = int((at[0] == 10.0).nonzero())
    centre = memory.basis.center_grid[k : k + 1]
    assert torch.allclose(memory.signal(state, centre)[0, 0], x[0, 10], atol=1e-2)  # the fits
    again = LongTermState.from_tensors(state.tensors())
    assert torch.equal(again.records["places"], places)
    cleared = state.reset(torch.tensor([True, False])).records["places"]
    assert not bool(cleared[0].any()) and torch.equal(cleared[1], places[1])


def test_the_salience_is_required_and_checked():
    memory = LongTermMemory(config(keep_salient=3))
    state, x = memory.init_state(2), torch.randn(2, 8, 3)
    with pytest.raises(ValueError, match=r"fill\(.*keep_salient=3.*\) keeps places by the new"):
        memory.update(state, x)
    with pytest.raises(ValueError, match="salience"):
        memory.update(state, x, salience=torch.zeros(2, 7))
    with pytest.raises(ValueError, match="salience must not be NaN"):
        memory.update(state, x, salience=torch.full((2, 8), float("nan")))
    bad = dataclasses.replace(state, records={"places": initial_records(2, 5)})
    with pytest.raises(ValueError, match=r"state.records\['places'\] must have shape \(2, 24, 4\)"):
        memory.update(bad, x, salience=torch.zeros(2, 8))
    bad = dataclasses.replace(state, records={})
    with pytest.raises(ValueError, match=r"state.records holds \[\]; squeeze 'fill' keeps"):
        memory.update(bad, x, salience=torch.zeros(2, 8))
    # a memory without keep_salient keeps no records, and takes none
    plain = LongTermMemory(config())
    assert plain.init_state(2).records == {}
    with pytest.raises(ValueError, match=r"records holds \['places'\]; squeeze 'fill' keeps \[\]"):
        plain.update(state, x)


def test_keep_salient_needs_fill_and_a_merged_place():
    with pytest.raises(ValueError, match="keep_salient"):
        config(keep_salient=2, squeeze="by_length", num_samples=256, num_basis=24)
    with pytest.raises(ValueError, match="keep_first \\+ keep_last \\+ keep_salient"):
        config(keep_first=4, keep_last=10, keep_salient=10)
    config(keep_first=4, keep_last=10, keep_salient=9)


def test_a_native_model_refuses_keep_salient():
    from inftyformer.native.model_config import ModelConfig

    memory = dict(num_basis=24, widths=(0.005,), squeeze="fill",
                  density="mixture", edge_padding=False)  # fmt: skip
    ModelConfig(vocab_size=16, long_term=LongTermConfig(**memory))
    with pytest.raises(ValueError, match="keep_salient .* native model"):
        ModelConfig(vocab_size=16, long_term=LongTermConfig(**memory, keep_salient=2))
