"""Sticky memories' unbounded update must not expand the memory (paper §3.3–3.4).

The update reads the old signal at u (drawn from the attention histogram), puts the values at
τ·i/M and refits them with the new vectors: B' = A(u) B + G_newᵀ X, A(u) = G_oldᵀ Ψ(u). The refit
overshoots its data next to a jump, and with u concentrated on that overshoot ρ(A(u)) > 1 at
every setting, even where uniform reading (`update_gain`) contracts strongly: a config check
cannot help. `ridge.limit_to_data` bounds each sticky refit by its data instead:

    max_grid |x̄_new| ≤ max(max_grid |x̄_past|, max_i |X_i|).

These tests stream 200 segments through a grid of settings with adversarial attention (all of
it on one point: the signal's peak, or the refit's overshoot) and check that bound at every
update, and that the coefficients stay bounded."""

import itertools
from dataclasses import replace

import pytest
import torch

from inftyformer import LongTermConfig, LongTermMemory
from inftyformer.core.basis import GaussianBasis
from inftyformer.core.ridge import (
    infinite_positions,
    limit_to_data,
    ridge_design_matrix,
    spectral_radius_bound,
    supremum_grid,
    update_gain,
)
from inftyformer.core.squeeze import MAX_UPDATE_GAIN

# (N, M, widths, τ, λ, L): N = M = 64 and the paper's two width sets, short and long segments
GRID = [
    (64, 64, (0.01, 0.05), 0.75, 1.0, 64),
    (64, 64, (0.005, 0.01), 0.5, 0.5, 64),
    (32, 16, (0.01, 0.05), 0.5, 1.0, 8),
    (64, 128, (0.05,), 0.9, 0.1, 16),
    (16, 64, (0.01,), 0.75, 1.0, 4),
    (128, 256, (0.005, 0.01), 0.75, 0.5, 32),
]


def _overshoot(N, M, widths, tau, lam, L):
    """Where the refit of a constant old signal (all of u on one point) is largest, and that
    value: the spectral radius of A(u) for u concentrated there (A(u) has rank one)."""
    basis = GaussianBasis(N, widths)
    G = ridge_design_matrix(basis, infinite_positions(M, tau, L), lam)
    t = supremum_grid(basis)
    step = basis.float64(t) @ G[:M].sum(0)  # the refit of x̃ = 1, read back on the grid
    i = int(step.argmax())
    return float(t[i]), float(step[i]), G, basis


@pytest.mark.parametrize("settings", GRID)
def test_a_concentrated_reading_expands_every_setting_the_uniform_one_contracts(settings):
    N, M, widths, tau, lam, L = settings
    assert update_gain(N, widths, lam, tau, M, L) <= MAX_UPDATE_GAIN  # accepted by the config
    where, value, G, basis = _overshoot(*settings)
    u = torch.full((M,), where, dtype=torch.float64)
    A = G[:M].T @ basis.float64(u)  # [N, N]: the old part of the update with u all at `where`
    assert value > 1.02  # the refit overshoots its data…
    assert spectral_radius_bound(A) == pytest.approx(value, rel=0.02)  # …and that is the growth


def _adversary(memory, state, grid, where):
    """All of each row's attention on one bin: the signal's peak, or a fixed point."""
    bins = memory.config.sticky_bins
    if where is None:
        peak = memory.signal(state, grid).abs().amax(-1).argmax(-1)  # [batch]
        t = grid[peak]
    else:
        t = torch.full((state.batch_size,), where, dtype=torch.float64)
    b = (t * bins).long().clamp(max=bins - 1)
    return replace(state, attention_mass=torch.nn.functional.one_hot(b, bins).double())


@pytest.mark.parametrize(
    "settings, adversary, training, quiet",
    [
        (s, a, t, q)
        for s, (a, t, q) in itertools.product(
            GRID,
            [
                ("peak", False, False),
                ("peak", True, False),
                ("overshoot", False, True),  # no new vectors after the first: the old part alone
                ("overshoot", True, False),
            ],
        )
    ],
)
def test_sticky_updates_stay_within_their_data_over_200_segments(
    settings, adversary, training, quiet
):
    N, M, widths, tau, lam, L = settings
    config = LongTermConfig(
        dim=3, num_heads=1, num_basis=N, num_samples=M, widths=widths, tau=tau,
        ridge_lambda=lam, segment_len=L, sticky=True, conv_gate=False,
    )  # fmt: skip
    memory = LongTermMemory(config).train(training)
    grid = supremum_grid(memory.basis)
    psi = memory.grid_basis("cpu", torch.float64)  # what the bound reads, [T, N]
    where = None if adversary == "peak" else _overshoot(*settings)[0]
    g = torch.Generator().manual_seed(0)
    state = memory.init_state(2, dtype=torch.float64)
    largest_x, peaks, sups = 0.0, [], []
    with torch.no_grad():
        for k in range(200):
            x = torch.randn(2, L, 3, generator=g, dtype=torch.float64)
            if quiet and k:
                x = torch.zeros_like(x)
            if k:
                state = _adversary(memory, state, grid, where)
            state = memory.update(state, x, g)
            largest_x = max(largest_x, float(x.abs().max()))
            sups.append(float((psi @ state.coefficients).abs().max()))
            peaks.append(float(state.coefficients.abs().max()))
    # the memory never holds more than the largest value it was given (on the grid) …
    assert max(sups[1:]) <= max(sups[0], largest_x) * (1 + 1e-9)
    # … so its coefficients stay bounded: they stop growing after the first updates
    assert max(peaks[100:]) <= 5 * max(peaks[:10])
    if quiet:  # nothing new arrives: at most what the first fit held, never grown
        assert max(sups[1:]) <= sups[0] * (1 + 1e-9)


def test_a_refit_within_its_data_is_left_unchanged():
    basis = GaussianBasis(32, (0.05,))
    psi = basis.float64(supremum_grid(basis))
    g = torch.Generator().manual_seed(0)
    B = torch.randn(2, 32, 5, generator=g, dtype=torch.float64)
    peak = (psi @ B).abs().amax(1)  # [2, 5]
    x = peak.unsqueeze(1) * torch.ones(2, 4, 5, dtype=torch.float64)  # new vectors that high
    assert torch.equal(limit_to_data(B, torch.zeros_like(B), x, psi), B)  # bit for bit
    # half as high: each channel scaled down to exactly its data's peak
    out = limit_to_data(B, torch.zeros_like(B), x / 2, psi)
    torch.testing.assert_close((psi @ out).abs().amax(1), peak / 2)
    torch.testing.assert_close(out, B / 2)


def test_only_sticky_updates_are_bounded_and_gradients_flow(monkeypatch):
    import inftyformer.core.squeeze as module

    calls = []
    monkeypatch.setattr(module, "limit_to_data", lambda *a: calls.append(1) or limit_to_data(*a))
    for sticky in (False, True):
        memory = LongTermMemory(LongTermConfig(dim=4, num_heads=1, num_basis=16, sticky=sticky))
        state = memory.update(memory.init_state(2), torch.randn(2, 8, 4))
        x = torch.randn(2, 8, 4, requires_grad=True)
        memory.update(state, x).coefficients.square().sum().backward()
        assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
        assert len(calls) == int(sticky)  # the plain update is the paper's, untouched
