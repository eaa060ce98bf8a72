"""The long-term memory (fit, unbounded update, sticky sampling, reset) and continuous attention."""

from dataclasses import replace

import pytest
import torch

from inftyformer import LongTermAttention, LongTermConfig, LongTermMemory, LongTermState
from inftyformer.core.ridge import segment_positions


def small_config(**overrides) -> LongTermConfig:
    base = dict(dim=8, num_heads=2, num_basis=16, widths=(0.05, 0.1), num_samples=24, tau=0.5)
    base.update(overrides)
    return LongTermConfig(**base)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(num_basis=15), "num_basis"),
        (dict(tau=1.0), "tau"),
        (dict(tau=0.0), "tau"),
        (dict(num_samples=0), "num_samples"),
        (dict(ridge_lambda=-0.1), "ridge_lambda"),
        (dict(dim=9), "num_heads"),
        (dict(sigma_0=0.0), "sigma_0"),
        (dict(widths=(0.1, float("nan"))), "widths"),
    ],
)
def test_config_rejects_impossible_values(overrides, match):
    with pytest.raises(ValueError, match=match):
        small_config(**overrides)


def test_first_fit_reconstructs_a_smooth_segment():
    memory = LongTermMemory(small_config(num_basis=64, conv_gate=False, ridge_lambda=0.01))
    t = segment_positions(40).float()
    x = torch.stack([torch.sin(3 * t), torch.cos(2 * t)] * 4, -1)[None]  # [1, 40, 8]
    state = memory.update(memory.init_state(1), x)
    assert not state.empty.any()
    recon = memory.signal(state, t)
    inner = slice(4, 36)  # the edge padding pulls the very ends towards 0, as in the paper's code
    err = (recon - x)[:, inner].norm() / x[:, inner].norm()
    assert err.item() < 0.02


def test_unbounded_update_squeezes_the_old_signal_into_tau():
    """After an update the old content is read at τ·t, the new at (τ, 1]."""
    cfg = small_config(num_basis=64, conv_gate=False, ridge_lambda=1e-3, num_samples=64, tau=0.5)
    memory = LongTermMemory(cfg)
    t = segment_positions(32).float()
    old = torch.stack([torch.sin(2 * t)] * 8, -1)[None]
    new = torch.stack([torch.cos(2 * t)] * 8, -1)[None]
    state = memory.update(memory.init_state(1), old)
    state = memory.update(state, new)
    read_old = memory.signal(state, cfg.tau * t)
    read_new = memory.signal(state, cfg.tau + (1 - cfg.tau) * t)
    assert ((read_old - old).norm() / old.norm()).item() < 0.1
    assert ((read_new - new).norm() / new.norm()).item() < 0.1


def test_resampling_at_the_grid_uses_one_cached_basis_and_changes_nothing(monkeypatch):
    """ψ(u) at the grid u = i/M is a constant: computed once (one entry in the design cache the
    layers share) and the update is bitwise the one that evaluates ψ(u) every call."""
    from inftyformer.core.squeeze import ResamplingSqueeze

    cfg = small_config(num_basis=64, num_samples=64)
    designs: dict = {}
    memory = LongTermMemory(cfg, designs)
    g = torch.Generator().manual_seed(0)
    chunks = [torch.randn(2, 12, 8, generator=g) for _ in range(3)]

    def stream(mem):
        state = mem.init_state(2)
        for x in chunks:
            state = mem.update(state, x)
        return state.coefficients

    cached = stream(memory)
    bases = [k for k in designs if k[0][1] == "basis"]
    assert len(bases) == 1 and bases[0][0][2] == ("grid", 64, torch.float32)
    monkeypatch.setattr(ResamplingSqueeze, "_samples_on_grid", lambda self: False)
    fresh = LongTermMemory(cfg)
    fresh.load_state_dict(memory.state_dict())
    assert torch.equal(stream(fresh), cached)


@pytest.mark.parametrize("sticky", [False, True])
def test_thousand_updates_keep_shape_footprint_and_finiteness(sticky):
    cfg = small_config(sticky=sticky)
    memory, attention = LongTermMemory(cfg), LongTermAttention(cfg)
    memory.train()
    gen = torch.Generator().manual_seed(0)
    state = memory.init_state(3)
    footprint = sum(t.numel() * t.element_size() for t in state.tensors().values())
    with torch.no_grad():
        for _ in range(1000):
            state = memory.update(state, torch.randn(3, 5, 8, generator=gen), generator=gen)
            out = attention(torch.randn(3, 4, 8, generator=gen), state)
            state = memory.observe(state, out.mu, out.sigma_sq)
    assert state.coefficients.shape == (3, 16, 8)
    assert sum(t.numel() * t.element_size() for t in state.tensors().values()) == footprint
    assert all(torch.isfinite(t.float()).all() for t in state.tensors().values())


def test_no_graph_is_kept_across_segments():
    cfg = small_config()
    memory = LongTermMemory(cfg)
    x = torch.randn(2, 6, 8, requires_grad=True)
    state = memory.update(memory.init_state(2), x)
    assert state.coefficients.requires_grad  # this step's graph (gate, fit) for this step only
    state = state.detach()
    state2 = memory.update(state, torch.randn(2, 6, 8))
    state2.coefficients.sum().backward()
    assert x.grad is None  # B_past was detached: nothing flows back into the previous segment


def _concentrated_state(memory: LongTermMemory, batch: int, mu: float) -> LongTermState:
    state = memory.update(memory.init_state(batch), torch.randn(batch, 10, memory.config.dim))
    mus = torch.full((batch, 2, 7), mu)
    sig = torch.full((batch, 2, 7), 0.03**2)
    return memory.observe(state, mus, sig)


@pytest.mark.parametrize("training", [True, False])
def test_sticky_sampling_follows_past_attention(training):
    memory = LongTermMemory(small_config(sticky=True, num_samples=400)).train(training)
    state = _concentrated_state(memory, 2, mu=0.8)
    u = memory.sample_positions(state, torch.Generator().manual_seed(1))  # [batch, M]
    assert u.shape == (2, 400)
    assert torch.all(u[:, 1:] >= u[:, :-1])  # sorted
    near = ((u > 0.7) & (u < 0.9)).float().mean().item()
    assert near > 0.9  # a uniform grid would put 20% there
    plain = LongTermMemory(small_config(sticky=False, num_samples=400))
    u0 = plain.sample_positions(state)
    assert ((u0 > 0.7) & (u0 < 0.9)).float().mean().item() == pytest.approx(0.2, abs=0.01)


def test_sticky_training_samples_are_uniform_within_bins_and_seeded():
    memory = LongTermMemory(small_config(sticky=True, num_samples=500)).train()
    state = _concentrated_state(memory, 1, mu=0.3)
    u1 = memory.sample_positions(state, torch.Generator().manual_seed(5))
    u2 = memory.sample_positions(state, torch.Generator().manual_seed(5))
    assert torch.equal(u1, u2)
    frac = (u1 * memory.config.sticky_bins).frac()
    # the authors' code put every sample on a bin's left edge; ours spread over the bin
    assert frac.std().item() > 0.2 and (frac > 0.5).float().mean().item() > 0.3


def test_sticky_eval_sampling_is_deterministic_quantiles():
    memory = LongTermMemory(small_config(sticky=True, num_samples=64)).eval()
    # uniform histogram → quantiles (i − ½)/M exactly
    state = memory.update(memory.init_state(1), torch.randn(1, 4, 8))
    u = memory.sample_positions(state)
    expected = (torch.arange(64) + 0.5) / 64
    assert torch.allclose(u[0], expected, atol=1e-5)
    state = _concentrated_state(memory, 1, mu=0.5)
    assert torch.equal(memory.sample_positions(state), memory.sample_positions(state))


def test_reset_clears_only_flagged_rows():
    memory = LongTermMemory(small_config(sticky=True))
    state = _concentrated_state(memory, 4, mu=0.6)
    rows = torch.tensor([False, True, False, True])
    cleared = memory.reset(state, rows)
    assert torch.equal(cleared.empty, rows)
    assert torch.equal(cleared.coefficients[[0, 2]], state.coefficients[[0, 2]])
    assert cleared.coefficients[[1, 3]].abs().sum() == 0
    assert torch.equal(cleared.attention_mass[[0, 2]], state.attention_mass[[0, 2]])
    assert torch.allclose(cleared.attention_mass[1], torch.full((128,), 1 / 128))
    with pytest.raises(TypeError, match="bool"):
        memory.reset(state, torch.tensor([0, 1, 0, 1]))
    with pytest.raises(ValueError, match="rows"):
        memory.reset(state, torch.tensor([True, False]))


def test_batch_of_streams_equals_separate_streams():
    """4 streams in one batch (with a reset of some rows midway) = 4 runs of batch 1."""
    torch.manual_seed(0)
    cfg = small_config(sticky=True)
    memory, attention = LongTermMemory(cfg).eval(), LongTermAttention(cfg).eval()
    segments = [torch.randn(4, 6, 8) for _ in range(4)]
    queries = [torch.randn(4, 5, 8) for _ in range(4)]
    resets = [None, None, torch.tensor([False, True, False, False]), None]

    def run(rows):
        state = memory.init_state(len(rows))
        outs = []
        for x, q, reset in zip(segments, queries, resets, strict=True):
            if reset is not None:
                state = memory.reset(state, reset[rows])
            state = memory.update(state, x[rows])
            out = attention(q[rows], state)
            state = memory.observe(state, out.mu, out.sigma_sq).detach()
            outs.append(out.context)
        return torch.cat(outs, 1), state

    batched, state = run(torch.arange(4))
    for i in range(4):
        single, s1 = run(torch.tensor([i]))
        assert torch.allclose(batched[i : i + 1], single, atol=1e-5)
        assert torch.allclose(state.coefficients[i], s1.coefficients[0], atol=1e-5)


def test_attention_shapes_empty_rows_and_kl():
    cfg = small_config(out_dim=5)
    memory, attention = LongTermMemory(cfg), LongTermAttention(cfg)
    state = memory.update(memory.init_state(3), torch.randn(3, 6, 8))
    state = memory.reset(state, torch.tensor([False, True, False]))
    out = attention(torch.randn(3, 4, 8), state)
    assert out.context.shape == (3, 4, 5)
    assert out.mu.shape == out.sigma_sq.shape == (3, 2, 4)
    assert out.context[1].abs().sum() == 0  # the emptied row reads nothing
    assert out.context[0].abs().sum() > 0
    assert out.kl.ndim == 0 and out.kl.item() >= 0
    assert (out.mu > 0).all() and (out.mu < 1).all() and (out.sigma_sq >= 1e-4).all()


def test_every_attention_parameter_gets_a_gradient_even_with_empty_memory():
    cfg = small_config(query_projection=True)
    attention = LongTermAttention(cfg)
    memory = LongTermMemory(cfg)
    out = attention(torch.randn(2, 3, 8), memory.init_state(2))
    (out.context.sum() + out.kl).backward()
    assert all(p.grad is not None for p in attention.parameters())


def test_attention_gradcheck_float64():
    torch.manual_seed(0)
    cfg = small_config(query_projection=True)
    memory = LongTermMemory(cfg).double()
    attention = LongTermAttention(cfg).double()
    state = memory.update(
        memory.init_state(2, dtype=torch.float64), torch.randn(2, 6, 8, dtype=torch.float64)
    ).detach()
    query = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    B = state.coefficients.clone().requires_grad_()

    def f(q, coeffs):
        s = replace(state, coefficients=coeffs)
        out = attention(q, s)
        return out.context, out.kl

    assert torch.autograd.gradcheck(f, (query, B))


def test_memory_update_gradcheck_through_gate():
    torch.manual_seed(0)
    cfg = small_config()
    memory = LongTermMemory(cfg).double()
    state = memory.update(
        memory.init_state(2, dtype=torch.float64), torch.randn(2, 5, 8, dtype=torch.float64)
    ).detach()
    x = torch.randn(2, 4, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: memory.update(state, v).coefficients, (x,))


def test_update_and_attention_reject_bad_input():
    cfg = small_config()
    memory, attention = LongTermMemory(cfg), LongTermAttention(cfg)
    state = memory.init_state(2)
    with pytest.raises(ValueError, match="x must have shape"):
        memory.update(state, torch.randn(3, 5, 8))  # batch mismatch
    with pytest.raises(ValueError, match="x must have shape"):
        memory.update(state, torch.randn(2, 5, 7))  # feature mismatch
    with pytest.raises(ValueError, match="zero-length"):
        memory.update(state, torch.randn(2, 0, 8))
    with pytest.raises(ValueError, match="NaN"):
        memory.update(state, torch.full((2, 5, 8), float("nan")))
    with pytest.raises(ValueError, match="x must have 3 dimensions"):
        memory.update(state, torch.randn(5, 8))
    with pytest.raises(TypeError, match="state"):
        memory.update("not a state", torch.randn(2, 5, 8))
    bad = replace(state, coefficients=torch.zeros(2, 15, 8))
    with pytest.raises(ValueError, match="state.coefficients"):
        memory.update(bad, torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match="query must have shape"):
        attention.attend(torch.randn(2, 4, 6), state)
    with pytest.raises(ValueError, match="NaN"):
        attention.attend(torch.full((2, 4, 8), float("inf")), state)
    with pytest.raises(ValueError, match="batch_size"):
        memory.init_state(0)


def test_state_round_trips_through_tensors():
    memory = LongTermMemory(small_config())
    state = memory.update(memory.init_state(2), torch.randn(2, 5, 8)).detach()
    again = LongTermState.from_tensors(state.tensors())
    assert all(
        torch.equal(a, b)
        for a, b in zip(state.tensors().values(), again.tensors().values(), strict=True)
    )
    with pytest.raises(ValueError, match="missing"):
        LongTermState.from_tensors({"coefficients": state.coefficients})


def test_a_prepared_memory_reads_exactly_like_the_state():
    """`prepare` once, read many times (generation): the same reads as preparing every call."""
    torch.manual_seed(0)
    config = LongTermConfig(dim=16, num_heads=2, num_basis=8, num_samples=8)
    memory, attention = LongTermMemory(config), LongTermAttention(config)
    state = memory.update(memory.init_state(3), torch.randn(3, 10, 16))
    prepared = attention.prepare(state, torch.float32)
    for queries in (1, 5):
        q = torch.randn(3, queries, 16)
        direct, cached = attention(q, state), attention(q, state, prepared=prepared)
        assert torch.equal(direct.context, cached.context) and torch.equal(direct.mu, cached.mu)
        assert torch.equal(direct.sigma_sq, cached.sigma_sq)
