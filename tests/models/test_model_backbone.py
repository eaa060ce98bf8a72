"""The shared backbone and Transformer-XL: relative attention, block semantics, equivalences
between model types, per-row resets, DDP-friendly gradients, configuration."""

from __future__ import annotations

import pytest
import torch
from tiny_models import MODEL_TYPES, V, tiny

from inftyformer.native.model import MemoryLM
from inftyformer.native.model_config import ModelConfig
from inftyformer.native.relative_attention import relative_shift, sinusoidal_encoding
from inftyformer.native.state import MemoryState


def build(config: ModelConfig, seed: int = 0) -> MemoryLM:
    torch.manual_seed(seed)
    return MemoryLM(config).eval()


def run(model: MemoryLM, segments, state=None, resets=None):
    outs = []
    for i, seg in enumerate(segments):
        reset = None if resets is None else resets[i]
        out = model(seg, state, reset=reset)
        state = out.state
        outs.append(out.logits)
    return outs, state


def segments(batch: int, lengths, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (batch, n), generator=g) for n in lengths]


# ---------------------------------------------------------------- relative attention
def test_relative_shift_matches_explicit_distances():
    L, W = 5, 7
    K = W + L
    x = torch.randn(2, 3, L, K)
    shifted = relative_shift(x)
    for i in range(L):
        for j in range(W + i + 1):  # past and present keys only
            distance = W + i - j
            assert shifted[..., i, j].equal(x[..., i, K - 1 - distance])


def test_relative_attention_gradients_with_ragged_memory():
    from inftyformer.native.relative_attention import RelativeMultiHeadAttention

    torch.manual_seed(0)
    attention = RelativeMultiHeadAttention(8, 2).double()
    torch.nn.init.normal_(attention.u)
    torch.nn.init.normal_(attention.v)
    h = torch.randn(2, 4, 8, dtype=torch.float64, requires_grad=True)
    memory = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    length = torch.tensor([3, 1])
    assert torch.autograd.gradcheck(lambda a, b: attention(a, b, length)[0], (h, memory))


def test_sinusoidal_encoding_rows_are_descending_distances():
    R = sinusoidal_encoding(6, 8)
    assert R.shape == (6, 8)
    assert torch.allclose(R[-1], torch.cat([torch.zeros(4), torch.ones(4)]))  # distance 0
    assert torch.allclose(R[0, 0], torch.tensor(5.0).sin())  # distance 5, first frequency


def test_causal_within_segment_and_memory_carries_information():
    model = build(tiny("xl"))
    a, b = segments(2, [8, 8])
    first = model(a)
    changed = a.clone()
    changed[:, -1] = (changed[:, -1] + 1) % V
    other = model(changed)
    assert torch.equal(first.logits[:, :-1], other.logits[:, :-1])  # causal
    # the next segment reads the memory: changing the previous segment changes it
    assert not torch.allclose(model(b, first.state).logits, model(b, other.state).logits)


# ---------------------------------------------------------------- equivalences
@pytest.mark.parametrize("model_type", ["xl", "compressive", "infty"])
def test_memories_off_equal_vanilla_transformer(model_type):
    vanilla = build(tiny("transformer"))
    kw = dict(mem_len=0)
    if model_type == "compressive":
        kw["compressed_len"] = 0
    if model_type == "infty":
        kw["use_long_term"] = False
    model = MemoryLM(tiny(model_type, **kw)).eval()
    missing, unexpected = model.load_state_dict(vanilla.state_dict(), strict=False)
    assert not unexpected and not missing
    segs = segments(3, [8, 8, 5, 3, 8])
    expected, _ = run(vanilla, segs)
    got, _ = run(model, segs)
    for e, g in zip(expected, got, strict=True):
        assert torch.equal(e, g)


@pytest.mark.parametrize("model_type", ["xl", "compressive", "infty"])
def test_fresh_first_segment_equals_vanilla(model_type):
    """With nothing in memory yet, every memory model computes the vanilla transformer (extra
    parameters are loaded with strict=False)."""
    vanilla = build(tiny("transformer"))
    model = MemoryLM(tiny(model_type)).eval()
    missing, unexpected = model.load_state_dict(vanilla.state_dict(), strict=False)
    assert not unexpected
    assert bool(missing) == (model_type != "xl")  # the memory modules' own parameters
    tokens = segments(2, [8])[0]
    assert torch.equal(vanilla(tokens).logits, model(tokens).logits)


def test_infty_without_long_term_equals_xl():
    xl = build(tiny("xl"))
    infty = MemoryLM(tiny("infty", use_long_term=False)).eval()
    infty.load_state_dict(xl.state_dict())  # the same parameters, nothing more
    segs = segments(2, [8, 8, 8, 4, 4, 8])
    for e, g in zip(run(xl, segs)[0], run(infty, segs)[0], strict=True):
        assert torch.equal(e, g)


def test_infty_with_silent_long_term_read_equals_xl():
    """The long-term memory is updated but its read is zeroed: the short-term windows of the
    ∞-former and of XL are identical, so the outputs are too."""
    xl = build(tiny("xl"))
    infty = MemoryLM(tiny("infty")).eval()
    infty.load_state_dict(xl.state_dict(), strict=False)
    with torch.no_grad():
        for block in infty.blocks:
            block.long_term_attention.out.weight.zero_()
            block.long_term_attention.out.bias.zero_()
    segs = segments(2, [8, 8, 8, 3, 5, 8])
    expected, _ = run(xl, segs)
    got, state = run(infty, segs)
    assert not bool(state.layers[0].long_term.empty.any())  # it really was written
    for e, g in zip(expected, got, strict=True):
        assert torch.equal(e, g)


def test_xl_forgets_beyond_its_receptive_field():
    """2 layers × m = 8: what came 3 segments ago cannot reach XL."""
    model = build(tiny("xl"))
    segs = segments(2, [8, 8, 8, 8])
    changed = [segs[0].flip(-1)] + segs[1:]
    assert torch.equal(run(model, segs)[0][-1], run(model, changed)[0][-1])
    assert not torch.equal(run(model, segs)[0][2], run(model, changed)[0][2])


# ---------------------------------------------------------------- per-row reset
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_reset_row_behaves_like_fresh_stream(model_type):
    model = build(tiny(model_type))
    lengths = [8, 5, 8, 3, 8, 8, 2, 8]
    segs = segments(3, lengths)
    reset_at = 2
    resets = [None] * len(lengths)
    resets[reset_at] = torch.tensor([False, True, False])
    batched, _ = run(model, segs, resets=resets)
    fresh, _ = run(model, [s[1:2] for s in segs[reset_at:]])
    for b, f in zip(batched[reset_at:], fresh, strict=True):
        assert torch.allclose(b[1:2], f, atol=1e-5, rtol=1e-5)
    # the other rows did not notice
    untouched, _ = run(model, [s[[0, 2]] for s in segs])
    for b, u in zip(batched, untouched, strict=True):
        assert torch.allclose(b[[0, 2]], u, atol=1e-5, rtol=1e-5)


def test_reset_all_rows_allows_a_new_batch_size():
    model = build(tiny("xl"))
    out = model(segments(3, [8])[0])
    tokens = segments(2, [8])[0]
    with pytest.raises(ValueError, match="batch size"):
        model(tokens, out.state)
    again = model(tokens, out.state, reset=torch.ones(2, dtype=torch.bool))
    assert torch.equal(again.logits, model(tokens).logits)


# ---------------------------------------------------------------- gradients (DDP)
@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("tie", [True, False])
def test_every_parameter_gets_a_gradient_on_a_fresh_step(model_type, tie):
    model = MemoryLM(tiny(model_type, dropout=0.1, tie_embeddings=tie)).train()
    tokens = segments(2, [8])[0]
    state = None
    for _ in range(3):  # fresh step, then steps where memories fill and overflow
        model.zero_grad(set_to_none=True)
        out = model(tokens, state, targets=tokens)
        out.loss.backward()
        missing = [n for n, p in model.named_parameters() if p.grad is None]
        assert not missing, missing
        state = out.state


def test_state_is_detached_and_loss_is_finite():
    model = MemoryLM(tiny("infty")).train()
    state = None
    for tokens in segments(2, [8, 8, 8]):
        out = model(tokens, state, targets=tokens)
        assert torch.isfinite(out.loss)
        state = out.state
        for layer in state.layers:
            assert not layer.long_term.coefficients.requires_grad
            assert not layer.short_term.memory.requires_grad


def test_outputs_and_losses():
    model = build(tiny("compressive"))
    tokens = segments(2, [8])[0]
    targets = tokens.clone()
    targets[0, :3] = -100
    out = model(tokens, targets=targets)
    assert out.logits.shape == (2, 8, V)
    assert out.token_loss.shape == (2, 8)
    assert bool((out.token_loss[0, :3] == 0).all())
    assert torch.allclose(out.lm_loss, out.token_loss.sum() / 13)
    assert set(out.aux) == {"reconstruction"}
    no_targets = model(tokens)
    assert no_targets.loss is None and no_targets.token_loss is None
    all_ignored = model(tokens, targets=torch.full_like(tokens, -100))
    assert all_ignored.lm_loss.item() == 0.0


# ---------------------------------------------------------------- state container
def test_state_container():
    model = build(tiny("compressive"))
    state = model(segments(3, [8])[0]).state
    assert isinstance(state, MemoryState) and state.batch_size == 3
    assert state.layers[0].short_term.memory.shape == (3, 8, 32)
    cleared = state.reset(torch.tensor([True, False, False]))
    assert cleared.layers[1].short_term.length.tolist() == [0, 8, 8]
    assert bool((cleared.layers[1].short_term.memory[0] == 0).all())
    assert state.layers[1].short_term.length.tolist() == [8, 8, 8]  # not modified in place
    assert state.to("cpu").detach().batch_size == 3


# ---------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(
    "make, match",
    [
        (lambda m, t, s: m(t.float()), "integer"),
        (lambda m, t, s: m(t[0]), "shape"),
        (lambda m, t, s: m(t + V), "tokens must be in"),
        (lambda m, t, s: m(t - V), "tokens must be in"),
        (lambda m, t, s: m(torch.zeros(2, 9, dtype=torch.long)), "longer than segment_len"),
        (lambda m, t, s: m(t, targets=t[:, :4]), "targets must have the shape"),
        (lambda m, t, s: m(t, targets=t + V), "targets must be in"),
        (lambda m, t, s: m(t[:1], s), "batch size"),
        (lambda m, t, s: m(t, s, reset=torch.zeros(3, dtype=torch.bool)), "reset must have"),
        (lambda m, t, s: m(t, s, reset=torch.zeros(2)), "bool"),
        (lambda m, t, s: m(t, "state"), "MemoryState"),
        (lambda m, t, s: m(t, MemoryState(s.layers[:1])), "layers"),
        (lambda m, t, s: m(t, _with(s, memory=torch.zeros(2, 8, 31))), "short_term.memory"),
        (lambda m, t, s: m(t, _with(s, length=torch.full((2,), 9))), "length"),
        (lambda m, t, s: m(t, _with(s, memory=torch.full((2, 8, 32), float("nan")))), "NaN"),
    ],
)
def test_bad_inputs_raise_clear_errors(make, match):
    model = build(tiny("xl"))
    tokens = segments(2, [8])[0]
    state = model(tokens).state
    with pytest.raises(ValueError, match=match):
        make(model, tokens, state)


def _with(state: MemoryState, **changes) -> MemoryState:
    from dataclasses import replace

    layers = list(state.layers)
    layers[0] = replace(layers[0], short_term=replace(layers[0].short_term, **changes))
    return MemoryState(tuple(layers))


def test_state_of_another_model_type_is_rejected():
    xl = build(tiny("xl"))
    infty = build(tiny("infty"))
    tokens = segments(2, [8])[0]
    with pytest.raises(ValueError, match="long_term"):
        infty(tokens, xl(tokens).state)


# ---------------------------------------------------------------- config
@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(model_type="gru"), "model_type"),
        (dict(d_model=30, n_heads=4), "d_model"),
        (dict(d_model=33, n_heads=3), "even"),
        (dict(segment_len=0), "segment_len"),
        (dict(mem_len=-1), "mem_len"),
        (dict(dropout=1.0), "dropout"),
        (dict(model_type="transformer", mem_len=8), "mem_len"),
        (dict(model_type="infty", num_basis=15), "num_basis"),
        (dict(model_type="infty", tau=1.0), "tau"),
        (dict(kl_weight=-1.0), "kl_weight"),
        (dict(vocab_size=0), "vocab_size"),
    ],
)
def test_config_validation_names_the_field(kw, match):
    base = dict(vocab_size=V, d_model=32, n_heads=2, d_ff=64, segment_len=8, mem_len=8)
    base.update(kw)
    with pytest.raises(ValueError, match=match):
        ModelConfig(**base)


def test_config_presets_and_round_trip():
    small = ModelConfig.preset("cpu-small", model_type="infty")
    assert (small.n_layers, small.d_model, small.n_heads) == (3, 128, 4)
    paper = ModelConfig.preset("paper-sorting", model_type="compressive", dropout=0.0)
    assert (paper.d_model, paper.n_heads, paper.segment_len, paper.mem_len) == (300, 6, 1024, 1024)
    assert (paper.num_basis, paper.num_samples, paper.tau, paper.widths) == (
        512,
        512,
        0.75,
        (0.01, 0.05),
    )
    assert ModelConfig.preset("cpu-small", model_type="transformer").mem_len == 0
    assert ModelConfig.from_dict(paper.to_dict()) == paper
    import json

    assert ModelConfig.from_dict(json.loads(json.dumps(small.to_dict()))) == small
    with pytest.raises(ValueError, match="preset"):
        ModelConfig.preset("huge")
    with pytest.raises(ValueError, match="unknown ModelConfig fields"):
        ModelConfig.from_dict({**small.to_dict(), "colour": 1})
