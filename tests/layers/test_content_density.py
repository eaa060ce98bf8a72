"""The content densities (core/attention.py): "content", the density's moments matched to a
softmax over the basis keys, so that a query reads where its content matches; "mixture", that
softmax read as it stands, z = Σ_n p_n x̄(c_n) W^V, not a Gaussian at its moments."""

import math
from dataclasses import replace

import pytest
import torch

from inftyformer import LongTermAttention, LongTermConfig, LongTermMemory
from inftyformer.core.continuous_softmax import continuous_softmax


def _setup(seed: int = 0, density: str = "content", **settings):
    torch.manual_seed(seed)
    base = dict(dim=32, num_heads=4, num_basis=32, density=density)
    if settings.get("squeeze") != "fill":  # the fill squeeze never resamples
        base["num_samples"] = 32
    cfg = LongTermConfig(**{**base, **settings})
    mem, att = LongTermMemory(cfg), LongTermAttention(cfg, None)
    g = torch.Generator().manual_seed(seed + 1)
    state = mem.update(mem.init_state(2), torch.randn(2, 64, 32, generator=g)).detach()
    return cfg, att, state, torch.randn(2, 5, 32, generator=g)


def _signal_at_centres(att, state):
    B = state.coefficients.double()  # [b, N, e]
    c = att.basis.centers.double()
    w = att.basis.widths.double()
    psi = torch.exp(-0.5 * (c[:, None] - c[None, :]) ** 2 / w**2) / (w * math.sqrt(2 * math.pi))
    return psi @ B  # x̄(c_n) = Σ_j B_j ψ_j(c_n)  [b, N, e]


def test_content_density_matches_a_hand_computation():
    """μ, σ² and the context against the formulas in float64, written out per head."""
    cfg, att, state, q = _setup()
    with torch.no_grad():  # a prior and an extra variance that matter
        att.mu_head.weight.normal_()
        att.sigma_head.weight.normal_(std=0.1)
    out = att(q, state)
    H, d = cfg.num_heads, cfg.head_dim
    B = state.coefficients.double()  # [b, N, e]
    c = att.basis.centers.double()
    signal = _signal_at_centres(att, state)  # x̄(c_n)
    K = (signal @ att.key.weight.double().T).view(2, -1, H, d).transpose(1, 2)  # [b, H, N, d]
    qh = q.double().view(2, -1, H, d).transpose(1, 2)  # [b, H, Q, d]
    s = qh @ K.transpose(-1, -2) / math.sqrt(d)  # [b, H, Q, N]
    p = torch.softmax(s + att.mu_head.weight[0].double(), dim=-1)
    mu = (p * c).sum(-1)
    spread = (p * (c - mu[..., None]) ** 2).sum(-1)
    w_sigma, b_sigma = att.sigma_head.weight[0].double(), att.sigma_head.bias.double()
    sigma_sq = (spread + torch.nn.functional.softplus(s @ w_sigma + b_sigma)).clamp(
        min=cfg.min_sigma_sq
    )
    torch.testing.assert_close(out.mu.double(), mu, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.sigma_sq.double(), sigma_sq, rtol=1e-5, atol=1e-7)
    V = (B @ att.value.weight.double().T).view(2, -1, H, d).transpose(1, 2)
    r = continuous_softmax(mu, sigma_sq, att.basis)  # [b, H, Q, N]
    z = (r @ V).transpose(1, 2).reshape(2, -1, H * d)
    context = z @ att.out.weight.double().T + att.out.bias.double()
    torch.testing.assert_close(out.context.double(), context, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("place", [3, 17, 30])
def test_a_query_that_matches_one_key_reads_at_its_centre(place):
    """A memory whose content at the centres is orthogonal (x̄(c_n) = e_n) and W^K = I: the
    query equal to the content at c_n (scaled) puts μ at c_n within a tenth of the basis spacing
    and σ below it — what the paper's linear head cannot do for an arbitrary n."""
    cfg, att, state, _ = _setup(widths=(0.02,))
    N = cfg.num_basis
    psi = att.basis(att.basis.centers.double())  # ψ_j(c_n)  [N, N]
    B = torch.linalg.inv(psi).float()  # x̄(c) = Ψ B = I
    state = replace(state, coefficients=B.expand(2, N, N).clone())
    with torch.no_grad():
        att.key.weight.copy_(torch.eye(cfg.dim))
        att.mu_head.weight.zero_()
        att.sigma_head.weight.zero_()
    q = (40.0 * torch.eye(N)[place]).expand(2, 1, N)
    out = att(q, state)
    spacing = 1.0 / (N - 1)
    centre = att.basis.centers[place].item()
    # each head sees its own slice of the coefficient: only the head holding index `place` matches
    head = place // cfg.head_dim
    assert out.mu[:, head].sub(centre).abs().max().item() < 0.1 * spacing
    assert out.sigma_sq[:, head].sqrt().max().item() < spacing
    others = [h for h in range(cfg.num_heads) if h != head]
    assert out.mu[:, others].sub(0.5).abs().max().item() < 0.05  # no match: the mean place


def test_the_extra_variance_starts_at_sigma_init_or_at_the_floor():
    _, att, state, q = _setup()
    with torch.no_grad():  # flat scores and prior: σ² = the centres' variance + the extra
        att.key.weight.mul_(1e-6)
        att.mu_head.weight.zero_()
    centres = att.basis.centers.double()
    flat = ((centres - centres.mean()) ** 2).mean().item()
    floor = att(q, state).sigma_sq
    assert floor.double().sub(flat + att.config.min_sigma_sq).abs().max().item() < 1e-5
    _, att, state, q = _setup(sigma_init=0.1)
    with torch.no_grad():
        att.key.weight.mul_(1e-6)
        att.mu_head.weight.zero_()
    assert att(q, state).sigma_sq.double().sub(flat + 0.01).abs().max().item() < 1e-4


@pytest.mark.parametrize("density", ["content", "mixture"])
def test_every_parameter_gets_a_gradient(density):
    """DistributedDataParallel without find_unused_parameters: every parameter in the graph."""
    _, att, state, q = _setup(density=density)
    out = att(q, state)
    (out.context.sum() + out.kl).backward()
    for name, p in att.named_parameters():
        assert p.grad is not None, name
    for p in (att.key.weight, att.value.weight, att.mu_head.weight):
        assert p.grad.abs().sum() > 0


def test_the_floor_of_sigma_is_a_setting_of_both_model_configs(tmp_path):
    """min_sigma_sq reaches every layer's attention (native and pretrained); bad values are
    refused by name. A content read narrower than the basis needs a floor below 1e-4."""
    from inftyformer import MemoryLM, ModelConfig

    small = dict(vocab_size=16, model_type="infty", d_model=16, n_layers=1, n_heads=2, d_ff=32)
    native = MemoryLM(ModelConfig(**small, num_basis=16, num_samples=16, min_sigma_sq=1e-6))
    assert {b.long_term_attention.config.min_sigma_sq for b in native.blocks} == {1e-6}
    for bad in (0.0, -1.0, float("nan"), 2.0):
        with pytest.raises(ValueError, match="min_sigma_sq"):
            ModelConfig(vocab_size=16, min_sigma_sq=bad)
    pytest.importorskip("transformers")
    from tiny_pretrained import write_tiny_model

    from inftyformer.model_kinds import PretrainedMemoryConfig, build_model

    base = str(write_tiny_model(tmp_path / "base"))
    model = build_model(PretrainedMemoryConfig(base_model=base, segment_len=16, min_sigma_sq=1e-6))
    floors = {m.config.min_sigma_sq for m in model.modules() if isinstance(m, LongTermAttention)}
    assert floors == {1e-6}
    with pytest.raises(ValueError, match="min_sigma_sq"):
        PretrainedMemoryConfig(base_model=base, min_sigma_sq=0.0)


# ------------------------------------------------------------------- density="mixture"
@pytest.mark.parametrize("settings", [{}, {"sharpness": 4.0, "sink_edge": 0.1}])
def test_mixture_read_matches_a_hand_computation(settings):
    """z = Σ_n p_n x̄(c_n) W^V per head, p_n = softmax(β s_n + w_μ,n) over the centres read."""
    cfg, att, state, q = _setup(density="mixture", **settings)
    with torch.no_grad():
        att.mu_head.weight.normal_()
    out = att(q, state)
    H, d = cfg.num_heads, cfg.head_dim
    signal = _signal_at_centres(att, state)
    K = (signal @ att.key.weight.double().T).view(2, -1, H, d).transpose(1, 2)  # [b, H, N, d]
    V = (signal @ att.value.weight.double().T).view(2, -1, H, d).transpose(1, 2)
    qh = q.double().view(2, -1, H, d).transpose(1, 2)  # [b, H, Q, d]
    s = qh @ K.transpose(-1, -2) / math.sqrt(d)  # [b, H, Q, N]
    c = att.basis.centers.double()
    s = s.masked_fill(c < cfg.sink_edge, -math.inf)
    p = torch.softmax(cfg.sharpness * s + att.mu_head.weight[0].double(), dim=-1)
    z = (p @ V).transpose(1, 2).reshape(2, -1, H * d)
    context = z @ att.out.weight.double().T + att.out.bias.double()
    torch.testing.assert_close(out.context.double(), context, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(out.mu.double(), (p * c).sum(-1), rtol=1e-5, atol=1e-6)
    heads = att.read_heads(att.project_queries(q), state)
    torch.testing.assert_close(heads.z.double(), p @ V, rtol=1e-4, atol=1e-6)
    log_mass = torch.logsumexp(s, dim=-1)
    torch.testing.assert_close(heads.log_mass.double(), log_mass, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("density", ["paper", "normalized"])
def test_read_heads_refuses_a_continuous_density_offering_the_discrete_ones(density):
    """The core knows the densities that read places by their capability (`discrete`), not by
    name: the error lists the kinds registered with it."""
    _, att, state, q = _setup(density=density)
    with pytest.raises(ValueError) as refused:
        att.read_heads(att.project_queries(q), state)
    message = str(refused.value)
    assert "reads places (discrete: content, mixture)" in message
    assert message.endswith(f"got {density!r}")


def test_two_matches_read_both_values_not_the_signal_between_them():
    """A query matching two places equally reads the mean of their values and nothing of the
    place between them; the Gaussian of density='content' sits between them and reads it."""
    cfg, att, state, _ = _setup(density="mixture", widths=(0.02,))
    N = cfg.num_basis
    psi = att.basis(att.basis.centers.double())  # ψ_j(c_n)  [N, N]
    B = torch.linalg.inv(psi).float()  # x̄(c_n) = e_n
    state = replace(state, coefficients=B.expand(2, N, N).clone())
    with torch.no_grad():
        for w in (att.key.weight, att.value.weight):
            w.copy_(torch.eye(cfg.dim))
        att.mu_head.weight.zero_()
    q = (40.0 * (torch.eye(N)[3] + torch.eye(N)[5])).expand(2, 1, N)  # head 0 holds 0..7
    z = att.read_heads(att.project_queries(q), state).z[:, 0, 0]  # [b, d]
    torch.testing.assert_close(z[:, 3], torch.full((2,), 0.5), atol=1e-4, rtol=0)
    torch.testing.assert_close(z[:, 5], torch.full((2,), 0.5), atol=1e-4, rtol=0)
    assert z[:, 4].abs().max() < 1e-4
    content = LongTermAttention(replace(cfg, density="content"), None)
    content.load_state_dict(att.state_dict())
    between = content.read_heads(content.project_queries(q), state).z[:, 0, 0]
    assert between[:, 4].min() > between[:, 3].max()  # the Gaussian reads c_4 most


def test_mixture_settings_are_checked():
    with pytest.raises(ValueError, match="density"):
        LongTermConfig(dim=8, num_heads=2, density="mixtures")
    LongTermConfig(dim=8, num_heads=2, density="mixture", sharpness=3.0, sink_edge=0.05)
    with pytest.raises(ValueError, match="sharpness"):
        LongTermConfig(dim=8, num_heads=2, density="normalized", sharpness=3.0)


def test_merged_by_mass_it_is_one_softmax_over_the_window_and_the_centres():
    """At β = 1 the heads read merged into a head's window attention by mass
    (`hf/head_read.merge_into_heads`) equals one softmax over the window's tokens and the N
    centres read, the centres' keys and values being the signal's there."""
    from inftyformer.hf.head_read import merge_into_heads

    cfg, att, state, q = _setup(density="mixture", sink_edge=0.1)
    with torch.no_grad():
        att.mu_head.weight.zero_()  # no prior over places (the heads read starts without one)
    H, d, S = cfg.num_heads, cfg.head_dim, 6
    g = torch.Generator().manual_seed(7)
    s_w = torch.randn(2, H, q.shape[1], S, generator=g) * 2  # window scores  [b, H, Q, S]
    v_w = torch.randn(2, H, S, d, generator=g)
    o_w = torch.softmax(s_w, -1) @ v_w
    heads_in = o_w.transpose(1, 2).reshape(2, -1, H * d)
    projection = torch.nn.Linear(H * d, 5)
    with torch.no_grad():
        read = att.read_heads(att.project_queries(q), state)
        merged = merge_into_heads(projection(heads_in), heads_in, read,
                                  torch.logsumexp(s_w, -1), projection, None)  # fmt: skip
    signal = _signal_at_centres(att, state)
    read_at = att.basis.centers >= cfg.sink_edge  # the centres read
    K = (signal @ att.key.weight.double().T).view(2, -1, H, d).transpose(1, 2)[:, :, read_at]
    V = (signal @ att.value.weight.double().T).view(2, -1, H, d).transpose(1, 2)[:, :, read_at]
    s_m = q.double().view(2, -1, H, d).transpose(1, 2) @ K.transpose(-1, -2) / math.sqrt(d)
    p = torch.softmax(torch.cat([s_w.double(), s_m], -1), -1)
    want = p[..., :S] @ v_w.double() + p[..., S:] @ V  # [b, H, Q, d]
    want = projection(want.transpose(1, 2).reshape(2, -1, H * d).float())
    torch.testing.assert_close(merged, want, rtol=1e-4, atol=1e-5)


def test_token_mass_adds_the_log_of_tokens_per_place_to_the_heads_read():
    """token_mass: log Z_M + log(S / N) per row, z unchanged; a memory of S = N / 8 tokens then
    weighs as S tokens against the window, not as N; the setting needs a uniform squeeze."""
    pytest.importorskip("transformers")
    from inftyformer.hf.head_read import add_token_mass
    from inftyformer.pretrained_config import AdapterConfig

    cfg, att, state, q = _setup(density="mixture", squeeze="by_length")
    state = replace(state, stored=torch.tensor([4, 64]))  # N = 32 places
    prepared = att.prepare(state, q.dtype)
    plain = att.read_heads(att.project_queries(q), state, prepared)
    mass = add_token_mass(plain, state, prepared)
    torch.testing.assert_close(mass.z, plain.z)
    shift = (mass.log_mass - plain.log_mass).double()
    torch.testing.assert_close(
        shift[0], torch.full_like(shift[0], math.log(4 / 32)), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        shift[1], torch.full_like(shift[1], math.log(64 / 32)), atol=1e-6, rtol=0
    )
    heads = dict(memory_read="heads", token_mass=True, density="mixture")
    AdapterConfig(**heads, squeeze="by_length")
    with pytest.raises(ValueError, match="token_mass"):
        AdapterConfig(**heads, squeeze="fixed")
    with pytest.raises(ValueError, match="token_mass|reads places"):
        AdapterConfig(**{**heads, "density": "normalized"}, squeeze="by_length")


def test_fill_reads_only_the_centres_that_hold_the_stream():
    """squeeze="fill": with S = 4 of K = 16 centres' tokens a row reads the first 4 centres
    only (a softmax over those, by hand); a full row reads them all."""
    cfg, att, state, q = _setup(density="mixture", squeeze="fill")
    state = replace(state, stored=torch.tensor([4, 64]))
    with torch.no_grad():
        att.mu_head.weight.zero_()
        read = att.read_heads(att.project_queries(q), state)
    H, d = cfg.num_heads, cfg.head_dim
    signal = _signal_at_centres(att, state)
    K = (signal @ att.key.weight.double().T).view(2, -1, H, d).transpose(1, 2)
    V = (signal @ att.value.weight.double().T).view(2, -1, H, d).transpose(1, 2)
    s = q.double().view(2, -1, H, d).transpose(1, 2) @ K.transpose(-1, -2) / math.sqrt(d)
    first_four = att.basis.centers <= 3 / 15 + 1e-6
    beyond = torch.stack([~first_four, torch.zeros(cfg.num_basis, dtype=torch.bool)])
    s = s.masked_fill(beyond[:, None, None, :], -math.inf)
    torch.testing.assert_close(read.z.double(), torch.softmax(s, -1) @ V, rtol=1e-4, atol=1e-5)
    assert float(read.mu[0].max()) <= 3 / 15 + 1e-6


def test_token_mass_under_fill_counts_the_places_read():
    """fill: a row of S = 4 tokens reads 4 centres × 2 widths = 8 places (log(4 / 8) added), a
    full row of 64 tokens all 32 (log(64 / 32))."""
    pytest.importorskip("transformers")
    from inftyformer.hf.head_read import add_token_mass

    cfg, att, state, q = _setup(density="mixture", squeeze="fill")
    state = replace(state, stored=torch.tensor([4, 64]))
    prepared = att.prepare(state, q.dtype)
    plain = att.read_heads(att.project_queries(q), state, prepared)
    shift = (add_token_mass(plain, state, prepared).log_mass - plain.log_mass).double()
    for row, want in ((0, math.log(4 / 8)), (1, math.log(64 / 32))):
        torch.testing.assert_close(shift[row], torch.full_like(shift[row], want), atol=1e-6, rtol=0)
