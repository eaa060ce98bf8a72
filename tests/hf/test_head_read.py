"""memory_read="heads": the base's own heads read the memory and merge it by attention mass
(`inftyformer.hf.head_read`). Checked against hand computations: the recorded window mass, the
rotated query's scores against rotary attention, the merge against one softmax over window and
memory places; then the model: the base's logits with an empty memory, generation equal to
recomputation, save/load, and the settings' errors."""

import math
from dataclasses import replace

import pytest
import torch
from tiny_hf import V, memory, tiny_base, with_settings

from inftyformer.core.attention import HeadsRead
from inftyformer.hf import add_long_term_memory
from inftyformer.hf.head_read import (
    WindowMass,
    init_from_heads,
    merge_into_heads,
    read_at_places,
    recording,
    stop_recording,
    window_attention,
)

HEADS = dict(density="content", memory_read="heads", sharpness=10.0, sink_edge=0.01, window=8)


def heads_model(arch: str, seed: int = 0, **settings):
    return add_long_term_memory(tiny_base(arch, seed), **memory(**{**HEADS, **settings})).eval()


def assert_generates_as_recomputed(model, memory, prompt, steps: int, recompute=None) -> None:
    """Greedy `generate` reading `memory` writes what one call per step of `recompute` (default
    the model itself) scores, every step's logits finite."""
    greedy = dict(max_new_tokens=steps, do_sample=False, return_dict_in_generate=True)
    out = model.generate(prompt, state=memory, **greedy)
    text = prompt
    for _ in range(steps):
        logits = (recompute or model)(text, state=memory).logits[:, -1]
        assert torch.isfinite(logits).all()
        text = torch.cat([text, logits.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out.sequences, text)


def test_window_attention_records_the_log_mass_of_each_head_and_query():
    """Grouped-query heads and an additive mask with a padded row: the output is scaled dot-
    product attention's and log Z_W is logsumexp of the masked scores, computed by hand."""
    torch.manual_seed(0)
    b, H, Hkv, T, d = 2, 4, 2, 5, 8
    q, k, v = torch.randn(b, H, T, d), torch.randn(b, Hkv, T, d), torch.randn(b, Hkv, T, d)
    allowed = torch.ones(T, T).tril().bool().expand(b, 1, T, T).clone()
    allowed[1, :, :, 0] = False  # row 1: its first token is padding
    allowed[1, :, 0, 0] = True  # (a query must see something)
    mask = torch.zeros(b, 1, T, T).masked_fill(~allowed, torch.finfo(torch.float32).min)
    module = torch.nn.Module()
    mass = WindowMass({id(module)})
    token = recording(mass)
    try:
        out, _ = window_attention(module, q, k, v, mask, scaling=d**-0.5)
    finally:
        stop_recording(token)
    k_full, v_full = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    s = (q @ k_full.transpose(-1, -2)) / math.sqrt(d) + mask
    want = torch.softmax(s, -1) @ v_full  # [b, H, T, d]
    assert torch.allclose(out, want.transpose(1, 2), atol=1e-6)
    assert torch.allclose(mass.log_mass[id(module)], torch.logsumexp(s, -1), atol=1e-6)
    # a module no memory block merges into runs without recording
    plain = torch.nn.Module()
    plain.num_key_value_groups, plain.is_causal = 2, True  # what HF's attention modules carry
    other, _ = window_attention(plain, q, k, v, mask, scaling=d**-0.5)
    assert torch.allclose(other, out, atol=1e-5) and len(mass.log_mass) == 1


def test_the_memory_queries_score_like_rotary_attention_delta_tokens_back():
    """Llama: W^Q h₁ · W^K h₂ of the initialised read equals the base's rotary score of a query
    at position m and a key at m − Δ (any m), for every head, grouped-query keys included."""
    base = tiny_base("llama")
    model = heads_model("llama")
    attention = base.model.layers[1].self_attn
    layer = model.long_term[1]
    delta, H, d = 8, 4, 8
    h1, h2 = torch.randn(3, 32), torch.randn(3, 32)
    q_mem = layer.attention.query(h1).view(3, H, d)
    k_mem = layer.attention.key(h2).view(3, H, d)
    ours = (q_mem * k_mem).sum(-1)  # [3, H]
    rotary = base.model.rotary_emb
    for m in (delta, 20, 50):
        cos_q, sin_q = rotary(h1[None], torch.tensor([[m] * 3]))
        cos_k, sin_k = rotary(h2[None], torch.tensor([[m - delta] * 3]))

        def rope(x, cos, sin):  # x [3, heads, d]
            turned = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
            return x * cos[0][:, None] + turned * sin[0][:, None]

        q = rope(attention.q_proj(h1).view(3, H, d), cos_q, sin_q)
        k = rope(attention.k_proj(h2).view(3, 2, d), cos_k, sin_k).repeat_interleave(2, 1)
        assert torch.allclose(ours, (q * k).sum(-1), atol=1e-5), m


def test_a_heads_read_starts_without_a_prior_over_places_or_extra_variance():
    """w_μ and w_σ are zero, so a query's place and width come from its scores alone: σ² is the
    spread of the sharpened softmax (plus the floor's worth of extra variance)."""
    model = heads_model("llama", min_sigma_sq=1e-6)
    for layer in model.long_term:
        assert layer.attention.mu_head.weight.abs().sum() == 0
        assert layer.attention.sigma_head.weight.abs().sum() == 0
    ids = torch.randint(1, V, (2, 8), generator=torch.Generator().manual_seed(2))
    memory = model(ids, state=model(ids).state).state
    with torch.no_grad():
        read = model.long_term[0].attention
        h = torch.randn(2, 3, 32)
        heads = read(read.project_queries(h), memory.layers[0].long_term, heads=True)
        q = read.query(h).view(2, 3, 4, 8).transpose(1, 2)
        keys = read.prepare(memory.layers[0].long_term, h.dtype).keys  # [b, H, N, d] / √d
        s = q @ keys.transpose(-1, -2)
        c = read.basis.centers
        s = s.masked_fill(c < 0.01, -math.inf)
        p = torch.softmax(10.0 * s, -1)
        mu = p @ c
        var = (p * (c - mu[..., None]) ** 2).sum(-1) + 1e-6
        assert torch.allclose(heads.mu, mu, atol=1e-6)
        assert torch.allclose(heads.sigma_sq, var.clamp(min=1e-6), rtol=1e-4, atol=1e-9)


def test_the_heads_reads_gate_starts_open():
    """The CNN gate X ⊙ sigmoid(Conv1d(X)) starts at 0.99 everywhere, so the memory stores the
    states the heads would read (a random gate scales each by a random factor below one)."""
    model = heads_model("gpt2")
    for layer in model.long_term:
        gate = layer.memory.gate
        assert gate.weight.abs().sum() == 0
        assert torch.allclose(torch.sigmoid(gate.bias), torch.full_like(gate.bias, 0.99))


def test_gpt2_memory_projections_are_the_fused_attention_parts():
    base = tiny_base("gpt2")
    model = heads_model("gpt2")
    read = model.long_term[0].attention
    h = torch.randn(4, 32)
    qkv = base.transformer.h[0].attn.c_attn(h)  # [4, 3e]: q | k | v, with biases
    assert torch.allclose(read.query(h), qkv[:, :32], atol=1e-6)
    k_bias, v_bias = base.transformer.h[0].attn.c_attn.bias[32:64], qkv[:, 64:] - read.value(h)
    assert torch.allclose(read.key(h), qkv[:, 32:64] - k_bias, atol=1e-6)
    assert torch.allclose(v_bias, base.transformer.h[0].attn.c_attn.bias[64:].expand(4, -1))


def test_the_value_bias_is_each_heads_own_grouped_query_heads_included():
    """A Llama with biased projections: head h's value bias is its key/value group's, as the
    base's attention repeats it; GPT-2's is the value third of c_attn's bias."""
    from inftyformer.hf.head_read import head_projections, value_bias

    llama = tiny_base("llama", 3, num_hidden_layers=1, attention_bias=True)
    attention = llama.model.layers[0].self_attn
    torch.nn.init.normal_(attention.v_proj.bias)
    bias = value_bias(attention, 4).view(4, 8)
    kv = attention.v_proj.bias.view(2, 8)
    for h in range(4):
        assert torch.equal(bias[h], kv[h // 2])
    assert torch.equal(head_projections(attention, 4).value_bias, bias.view(-1))
    gpt2 = tiny_base("gpt2").transformer.h[0].attn
    assert torch.equal(value_bias(gpt2, 4), gpt2.c_attn.bias[64:])
    with pytest.raises(ValueError, match="no value projection"):
        value_bias(torch.nn.Linear(2, 2), 4)


def test_the_merge_is_one_softmax_over_window_and_memory_places():
    """A memory whose read is exactly one place (score s_p, value v_p) merged by mass gives the
    softmax attention over the window's tokens and that place together; W_o applied after."""
    torch.manual_seed(1)
    b, H, T, S, d = 2, 3, 4, 6, 5
    s_w, v_w = torch.randn(b, H, T, S) * 2, torch.randn(b, H, S, d)
    s_p, v_p = torch.randn(b, H, T) * 2, torch.randn(b, H, T, d)
    o_w = torch.softmax(s_w, -1) @ v_w  # [b, H, T, d]
    projection = torch.nn.Linear(H * d, 7)
    heads_in = o_w.transpose(1, 2).reshape(b, T, H * d)
    read = HeadsRead(z=v_p, log_mass=s_p, mu=s_p, sigma_sq=s_p, kl=s_p.new_zeros(()))
    merged = merge_into_heads(
        projection(heads_in), heads_in, read, torch.logsumexp(s_w, -1), projection, None
    )
    p = torch.softmax(torch.cat([s_w, s_p.unsqueeze(-1)], -1), -1)
    want = (p[..., :S] @ v_w) + p[..., S:] * v_p  # [b, H, T, d]
    assert torch.allclose(merged, projection(want.transpose(1, 2).reshape(b, T, H * d)), atol=1e-5)
    # an empty memory (log-mass −inf) leaves the output as it was
    read.log_mass = torch.full_like(s_p, -math.inf)
    same = merge_into_heads(
        projection(heads_in), heads_in, read, torch.logsumexp(s_w, -1), projection, None
    )
    assert torch.equal(same, projection(heads_in))


@torch.no_grad()
def test_with_an_empty_memory_the_logits_are_the_bases_and_a_filled_one_changes_them(arch):
    ids = torch.randint(1, V, (2, 8), generator=torch.Generator().manual_seed(3))
    model = heads_model(arch)
    want = tiny_base(arch)(ids).logits
    first = model(ids)
    assert torch.allclose(first.logits, want, atol=1e-5)
    third = model(ids, state=model(ids, state=first.state).state)
    assert (third.logits - want).abs().max() > 1e-3  # the memory holds the first segment now
    assert torch.isfinite(third.logits).all()


@pytest.mark.parametrize("density", ["content", "mixture"])
def test_every_memory_parameter_gets_a_gradient(arch, density):
    model = heads_model(arch, density=density).train()
    ids = torch.randint(1, V, (2, 8), generator=torch.Generator().manual_seed(4))
    memory = model(ids, state=model(ids).state).state
    model(ids, state=memory, labels=ids).loss.backward()
    missing = [n for n, p in model.long_term.named_parameters() if p.grad is None]
    assert missing == []
    trained = model.long_term[0].attention
    for p in (trained.query.weight, trained.key.weight, trained.value.weight):
        assert p.grad.abs().sum() > 0


@torch.no_grad()
@pytest.mark.parametrize("density", ["content", "mixture"])
def test_greedy_generation_equals_recomputation_with_the_heads_read(arch, density):
    model = heads_model(arch, density=density)
    ids = torch.randint(1, V, (2, 16), generator=torch.Generator().manual_seed(5))
    memory = model(ids[:, 8:], state=model(ids[:, :8]).state).state
    memory = model(ids[:, :8], state=memory).state  # something in the long-term memory
    prompt = torch.randint(1, V, (2, 4), generator=torch.Generator().manual_seed(6))
    assert_generates_as_recomputed(model, memory, prompt, 4, with_settings(model, segment_len=8))


@torch.no_grad()
def test_save_and_load_keep_the_heads_read(tmp_path, arch):
    from inftyformer.hf import InftyformerForCausalLM

    model = heads_model(arch)
    ids = torch.randint(1, V, (2, 8), generator=torch.Generator().manual_seed(9))
    memory = model(ids, state=model(ids).state).state
    model.save_pretrained(tmp_path)
    loaded = InftyformerForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.adapter.memory_read.kind == "heads"
    assert torch.allclose(loaded(ids, state=memory).logits, model(ids, state=memory).logits)
    base = loaded.unwrap()
    assert base.config._attn_implementation == "sdpa"


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(memory_read="heads"), "density that reads places"),
        (dict(memory_read="heads", density="content", num_heads=2), "base's 4 heads"),
        (dict(memory_read="rows"), "memory_read must be one of"),
        (dict(sharpness=10.0), "sharpness is a setting of density 'content' or 'mixture'"),
        (dict(density="content", sink_edge=0.7), "sink_edge"),
        (dict(density="content", sharpness=0.0), "sharpness"),
    ],
)
def test_settings_that_cannot_work_are_refused_by_name(settings, message):
    with pytest.raises(ValueError, match=message):
        add_long_term_memory(tiny_base("llama"), **memory(**settings))


def test_init_from_heads_refuses_an_attention_without_projections():
    model = heads_model("llama")
    with pytest.raises(ValueError, match="no query/key/value projections"):
        init_from_heads(model.long_term[0], torch.nn.Linear(2, 2), 4)


@torch.no_grad()
def test_the_pretrained_memory_squeezes_by_length_and_keeps_it_on_save(tmp_path, arch):
    """squeeze="by_length" reaches every memory layer (another signal than the fixed τ's), the
    state counts the stored tokens, and save/load keeps the setting."""
    from inftyformer.hf import InftyformerForCausalLM

    ids = torch.randint(1, V, (2, 32), generator=torch.Generator().manual_seed(3))
    settings = dict(density="mixture", tau=0.9, num_samples=64)
    fixed = heads_model(arch, squeeze="fixed", **settings)
    by_length = heads_model(arch, squeeze="by_length", **settings)
    state = by_length(ids).state
    stored = [layer.long_term.stored.tolist() for layer in state.layers]
    # 4 segments of 8: the last one waits, the one before it is the window, 2 are in memory
    assert stored == [[16, 16]] * len(state.layers)
    B_fixed = fixed(ids).state.layers[0].long_term.coefficients
    assert not torch.allclose(state.layers[0].long_term.coefficients, B_fixed, atol=1e-3)
    by_length.save_pretrained(tmp_path)
    loaded = InftyformerForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.adapter.long_term.squeeze.kind == "by_length"
    # the layers share their design matrices (one per τ, not one per layer and τ)
    assert len({id(layer.memory.ridge._cache) for layer in by_length.long_term}) == 1
    assert torch.allclose(loaded(ids, state=state).logits, by_length(ids, state=state).logits)


@torch.no_grad()
@pytest.mark.parametrize("keep", ["keep_first", "keep_last"])
def test_the_pretrained_fill_memory_keeps_its_first_tokens_and_the_setting_on_save(
    tmp_path, arch, keep
):
    """keep_first (keep_last) reaches every memory layer: past K = 8 stored tokens the first
    (most recent) ones stay on their centres (another signal than without), and save/load keeps
    the setting."""
    from inftyformer.hf import InftyformerForCausalLM

    ids = torch.randint(1, V, (2, 48), generator=torch.Generator().manual_seed(3))
    settings = dict(density="mixture", squeeze="fill", num_basis=8, widths=(0.01,))
    merged = heads_model(arch, **settings)
    kept = heads_model(arch, **{keep: 2}, **settings)
    state = kept(ids).state
    assert {getattr(layer.memory.config, keep) for layer in kept.long_term} == {2}
    assert state.layers[0].long_term.stored.tolist() == [32, 32]  # 4 segments, past K = 8
    B_merged = merged(ids).state.layers[0].long_term.coefficients
    assert not torch.allclose(state.layers[0].long_term.coefficients, B_merged, atol=1e-3)
    kept.save_pretrained(tmp_path)
    loaded = InftyformerForCausalLM.from_pretrained(tmp_path).eval()
    assert getattr(loaded.config.adapter, keep) == 2
    assert torch.allclose(loaded(ids, state=state).logits, kept(ids, state=state).logits)


# ---------------------------------------------------------------------- places at their positions
PLACES = dict(
    density="mixture", squeeze="fill", num_basis=32, widths=(0.004,),
    ridge_lambda=1e-6, edge_padding=False, conv_gate=False, sharpness=1.0, sink_edge=0.0,
    memory_layers=[0],
)  # fmt: skip


def block0_attention(model, base, ids, **call):
    """The output of block 0's attention (after the memory's merge, if any) for `ids`."""
    seen = []
    handle = base.model.layers[0].self_attn.o_proj.register_forward_hook(
        lambda module, args, out: seen.append(out)
    )
    try:
        model(ids, **call)
    finally:
        handle.remove()
    return seen[-1]


@torch.no_grad()
@pytest.mark.parametrize("window", [8, 0])
def test_with_places_at_their_positions_the_memory_reads_like_the_full_context(window):
    """Block 0 of a Llama reads a memory of the tokens that left its window (one place each) at
    their stream positions: its attention output equals the base's attention over the whole
    text, window and memory as one softmax, up to the signal's fit. Read at one distance
    (memory_positions="window") it does not."""
    ids = torch.randint(1, V, (2, 40), generator=torch.Generator().manual_seed(11))
    base = tiny_base("llama")
    want = block0_attention(base, base, ids)[:, 32:]  # [2, 8, e]
    errors = {}
    for positions in ("places", "window"):
        model = heads_model("llama", memory_positions=positions, window=window, **PLACES)
        state = model(ids[:, :32]).state  # the window, and 8 tokens waiting for the memory
        assert state.layers[0].long_term.stored.tolist() == [24 - window] * 2
        got = block0_attention(model, model.base, ids[:, 32:], state=state)[:, window:]
        errors[positions] = (got - want).abs().max() / want.abs().max()
    assert errors["places"] < 1e-5
    assert errors["window"] > 1e-3


@torch.no_grad()
def test_with_two_widths_each_basis_function_sits_at_its_centres_place():
    """N = 2 widths × 32 centres: both basis functions on a centre are read at that centre's
    stream position, so the read is the one-width read with every place counted twice (the
    same z, log-mass + log 2)."""
    from inftyformer.core.attention import record_reads

    ids = torch.randint(1, V, (2, 40), generator=torch.Generator().manual_seed(11))
    reads = {}
    for name, extra in (("one", {}), ("two", {"num_basis": 64, "widths": (0.004, 0.002)})):
        model = heads_model("llama", memory_positions="places", **{**PLACES, **extra})
        state = model(ids[:, :32]).state
        with record_reads(model) as recorded:
            model(ids[:, 32:], state=state)
        reads[name] = recorded[0][-1]
    one, two = reads["one"], reads["two"]
    assert torch.allclose(two.z, one.z, atol=1e-6)
    assert torch.allclose(two.log_mass, one.log_mass + math.log(2), atol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("positions,keep_last", [("places", 0), ("places", 5), ("ranks", 5)])
def test_greedy_generation_equals_recomputation_with_places_past_the_bases_positions(
    positions, keep_last
):
    """96 tokens through 16 places (merged, the first 2 kept, and the last 5): the memory reaches
    further back than the base's 64 positions, and the read at place positions (or ranks)
    generates what one call per step recomputes."""
    model = heads_model("llama", memory_positions=positions, keep_first=2, keep_last=keep_last,
                        **{**PLACES, "num_basis": 16})  # fmt: skip
    ids = torch.randint(1, V, (2, 96), generator=torch.Generator().manual_seed(12))
    memory = model(ids).state
    assert memory.layers[0].long_term.stored.tolist() == [80, 80]
    prompt = torch.randint(1, V, (2, 4), generator=torch.Generator().manual_seed(13))
    assert_generates_as_recomputed(model, memory, prompt, 4)


@torch.no_grad()
def test_read_at_ranks_is_the_read_at_places_until_the_memory_merges_then_ignores_how_far_back():
    """memory_positions="ranks": with one token per place (16 tokens in 32 places) the logits are
    those of "places"; once the places merge (80 tokens in 16) a block's read depends on what
    the places hold, not on how many tokens they stand for: the same places said to stand for
    500 more tokens read the same (at "places" they are read further back, and differently)."""
    ids = torch.randint(1, V, (2, 40), generator=torch.Generator().manual_seed(16))
    logits = {}
    for positions in ("places", "ranks"):
        model = heads_model("llama", memory_positions=positions, **PLACES)
        state = model(ids[:, :32]).state
        assert state.layers[0].long_term.stored.tolist() == [16, 16]
        logits[positions] = model(ids[:, 32:], state=state).logits
    assert torch.equal(logits["ranks"], logits["places"])

    merged = {**PLACES, "num_basis": 16, "keep_first": 2}
    model = heads_model("llama", memory_positions="ranks", **merged)
    ids = torch.randint(1, V, (2, 96), generator=torch.Generator().manual_seed(17))
    memory = model(ids).state.layers[0].long_term
    assert memory.stored.tolist() == [80, 80]
    further = replace(memory, stored=memory.stored + 500)
    h = torch.randn(
        2, 8, model.base.config.hidden_size, generator=torch.Generator().manual_seed(18)
    )
    at = torch.arange(8).expand(2, -1)  # the queries' position ids
    rotary, limit = model.adapter.rotary_embedding(model.base), 64
    att = model.long_term[0].attention
    for ranks in (True, False):
        here, there = (
            read_at_places(
                att, att.project_queries(h), s, att.prepare(s, h.dtype), at, rotary, limit, ranks
            )
            for s in (memory, further)
        )
        if ranks:
            assert torch.equal(here.z, there.z) and torch.equal(here.log_mass, there.log_mass)
        else:
            assert (here.z - there.z).abs().max() > 1e-4


def test_places_need_a_heads_read_of_a_fill_memory_on_rotary_positions():
    with pytest.raises(ValueError, match="memory_positions must be one of"):
        heads_model("llama", memory_positions="stream", **PLACES)
    with pytest.raises(ValueError, match="squeeze='fill'"):
        heads_model("llama", memory_positions="places", **{**PLACES, "squeeze": "by_length"})
    with pytest.raises(ValueError, match="absolute ones"):
        heads_model("gpt2", memory_positions="places", **PLACES)
    with pytest.raises(ValueError, match="'ranks' turns the read by rotary positions"):
        heads_model("gpt2", memory_positions="ranks", **PLACES)
    with pytest.raises(ValueError, match="memory_positions='ranks' needs places that know"):
        heads_model("llama", memory_positions="ranks", **{**PLACES, "squeeze": "by_length"})
    with pytest.raises(ValueError, match="a setting of memory_read 'heads'"):
        settings = {**memory(**PLACES), "memory_read": "added", "memory_positions": "places"}
        add_long_term_memory(tiny_base("llama"), **settings)


@torch.no_grad()
@pytest.mark.parametrize("positions", ["places", "ranks"])
def test_the_place_positions_setting_survives_save_and_load(tmp_path, positions):
    from inftyformer.hf import InftyformerForCausalLM

    model = heads_model("llama", memory_positions=positions, **PLACES)
    ids = torch.randint(1, V, (2, 32), generator=torch.Generator().manual_seed(14))
    state = model(ids).state
    model.save_pretrained(tmp_path)
    loaded = InftyformerForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.adapter.positions == positions
    assert torch.allclose(loaded(ids, state=state).logits, model(ids, state=state).logits)


def test_the_run_config_takes_place_positions_to_the_model(tmp_path):
    """The training command's config carries memory_positions (keep_last, keep_salient) to the
    model it builds, through to_dict/from_dict, and refuses it without a fill memory."""
    from tiny_pretrained import write_tiny_model

    from inftyformer.model_kinds import PretrainedMemoryConfig, build_model

    path = str(write_tiny_model(tmp_path / "llama", "llama", max_positions=64))
    settings = dict(base_model=path, segment_len=8, window=8, memory_read="heads",
                    memory_positions="places", **{**PLACES, "memory_layers": (0,)})  # fmt: skip
    config = PretrainedMemoryConfig(**settings, keep_last=3, keep_salient=2)
    assert PretrainedMemoryConfig.from_dict(config.to_dict()) == config
    lm = build_model(config).lm
    assert lm.config.adapter.positions == "places"
    assert [layer.memory.config.keep_last for layer in lm.long_term] == [3]
    assert [layer.memory.config.keep_salient for layer in lm.long_term] == [2]
    with pytest.raises(ValueError, match="squeeze='fill'"):
        PretrainedMemoryConfig(**{**settings, "squeeze": "by_length"})


@torch.no_grad()
@pytest.mark.parametrize(
    "kept", [{}, {"keep_first": 2, "keep_last": 5}, {"keep_first": 2, "keep_salient": 3}]
)
def test_rows_at_different_stream_positions_read_as_if_alone(kept):
    """Row 0 starts a new document at segment 3 (reset), row 1 goes on: each row's places and
    queries sit at its own stream positions (with keep_last: row 0 filling again while row 1
    merges into its kept tail), so the batch gives each row's logits alone."""
    places = {**PLACES, "num_basis": 16, **kept}
    model = heads_model("llama", memory_positions="places", **places)
    ids = torch.randint(1, V, (2, 48), generator=torch.Generator().manual_seed(15))

    def run(rows, reset_at=None):
        state, logits = None, []
        for k, a in enumerate(range(0, 48, 8)):
            reset = None if reset_at is None else torch.tensor(reset_at) & (k == 3)
            out = model(ids[rows, a : a + 8], state=state, reset=reset)
            state = out.state
            logits.append(out.logits)
        return torch.cat(logits, 1)

    both = run([0, 1], reset_at=[True, False])
    assert torch.allclose(both[1:], run([1]), atol=1e-5)
    alone = run([0], reset_at=[True])
    assert torch.allclose(both[:1], alone, atol=1e-5)
    assert (alone[:, 24:] - run([0])[:, 24:]).abs().max() > 1e-3  # the reset mattered


# ---------------------------------------------------------------------- salient places
SALIENT = dict(PLACES, num_basis=16, keep_first=2, keep_salient=3, window=8)


def test_a_salience_looking_past_the_window_is_refused():
    settings = {**memory(**SALIENT), "memory_read": "added"}  # window 8
    with pytest.raises(ValueError, match="salient_before .* at most the window"):
        add_long_term_memory(tiny_base("llama"), **settings, salient_before=9)
    add_long_term_memory(tiny_base("llama"), **settings, salient_before=8)  # the window: fine


@torch.no_grad()
@pytest.mark.parametrize("arch,before", [("llama", 0), ("gpt2", 0), ("llama", 5)])
def test_the_salience_of_a_stored_token_is_from_the_bases_own_surprisal(arch, before):
    """With the paper's read (zero at initialisation) the model's logits are the base's with
    the window; the salience each whole place records is `salience` of the base's surprisal
    over the stream, block by block with the 8 tokens before it: the first token of a block
    scored by the window's last position, carried over calls with the window (salient_before:
    looking ahead at the next call's tokens too, while the token is in the window)."""
    from inftyformer.extensions.places import TOKENS, record_positions, salience

    settings = {**SALIENT, "memory_read": "added", "salient_before": before}
    if arch == "gpt2":
        settings.pop("memory_positions", None)
    model = add_long_term_memory(tiny_base(arch), **memory(**settings)).eval()
    ids = torch.randint(1, V, (2, 64), generator=torch.Generator().manual_seed(3))
    state = None
    for a in range(0, 64, 8):
        state = model(ids[:, a : a + 8], state=state).state
    want = torch.zeros(2, 64, dtype=torch.float64)
    for a in range(8, 64, 8):  # the first block has nothing before it: its first token 0
        logp = torch.log_softmax(model.base(ids[:, a - 8 : a + 8]).logits.double(), -1)
        want[:, a : a + 8] = -logp[:, 7:-1].gather(2, ids[:, a : a + 8, None])[..., 0]
    logp = torch.log_softmax(model.base(ids[:, :8]).logits.double(), -1)
    want[:, 1:8] = -logp[:, :-1].gather(2, ids[:, 1:8, None])[..., 0]
    want = salience(want, before=before)
    lt = state.layers[0].long_term
    assert lt.stored.tolist() == [48, 48]
    places = lt.records["places"]
    for row in range(2):
        whole = places[row, :, TOKENS] == 1
        at = record_positions(places)[row, whole].long()
        assert len(at) == 2 + 3  # the first 2 and the 3 most salient
        assert torch.allclose(places[row, whole, 3], want[row, at], atol=1e-4)
        top = want[row, 2:48].topk(3).values  # (bursts make ties: compare the values)
        assert torch.allclose(want[row, at[2:]].sort().values, top.sort().values)
    waiting = state.salience  # the window's 8 tokens that left it, waiting
    assert torch.allclose(waiting, want[:, 48:56], atol=1e-4)


@torch.no_grad()
def test_salient_places_survive_save_load_and_generate_like_recomputation(tmp_path):
    from inftyformer import load_state, save_state

    model = heads_model("llama", memory_positions="places", **SALIENT)
    ids = torch.randint(1, V, (2, 64), generator=torch.Generator().manual_seed(4))
    memory = model(ids).state
    save_state(tmp_path / "memory.safetensors", memory)
    loaded = load_state(tmp_path / "memory.safetensors")
    places = memory.layers[0].long_term.records["places"]
    assert torch.equal(loaded.layers[0].long_term.records["places"], places)
    assert torch.equal(loaded.salience, memory.salience)
    assert torch.equal(loaded.window.surprisal, memory.window.surprisal)
    nxt = ids[:, :8]
    assert torch.equal(model(nxt, state=loaded).logits, model(nxt, state=memory).logits)
    prompt = torch.randint(1, V, (2, 4), generator=torch.Generator().manual_seed(5))
    assert_generates_as_recomputed(model, memory, prompt, 3)
