"""The unbounded update must not expand the memory (paper §3.3): old coefficients → squeeze into
[0, τ] → resample at M points → refit with the new vectors is linear in the old coefficients,
B' = A B + G_newᵀ X, and `ridge.update_gain` is the spectral radius of A. Settings whose gain
exceeds `MAX_UPDATE_GAIN` are refused when a config is built (native and pretrained) or, for a
segment length not known then, when the memory first updates with it."""

import itertools
import math

import pytest
import torch

from inftyformer import LongTermConfig, LongTermMemory, ModelConfig
from inftyformer.core.basis import GaussianBasis
from inftyformer.core.ridge import (
    evaluate_signal,
    fit_coefficients,
    infinite_positions,
    ridge_design_matrix,
    update_gain,
)
from inftyformer.core.squeeze import MAX_UPDATE_GAIN

# the issue's two examples: 0.07 → 6e5 after 10 updates, and 9e4 after 40
EXPANDING = [
    dict(num_basis=16, widths=(0.01,), tau=0.75, num_samples=16, segment_len=16),
    dict(num_basis=64, widths=(0.005, 0.01), tau=0.75, num_samples=64, segment_len=128),
]


def _iterate_old_part(N, widths, lam, tau, M, L, padding, steps):
    """Apply the update's map to the old coefficients alone (new vectors 0) with the ridge
    functions the memory uses, and return the growth per step over the last half (the map is
    linear: B is rescaled to norm 1 after each step and the factors recorded)."""
    basis = GaussianBasis(N, widths)
    G = ridge_design_matrix(basis, infinite_positions(M, tau, L), lam, padding)
    u = torch.arange(1, M + 1, dtype=torch.float64) / M
    B = torch.randn(1, N, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    logs = []
    for _ in range(steps):
        old = evaluate_signal(B / B.norm(), basis, u)  # [1, M, 3]
        B = fit_coefficients(torch.cat([old, old.new_zeros(1, L, 3)], 1), G)
        logs.append(math.log(float(B.norm())))
    half = steps // 2
    return math.exp(sum(logs[half:]) / (steps - half))


@pytest.mark.parametrize(
    "N, widths, lam, tau, M, L, padding",
    [
        (16, (0.01,), 1.0, 0.75, 16, 16, True),
        (64, (0.005, 0.01), 1.0, 0.75, 64, 128, True),
        (32, (0.01, 0.05), 1.0, 0.75, 16, 8, True),
        (64, (0.01, 0.05), 1.0, 0.75, 64, 40, False),
        (128, (0.01, 0.05), 1.0, 0.75, 128, 128, True),
        (64, (0.005, 0.01), 0.5, 0.5, 64, 64, True),
    ],
)
def test_the_gain_is_the_growth_per_update(N, widths, lam, tau, M, L, padding):
    gain = update_gain(N, widths, lam, tau, M, L, padding)
    growth = _iterate_old_part(N, widths, lam, tau, M, L, padding, steps=400)
    # (an upper bound on) the spectral radius: the growth the map really has, within 2%
    assert gain * 0.98 <= growth <= gain * 1.02


@pytest.mark.parametrize("settings", EXPANDING)
def test_the_issues_expanding_examples_are_refused_by_name(settings):
    with pytest.raises(ValueError, match="expands") as err:
        LongTermConfig(dim=32, num_heads=2, **settings)
    message = str(err.value)
    for name in ("num_basis", "widths", "ridge_lambda", "tau", "num_samples", "edge_padding"):
        assert name in message
    assert f"segments of length {settings['segment_len']}" in message
    # and it proposes a change that works
    assert "e.g." in message and "gain 0." in message


@pytest.mark.parametrize("settings", EXPANDING)
def test_the_examples_are_refused_through_the_model_and_the_standalone_memory(settings):
    lt = {k: v for k, v in settings.items() if k != "segment_len"}
    with pytest.raises(ValueError, match="expands"):
        ModelConfig(vocab_size=13, d_model=32, n_heads=2, segment_len=settings["segment_len"], **lt)
    # without a segment length the config cannot know L: the first unbounded update refuses
    memory = LongTermMemory(LongTermConfig(dim=32, num_heads=2, **lt))
    state = memory.update(memory.init_state(1), torch.randn(1, 16, 32))  # first fit
    with pytest.raises(ValueError, match="expands"):
        memory.update(state, torch.randn(1, 16, 32))


def test_the_pretrained_adapter_refuses_expanding_settings():
    pytest.importorskip("transformers")
    from transformers import GPT2Config

    from inftyformer.hf import InftyformerConfig

    base = GPT2Config(vocab_size=61, n_embd=32, n_layer=1, n_head=2, n_positions=64)
    with pytest.raises(ValueError, match="expands"):
        InftyformerConfig(text_config=base, **EXPANDING[0])
    InftyformerConfig(text_config=base, segment_len=16)  # the paper's GPT-2 settings: accepted


@pytest.mark.parametrize("name", ["cpu-small", "paper-sorting"])
def test_the_papers_settings_are_accepted_with_a_margin(name):
    config = ModelConfig.preset(name)
    lt = config.long_term_config()
    gain = update_gain(
        lt.num_basis, lt.widths, lt.ridge_lambda, lt.tau, lt.num_samples, config.segment_len
    )
    assert gain < 0.6  # about half of what is kept survives each update's squeeze
    # the pretrained adapter's defaults (the paper's GPT-2 settings) at its shortest segments
    assert update_gain(512, (0.005, 0.01), 0.5, 0.5, 512, 1) < 0.35


GRID = list(
    itertools.product(
        [16, 32, 64],  # N
        [(0.01,), (0.05,), (0.01, 0.05)],  # widths
        [0.1, 1.0],  # λ
        [0.5, 0.9],  # τ
        [16, 64],  # M
    )
)


# the issue's two examples as grid points (N, widths, λ, τ, M)
ISSUE_POINTS = [(16, (0.01,), 1.0, 0.75, 16), (64, (0.005, 0.01), 1.0, 0.75, 64)]


def _stream(config: LongTermConfig, segments: int, L: int) -> list[float]:
    torch.manual_seed(0)
    memory = LongTermMemory(config)
    g = torch.Generator().manual_seed(1)
    state = memory.init_state(2)
    peaks = []
    with torch.no_grad():
        for _ in range(segments):
            state = memory.update(state, torch.randn(2, L, config.dim, generator=g), g)
            peaks.append(float(state.coefficients.abs().max()))
    return peaks


def _sweep(grid, L, segments):
    grid = [*grid, *ISSUE_POINTS]
    accepted = refused = 0
    for N, widths, lam, tau, M in grid:
        if N % len(widths):
            continue
        settings = dict(num_basis=N, widths=widths, ridge_lambda=lam, tau=tau, num_samples=M)
        gain = update_gain(N, widths, lam, tau, M, L)
        try:
            config = LongTermConfig(dim=4, num_heads=1, segment_len=L, **settings)
        except ValueError as err:
            assert gain > MAX_UPDATE_GAIN and "expands" in str(err), settings
            refused += 1
            continue
        assert gain <= MAX_UPDATE_GAIN
        accepted += 1
        peaks = _stream(config, segments, L)
        # bounded: after the first updates the coefficients stop growing
        assert max(peaks[segments // 2 :]) <= 5 * max(peaks[:10]) + 1e-6, (settings, gain)
    assert accepted and refused  # the grid crosses the boundary
    for N, widths, lam, tau, M in ISSUE_POINTS:  # refused at every segment length
        assert update_gain(N, widths, lam, tau, M, L) > MAX_UPDATE_GAIN
    return accepted, refused


def test_every_accepted_setting_stays_bounded_over_200_segments():
    _sweep(GRID[::5], L=8, segments=200)


@pytest.mark.slow
@pytest.mark.parametrize("L", [1, 8, 32])
def test_every_accepted_setting_stays_bounded_over_200_segments_full_grid(L):
    _sweep(GRID, L=L, segments=200)
