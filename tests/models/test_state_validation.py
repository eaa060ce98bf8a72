"""No silent wrong results: every argument and state field of the wrong dtype, shape, range or
provenance is a TypeError/ValueError naming the field and what was expected, raised before any
computation (the math functions, the long-term memory and attention, and MemoryLM's state)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from tiny_models import MODEL_TYPES, V, tiny

from inftyformer import (
    GaussianBasis,
    LongTermAttention,
    LongTermConfig,
    LongTermMemory,
    MemoryLM,
    continuous_softmax,
    variance_kl,
)
from inftyformer.core.ridge import (
    RidgeRegression,
    evaluate_signal,
    fit_coefficients,
    ridge_design_matrix,
    segment_positions,
)
from inftyformer.native.model_config import ModelConfig
from inftyformer.native.state import MemoryState

BASIS = GaussianBasis(8, widths=(0.05, 0.1))


# ---------------------------------------------------------------- the math functions
@pytest.mark.parametrize(
    "mu, sigma_sq, error, match",
    [
        (torch.tensor([0, 1]), torch.tensor([0.1, 0.1]), TypeError, "mu must be a floating"),
        (torch.tensor([0.5]), torch.tensor([1]), TypeError, "sigma_sq must be a floating"),
        (torch.tensor([0.5]), torch.tensor([True]), TypeError, "sigma_sq must be a floating"),
        (torch.tensor([0.5]), torch.tensor([-0.1]), ValueError, "sigma_sq must be positive"),
        (torch.tensor([0.5]), torch.tensor([0.0]), ValueError, "sigma_sq must be positive"),
        (torch.tensor([0.5]), torch.tensor([math.inf]), ValueError, "sigma_sq must be positive"),
        (torch.tensor([math.nan]), torch.tensor([0.1]), ValueError, "mu contains NaN"),
        (torch.tensor([0.5]), torch.tensor([math.nan]), ValueError, "sigma_sq must be positive"),
    ],
)
def test_continuous_softmax_refuses_wrong_dtypes_and_values(mu, sigma_sq, error, match):
    with pytest.raises(error, match=match):
        continuous_softmax(mu, sigma_sq, BASIS)


def test_continuous_softmax_in_float64_matches_the_closed_form():
    """Regression: integer μ used to cast the basis to integers; now the dtype is refused and a
    float64 μ gives the float64 closed form."""
    mu = torch.tensor([0.3], dtype=torch.float64)
    out = continuous_softmax(mu, torch.tensor([0.01], dtype=torch.float64), BASIS)
    assert out.dtype == torch.float64
    c, w = BASIS.centers[1].double(), BASIS.widths[1].double()
    var = 0.01 + w**2
    hand = torch.exp(-((0.3 - c) ** 2) / (2 * var)) / torch.sqrt(2 * math.pi * var)
    assert out[0, 1].item() == pytest.approx(hand.item(), rel=1e-12)


def test_variance_kl_and_basis_refuse_bad_input():
    with pytest.raises(TypeError, match="sigma_sq must be a floating"):
        variance_kl(torch.tensor([1]), 0.05)
    with pytest.raises(ValueError, match="sigma_sq must be positive"):
        variance_kl(torch.tensor([-1.0]), 0.05)
    with pytest.raises(ValueError, match="sigma_0"):
        variance_kl(torch.tensor([1.0]), 0.0)
    with pytest.raises(ValueError, match="sigma_0"):
        variance_kl(torch.tensor([1.0]), math.nan)
    with pytest.raises(TypeError, match="t must be a floating"):
        BASIS(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="t contains NaN"):
        BASIS(torch.tensor([math.nan]))


def test_ridge_functions_refuse_bad_input():
    with pytest.raises(TypeError, match="positions must be a floating"):
        ridge_design_matrix(BASIS, torch.arange(4), 1.0)
    with pytest.raises(ValueError, match="positions contains NaN"):
        ridge_design_matrix(BASIS, torch.tensor([0.1, math.nan]), 1.0)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="ridge_lambda"):
            ridge_design_matrix(BASIS, segment_positions(4), bad)
        with pytest.raises(ValueError, match="ridge_lambda"):
            RidgeRegression(BASIS, bad)
    with pytest.raises(TypeError, match="basis"):
        ridge_design_matrix("not a basis", segment_positions(4), 1.0)
    G = ridge_design_matrix(BASIS, segment_positions(4), 1.0)
    with pytest.raises(ValueError, match="G must have shape"):
        fit_coefficients(torch.randn(2, 5, 3), G)
    with pytest.raises(TypeError, match="x must be a floating"):
        fit_coefficients(torch.ones(2, 4, 3, dtype=torch.long), G)
    with pytest.raises(ValueError, match="x contains NaN"):
        fit_coefficients(torch.full((2, 4, 3), math.nan), G)
    B = fit_coefficients(torch.randn(2, 4, 3), G.float())
    with pytest.raises(ValueError, match="B must have shape"):
        evaluate_signal(B[:, :5], BASIS, torch.rand(3))
    with pytest.raises(TypeError, match="t must be a floating"):
        evaluate_signal(B, BASIS, torch.arange(3))
    with pytest.raises(ValueError, match="t must have shape"):
        evaluate_signal(B, BASIS, torch.rand(5, 3))


@pytest.mark.parametrize(
    "field, value", [("ridge_lambda", 0.0), ("kl_weight", math.inf), ("kl_weight", math.nan)]
)
def test_configs_refuse_degenerate_numbers(field, value):
    with pytest.raises(ValueError, match=field):
        tiny("infty", **{field: value})
    if field == "ridge_lambda":
        with pytest.raises(ValueError, match=field):
            LongTermConfig(dim=8, num_heads=2, ridge_lambda=value)


# ---------------------------------------------------------------- long-term memory and attention
def long_term(sticky: bool = True, **overrides):
    config = LongTermConfig(dim=8, num_heads=2, num_basis=16, sticky=sticky, sticky_bins=4,
                            num_samples=8, **overrides)  # fmt: skip
    memory, attention = LongTermMemory(config), LongTermAttention(config)
    state = memory.update(memory.init_state(2), torch.randn(2, 5, 8)).detach()
    return memory, attention, state


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("empty", lambda s: s.empty.to(torch.uint8), "empty must have dtype torch.bool"),
        ("coefficients", lambda s: s.coefficients.double(), "coefficients must have dtype"),
        ("coefficients", lambda s: s.coefficients.long(), "coefficients must be a floating"),
        (
            "attention_mass",
            lambda s: s.attention_mass.double(),
            "attention_mass must have the dtype",
        ),
        ("observed", lambda s: s.observed.long(), "observed must have the dtype"),
    ],
)
def test_long_term_state_of_the_wrong_dtype_is_refused(field, value, match):
    memory, attention, state = long_term()
    bad = replace(state, **{field: value(state)})
    with pytest.raises(TypeError, match=match):
        memory.update(bad, torch.randn(2, 5, 8))
    if field != "coefficients" or "floating" in match:
        with pytest.raises(TypeError, match=match):
            attention.attend(torch.randn(2, 3, 8), bad)


@pytest.mark.parametrize(
    "mass", [torch.zeros(2, 4), torch.tensor([[0.5, 0.5, 0.5, -0.5]] * 2), torch.ones(2, 4)]
)
@pytest.mark.parametrize("training", [True, False])
def test_sticky_sampling_refuses_a_histogram_that_is_not_one(mass, training):
    """Training used to fail inside torch.multinomial, evaluation to accept it silently."""
    memory, _, state = long_term()
    memory.train(training)
    bad = replace(state, attention_mass=mass)
    with pytest.raises(ValueError, match="attention_mass must be a histogram"):
        memory.update(bad, torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match="attention_mass must be a histogram"):
        memory.sample_positions(bad)
    with pytest.raises(ValueError, match="observed must be finite and >= 0"):
        memory.update(replace(state, observed=torch.tensor([-1.0, 0.0])), torch.randn(2, 5, 8))


def test_attention_refuses_zero_queries_and_bad_query_dtypes():
    _, attention, state = long_term()
    with pytest.raises(ValueError, match="at least one query"):
        attention.attend(torch.randn(2, 0, 8), state)
    with pytest.raises(TypeError, match="query must have dtype torch.float32"):
        attention.attend(torch.randn(2, 3, 8, dtype=torch.float64), state)
    with pytest.raises(TypeError, match="query must have dtype"):
        attention.attend(torch.ones(2, 3, 8, dtype=torch.long), state)
    with pytest.raises(ValueError, match="state.coefficients contains NaN"):
        attention.attend(
            torch.randn(2, 3, 8), replace(state, coefficients=state.coefficients * math.nan)
        )


def test_observe_and_update_refuse_bad_arguments():
    memory, _, state = long_term()
    mu, sigma_sq = torch.rand(2, 2, 3), torch.full((2, 2, 3), 0.01)
    with pytest.raises(ValueError, match="sigma_sq must be positive"):
        memory.observe(state, mu, -sigma_sq)
    with pytest.raises(ValueError, match="mu contains NaN"):
        memory.observe(state, mu * math.nan, sigma_sq)
    with pytest.raises(ValueError, match="sigma_sq must have shape"):
        memory.observe(state, mu, sigma_sq[:, :1])
    with pytest.raises(TypeError, match="x must be a floating"):
        memory.update(state, torch.ones(2, 5, 8, dtype=torch.long))
    with pytest.raises(TypeError, match="generator"):
        memory.update(state, torch.randn(2, 5, 8), generator=0)


# ---------------------------------------------------------------- MemoryLM states
def filled_state(model: MemoryLM, calls: int = 3) -> MemoryState:
    g = torch.Generator().manual_seed(0)
    state = None
    for _ in range(calls):
        state = model(torch.randint(0, V, (2, 8), generator=g), state).state
    return state


def with_field(state: MemoryState, layer: int, part: str, field: str, value) -> MemoryState:
    layers = list(state.layers)
    sub = replace(getattr(layers[layer], part), **{field: value})
    layers[layer] = replace(layers[layer], **{part: sub})
    return MemoryState(tuple(layers))


@pytest.mark.parametrize(
    "model_type, part, field, make, error, match",
    [
        ("infty", "long_term", "empty", lambda t: t.to(torch.uint8), TypeError, "torch.bool"),
        ("infty", "long_term", "coefficients", lambda t: t.double(), TypeError, "torch.float32"),
        ("infty", "long_term", "coefficients", lambda t: t.long(), TypeError, "floating"),
        ("xl", "short_term", "memory", lambda t: t.double(), TypeError, "torch.float32"),
        ("xl", "short_term", "memory", lambda t: t.long(), TypeError, "floating"),
        ("xl", "short_term", "length", lambda t: t.int(), TypeError, "torch.int64"),
        ("xl", "short_term", "length", lambda t: t + 100, ValueError, "must be in"),
        ("compressive", "compressed", "memory", lambda t: t.half(), TypeError, "torch.float32"),
        ("infty", "long_term", "attention_mass", lambda t: t * 0, ValueError, "histogram"),
        ("infty", "short_term", "memory", lambda t: t * math.nan, ValueError, "NaN"),
        ("compressive", "short_term", "memory", lambda t: t + 1e30, ValueError, "beyond"),
        ("infty", "long_term", "coefficients", lambda t: t - 1e20, ValueError, "beyond"),
    ],
)
def test_memory_lm_refuses_state_fields_of_the_wrong_dtype_or_range(
    model_type, part, field, make, error, match
):
    """E.g. a uint8 `empty` mask used to give other logits with no error (~mask is not a logical
    not on uint8), and float64/int64 memories failed deep inside torch."""
    model = MemoryLM(tiny(model_type, sticky=model_type == "infty")).eval()
    state = filled_state(model)
    bad = with_field(state, 1, part, field, make(getattr(getattr(state.layers[1], part), field)))
    tokens = torch.randint(0, V, (2, 8))
    with pytest.raises(error, match=rf"state\.layers\[1\]\.{part}\.{field}.*{match}"):
        model(tokens, bad)


@pytest.mark.parametrize(
    "source, target",
    [
        (dict(model_type="xl"), dict(model_type="transformer")),
        (dict(model_type="xl", mem_len=16), dict(model_type="xl", mem_len=8)),
        (dict(model_type="infty"), dict(model_type="infty", use_long_term=False)),
    ],
)
def test_a_state_holding_more_memory_than_the_model_keeps_is_refused(source, target):
    """Provenance: an XL state (m = 8 states) given to a transformer without memory used to be
    attended over. A state holding more short-term memory than the model keeps between calls
    comes from another model. (A state within the bound cannot be told apart from one of the
    model's own: a transformer also keeps the earlier tokens of an unfinished block.)"""
    torch.manual_seed(0)
    state = filled_state(MemoryLM(tiny(**source)).eval(), calls=4)
    model = MemoryLM(tiny(**target)).eval()
    tokens = torch.randint(0, V, (2, 4))
    with pytest.raises(ValueError, match="more than the .* a state of this model can hold|absent"):
        model(tokens, state)


def test_compressed_and_long_term_parts_must_match_the_model_type():
    infty_state = filled_state(MemoryLM(tiny("infty")).eval())
    with pytest.raises(ValueError, match="long_term must be absent"):
        MemoryLM(tiny("xl", mem_len=24)).eval()(torch.zeros(2, 4, dtype=torch.long), infty_state)
    no_long_term = MemoryLM(tiny("infty", use_long_term=False, mem_len=24)).eval()
    with pytest.raises(ValueError, match="use_long_term=False"):
        no_long_term(torch.zeros(2, 4, dtype=torch.long), infty_state)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_the_models_own_states_always_pass(model_type):
    """The bounds are not too tight: uneven calls and per-row resets (the fuzz tests draw many
    more such streams)."""
    model = MemoryLM(tiny(model_type, compression_rate=3, compressed_len=6)).eval()
    g = torch.Generator().manual_seed(1)
    state = None
    for n, reset in [(8, None), (3, [True, False]), (8, None), (5, None), (1, [False, True])] * 3:
        reset = None if reset is None else torch.tensor(reset)
        state = model(torch.randint(0, V, (2, n), generator=g), state, reset=reset).state
        model.check_state(state)
        assert state.layers[0].short_term.memory.shape[1] <= model.config.max_short_term_len


def test_a_model_in_float64_takes_float64_states():
    model = MemoryLM(tiny("infty")).double().eval()
    state = filled_state(model)
    assert state.layers[0].long_term.coefficients.dtype == torch.float64
    float32 = MemoryLM(tiny("infty")).eval()
    with pytest.raises(TypeError, match="must have dtype torch.float32, got torch.float64"):
        float32(torch.zeros(2, 4, dtype=torch.long), state)


def test_config_bound_follows_the_block_semantics():
    c = ModelConfig(vocab_size=V, model_type="xl", segment_len=8, mem_len=16)
    assert c.max_short_term_len == 16 + 8 - 1
    assert c.replace(model_type="infty").max_short_term_len == 16 + 2 * 8 - 1
    assert c.replace(model_type="compressive", compression_rate=3).max_short_term_len == 16 + 7 + 2
    assert c.replace(model_type="transformer", mem_len=0).max_short_term_len == 7


@pytest.mark.parametrize("model_type", ["infty", "xl"])
def test_a_model_on_the_meta_device_is_refused_clearly(model_type):
    model = MemoryLM(tiny(model_type)).to("meta")
    for device in ("cpu", "meta"):
        with pytest.raises(ValueError, match="meta device: its parameters hold no data"):
            model(torch.zeros(1, 8, dtype=torch.long, device=device))


def test_a_pretrained_memory_model_on_the_meta_device_is_refused_clearly():
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel

    from inftyformer.hf import add_long_term_memory

    base = GPT2LMHeadModel(
        GPT2Config(vocab_size=61, n_embd=32, n_layer=1, n_head=2, n_positions=64)
    )
    model = add_long_term_memory(base, num_basis=16, num_samples=16, segment_len=8).to("meta")
    with pytest.raises(ValueError, match="meta device"):
        model(torch.zeros(1, 8, dtype=torch.long))


def test_a_native_state_records_its_memory_and_another_memory_refuses_it():
    """The native model's states record their memory too (`state_record.py`): a squeeze="fill"
    memory's state is refused by a fixed-squeeze model of the same shapes, naming the setting."""
    from inftyformer.native.state_record import memory_record

    torch.manual_seed(0)
    tokens = torch.randint(0, 13, (2, 8), generator=torch.Generator().manual_seed(1))
    fill = MemoryLM(tiny("infty", squeeze="fill", density="mixture")).eval()
    fixed = MemoryLM(tiny("infty")).eval()
    with torch.no_grad():
        state = fill(tokens, state=fill(tokens).state).state
        assert state.memory == memory_record(fill.config.to_dict()) == fill.state_record
        with pytest.raises(ValueError, match="squeeze: 'fill' -> 'fixed'"):
            fixed(tokens, state=state)
        fill(tokens, state=state)
