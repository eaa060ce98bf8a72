"""Inspection: where stored vectors sit after squeezes (by hand), fidelity of a signal the basis
represents exactly, read densities mapped back to the stream, σ shapes, and a tiny model end to
end through `MemoryLM.forward(..., return_trace=True)`."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_models import tiny

from inftyformer import LongTermConfig, LongTermMemory, MemoryLM
from inftyformer.core.attention import density_statistics
from inftyformer.core.ridge import fit_coefficients
from inftyformer.inspection import (
    LayerRecord,
    StreamRecord,
    block_positions,
    compressed_fidelity,
    inspect_stream,
    origin_history,
    position_history,
    read_map,
    record_stream,
    sample_history,
    sigma_values,
    signal_fidelity,
    squeeze_positions,
)


def _record(updates, batch=1, reads=(), C=4, compressions=()):
    layer = LayerRecord(reads=list(reads), updates=list(updates), compressions=list(compressions))
    total = C * max(len(updates) + 1, 1)
    return StreamRecord("infty", C, total, batch, [layer])


def _uniform(M: int) -> torch.Tensor:
    return torch.arange(1, M + 1, dtype=torch.float64) / M


# --------------------------------------------------------------------------- positions
def test_block_positions_first_fit_and_update() -> None:
    assert block_positions(4, 0.5, first=True).tolist() == [0.125, 0.375, 0.625, 0.875]
    assert block_positions(4, 0.5, first=False).tolist() == [0.5625, 0.6875, 0.8125, 0.9375]


def test_uniform_samples_squeeze_by_tau() -> None:
    t = torch.tensor([[0.125, 0.3, 0.999, 1.0]], dtype=torch.float64)
    torch.testing.assert_close(squeeze_positions(t, _uniform(8), 0.75), 0.75 * t)
    # below the first sample 1/8 nothing is resampled: it collapses onto τ/8
    low = torch.tensor([[0.0, 0.01, 0.1]], dtype=torch.float64)
    torch.testing.assert_close(
        squeeze_positions(low, _uniform(8), 0.75), torch.full_like(low, 0.75 / 8)
    )


def test_sticky_samples_map_by_hand() -> None:
    # samples u = 0.1, 0.2, 0.3, 0.9 are refitted at τ·(1, 2, 3, 4)/4
    u = torch.tensor([0.1, 0.2, 0.3, 0.9], dtype=torch.float64)
    t = torch.tensor([[0.25, 0.6, 0.05, 0.95]], dtype=torch.float64)
    tau = 0.5
    expected = [
        tau * (0.50 + 0.5 * 0.25),  # halfway between u_2 and u_3
        tau * (0.75 + 0.5 * 0.25),  # halfway between u_3 and u_4
        tau * 0.25,  # before the first sample: collapses onto it
        tau * 1.00,  # after the last sample: collapses onto it
    ]
    torch.testing.assert_close(squeeze_positions(t, u, tau)[0], torch.tensor(expected).double())


def test_position_history_after_k_squeezes_by_hand() -> None:
    C, tau, M = 4, 0.5, 1000  # every position stays above the first sample 1/M
    updates = [(0, torch.zeros(1, C, 2), None)]
    updates += [(k, torch.zeros(1, C, 2), _uniform(M)) for k in range(1, 4)]
    history = position_history(_record(updates).layers[0], 1, tau)
    assert [h.shape for h in history] == [torch.Size([1, C * (j + 1)]) for j in range(4)]
    cells = (torch.arange(C, dtype=torch.float64) + 0.5) / C
    last = history[-1][0]
    torch.testing.assert_close(last[:C], tau**3 * cells)  # first fit, then 3 squeezes
    for j in range(1, 4):  # block j entered at τ + (1 − τ)·cell, then 3 − j squeezes
        torch.testing.assert_close(
            last[C * j : C * (j + 1)], tau ** (3 - j) * (tau + (1 - tau) * cells)
        )
    assert bool((last[1:] > last[:-1]).all())  # stream order = order in [0, 1]
    # with M = 8 block 0 falls below 1/8 after its first squeeze (τ·(i + ½)/4 < 1/8 for i = 0)
    # and block 0's first vector collapses onto τ/8 for good
    coarse = [(j, s, None if u is None else _uniform(8)) for j, s, u in updates]
    last = position_history(_record(coarse).layers[0], 1, tau)[-1][0]
    assert last[0] == tau / 8 and bool((last[1:] >= last[:-1]).all())


def test_position_history_per_row_sticky_samples() -> None:
    C, tau = 2, 0.5
    u = torch.tensor([[0.25, 0.5, 0.75, 1.0], [0.1, 0.2, 0.3, 0.4]], dtype=torch.float64)
    updates = [(0, torch.zeros(2, C, 1), None), (1, torch.zeros(2, C, 1), u)]
    last = position_history(_record(updates, batch=2).layers[0], 2, tau)[-1]
    # row 0 is uniform: τ·t. Row 1 sampled [0.1, 0.4] at levels 1/4 .. 1: t = 0.25 lies halfway
    # between u_2 and u_3 (level 0.625); t = 0.75 beyond u_4 is not resampled (onto level 1)
    torch.testing.assert_close(last[0, :2], tau * torch.tensor([0.25, 0.75]).double())
    torch.testing.assert_close(last[1, :2], tau * torch.tensor([0.625, 1.0]).double())


def test_origin_history_by_hand() -> None:
    """Which stream position the signal at t holds: block 0 first fitted over [0, 1], blocks 1
    and 2 entered (τ, 1] = (0.5, 1] and squeezed by τ (M = 1000: P̂ is the identity)."""
    C, tau = 4, 0.5
    updates = [(0, torch.zeros(1, C, 2), None)]
    updates += [(k, torch.zeros(1, C, 2), _uniform(1000)) for k in (1, 2)]
    t, origins = origin_history(_record(updates).layers[0], 1, tau, grid=20)
    assert t[2] == 0.125 and len(origins) == 3
    torch.testing.assert_close(origins[0][0], t * C)  # token t·C at t
    o = origins[2][0]
    assert float(o[2]) == pytest.approx(2.0)  # 0.125 → 0.25 → 0.5 in block 0: token 2
    assert float(o[6]) == pytest.approx(5.2)  # 0.325 → 0.65 in block 1: 4 + 4·0.3
    assert float(o[15]) == pytest.approx(10.2)  # 0.775 in block 2: 8 + 4·0.55


def test_origin_history_follows_sticky_samples() -> None:
    """Sticky samples in [0.6, 0.9] of a first fit are stretched over [τ/M, τ]: the squeezed half
    holds tokens 2.4-3.6 of block 0, nothing of the rest; below the first sample, its value."""
    C, tau = 4, 0.5
    u = torch.tensor([0.6, 0.7, 0.8, 0.9], dtype=torch.float64)  # levels 1/4 .. 1
    updates = [(0, torch.zeros(1, C, 2), None), (1, torch.zeros(1, C, 2), u)]
    t, origins = origin_history(_record(updates).layers[0], 1, tau, grid=8)
    o = origins[1][0]  # t = 1/16, 3/16, ...
    assert float(o[0]) == pytest.approx(0.6 * C)  # t/τ = 1/8 < 1/4: the first sample
    assert float(o[2]) == pytest.approx(0.75 * C)  # t/τ = 5/8: halfway between u_2 and u_3
    assert float(o[3]) == pytest.approx(0.85 * C)  # t/τ = 7/8: halfway between u_3 and u_4
    assert float(o[4]) == pytest.approx(C + C * (9 / 16 - 0.5) / 0.5)  # block 1


# --------------------------------------------------------------------------- fidelity
def _memory(**overrides) -> LongTermMemory:
    settings = dict(dim=3, num_heads=1, num_basis=32, widths=(0.05, 0.1), ridge_lambda=1e-6,
                    tau=0.5, num_samples=128, edge_padding=False, conv_gate=False)  # fmt: skip
    settings.update(overrides)
    return LongTermMemory(LongTermConfig(**settings)).double()


def test_fidelity_is_one_for_a_signal_the_basis_represents() -> None:
    memory = _memory()
    L = 64
    B0 = torch.randn(2, 32, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    t = block_positions(L, 0.5, first=True)
    x = torch.matmul(memory.basis(t), B0)  # rows Bᵀψ(t_i)  [2, L, 3]
    state, update = memory.update_traced(memory.init_state(2, dtype=torch.float64), x)
    fid = signal_fidelity([update.stored], [state.coefficients], [t.expand(2, -1)],
                          memory.basis, ages=[0], per_block=None)  # fmt: skip
    assert fid.count == [2 * L]
    assert fid.cosine[0] > 1 - 1e-6 and fid.rel_error[0] < 1e-3
    assert fid.centred_cosine[0] > 1 - 1e-6  # what is specific to each vector comes back too
    assert fid.baseline_cosine < 0.9  # the mean alone would not score that


def test_fidelity_follows_blocks_through_squeezes() -> None:
    """Each block holds one constant direction; read where `position_history` says it is, it
    comes back after squeezes. Read where it was stored (positions not tracked), it does not."""
    memory = _memory(ridge_lambda=1e-3, edge_padding=True, num_basis=128, widths=(0.02, 0.05))
    L, tau = 32, 0.5
    state = memory.init_state(1, dtype=torch.float64)
    stored, coefficients, samples = [], [], []
    for j in range(3):
        x = torch.zeros(1, L, 3, dtype=torch.float64)
        x[..., j] = 1.0
        state, update = memory.update_traced(state, x)
        stored.append(update.stored)
        coefficients.append(state.coefficients)
        samples.append(update.samples)
    record = _record([(j, s, u) for j, (s, u) in enumerate(zip(stored, samples, strict=True))])
    history = position_history(record.layers[0], 1, tau)
    middle = slice(L // 4, 3 * L // 4)  # away from the block edges, where blocks blur together
    for j in range(2):
        t = history[2][:, j * L : (j + 1) * L][:, middle]
        read = torch.matmul(memory.basis(t), coefficients[2])[0]  # [n, 3]
        assert bool((read.argmax(-1) == j).all())
    fid = signal_fidelity(stored, coefficients, history, memory.basis, ages=[0, 1, 2])
    assert fid.count == [3 * 32, 2 * 32, 32]
    assert min(fid.cosine) > 0.8 and min(fid.centred_cosine) > 0.8
    assert fid.baseline_cosine == pytest.approx(1 / math.sqrt(3), abs=0.01)  # mean = (1, 1, 1)/3
    entry = [block_positions(L, tau, first=j == 0) for j in range(3)]  # never moved
    untracked = [torch.cat(entry[: j + 1])[None] for j in range(3)]
    wrong = signal_fidelity(stored, coefficients, untracked, memory.basis, ages=[2])
    assert wrong.cosine[0] < 0.5


def test_signal_fidelity_rejects_mismatched_lists() -> None:
    with pytest.raises(ValueError, match="one entry per update"):
        signal_fidelity([torch.zeros(1, 2, 3)], [], [], _memory().basis)


def test_compressed_fidelity_by_hand() -> None:
    """Slots equal to the mean of their states give the mean-pool cosine. Calls 0-2 make two
    slots each, call 3 none; a slot is kept while fewer than `capacity` slots are newer."""
    C, c = 4, 2
    g = torch.Generator().manual_seed(0)
    comps = []
    for call in range(3):
        source = torch.randn(1, C, 5, generator=g)
        slots = source.view(1, C // c, c, 5).mean(2)
        comps.append((call, source, torch.tensor([C]), slots))
    record = StreamRecord("compressive", C, 4 * C, 1, [LayerRecord(compressions=comps)])
    fid, pooled = compressed_fidelity(record, 0, rate=c, capacity=2, ages=[0, 1, 2])
    # capacity 2: one call later the slots of calls 0 and 1 are replaced, call 2's are not
    assert fid.present == [1.0, pytest.approx(1 / 3), 0.0]
    assert fid.cosine[0] == pytest.approx(pooled, abs=1e-9)
    assert fid.count == [3 * C, C, 0] and math.isnan(fid.cosine[2])
    fid4, _ = compressed_fidelity(record, 0, rate=c, capacity=4, ages=[1, 2])
    # capacity 4: everything survives one call; two calls later call 0's slots are gone
    # (6 slots made by then), call 1's are not, call 2's are past the end of the stream
    assert fid4.present == [1.0, 0.5]


# --------------------------------------------------------------------------- reads
def test_read_map_lands_on_the_block_read() -> None:
    C, tau = 4, 0.5
    updates = [(0, torch.zeros(1, C, 2), None)]
    updates += [(k, torch.zeros(1, C, 2), _uniform(16)) for k in (1, 2)]
    # after 3 updates block 0 sits in [0, τ²] = [0, 0.25]: a narrow read at 0.125 lands there
    mu = torch.tensor([[[0.125, 0.625]]])  # [batch 1, H 1, Q 2]: block 0, then block 2
    sigma_sq = torch.full_like(mu, 0.01**2)
    record = _record(updates, reads=[(2, mu, sigma_sq)], C=C)
    record.num_tokens = 16
    rm = read_map(record, 0, tau, bins=4)  # bins = the 4 blocks
    assert rm.mass.shape == (1, 1, 4) and rm.outside.shape == (1, 1)
    mass = rm.mass[0, 0]
    assert mass[0] == pytest.approx(0.5, abs=1e-6)  # half of the queries read block 0
    assert mass[2] == pytest.approx(0.5, abs=1e-6)  # the other half block 2 (τ + (1 − τ)/4...)
    assert mass[3] == 0.0  # the current block is not in the long-term memory yet
    assert rm.outside[0, 0] == pytest.approx(0.0, abs=1e-6)
    # mean distance from the call's first query (position 8): block 0 ≈ 6, block 2 ≈ 0
    assert 2.5 < float(rm.mean_distance[0, 0]) < 3.5
    assert float(rm.first_segment[0, 0]) == pytest.approx(0.5, abs=1e-6)  # block 0 = tokens 0-3


def test_read_map_reports_mass_outside_the_cells() -> None:
    updates = [(0, torch.zeros(1, 4, 2), None)]
    mu = torch.tensor([[[0.5]]])
    record = _record(updates, reads=[(0, mu, torch.full_like(mu, 100.0))])
    rm = read_map(record, 0, 0.5, bins=8)
    assert float(rm.outside[0, 0]) > 0.9  # σ = 10: almost all of it beyond [0, 1]
    assert float(rm.mass.sum() + rm.outside.sum()) == pytest.approx(1.0)


def test_sample_history_maps_samples_back_to_the_stream() -> None:
    C, tau = 4, 0.5
    # before the 3rd update block 0 sits at 0.5·(i + ½)/4 and block 1 at 0.5 + 0.5·(i + ½)/4:
    # the samples u fall in block 1's cells only
    u = torch.linspace(0.55, 0.95, 8, dtype=torch.float64)
    updates = [(0, torch.zeros(1, C, 2), None), (1, torch.zeros(1, C, 2), _uniform(8)),
               (2, torch.zeros(1, C, 2), u)]  # fmt: skip
    record = _record(updates, C=C)
    record.num_tokens = 4 * C
    hist = sample_history(record, 0, tau, t_bins=4, abs_bins=4)
    assert sample_history(record, 0, tau).t_hist.shape == (2, 8)  # default: M bins
    assert hist.calls.tolist() == [1, 2]
    # i/8 in 4 bins of [0, 1] (the last bin holds its right edge): 1, 2, 2, 3 of the 8
    expected = torch.tensor([1, 2, 2, 3], dtype=hist.t_hist.dtype) / 8
    torch.testing.assert_close(hist.t_hist[0], expected)
    assert float(hist.abs_hist[1, 1]) == pytest.approx(1.0)  # all of them read block 1
    assert hist.first_segment.tolist() == [1.0, 0.0]  # update 1 samples a memory of block 0
    assert float(hist.abs_hist[0, :2].sum()) == pytest.approx(1.0)  # uniform: blocks 0 and 1


# --------------------------------------------------------------------------- a tiny model
def _tiny_model(model_type: str, **overrides) -> MemoryLM:
    torch.manual_seed(0)
    return MemoryLM(tiny(model_type, **overrides)).eval()


def test_trace_leaves_the_forward_unchanged_and_is_what_was_fitted() -> None:
    model = _tiny_model("infty")
    tokens = torch.randint(0, 13, (2, 24), generator=torch.Generator().manual_seed(1))
    state_a = state_b = None
    for start in range(0, 24, 8):
        a = model(tokens[:, start : start + 8], state=state_a)
        b = model(tokens[:, start : start + 8], state=state_b, return_trace=True)
        torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=0)
        assert a.trace is None and len(b.trace) == 2
        first_update = b.trace[0].updates
        if first_update and first_update[0][0].samples is None:  # the first fit: B = G_Lᵀ X
            memory = model.blocks[0].long_term_memory
            G = memory.ridge.segment(8, torch.device("cpu"), torch.float32)
            B = fit_coefficients(first_update[0][0].stored, G)
            torch.testing.assert_close(B, b.state.layers[0].long_term.coefficients)
        state_a, state_b = a.state, b.state
    assert b.trace[0].mu.shape == (2, 2, 8) and b.trace[0].sigma_sq.shape == (2, 2, 8)


@pytest.mark.parametrize("sticky", [False, True])
def test_inspect_a_tiny_infinity_former(sticky: bool) -> None:
    model = _tiny_model("infty", sticky=sticky)
    tokens = torch.randint(0, 13, (2, 8 * 14), generator=torch.Generator().manual_seed(2))
    record = record_stream(model, tokens)
    layer = record.layers[1]
    # the memory fills at the start of the 3rd call (short-term holds m = 8, then a block of 8)
    assert [call for call, *_ in layer.updates] == list(range(2, 14))
    assert [call for call, *_ in layer.reads] == list(range(2, 14))
    assert sigma_values(record, 1).shape == (2, 12 * 2 * 8)  # [H, calls · batch · C]
    result = inspect_stream(model, tokens, ages=(0, 1, 5, 11, 50), bins=16)
    assert result.reads[0].mass.shape == (12, 2, 16)
    assert bool((result.reads[0].mass.sum(-1) <= 1 + 1e-9).all())
    fid = result.fidelity[0]
    assert fid.count == [12 * 2 * 8, 11 * 2 * 8, 7 * 2 * 8, 1 * 2 * 8, 0]
    assert math.isnan(fid.cosine[-1])
    assert result.samples[0].t_hist.shape == (11, 16)  # M = 16 bins
    summary = result.summary()
    assert summary["sticky"] is sticky and len(summary["layers"]) == 2
    assert 0 < summary["layers"][0]["sigma"]["median"]
    # μ's spread across queries, as the trainer logs it: the reads of layer 1, one by one
    by_read = [density_statistics(mu, s, torch.zeros(2, dtype=bool))[1] for _, mu, s in layer.reads]
    assert summary["layers"][1]["mu_spread"] == pytest.approx(float(torch.stack(by_read).mean()))
    assert summary["layers"][1]["mu_spread"] > 1e-2  # the default density depends on the query
    assert ("sample_entropy_vs_uniform" in summary["layers"][0]) is sticky
    # M = 16, τ = 0.75: a new vector falls below the first sample point after ln 16 / ln(4/3)
    assert summary["first_sample_horizon"] == pytest.approx(math.log(16) / math.log(4 / 3))
    assert "fidelity_horizon" in summary["layers"][0]
    was = model.training
    model.train()
    inspect_stream(model, tokens[:, :40], ages=(0,))
    assert model.training and not was  # the mode is restored


def test_inspect_a_tiny_compressive_and_xl_model() -> None:
    model = _tiny_model("compressive")
    tokens = torch.randint(0, 13, (1, 8 * 8), generator=torch.Generator().manual_seed(3))
    result = inspect_stream(model, tokens, ages=(0, 1, 2, 5))
    fid = result.compressed[0]
    # 8 states leave per call from the 2nd call on, 4 slots of rate 2; 6 kept: half survive one
    # more call, none two
    assert fid.present[:3] == [1.0, 0.5, 0.0]
    assert result.reads == [None, None] and result.fidelity == [None, None]
    xl = inspect_stream(_tiny_model("xl"), tokens, ages=(0,))
    assert xl.summary()["layers"] == [{"layer": 0}, {"layer": 1}]


def test_record_stream_rejects_bad_input() -> None:
    with pytest.raises(TypeError, match="MemoryLM"):
        record_stream(torch.nn.Linear(2, 2), torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="2 dimensions"):
        record_stream(_tiny_model("xl"), torch.zeros(4, dtype=torch.long))
