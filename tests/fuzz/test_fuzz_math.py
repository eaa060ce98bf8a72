"""Fuzzing the math layer: GaussianBasis, continuous_softmax, variance_kl and the ridge functions,
with tensors of every dtype, shape and poison (see fuzzing.py for the oracle's rules)."""

from __future__ import annotations

import math
import numbers

import pytest
import torch
from fuzzing import FAST, FLOATS, MANY, accepted, expect_error, finite, is_floating, tensors
from hypothesis import given
from hypothesis import strategies as st

from inftyformer import GaussianBasis, continuous_softmax, variance_kl
from inftyformer.core.ridge import (
    edge_padding_positions,
    evaluate_signal,
    fit_coefficients,
    ridge_design_matrix,
    segment_positions,
)

BASES = [
    GaussianBasis(4, (0.1,)),
    GaussianBasis(8, (0.05, 0.2)),
    GaussianBasis(6, (0.01, 0.05, 0.5)),
]
bases = st.sampled_from(BASES)
numbers_any = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-5, 5),
    st.booleans(),
    st.text(max_size=3),
    st.none(),
)


def peak(x: torch.Tensor) -> float:
    return float(x.abs().max()) if x.numel() else 1.0


def real_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


# ---------------------------------------------------------------- GaussianBasis
def check_basis_constructor(num_basis, widths):
    valid_n = isinstance(num_basis, int) and not isinstance(num_basis, bool) and num_basis >= 1
    valid_w = (
        isinstance(widths, (list, tuple))
        and len(widths) > 0
        and all(real_number(w) and 1e-6 <= w <= 1e3 for w in widths)
    )
    if valid_n and valid_w and num_basis % len(widths) == 0:
        accepted()
        basis = GaussianBasis(num_basis, widths)
        assert basis.centers.shape == (num_basis,) and bool((basis.widths > 0).all())
    else:
        expect_error(lambda: GaussianBasis(num_basis, widths), "num_basis", "widths")


constructor_args = dict(
    num_basis=st.one_of(st.integers(1, 24), st.integers(-2, 24), st.booleans(), st.floats(0, 10),
                        st.none()),
    widths=st.one_of(
        st.lists(st.floats(1e-6, 1e3), min_size=1, max_size=3),  # mostly valid
        st.lists(st.one_of(st.floats(-1, 1), st.floats(allow_nan=True), numbers_any), max_size=3),
        st.none(),
        st.text(max_size=3),
    ),
)  # fmt: skip


@FAST
@given(**constructor_args)
def test_fuzz_basis_constructor(num_basis, widths):
    check_basis_constructor(num_basis, widths)


@pytest.mark.slow
@MANY
@given(**constructor_args)
def test_fuzz_basis_constructor_many(num_basis, widths):
    check_basis_constructor(num_basis, widths)


def check_basis_forward(basis, t):
    if not (is_floating(t) and finite(t)):
        expect_error(lambda: basis(t), "t")
        return
    accepted()
    psi = basis(t)
    assert psi.shape == (*t.shape, basis.num_basis) and psi.dtype == t.dtype
    assert finite(psi) and bool((psi >= 0).all())
    if t.dtype in (torch.float32, torch.float64):
        c, w = basis.centers.double(), basis.widths.double()
        x = t.double().unsqueeze(-1)
        ref = torch.exp(-((x - c) ** 2) / (2 * w * w)) / (w * math.sqrt(2 * math.pi))
        assert torch.allclose(psi.double(), ref, rtol=1e-4, atol=1e-5 * peak(ref))


@FAST
@given(basis=bases, t=tensors(low=-1, high=2))
def test_fuzz_basis_forward(basis, t):
    check_basis_forward(basis, t)


@pytest.mark.slow
@MANY
@given(basis=bases, t=tensors(low=-1, high=2))
def test_fuzz_basis_forward_many(basis, t):
    check_basis_forward(basis, t)


# ---------------------------------------------------------------- continuous softmax
@st.composite
def density_args(draw):
    """mu and sigma_sq: usually of broadcastable shapes, sometimes not."""
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    how = draw(st.sampled_from(["same", "suffix", "ones", "random"]))
    if how == "same":
        other = shape
    elif how == "suffix":
        other = shape[draw(st.integers(0, len(shape))) :]
    elif how == "ones":
        other = tuple(1 if draw(st.booleans()) else s for s in shape)
    else:
        other = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    mu = draw(tensors(shape=shape, low=-0.5, high=1.5))
    sigma_sq = draw(tensors(shape=other, low=1e-5, high=0.5))
    return mu, sigma_sq


def broadcastable(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        torch.broadcast_shapes(a.shape, b.shape)
    except RuntimeError:
        return False
    return True


def reference_softmax(mu, sigma_sq, basis):
    c, w = basis.centers.double(), basis.widths.double()
    var = sigma_sq.double().unsqueeze(-1) + w * w
    return torch.exp(-((mu.double().unsqueeze(-1) - c) ** 2) / (2 * var)) / torch.sqrt(
        2 * math.pi * var
    )


def check_continuous_softmax(basis, args):
    mu, sigma_sq = args
    valid = (
        is_floating(mu)
        and is_floating(sigma_sq)
        and broadcastable(mu, sigma_sq)
        and finite(mu)
        and bool(((sigma_sq > 0) & torch.isfinite(sigma_sq)).all())
    )
    if not valid:
        expect_error(lambda: continuous_softmax(mu, sigma_sq, basis), "mu", "sigma_sq")
        return
    accepted()
    r = continuous_softmax(mu, sigma_sq, basis)
    shape = torch.broadcast_shapes(mu.shape, sigma_sq.shape)
    assert r.shape == (*shape, basis.num_basis)
    assert finite(r) and bool((r >= 0).all())
    if mu.dtype in (torch.float32, torch.float64) and sigma_sq.dtype in (
        torch.float32,
        torch.float64,
    ):
        # the closed form 𝒩(μ; c_j, σ² + w_j²), in the order of the basis' centres and widths
        ref = reference_softmax(mu, sigma_sq, basis)
        assert torch.allclose(r.double(), ref, rtol=1e-3, atol=1e-5 * peak(ref))


@FAST
@given(basis=bases, args=density_args())
def test_fuzz_continuous_softmax(basis, args):
    check_continuous_softmax(basis, args)


@pytest.mark.slow
@MANY
@given(basis=bases, args=density_args())
def test_fuzz_continuous_softmax_many(basis, args):
    check_continuous_softmax(basis, args)


def check_variance_kl(sigma_sq, sigma_0):
    valid = (
        is_floating(sigma_sq)
        and bool(((sigma_sq > 0) & torch.isfinite(sigma_sq)).all())
        and real_number(sigma_0)
        and math.isfinite(sigma_0)
        and sigma_0 > 0
    )
    if not valid:
        expect_error(lambda: variance_kl(sigma_sq, sigma_0), "sigma_sq", "sigma_0")
        return
    accepted()
    kl = variance_kl(sigma_sq, sigma_0)
    assert kl.shape == sigma_sq.shape
    assert not bool(torch.isnan(kl).any()), "NaN for a valid input"
    # KL >= 0 (up to rounding), 0 at sigma = sigma_0
    assert bool((kl >= -1e-3).all())


variance_args = dict(
    sigma_sq=tensors(low=1e-6, high=1.0),
    sigma_0=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([0.05]),
        st.integers(-1, 2),
        st.booleans(),
    ),  # fmt: skip
)


@FAST
@given(**variance_args)
def test_fuzz_variance_kl(sigma_sq, sigma_0):
    check_variance_kl(sigma_sq, sigma_0)


@pytest.mark.slow
@MANY
@given(**variance_args)
def test_fuzz_variance_kl_many(sigma_sq, sigma_0):
    check_variance_kl(sigma_sq, sigma_0)


# ---------------------------------------------------------------- ridge regression
def check_design_matrix(basis, positions, ridge_lambda, edge_padding):
    valid = (
        is_floating(positions)
        and positions.dim() == 1
        and positions.numel() > 0
        and finite(positions)
        and real_number(ridge_lambda)
        and math.isfinite(ridge_lambda)
        and ridge_lambda > 0
        and isinstance(edge_padding, bool)
    )
    call = lambda: ridge_design_matrix(basis, positions, ridge_lambda, edge_padding)  # noqa: E731
    if not valid:
        expect_error(call, "positions", "ridge_lambda", "edge_padding")
        return
    accepted()
    try:
        G = call()
    except ValueError as err:  # refused as numerically singular: must say so
        assert "ridge_lambda" in str(err), err
        return
    assert G.shape == (positions.numel(), basis.num_basis) and G.dtype == torch.float64
    assert finite(G)


design_args = dict(
    basis=bases,
    positions=st.one_of(
        tensors(low=-0.5, high=1.5, max_side=12, max_dims=2),
        st.integers(1, 12).flatmap(lambda n: tensors(shape=(n,), low=-0.5, high=1.5)),
    ),
    ridge_lambda=st.one_of(st.floats(1e-3, 10), st.floats(allow_nan=True, allow_infinity=True),
                           st.sampled_from(
        [1.0, 0.5, 1e-3, 1e-12, 1e-300, 5e-324, 1e300]), st.integers(-1, 3), st.booleans()),
    edge_padding=st.one_of(st.booleans(), st.integers(0, 1)),
)  # fmt: skip


@FAST
@given(**design_args)
def test_fuzz_ridge_design_matrix(basis, positions, ridge_lambda, edge_padding):
    check_design_matrix(basis, positions, ridge_lambda, edge_padding)


@pytest.mark.slow
@MANY
@given(**design_args)
def test_fuzz_ridge_design_matrix_many(basis, positions, ridge_lambda, edge_padding):
    check_design_matrix(basis, positions, ridge_lambda, edge_padding)


@st.composite
def fit_args(draw):
    batch, P, e, N = (draw(st.integers(0, 3)), draw(st.integers(0, 5)), draw(st.integers(0, 3)),
                      draw(st.integers(1, 6)))  # fmt: skip
    x_shape = (batch, P, e) if draw(st.booleans()) else None
    G_rows = P if draw(st.integers(0, 3)) else draw(st.integers(0, 6))
    G_shape = (G_rows, N) if draw(st.booleans()) else None
    x = draw(tensors(shape=x_shape))
    G = draw(tensors(shape=G_shape, dtypes=(*FLOATS, torch.int64)))
    return x, G


def check_fit(args):
    x, G = args
    valid = (
        is_floating(x)
        and x.dim() == 3
        and is_floating(G)
        and G.dim() == 2
        and G.shape[0] == x.shape[1]
        and finite(x)
        and finite(G)
    )
    if not valid:
        expect_error(lambda: fit_coefficients(x, G), "x", "G")
        return
    accepted()
    B = fit_coefficients(x, G)
    # the fit runs in float32 at least (precision.py): half-precision inputs give float32
    assert B.shape == (x.shape[0], G.shape[1], x.shape[2])
    assert B.dtype == torch.promote_types(x.dtype, torch.float32)
    ref = torch.einsum("pn,bpe->bne", G.double().to(x.dtype).double(), x.double())
    # finite inputs may overflow (1e30 · 1e30 in float32): compare where the result fits
    if x.dtype in (torch.float32, torch.float64) and peak(ref) < torch.finfo(x.dtype).max / 1e3:
        assert torch.allclose(B.double(), ref, rtol=1e-4, atol=1e-4 * peak(ref))


@FAST
@given(args=fit_args())
def test_fuzz_fit_coefficients(args):
    check_fit(args)


@pytest.mark.slow
@MANY
@given(args=fit_args())
def test_fuzz_fit_coefficients_many(args):
    check_fit(args)


@st.composite
def signal_args(draw):
    basis = draw(bases)
    batch = draw(st.integers(0, 3))
    regular = draw(st.booleans())
    B = draw(tensors(shape=(batch, basis.num_basis, 2) if regular else None))
    t_shape = draw(st.sampled_from([(3,), (batch, 3), (batch + 1, 2), (2, 2, 2), ()]))
    t = draw(tensors(shape=t_shape if draw(st.booleans()) else None, low=-0.5, high=1.5))
    return B, basis, t


def check_signal(args):
    B, basis, t = args
    valid = (
        is_floating(B)
        and B.dim() == 3
        and B.shape[1] == basis.num_basis
        and is_floating(t)
        and (t.dim() == 1 or (t.dim() == 2 and t.shape[0] == B.shape[0]))
        and finite(B)
        and finite(t)
    )
    if not valid:
        expect_error(lambda: evaluate_signal(B, basis, t), "B", "t")
        return
    accepted()
    out = evaluate_signal(B, basis, t)
    assert out.shape == (B.shape[0], t.shape[-1], B.shape[2])


@FAST
@given(args=signal_args())
def test_fuzz_evaluate_signal(args):
    check_signal(args)


@pytest.mark.slow
@MANY
@given(args=signal_args())
def test_fuzz_evaluate_signal_many(args):
    check_signal(args)


def check_positions(length, count):
    if isinstance(length, int) and not isinstance(length, bool) and length >= 1:
        accepted()
        t = segment_positions(length)
        assert t.shape == (length,) and bool(((t > 0) & (t < 1)).all())
    else:
        expect_error(lambda: segment_positions(length), "length")
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        left, right = edge_padding_positions(count)
        assert left.shape == right.shape == (count,)
        assert bool(((left > -0.5) & (left < 0)).all() and ((right > 1) & (right < 1.5)).all())
    else:
        expect_error(lambda: edge_padding_positions(count), "count")


position_args = dict(
    length=st.one_of(st.integers(-3, 300), st.booleans(), st.floats(0, 4), st.none()),
    count=st.one_of(st.integers(-3, 300), st.booleans(), st.floats(0, 4), st.none()),
)


@FAST
@given(**position_args)
def test_fuzz_positions(length, count):
    check_positions(length, count)


@pytest.mark.slow
@MANY
@given(**position_args)
def test_fuzz_positions_many(length, count):
    check_positions(length, count)
