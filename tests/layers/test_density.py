"""The density heads: with the scores standardised over the basis ("normalized", the default),
every query's μ and σ depend on the query from the first step, whatever the scale of the scores;
with the paper's form they start as one flat read shared by every query."""

import math
import re

import pytest
import torch

from inftyformer import (
    LongTermAttention,
    LongTermConfig,
    LongTermMemory,
    MemoryLM,
    ModelConfig,
)


def _read(density: str, key_scale: float = 1.0, sigma_init=None, seed: int = 0):
    torch.manual_seed(seed)
    cfg = LongTermConfig(
        dim=32, num_heads=4, num_basis=32, num_samples=32, density=density, sigma_init=sigma_init
    )
    mem, att = LongTermMemory(cfg), LongTermAttention(cfg, None)
    with torch.no_grad():
        att.key.weight.mul_(key_scale)
    g = torch.Generator().manual_seed(seed + 1)
    state = mem.update(mem.init_state(2), torch.randn(2, 64, 32, generator=g)).detach()
    q = torch.randn(2, 48, 32, generator=g)
    return att(q, state)


def _spread(mu: torch.Tensor) -> float:
    """μ's standard deviation across the queries of a head, averaged over rows and heads."""
    return mu.std(dim=-1).mean().item()


def test_normalized_density_is_invariant_to_the_scale_of_the_scores():
    """ŝ = (s − mean s)/std s: W^K a hundred times smaller gives the same densities."""
    big, small = _read("normalized"), _read("normalized", key_scale=1e-2)
    torch.testing.assert_close(small.mu, big.mu, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(small.sigma_sq, big.sigma_sq, rtol=1e-4, atol=1e-6)
    assert _spread(small.mu) > 0.05


def test_normalized_density_of_a_huge_finite_query_is_finite():
    """qᵀGq of a query with an entry of 1e30 overflows float32; ŝ is computed from q / max|q|,
    so the read stays finite (gradient too) and equals that of the entry at 1e10 (the same
    direction, ε negligible at both scales), and ordinary queries read ŝ as computed by hand."""
    torch.manual_seed(0)
    cfg = LongTermConfig(dim=32, num_heads=4, num_basis=32, num_samples=32, density="normalized")
    mem, att = LongTermMemory(cfg), LongTermAttention(cfg, None)
    state = mem.update(mem.init_state(2), torch.randn(2, 64, 32)).detach()
    q = torch.randn(2, 5, 32)
    q[0, 1, 3] = 1e30  # one huge entry: that query points along the 4th input axis
    huge = q.clone().requires_grad_(True)
    out = att(huge, state)
    assert torch.isfinite(out.context).all() and torch.isfinite(out.sigma_sq).all()
    (out.context.sum() + out.kl).backward()
    assert torch.isfinite(huge.grad).all()
    q[0, 1, 3] = 1e10
    scaled = att(q, state)
    torch.testing.assert_close(out.mu, scaled.mu, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.sigma_sq, scaled.sigma_sq, rtol=1e-5, atol=1e-6)
    # ordinary queries: the standardised scores computed directly from s = K q / √d
    B = state.coefficients
    d = cfg.head_dim
    K = att.key(B - B.mean(1, keepdim=True)).view(2, -1, 4, d).transpose(1, 2)  # [b, H, N, d]
    qh = q[1:].view(1, 5, 4, d).transpose(1, 2)  # no query projection in this config
    assert att.query is None
    s = torch.matmul(qh, K[1:].transpose(-1, -2)) / math.sqrt(d)  # [1, H, Q, N] centred
    s_hat = s / (s.square().mean(-1, keepdim=True) + 1e-12).sqrt()
    mu = torch.sigmoid(s_hat @ att.mu_head.weight[0] + att.mu_head.bias)
    torch.testing.assert_close(out.mu[1:], mu, rtol=1e-4, atol=1e-5)


def test_paper_density_collapses_to_one_read_when_the_scores_are_small():
    """The failure the normalized form removes: small scores, every query the same density."""
    paper = _read("paper", key_scale=1e-2)
    assert _spread(paper.mu) < 1e-3
    assert _spread(_read("normalized", key_scale=1e-2).mu) > 50 * _spread(paper.mu)


@pytest.mark.parametrize("density", ["paper", "normalized"])
def test_sigma_init_sets_the_initial_width(density):
    """The bias of w_σ puts σ at sigma_init for the paper form exactly where the scores vanish,
    and as the median for the normalized form (ŝ is centred, w_σ ~ U(±1/√N))."""
    out = _read(density, key_scale=1e-6 if density == "paper" else 1.0, sigma_init=0.2)
    sigma = out.sigma_sq.sqrt()
    assert sigma.median().item() == pytest.approx(0.2, rel=0.15)
    default = _read(density, key_scale=1e-6 if density == "paper" else 1.0)
    # PyTorch's default bias: softplus(b) with |b| ≤ 1/√N, σ near √ln 2
    assert default.sigma_sq.sqrt().median().item() == pytest.approx(math.sqrt(math.log(2)), 0.1)


def test_paper_form_keeps_its_random_draws():
    """sigma_init draws nothing: the other parameters of both forms are the same draws."""
    torch.manual_seed(0)
    a = LongTermAttention(LongTermConfig(dim=16, num_heads=2, num_basis=16, sigma_init=0.1))
    torch.manual_seed(0)
    b = LongTermAttention(LongTermConfig(dim=16, num_heads=2, num_basis=16, density="paper"))
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        if name != "sigma_head.bias":
            assert torch.equal(p, q), name


def test_default_cpu_small_infty_reads_depend_on_the_query_at_initialisation():
    """At initialisation of the default cpu-small ∞-former, μ's standard deviation across the
    queries of one batch is ≥ 1e-2 in every layer."""
    torch.manual_seed(0)
    config = ModelConfig.preset("cpu-small", model_type="infty", vocab_size=256)
    assert config.density.kind == "normalized"
    model = MemoryLM(config).eval()
    reads = []

    def keep(module, args, out):
        if not bool(args[1].empty.any()):  # reads of a memory that holds something
            reads.append(out.mu)

    hooks = [b.long_term_attention.register_forward_hook(keep) for b in model.blocks]
    tokens = torch.randint(0, 256, (4, 4 * config.segment_len))
    state = model.init_state(4)
    with torch.no_grad():
        for start in range(0, tokens.shape[1], config.segment_len):
            state = model(tokens[:, start : start + config.segment_len], state=state).state
    for h in hooks:
        h.remove()
    last = reads[-len(model.blocks) :]  # the last segment's reads, one per layer
    assert len(last) == len(model.blocks)
    for layer, mu in enumerate(last):
        assert _spread(mu) >= 1e-2, f"layer {layer}: μ spread {_spread(mu):.2e}"


def test_bad_density_settings_are_refused():
    with pytest.raises(ValueError, match="density must be one of"):
        LongTermConfig(dim=8, num_heads=2, density="softmax")
    with pytest.raises(ValueError, match="sigma_init"):
        LongTermConfig(dim=8, num_heads=2, sigma_init=0.0)
    with pytest.raises(TypeError, match="sigma_init"):
        ModelConfig(vocab_size=16, sigma_init="0.1")
    with pytest.raises(ValueError, match="density"):
        ModelConfig(vocab_size=16, density="Paper")


@pytest.mark.parametrize("density", ["paper", "normalized", "content", "mixture"])
@pytest.mark.parametrize("query_projection", [False, True])
def test_a_finite_query_near_the_float32_limit_reads_finite_or_is_named(density, query_projection):
    """Entries of 3e38 are finite, but the scores of the paper's and the content densities
    overflow float32 (the read was NaN, returned without a word): `attend` names the query and
    its scale instead (NonFiniteError, a ValueError). The normalized density reads q / max|q|
    and stays finite (unless its own W^Q overflows first: then named too); at 1e30 every
    density reads finite values."""
    from inftyformer._checks import NonFiniteError

    torch.manual_seed(0)
    cfg = LongTermConfig(
        dim=8, num_heads=2, num_basis=16, widths=(0.05, 0.1), num_samples=16, density=density,
        query_projection=query_projection,
    )  # fmt: skip
    mem, att = LongTermMemory(cfg), LongTermAttention(cfg, None)
    state = mem.update(mem.init_state(2), torch.randn(2, 6, 8)).detach()
    for scale in (1e30, 3e38):
        q = (torch.randn(2, 3, 8) * scale).clamp(-3.3e38, 3.3e38)
        assert bool(torch.isfinite(q).all())
        try:
            out = att.attend(q, state)
        except NonFiniteError as err:  # named: the query and its scale
            assert scale > 1e38 and (density != "normalized" or query_projection)
            assert re.search(r"query: its read is not finite .*3\.\de\+38", str(err))
            continue
        # what is returned is finite; the scores of these overflow at 3e38 (they were NaN)
        assert not (scale > 1e38 and density != "normalized" and not query_projection)
        for t in (out.context, out.mu, out.sigma_sq, out.kl):
            assert bool(torch.isfinite(t).all())
