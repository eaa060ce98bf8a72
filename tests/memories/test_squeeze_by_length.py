"""squeeze="by_length": the unbounded update shares [0, 1] among the stored tokens
(τ_t = min(τ, S / (S + L))) instead of squeezing the past by a fixed τ."""

import pytest
import torch

from inftyformer import LongTermConfig, LongTermMemory, LongTermState
from inftyformer.core.state import UNKNOWN_STORED
from inftyformer.extensions.places import place_positions, pool_by_length, rank_positions
from inftyformer.extensions.squeezes import FillSqueeze


def config(**overrides) -> LongTermConfig:
    base = dict(dim=4, num_heads=1, num_basis=128, widths=(0.01, 0.02), ridge_lambda=1e-3)
    base.update(conv_gate=False, squeeze="by_length", density="mixture")
    base.update(overrides)
    if base["squeeze"] != "fill":  # the resampling squeezes' M and τ
        base = {"num_samples": 256, "tau": 0.9, **base}
    return LongTermConfig(**base)


def stream(T: int = 128) -> torch.Tensor:
    """A smooth function of the stream position s/T, [1, T, 4]."""
    s = (torch.arange(T, dtype=torch.float32) + 0.5) / T
    return torch.stack([torch.sin(4 * s), torch.cos(3 * s), s, s * s], -1)[None]


def fitted(memory: LongTermMemory, x: torch.Tensor, segment: int) -> LongTermState:
    state = memory.init_state(x.shape[0])
    for part in x.split(segment, dim=1):
        state = memory.update(state, part)
    return state


@pytest.mark.parametrize("squeeze", ["by_length", "fixed"])
def test_by_length_keeps_the_stream_uniform_over_the_signal(squeeze):
    """After 4 segments of 32, token s of 128 sits at (s + ½)/128 by length; a fixed τ = 0.5
    squeezes the old segments into [0, 0.5] instead."""
    x = stream()
    tau = 0.9 if squeeze == "by_length" else 0.5
    # no edge padding: it pulls each segment's ends towards 0 and the update keeps those dips
    memory = LongTermMemory(config(squeeze=squeeze, tau=tau, edge_padding=False))
    state = fitted(memory, x, 32)
    t = (torch.arange(128, dtype=torch.float32) + 0.5) / 128
    error = ((memory.signal(state, t) - x).norm() / x.norm()).item()
    if squeeze == "by_length":
        assert error < 0.05
    else:
        assert error > 0.2
    assert state.stored.tolist() == [128]


def test_squeeze_ratios_by_hand():
    memory = LongTermMemory(config(tau=0.75))
    stored = torch.tensor([256, 512, 768, UNKNOWN_STORED])
    ratios = memory.config.squeeze.squeeze_ratios(stored, 256).tolist()
    assert ratios == pytest.approx([0.5, 2 / 3, 0.75, 0.75])
    fixed = LongTermMemory(config(tau=0.75, squeeze="fixed"))
    assert fixed.config.squeeze.squeeze_ratios(stored, 256).tolist() == [0.75] * 4


@pytest.mark.parametrize(
    "squeeze, kept", [("by_length", {}), ("fill", {}), ("fill", dict(keep_first=2, keep_last=5))]
)
def test_rows_of_different_lengths_equal_separate_streams(squeeze, kept):
    """A row reset midway squeezes by its own τ (fill: a row not yet full beside full ones,
    which with keep_last first overflow into their kept tail): the batch equals each row run
    alone."""
    torch.manual_seed(0)
    memory = LongTermMemory(config(num_basis=32, widths=(0.05, 0.1), squeeze=squeeze, **kept))
    segments = [torch.randn(3, 8, 4) for _ in range(4)]
    resets = [None, None, torch.tensor([False, True, False]), None]

    def run(rows):
        state = memory.init_state(len(rows))
        for x, reset in zip(segments, resets, strict=True):
            if reset is not None:
                state = memory.reset(state, reset[rows])
            state = memory.update(state, x[rows])
        return state

    batched = run(torch.arange(3))
    assert batched.stored.tolist() == [32, 16, 32]
    for i in range(3):
        alone = run(torch.tensor([i]))
        # float32 ridge solves of a batch and of one row round apart by ~1e-5 of the largest
        # coefficient (the fit's conditioning; CPUs differ); another row's fit is off by O(1)
        scale = alone.coefficients.abs().max()
        assert torch.allclose(batched.coefficients[i], alone.coefficients[0], atol=2e-5 * scale)


def test_states_saved_without_a_length_load_as_long():
    memory = LongTermMemory(config())
    state = memory.update(memory.init_state(2), torch.randn(2, 5, 4))
    state = memory.reset(state, torch.tensor([False, True]))
    saved = {k: v for k, v in state.tensors().items() if k != "stored"}
    loaded = LongTermState.from_tensors(saved)
    assert loaded.stored.tolist() == [UNKNOWN_STORED, 0]
    loaded.check(memory.config)


def test_bad_squeeze_settings_and_lengths_are_refused():
    with pytest.raises(ValueError, match="squeeze"):
        config(squeeze="linear")
    memory = LongTermMemory(config())
    state = memory.init_state(2)
    with pytest.raises(TypeError, match="stored"):
        memory.update(LongTermState(**{**state.tensors(), "stored": state.stored.float()}),
                      torch.randn(2, 3, 4))  # fmt: skip
    with pytest.raises(ValueError, match="stored"):
        memory.update(LongTermState(**{**state.tensors(), "stored": state.stored - 1}),
                      torch.randn(2, 3, 4))  # fmt: skip


def test_fill_places_one_token_per_centre_until_the_memory_is_full():
    """squeeze="fill", K = 128 centres: 64 tokens sit on the first 64 centres, s/(K − 1), and
    once more than K tokens are stored the signal spans [0, 1] as under "by_length"."""
    x = stream(192)
    memory = LongTermMemory(config(squeeze="fill", edge_padding=False, widths=(0.02,)))
    state = fitted(memory, x[:, :64], 32)
    assert FillSqueeze().extent(state.stored, 128).tolist() == [63 / 127]
    t = torch.arange(64, dtype=torch.float32) / 127
    error = ((memory.signal(state, t) - x[:, :64]).norm() / x[:, :64].norm()).item()
    assert error < 0.05
    full = fitted(memory, x, 32)
    assert FillSqueeze().extent(full.stored, 128).tolist() == [1.0]
    by_length = LongTermMemory(config(edge_padding=False, widths=(0.02,)))
    t = (torch.arange(192, dtype=torch.float32) + 0.5) / 192
    for m, s in ((memory, full), (by_length, fitted(by_length, x, 32))):
        error = ((m.signal(s, t) - x).norm() / x.norm()).item()
        assert error < 0.1


def test_fill_at_narrow_widths_keeps_every_token_exactly():
    """Widths well below the centres' spacing: the signal at the centres is the stored tokens
    themselves (random vectors, nothing smooth), as long as the memory is not full."""
    torch.manual_seed(0)
    memory = LongTermMemory(
        config(squeeze="fill", widths=(0.003,), ridge_lambda=1e-6, edge_padding=False)
    )
    x = torch.randn(2, 96, 4)
    state = fitted(memory, x, 32)
    at_centres = memory.signal(state, memory.basis.centers[:96])
    torch.testing.assert_close(at_centres, x, rtol=1e-3, atol=1e-3)


def test_pool_by_length_by_hand():
    """K = 4 places full with S = 4 tokens (one each), L = 2 new: r = 6 / 4 = 1.5 tokens per
    place, place k the mean of the units over [1.5 k, 1.5 k + 1.5)."""
    old = torch.tensor([[[0.0], [2.0], [4.0], [6.0]]])
    new = torch.tensor([[[8.0], [10.0]]])
    places, filled = pool_by_length(old, torch.tensor([4]), new)
    stream = [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    expected = [
        (stream[0] + 0.5 * stream[1]) / 1.5,
        (0.5 * stream[1] + stream[2]) / 1.5,
        (stream[3] + 0.5 * stream[4]) / 1.5,
        (0.5 * stream[4] + stream[5]) / 1.5,
    ]
    assert places[0, :, 0].tolist() == pytest.approx(expected)
    assert filled.tolist() == [4]
    # S = 4 places of 2 tokens each (8 tokens), L = 4 new: r = 3, old places weigh twice
    new = torch.tensor([[[8.0], [9.0], [10.0], [11.0]]])
    places, _ = pool_by_length(old, torch.tensor([8]), new)
    assert places[0, :, 0].tolist() == pytest.approx(
        [(0 * 2 + 2 * 1) / 3, (2 * 1 + 4 * 2) / 3, (6 * 2 + 8) / 3, (9 + 10 + 11) / 3]
    )


def test_pool_by_length_fills_then_keeps_one_place_per_equal_run():
    """Not full: the new tokens go on the next places, one each, the rest stay zero. Rows of
    different lengths pool on their own; the new tokens get gradients."""
    old = torch.zeros(2, 6, 1)
    old[0, :2, 0] = torch.tensor([1.0, 2.0])
    old[1, :, 0] = torch.arange(6.0)
    new = torch.tensor([[[3.0], [4.0]], [[6.0], [7.0]]], requires_grad=True)
    places, filled = pool_by_length(old, torch.tensor([2, 6]), new)
    assert places[0, :, 0].tolist() == [1.0, 2.0, 3.0, 4.0, 0.0, 0.0]
    assert places[1, :, 0].tolist() == pytest.approx([(k * 8 / 6 + (k + 1) * 8 / 6 - 1) / 2
                                                      for k in range(6)], abs=0.2)  # fmt: skip
    assert filled.tolist() == [4, 6]
    places.sum().backward()
    assert new.grad.abs().min() > 0


def test_fill_past_full_keeps_the_stream_in_order_on_the_centres():
    """A ramp (token s holds s) streamed into K = 64 places by segments of 40, 600 tokens: every
    place holds the mean of its run, (k + ½) · 600 / 64 − ½, within a quarter of a place (each
    merge takes the older places as constant over their runs)."""
    K, T = 64, 600
    memory = LongTermMemory(
        config(
            num_basis=K, widths=(0.004,), ridge_lambda=1e-6, squeeze="fill",
            edge_padding=False,
        )
    )  # fmt: skip
    x = torch.arange(T, dtype=torch.float32)[None, :, None].expand(2, T, 4).contiguous()
    state = fitted(memory, x, 40)
    at_centres = memory.signal(state, memory.basis.centers)[..., 0]  # [2, K]
    expected = (torch.arange(K) + 0.5) * T / K - 0.5
    assert torch.allclose(place_positions(state.stored, K)[0], expected.double())
    assert (at_centres - expected).abs().max() < 0.25 * T / K
    assert state.stored.tolist() == [T, T]


def test_keep_first_never_merges_the_first_tokens():
    """keep = 2 of K = 5 places: the stream's first two tokens stay on places 0 and 1 whatever
    follows; the other places share the rest by equal runs. A row still filling (S = 1) places
    one token per centre."""
    old = torch.tensor([[[0.0], [1.0], [2.0], [3.0], [4.0]], [[7.0], [0.0], [0.0], [0.0], [0.0]]])
    new = torch.tensor([[[5.0], [6.0], [7.0]], [[8.0], [9.0], [10.0]]])
    places, filled = pool_by_length(old, torch.tensor([5, 1]), new, keep=2)
    # row 0: tokens 2..7 (6 tokens) on 3 places, 2 each
    assert places[0, :, 0].tolist() == pytest.approx([0.0, 1.0, 2.5, 4.5, 6.5])
    assert places[1, :, 0].tolist() == [7.0, 8.0, 9.0, 10.0, 0.0]
    assert filled.tolist() == [5, 4]


def test_keep_first_over_many_merges():
    """K = 32, keep 4, a ramp of 500 tokens by segments of 24: places 0–3 hold tokens 0–3, the
    others the means of equal runs of tokens 4–499."""
    K, T, keep = 32, 500, 4
    memory = LongTermMemory(
        config(
            num_basis=K, widths=(0.004,), ridge_lambda=1e-6, squeeze="fill",
            edge_padding=False, keep_first=keep,
        )
    )  # fmt: skip
    x = torch.arange(T, dtype=torch.float32)[None, :, None].expand(1, T, 4).contiguous()
    at_centres = memory.signal(fitted(memory, x, 24), memory.basis.centers)[0, :, 0]
    assert at_centres[:keep].tolist() == pytest.approx([0.0, 1.0, 2.0, 3.0], abs=1e-2)
    r = (T - keep) / (K - keep)
    expected = keep + (torch.arange(K - keep) + 0.5) * r - 0.5
    positions = place_positions(torch.tensor([T]), K, keep)[0]
    assert torch.allclose(positions, torch.cat([torch.arange(keep), expected]).double())
    # each merge takes the older places as constant over their runs, which pulls the oldest
    # merged place toward later tokens by a fraction of a run (0.27 r here)
    assert (at_centres[keep:] - expected).abs().max() < 0.35 * r


@pytest.mark.parametrize("keep, keep_last", [(0, 0), (3, 0), (0, 4), (3, 4)])
def test_place_positions_are_the_mean_token_index_of_each_place(keep, keep_last):
    """A ramp (token s holds s) pooled in one update: each place holds the mean index of its
    run of tokens, which `place_positions` gives exactly when a run is whole tokens (r = 7) and
    within half a token when runs split tokens; while the memory fills, place k is token k."""
    K, e = 16, 2
    ends = keep + keep_last
    for T, tolerance in ((ends + (K - ends) * 7, 1e-9), (100, 0.5), (11, 1e-9)):
        ramp = torch.arange(T, dtype=torch.float64)[None, :, None].expand(2, T, e)
        places, filled = pool_by_length(
            torch.zeros(2, K, e, dtype=torch.float64),
            torch.zeros(2, dtype=torch.long),
            ramp,
            keep,
            keep_last,
        )
        P = int(filled[0])
        positions = place_positions(torch.tensor([T, T]), K, keep, keep_last)  # [2, K]
        assert positions.shape == (2, K) and positions.dtype == torch.float64
        assert (places[:, :P, 0] - positions[:, :P]).abs().max() <= tolerance


def test_keep_last_by_hand():
    """K = 6 places, keep_first 1, keep_last 2, three rows of a ramp (token s holds s) at
    different lengths in one batch, 5 then 3 new tokens.

    Row 0 (S = 4, filling) overflows to 9 tokens: token 0, then tokens 1–6 in runs of 2 on the 3
    middle places, then tokens 7 and 8 one each. Its next 3 tokens make 12: tokens 7 and 8 leave
    the tail and join the middle (9 tokens, runs of 3) one token each, the old middle places as
    2 tokens each (their mean over their run), the tail is tokens 10 and 11.
    Row 1 (S = 1) fills up to exactly K = 6, then overflows from a full memory as row 0 did.
    Row 2 (S = 0) fills 5 places, then overflows to 8: tokens 1–5 in runs of 5/3."""
    old = torch.zeros(3, 6, 1, dtype=torch.float64)
    old[0, :4, 0] = torch.arange(4.0)
    old[1, 0, 0] = 0.0
    stored = torch.tensor([4, 1, 0])
    new = (stored[:, None] + torch.arange(5))[..., None].double()
    places, filled = pool_by_length(old, stored, new, keep=1, keep_last=2)
    assert places[0, :, 0].tolist() == [0.0, 1.5, 3.5, 5.5, 7.0, 8.0]
    assert places[1, :, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert places[2, :, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 0.0]
    assert filled.tolist() == [6, 6, 5]
    assert place_positions(stored + 5, 6, 1, 2)[0].tolist() == [0.0, 1.5, 3.5, 5.5, 7.0, 8.0]

    stored = stored + 5
    new = (stored[:, None] + torch.arange(3))[..., None].double()
    places, filled = pool_by_length(places, stored, new, keep=1, keep_last=2)
    assert places[0, :, 0].tolist() == pytest.approx(
        [0.0, (1.5 * 2 + 3.5) / 3, (3.5 + 5.5 * 2) / 3, (7 + 8 + 9) / 3, 10.0, 11.0]
    )
    assert places[1, :, 0].tolist() == pytest.approx([0.0, 1.5, 3.5, 5.5, 7.0, 8.0])
    assert places[2, :, 0].tolist() == pytest.approx(
        [0.0, (1 + 2 * 2 / 3) * 3 / 5, (2 / 3 + 3 + 4 / 3) * 3 / 5, (4 * 2 / 3 + 5) * 3 / 5, 6, 7]
    )
    assert filled.tolist() == [6, 6, 6]
    # the runs' mean token indices: tokens 1–3, 4–6, 7–9 (row 0); runs of 5/3 from 1 (row 2)
    positions = place_positions(stored + 3, 6, 1, 2)
    assert positions[0].tolist() == [0.0, 2.0, 5.0, 8.0, 10.0, 11.0]
    assert positions[1].tolist() == [0.0, 1.5, 3.5, 5.5, 7.0, 8.0]
    assert positions[2].tolist() == pytest.approx([0.0, 4 / 3, 3.0, 14 / 3, 6.0, 7.0])


@pytest.mark.parametrize("keep", [0, 4])
def test_keep_last_over_many_merges(keep):
    """A ramp of 600 tokens through K = 64 places by segments of 40, the last 16 never merged:
    the last 16 places hold tokens 584–599 exactly, the middle ones the means of equal runs of
    the tokens between (within a fraction of a run), at their `place_positions`."""
    K, T, keep_last = 64, 600, 16
    memory = LongTermMemory(
        config(
            num_basis=K, widths=(0.004,), ridge_lambda=1e-6, squeeze="fill",
            edge_padding=False, keep_first=keep, keep_last=keep_last,
        )
    )  # fmt: skip
    x = torch.arange(T, dtype=torch.float32)[None, :, None].expand(1, T, 4).contiguous()
    at_centres = memory.signal(fitted(memory, x, 40), memory.basis.centers)[0, :, 0]
    tail = torch.arange(T - keep_last, T, dtype=torch.float32)
    assert (at_centres[K - keep_last :] - tail).abs().max() < 1e-2
    assert torch.allclose(at_centres[:keep], torch.arange(keep, dtype=torch.float32), atol=1e-2)
    r = (T - keep - keep_last) / (K - keep - keep_last)
    middle = keep + (torch.arange(K - keep - keep_last) + 0.5) * r - 0.5
    positions = place_positions(torch.tensor([T]), K, keep, keep_last)[0]
    want = torch.cat([torch.arange(keep), middle, tail]).double()
    assert torch.allclose(positions, want)
    # the older places taken as constant over their runs: a quarter of a run off (0.24 r here)
    assert (at_centres[keep : K - keep_last] - middle).abs().max() < 0.3 * r


def test_keep_first_needs_fill():
    with pytest.raises(ValueError, match="keep_first"):
        config(keep_first=4)
    with pytest.raises(ValueError, match="keep_first"):
        config(squeeze="fill", keep_first=128)
    with pytest.raises(TypeError, match="keep_first"):
        config(squeeze="fill", keep_first=1.5)


def test_keep_last_needs_fill_and_a_middle_place():
    with pytest.raises(ValueError, match="keep_last"):
        config(keep_last=4)
    with pytest.raises(ValueError, match="keep_last"):
        config(squeeze="fill", keep_last=128)
    with pytest.raises(ValueError, match="keep_last"):
        config(squeeze="fill", keep_first=4, keep_last=124)
    with pytest.raises(ValueError, match="keep_last"):
        config(squeeze="fill", keep_last=-1)
    with pytest.raises(TypeError, match="keep_last"):
        config(squeeze="fill", keep_last=2.0)
    settings = dict(squeeze="fill", widths=(0.01,))
    assert config(**settings, keep_first=4, keep_last=123).keep_last == 123


def test_fill_needs_a_content_density_and_no_sticky_memories():
    with pytest.raises(ValueError, match="fill"):
        config(squeeze="fill", sticky=True)
    with pytest.raises(ValueError, match="fill"):
        config(squeeze="fill", density="normalized")
    with pytest.raises(ValueError, match="num_samples is a setting of squeeze 'fixed' or"):
        config(squeeze="fill", num_samples=64)  # its places are the K centres


def test_rank_positions_are_the_stream_positions_until_places_merge_then_one_apart():
    """While every place holds one token a place's rank is its stream position; once the
    stream outgrows K places they are the last K token indices before the window, by hand."""
    stored = torch.tensor([0, 3, 6, 9, 1000])
    ranks = rank_positions(stored, 6)  # [5, 6]
    assert torch.equal(ranks[:3], place_positions(stored[:3], 6).expand(3, -1))
    assert ranks[3].tolist() == [3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert ranks[4].tolist() == [994.0, 995.0, 996.0, 997.0, 998.0, 999.0]
    assert ranks.dtype == torch.float64
