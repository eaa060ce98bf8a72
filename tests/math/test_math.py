"""The math layer: basis functions, ridge regression, continuous softmax, KL."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate

from inftyformer import GaussianBasis, continuous_softmax, variance_kl
from inftyformer.core.basis import gaussian_density
from inftyformer.core.ridge import (
    RidgeRegression,
    evaluate_signal,
    fit_coefficients,
    ridge_design_matrix,
    segment_positions,
)


def test_basis_placement_and_values():
    basis = GaussianBasis(8, widths=(0.1, 0.2))
    # width-major: 4 centres linspace(0, 1, 4) with width 0.1, then the same centres with 0.2
    assert torch.allclose(basis.centers, torch.tensor([0, 1 / 3, 2 / 3, 1] * 2))
    assert torch.allclose(basis.widths, torch.tensor([0.1] * 4 + [0.2] * 4))
    t = torch.tensor([0.25], dtype=torch.float64)
    psi = basis(t)  # [1, 8]
    by_hand = math.exp(-((0.25 - 1 / 3) ** 2) / (2 * 0.2**2)) / (0.2 * math.sqrt(2 * math.pi))
    assert psi.shape == (1, 8)
    assert psi[0, 5].item() == pytest.approx(by_hand, rel=1e-6)
    assert torch.allclose(basis.float64(t), psi.double())


def test_basis_has_no_subnormal_values_and_the_signal_is_unchanged():
    # cpu-small's basis at the unbounded update's resampling positions u = i/M: in float32 the
    # far tails of the narrow functions are subnormal; they are 0 now, and the resampled signal
    # x̃ = Bᵀ ψ(u) equals the one from the unflushed ψ (the previous computation)
    basis = GaussianBasis(128, widths=(0.01, 0.05))
    u = torch.arange(1, 129, dtype=torch.float32) / 128
    exact = gaussian_density(
        u.unsqueeze(-1), basis.centers, basis.widths.square()
    )  # ψ(u) as computed before  [M, N]
    tiny = torch.finfo(torch.float32).tiny
    subnormal = (exact > 0) & (exact < tiny)
    assert subnormal.any()  # the case the flush exists for
    psi = basis(u)
    assert not ((psi > 0) & (psi < tiny)).any()
    assert torch.equal(psi[~subnormal], exact[~subnormal])
    assert (psi[subnormal] == 0).all()
    B = torch.randn(3, 128, 16, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(evaluate_signal(B, basis, u), torch.matmul(exact, B), rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    "num_basis, widths, error",
    [
        (7, (0.01, 0.05), ValueError),
        (0, (0.1,), ValueError),
        (4, (), ValueError),
        (4, (0.1, -0.1), ValueError),
        (4.0, (0.1,), TypeError),
    ],
)
def test_basis_rejects_bad_config(num_basis, widths, error):
    with pytest.raises(error, match="num_basis|widths"):
        GaussianBasis(num_basis, widths)


def _quadrature(mu: float, sigma_sq: float, c: float, w: float) -> float:
    """∫ 𝒩(t; μ, σ²) 𝒩(t; c, w²) dt by adaptive quadrature over the region holding the mass."""
    s = math.sqrt(sigma_sq)

    def f(t):
        return (
            math.exp(-((t - mu) ** 2) / (2 * sigma_sq))
            / (s * math.sqrt(2 * math.pi))
            * math.exp(-((t - c) ** 2) / (2 * w * w))
            / (w * math.sqrt(2 * math.pi))
        )

    lo, hi = min(mu - 14 * s, c - 14 * w), max(mu + 14 * s, c + 14 * w)
    value, _ = integrate.quad(f, lo, hi, points=sorted({mu, c}), limit=1000, epsabs=0, epsrel=1e-11)
    return value


@pytest.mark.parametrize("sigma_sq", [1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0])
@pytest.mark.parametrize("mu", [0.0, 0.37, 1.0])
def test_continuous_softmax_matches_quadrature(mu, sigma_sq):
    basis = GaussianBasis(6, widths=(0.01, 0.05))
    r = continuous_softmax(
        torch.tensor(mu, dtype=torch.float64), torch.tensor(sigma_sq, dtype=torch.float64), basis
    )
    for j in range(6):
        c, w = basis.centers[j].item(), basis.widths[j].item()
        expected = _quadrature(mu, sigma_sq, c, w)
        if expected < 1e-200:
            assert r[j].item() < 1e-150
        else:
            assert r[j].item() == pytest.approx(expected, rel=1e-5)


def test_continuous_softmax_broadcasts_and_validates():
    basis = GaussianBasis(4, widths=(0.1,))
    mu = torch.rand(2, 3, 5)
    out = continuous_softmax(mu, torch.full((2, 3, 5), 0.01), basis)
    assert out.shape == (2, 3, 5, 4)
    # r_j = 𝒩(μ; c_j, σ² + w_j²) by hand for one entry
    m, c = mu[1, 2, 3].item(), basis.centers[2].item()
    var = 0.01 + 0.01
    hand = math.exp(-((m - c) ** 2) / (2 * var)) / math.sqrt(2 * math.pi * var)
    assert out[1, 2, 3, 2].item() == pytest.approx(hand, rel=1e-5)
    with pytest.raises(ValueError, match="broadcast"):
        continuous_softmax(torch.rand(2, 3), torch.rand(4), basis)
    with pytest.raises(TypeError, match="mu"):
        continuous_softmax([0.5], torch.rand(1), basis)


def test_continuous_softmax_gradcheck():
    basis = GaussianBasis(8, widths=(0.01, 0.05))
    mu = torch.rand(3, 4, dtype=torch.float64, requires_grad=True)
    sigma_sq = (torch.rand(3, 4, dtype=torch.float64) * 0.1 + 1e-3).requires_grad_()
    assert torch.autograd.gradcheck(lambda m, s: continuous_softmax(m, s, basis), (mu, sigma_sq))


def test_variance_kl_by_hand():
    assert variance_kl(torch.tensor(0.05**2), 0.05).item() == pytest.approx(0.0, abs=1e-7)
    s = 0.2**2
    ratio = s / 0.05**2
    assert variance_kl(torch.tensor(s, dtype=torch.float64), 0.05).item() == pytest.approx(
        0.5 * (ratio - math.log(ratio) - 1)
    )


def _ridge_by_lstsq(basis, positions, X, lam, pad):
    """Solve min ‖Fᵀ B − X‖² + λ‖B‖² directly (with zero targets at the padded positions)."""
    t = positions.double()
    if pad:
        n = len(t) // 2
        off = (torch.arange(n, dtype=torch.float64) + 0.5) * (0.5 / max(n, 1))
        t = torch.cat([-0.5 + off, t, 1.0 + off])
        X = torch.cat([torch.zeros(n, X.shape[1]), X, torch.zeros(n, X.shape[1])]).double()
    F = basis.float64(t)  # [P, N]
    A = torch.cat([F, math.sqrt(lam) * torch.eye(basis.num_basis, dtype=torch.float64)])
    rhs = torch.cat([X.double(), torch.zeros(basis.num_basis, X.shape[1], dtype=torch.float64)])
    return torch.linalg.lstsq(A, rhs).solution  # [N, e]


@pytest.mark.parametrize("length", [1, 2, 7, 33, 64])
@pytest.mark.parametrize("pad", [True, False])
def test_ridge_matches_direct_least_squares(length, pad):
    basis = GaussianBasis(16, widths=(0.05, 0.1))
    X = torch.randn(length, 3, dtype=torch.float64)
    G = ridge_design_matrix(basis, segment_positions(length), 0.5, edge_padding=pad)
    assert G.shape == (length, 16) and G.dtype == torch.float64
    B = fit_coefficients(X[None], G)[0]
    expected = _ridge_by_lstsq(basis, segment_positions(length), X, 0.5, pad)
    assert torch.allclose(B, expected, atol=1e-8)


def test_design_matrix_float32_solve_is_worse_than_float64():
    """Why G is built in float64: the float32 inverse is visibly off at N = 512."""
    basis = GaussianBasis(512, widths=(0.01, 0.05))
    t = segment_positions(1024)
    G64 = ridge_design_matrix(basis, t, 1.0, edge_padding=False)
    F32 = basis.float64(t).float().T
    G32 = F32.T @ torch.linalg.inv(F32 @ F32.T + torch.eye(512))
    rel = ((G32.double() - G64).norm() / G64.norm()).item()
    assert rel > 1e-4  # explicit float32 inverse: clearly off
    assert ((G64.float().double() - G64).norm() / G64.norm()).item() < 1e-6  # casting is fine


def test_ridge_cache_reuses_and_casts():
    basis = GaussianBasis(8, widths=(0.1,))
    ridge = RidgeRegression(basis, 1.0)
    a = ridge.segment(10, torch.device("cpu"), torch.float32)
    b = ridge.segment(10, torch.device("cpu"), torch.float32)
    assert a is b and a.dtype == torch.float32
    assert ridge.segment(10, torch.device("cpu"), torch.float64).dtype == torch.float64
    assert ridge.segment(11, torch.device("cpu"), torch.float32).shape == (11, 8)


def test_ridge_rejects_bad_input():
    basis = GaussianBasis(8, widths=(0.1,))
    with pytest.raises(ValueError, match="ridge_lambda"):
        RidgeRegression(basis, -1.0)
    with pytest.raises(ValueError, match="positions"):
        ridge_design_matrix(basis, torch.zeros(0), 1.0)
    with pytest.raises(ValueError, match="length"):
        segment_positions(0)


def test_fit_error_grows_as_length_per_basis_grows():
    """A signal with a fixed period in tokens: more tokens per basis function lose detail."""
    basis = GaussianBasis(64, widths=(0.01, 0.05))
    errors = []
    for length in (32, 128, 512, 2048):
        i = torch.arange(length, dtype=torch.float64)
        X = torch.stack([torch.sin(2 * math.pi * i / 64), torch.cos(2 * math.pi * i / 48)], -1)
        G = ridge_design_matrix(basis, segment_positions(length), 0.1)
        B = fit_coefficients(X[None], G)
        recon = evaluate_signal(B, basis, segment_positions(length))[0]
        errors.append(((recon - X).norm() / X.norm()).item())
    assert errors == sorted(errors), errors
    assert errors[0] < 0.05 and errors[-1] > 0.5, errors


@settings(max_examples=25, deadline=None)
@given(
    length=st.integers(1, 300),
    num_centers=st.integers(2, 40),
    lam=st.floats(0.01, 5.0),
)
def test_ridge_fit_never_overshoots_any_length_or_n(length, num_centers, lam):
    """Any length (odd ones too) and N fit, and ridge regression only shrinks: the fitted values
    at the data positions are H X with H a principal block of a hat matrix (eigenvalues in
    [0, 1), edge padding included), so neither they nor the residual outgrow the data."""
    basis = GaussianBasis(2 * num_centers, widths=(0.05, 0.1))
    G = RidgeRegression(basis, lam).segment(length, torch.device("cpu"), torch.float64)
    X = torch.randn(1, length, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    recon = evaluate_signal(fit_coefficients(X, G), basis, segment_positions(length))
    assert recon.shape == (1, length, 2)
    assert recon.norm() <= X.norm() * (1 + 1e-9)
    assert (X - recon).norm() <= X.norm() * (1 + 1e-9)


@pytest.mark.parametrize("length", [64, 301])
@pytest.mark.parametrize("num_centers", [20, 40])
@pytest.mark.parametrize("lam", [0.01, 1.0])
def test_fit_of_a_constant_is_close_inside_the_interval(length, num_centers, lam):
    """A constant is recovered within 5% on [0.2, 0.8], away from the edges, when the centres
    are dense enough for the widths (20 or more: with 10 the ripple between centres is ~12%)."""
    basis = GaussianBasis(2 * num_centers, widths=(0.05, 0.1))
    G = RidgeRegression(basis, lam).segment(length, torch.device("cpu"), torch.float64)
    X = torch.full((1, length, 2), 3.0, dtype=torch.float64)
    t = segment_positions(length)
    recon = evaluate_signal(fit_coefficients(X, G), basis, t)[0]  # [length, 2]
    inside = (t > 0.2) & (t < 0.8)
    assert (recon[inside] - 3.0).abs().max() < 0.05 * 3.0


def test_variance_kl_is_never_negative_in_bfloat16():
    """Near σ = σ₀ the KL's three terms cancel; computed in bfloat16 their rounding made it
    negative (found by the fuzzing run: σ² = 0.0021 against σ₀² = 0.0025)."""
    from inftyformer.core.continuous_softmax import variance_kl

    sigma_sq = torch.linspace(0.0015, 0.0035, 401).bfloat16()
    kl = variance_kl(sigma_sq, 0.05)
    assert kl.dtype == torch.bfloat16
    assert bool((kl >= 0).all())
    want = variance_kl(sigma_sq.double(), 0.05)
    torch.testing.assert_close(kl.double(), want, rtol=1e-2, atol=1e-4)
