"""Fuzzing the long-term memory (update, observe, sample_positions) and the continuous attention:
fuzzed inputs and fuzzed states (each field given another dtype, shape, device, type, poison or
range, or a valid other value)."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from fuzzing import ALL_DTYPES, FAST, MANY, accepted, expect_error, finite, is_floating, tensors
from hypothesis import given
from hypothesis import strategies as st

from inftyformer import LongTermAttention, LongTermConfig, LongTermMemory, LongTermState

BATCH, DIM, HEADS, N, BINS = 3, 8, 2, 8, 4


@functools.cache
def modules(sticky: bool, gate: bool, training: bool):
    torch.manual_seed(0)
    config = LongTermConfig(dim=DIM, num_heads=HEADS, num_basis=N, widths=(0.05, 0.2),
                            num_samples=6, sticky=sticky, sticky_bins=BINS,
                            conv_gate=gate)  # fmt: skip
    memory, attention = LongTermMemory(config), LongTermAttention(config)
    memory.train(training)
    # a state with two filled rows (one of them attended to, for sticky) and one empty row
    state = memory.update(memory.init_state(BATCH), torch.randn(BATCH, 5, DIM)).detach()
    state = memory.reset(state, torch.tensor([False, False, True]))
    mu, sigma_sq = torch.rand(BATCH, HEADS, 4), torch.full((BATCH, HEADS, 4), 0.01)
    state = memory.observe(state, mu, sigma_sq)
    return memory, attention, state


settings_of_modules = st.tuples(st.booleans(), st.booleans(), st.booleans())
FIELDS = ("coefficients", "attention_mass", "observed", "empty")
KINDS = ("valid", "valid", "dtype", "shape", "poison", "range", "device", "type")


@st.composite
def mutated_states(draw, state: LongTermState):
    """(state or an error raised while building it, the field changed or None, valid?)."""
    if draw(st.booleans()):
        return state, None, True  # half of the draws: the state as it is
    kind = draw(st.sampled_from(KINDS))
    name = draw(st.sampled_from(FIELDS))
    old = getattr(state, name)
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    valid = False
    if kind == "valid":  # another legitimate value of the field
        valid = True
        if name == "coefficients":
            new = torch.randn(old.shape, generator=g) * draw(st.sampled_from([0.0, 1.0, 100.0]))
        elif name == "attention_mass":
            new = torch.rand(old.shape, generator=g) + 1e-3
            new = new / new.sum(-1, keepdim=True)
        elif name == "observed":
            new = torch.randint(0, 1000, old.shape, generator=g).float()
        else:
            new = torch.rand(old.shape, generator=g) < 0.5
    elif kind == "dtype":
        new = old.to(draw(st.sampled_from([d for d in ALL_DTYPES if d != old.dtype])))
    elif kind == "shape":
        shape = list(old.shape)
        how = draw(st.sampled_from(["batch", "last", "extra", "drop"]))
        if how == "batch":
            shape[0] += draw(st.sampled_from([-1, 1]))
        elif how == "last" and len(shape) > 1:
            shape[-1] += 1
        elif how == "extra" or len(shape) == 1:
            shape.append(1)
        else:
            shape.pop()
        new = torch.zeros(shape, dtype=old.dtype)
    elif kind == "poison":
        if not old.is_floating_point():
            return state, None, True  # nothing to poison: unchanged
        new = old.clone(memory_format=torch.contiguous_format)
        new.view(-1)[torch.randint(0, new.numel(), (1,), generator=g)] = draw(
            st.sampled_from([float("nan"), float("inf"), float("-inf")])
        )
    elif kind == "range":
        if name == "attention_mass":
            new = old * draw(st.sampled_from([0.0, 2.0, -1.0]))
        elif name == "observed":
            new = old - 1.0 - old.max()
        else:
            return state, None, True  # no range to break
    elif kind == "device":
        new = old.to("meta")
    else:
        new = draw(st.sampled_from([None, [1.0], 3.0]))
    if not valid:  # a field that no longer fits may be reported on the one it contradicts
        name = "|".join(FIELDS) if kind == "shape" and name != "coefficients" else name
        name = "coefficients|" + name if kind in ("shape", "dtype") else name
    try:
        return dataclasses.replace(state, **{name.split("|")[-1]: new}), name, valid
    except (TypeError, ValueError) as err:
        assert any(n in str(err) for n in name.split("|")), err
        return err, name, False


def check_call(call, state, problems):
    """Run `call` when every argument is valid (True, and the result is checked by the caller);
    otherwise it must fail naming one of the invalid arguments (`problems`)."""
    if isinstance(state, Exception):
        return False  # refused while building the state
    if problems:
        expect_error(call, *problems)
        return False
    accepted()
    return True


# ---------------------------------------------------------------- update
@st.composite
def update_args(draw):
    sticky, gate, training = draw(settings_of_modules)
    memory, _, state = modules(sticky, gate, training)
    mutated, name, valid_state = draw(mutated_states(state))
    length = draw(st.integers(0, 6))
    shape = (BATCH, length, DIM) if draw(st.integers(0, 3)) else None
    x = draw(tensors(shape=shape))
    generator = draw(st.sampled_from([None, "generator", 7]))
    if generator == "generator":
        generator = torch.Generator().manual_seed(0)
    return memory, mutated, name, valid_state, x, generator


def check_update(args):
    memory, state, name, valid_state, x, generator = args
    call = lambda: memory.update(state, x, generator)  # noqa: E731
    valid_x = (
        is_floating(x)
        and x.dim() == 3
        and x.shape[0] == BATCH
        and x.shape[1] >= 1
        and x.shape[2] == DIM
        and finite(x)
    )
    valid_generator = generator is None or isinstance(generator, torch.Generator)
    checks = ((name, valid_state), ("x", valid_x), ("generator", valid_generator))
    problems = [n for n, ok in checks if not ok]
    if not check_call(call, state, problems):
        return
    new = call().detach()  # x is cast to the state's dtype
    memory.check_state(new)
    assert finite(new.coefficients) and not bool(new.empty.any())
    assert bool((new.observed == 0).all())


@FAST
@given(args=update_args())
def test_fuzz_long_term_update(args):
    check_update(args)


@pytest.mark.slow
@MANY
@given(args=update_args())
def test_fuzz_long_term_update_many(args):
    check_update(args)


# ---------------------------------------------------------------- observe
@st.composite
def observe_args(draw):
    sticky, gate, training = draw(settings_of_modules)
    memory, _, state = modules(sticky, gate, training)
    mutated, name, valid_state = draw(mutated_states(state))
    queries = draw(st.integers(0, 5))
    regular = draw(st.integers(0, 3))
    shape = (BATCH, HEADS, queries) if regular else None
    mu = draw(tensors(shape=shape, low=-0.5, high=1.5))
    other = shape if regular > 1 else None
    sigma_sq = draw(tensors(shape=other, low=1e-4, high=0.5))
    return memory, mutated, name, valid_state, mu, sigma_sq


def check_observe(args):
    memory, state, name, valid_state, mu, sigma_sq = args
    call = lambda: memory.observe(state, mu, sigma_sq)  # noqa: E731
    valid = (
        is_floating(mu)
        and is_floating(sigma_sq)
        and mu.dim() == 3
        and mu.shape[0] == BATCH
        and sigma_sq.shape == mu.shape
        and finite(mu)
        and bool(((sigma_sq > 0) & torch.isfinite(sigma_sq)).all())
    )
    problems = ([] if valid_state else [name]) + ([] if valid else ["mu", "sigma_sq"])
    if not check_call(call, state, problems):
        return
    new = call()
    memory.check_state(new)
    if memory.config.sticky:
        filled = ~state.empty
        expected = state.observed + filled * mu.shape[-1]
        assert torch.equal(new.observed, expected)
    else:
        assert new is state


@FAST
@given(args=observe_args())
def test_fuzz_long_term_observe(args):
    check_observe(args)


@pytest.mark.slow
@MANY
@given(args=observe_args())
def test_fuzz_long_term_observe_many(args):
    check_observe(args)


# ---------------------------------------------------------------- sample_positions
@st.composite
def sample_args(draw):
    sticky, gate, training = draw(settings_of_modules)
    memory, _, state = modules(sticky, gate, training)
    mutated, name, valid_state = draw(mutated_states(state))
    return memory, mutated, name, valid_state, draw(st.integers(0, 2**31 - 1))


def check_sample(args):
    memory, state, name, valid_state, seed = args
    generator = torch.Generator().manual_seed(seed)
    call = lambda: memory.sample_positions(state, generator)  # noqa: E731
    if not check_call(call, state, [] if valid_state else [name]):
        return
    u = call()
    M = memory.config.num_samples
    assert u.shape == ((BATCH, M) if memory.config.sticky else (M,))
    assert finite(u) and bool(((u >= 0) & (u <= 1)).all())
    assert bool((u.diff(dim=-1) >= 0).all())  # sorted


@FAST
@given(args=sample_args())
def test_fuzz_long_term_sample_positions(args):
    check_sample(args)


@pytest.mark.slow
@MANY
@given(args=sample_args())
def test_fuzz_long_term_sample_positions_many(args):
    check_sample(args)


# ---------------------------------------------------------------- continuous attention
@st.composite
def attention_args(draw):
    sticky, gate, training = draw(settings_of_modules)
    _, attention, state = modules(sticky, gate, training)
    mutated, name, valid_state = draw(mutated_states(state))
    queries = draw(st.integers(0, 5))
    shape = (BATCH, queries, DIM) if draw(st.integers(0, 3)) else None
    return attention, mutated, name, valid_state, draw(tensors(shape=shape, clean=(torch.float32,)))


def check_attention(args):
    attention, state, name, valid_state, query = args
    call = lambda: attention.attend(query, state)  # noqa: E731
    valid = (
        isinstance(query, torch.Tensor)
        and query.dtype == torch.float32
        and query.dim() == 3
        and query.shape[0] == BATCH
        and query.shape[1] >= 1
        and query.shape[2] == DIM
        and finite(query)
    )
    problems = ([] if valid_state else [name]) + ([] if valid else ["query"])
    if not check_call(call, state, problems):
        return
    out = call()
    assert out.context.shape == query.shape and finite(out.context)
    assert finite(out.kl) and float(out.kl.detach()) >= -1e-6
    assert bool(((out.mu >= 0) & (out.mu <= 1)).all())  # sigmoid, saturating in float32
    assert bool((out.sigma_sq >= attention.config.min_sigma_sq).all())
    assert bool((out.context[state.empty] == 0).all())  # empty rows read nothing


@FAST
@given(args=attention_args())
def test_fuzz_long_term_attention(args):
    check_attention(args)


@pytest.mark.slow
@MANY
@given(args=attention_args())
def test_fuzz_long_term_attention_many(args):
    check_attention(args)
