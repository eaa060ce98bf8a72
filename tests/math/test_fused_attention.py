"""The fused continuous read z = E_p[ψ]ᵀ V (core/fused_read.py) against plain autograd of the
closed form (core/continuous_softmax.py + matmul): same values and gradients to float round-off,
whatever the blocking, and a float64 gradcheck of the custom backward."""

import pytest
import torch

from inftyformer import GaussianBasis, continuous_softmax
from inftyformer.core.fused_read import expected_values


def _inputs(dtype, batch=2, heads=3, queries=37, num_basis=64, dim=5, narrow=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    # μ also a little outside [0, 1]; σ² from 1e-4 (the clamp: most r underflow) up to wide
    mu = torch.rand(batch, heads, queries, generator=g, dtype=dtype) * 1.2 - 0.1
    top = 1e-3 if narrow else 0.5
    sigma_sq = 1e-4 + torch.rand(batch, heads, queries, generator=g, dtype=dtype) * top
    values = torch.randn(batch, heads, num_basis, dim, generator=g, dtype=dtype)
    grad_z = torch.randn(batch, heads, queries, dim, generator=g, dtype=dtype)
    return [t.requires_grad_() for t in (mu, sigma_sq, values)], grad_z


def _reference(mu, sigma_sq, values, basis):
    return torch.matmul(continuous_softmax(mu, sigma_sq, basis), values)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| / max |b|"""
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("narrow", [False, True])
@pytest.mark.parametrize(
    "dtype, tol", [(torch.float32, 2e-6), (torch.float64, 1e-13)], ids=["float32", "float64"]
)
@pytest.mark.parametrize("block_elements", [None, 1, 1000, 1 << 20])
def test_matches_autograd_of_the_closed_form(dtype, tol, narrow, block_elements):
    basis = GaussianBasis(64, (0.01, 0.05))
    inputs, grad_z = _inputs(dtype, narrow=narrow)
    z_ref = _reference(*inputs, basis)
    grads_ref = torch.autograd.grad(z_ref, inputs, grad_z)
    z = expected_values(*inputs, basis, block_elements)
    grads = torch.autograd.grad(z, inputs, grad_z)
    assert z.dtype == dtype and z.shape == z_ref.shape
    assert _rel(z, z_ref) < tol
    for name, got, want in zip(("mu", "sigma_sq", "values"), grads, grads_ref, strict=True):
        assert _rel(got, want) < tol, name


def test_gradcheck_float64():
    basis = GaussianBasis(12, (0.05, 0.2, 0.4))
    g = torch.Generator().manual_seed(1)
    mu = torch.rand(2, 7, generator=g, dtype=torch.float64).requires_grad_()
    sigma_sq = (1e-3 + 0.05 * torch.rand(2, 7, generator=g, dtype=torch.float64)).requires_grad_()
    values = torch.randn(2, 12, 3, generator=g, dtype=torch.float64).requires_grad_()
    # blocks of 8 queries over 7 … and of 1 value (rounded up to 8): one block and uneven ones
    for block in (None, 30, 1):
        assert torch.autograd.gradcheck(
            lambda m, s, v, b=block: expected_values(m, s, v, basis, b), (mu, sigma_sq, values)
        )


def test_only_the_wanted_gradients_and_no_grad_forward():
    basis = GaussianBasis(16, (0.02, 0.1))
    (mu, sigma_sq, values), grad_z = _inputs(torch.float64, num_basis=16)
    z_ref = _reference(mu, sigma_sq, values, basis)
    want = torch.autograd.grad(z_ref, (mu, sigma_sq, values), grad_z)
    for i, x in enumerate((mu, sigma_sq, values)):  # one input at a time needs a gradient
        args = [t.detach().requires_grad_(t is x) for t in (mu, sigma_sq, values)]
        (got,) = torch.autograd.grad(expected_values(*args, basis, 500), args[i], grad_z)
        assert _rel(got, want[i]) < 1e-13
    with torch.no_grad():
        z = expected_values(mu, sigma_sq, values, basis, 500)
    assert z.grad_fn is None and _rel(z, z_ref) < 1e-13


def test_keeps_nothing_of_size_queries_times_basis():
    basis = GaussianBasis(64, (0.01, 0.05))
    (mu, sigma_sq, values), _ = _inputs(torch.float32, queries=128)
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        expected_values(mu, sigma_sq, values, basis, 4096)
        full = mu.numel() * basis.num_basis  # the [batch, H, Q, N] tensor of the unfused form
        assert sizes and max(sizes) < full // 8
        sizes.clear()
        _reference(mu, sigma_sq, values, basis)
        assert max(sizes) == full  # what the unfused form keeps for its backward


def test_autocast_reads_in_float32():
    basis = GaussianBasis(32, (0.01, 0.05))
    (mu, sigma_sq, values), grad_z = _inputs(torch.float32, num_basis=32)
    z32 = expected_values(mu, sigma_sq, values, basis)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = expected_values(mu, sigma_sq, values.bfloat16(), basis)
        (grad_mu,) = torch.autograd.grad(z, mu, grad_z)
    assert z.dtype == torch.float32 and grad_mu.dtype == torch.float32
    # only V was rounded to bf16 (8 significant bits), nothing computed in it
    assert _rel(z, z32) < 1e-2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(expected_values(mu, sigma_sq, values, basis), z32)


def test_no_queries_read_nothing():
    basis = GaussianBasis(8, (0.1,))
    values = torch.randn(2, 3, 8, 4, requires_grad=True)
    for block in (None, 1000):
        z = expected_values(torch.rand(2, 3, 0), torch.rand(2, 3, 0), values, basis, block)
        assert z.shape == (2, 3, 0, 4)


def test_rejects_mismatched_shapes():
    basis = GaussianBasis(8, (0.1,))
    mu = torch.rand(2, 3, 5)
    with pytest.raises(ValueError, match="sigma_sq"):
        expected_values(mu, torch.rand(2, 3, 4), torch.randn(2, 3, 8, 4), basis)
    with pytest.raises(ValueError, match="leading"):
        expected_values(mu, torch.rand(2, 3, 5), torch.randn(3, 2, 8, 4), basis)
    with pytest.raises(ValueError, match="N=8"):
        expected_values(mu, torch.rand(2, 3, 5), torch.randn(2, 3, 7, 4), basis)


def test_scratch_reused_across_calls_and_threads_keeps_each_read_its_own():
    """The blocks' scratch tensors are kept between calls (per thread and shape): a read right
    after another of the same shape, and reads running at once in two threads, give each its
    own values and gradients, bitwise as a read on its own."""
    import threading

    basis = GaussianBasis(64, (0.01, 0.05))
    cases = [_inputs(torch.float32, seed=seed) for seed in (1, 2)]

    def read(inputs, grad_z):
        z = expected_values(*inputs, basis, block_elements=1000)
        grads = torch.autograd.grad(z, inputs, grad_z)
        return [z.detach(), *grads]

    alone = [read(*case) for case in cases]
    again = [read(*case) for case in reversed(cases)][::-1]
    threaded: list = [None, None]

    def worker(i: int) -> None:
        for _ in range(20):  # long enough that the two threads' reads interleave
            threaded[i] = read(*cases[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for ref, seq, par in zip(alone, again, threaded, strict=True):
        for a, b, c in zip(ref, seq, par, strict=True):
            assert torch.equal(a, b) and torch.equal(a, c)
    assert not torch.equal(alone[0][0], alone[1][0])  # the two cases do differ


def test_scratch_keeps_only_the_shapes_used_last():
    """Calls of many lengths (a stream's tail segments, evaluation) keep a few scratch shapes,
    not one per length, and each read stays right."""
    from inftyformer.core import fused_read

    basis = GaussianBasis(64, (0.01, 0.05))
    for queries in range(3, 12):
        inputs, _ = _inputs(torch.float32, queries=queries, seed=queries)
        z = expected_values(*[t.detach() for t in inputs], basis, block_elements=1000)
        assert _rel(z, _reference(*[t.detach() for t in inputs], basis)) < 2e-6
    kept = fused_read._WORKSPACE.tensors
    assert 1 <= len(kept) <= fused_read._WORKSPACE_SHAPES
