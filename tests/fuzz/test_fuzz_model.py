"""Fuzzing MemoryLM.forward: fuzzed tokens, targets and reset rows, fuzzed state fields (dtype,
shape, device, type, NaN, range, or a valid other value) for the four model types, and random
streams (call lengths, resets) whose every state must pass the model's own check."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from fuzzing import ALL_DTYPES, FAST, INTEGERS, MANY, accepted, expect_error, finite, tensors
from hypothesis import given
from hypothesis import strategies as st
from tiny_models import MODEL_TYPES, C, V, tiny

from inftyformer import MemoryLM
from inftyformer.native.model import IGNORE_INDEX
from inftyformer.native.state import MemoryState

BATCH = 3


@functools.cache
def model_and_state(model_type: str, training: bool):
    torch.manual_seed(0)
    model = MemoryLM(tiny(model_type, sticky=model_type == "infty", compression_rate=2)).train(
        training
    )
    g = torch.Generator().manual_seed(0)
    state = None
    for n, reset in [(C, None), (C, None), (5, [False, True, False]), (C, None)]:
        reset = None if reset is None else torch.tensor(reset)
        with torch.no_grad():
            state = model(torch.randint(0, V, (BATCH, n), generator=g), state, reset=reset).state
    return model, state


models = st.tuples(st.sampled_from(MODEL_TYPES), st.booleans())


# ---------------------------------------------------------------- tokens, targets, reset
@st.composite
def call_args(draw):
    model_type, training = draw(models)
    model, state = model_and_state(model_type, training)
    batch = draw(st.sampled_from([BATCH, BATCH, 1, 2]))
    if draw(st.booleans()):  # half of the draws: a valid call
        g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
        tokens = torch.randint(0, V, (BATCH, draw(st.integers(1, C))), generator=g)
        targets = draw(st.sampled_from([None, "targets"]))
        if targets is not None:
            targets = torch.randint(-1, V, tokens.shape, generator=g)
            targets[targets < 0] = IGNORE_INDEX
        reset = None
        if draw(st.booleans()):
            reset = torch.rand(BATCH, generator=g) < 0.5
        return model, state if draw(st.booleans()) else None, tokens, targets, reset
    length = draw(st.integers(0, C + 2))
    regular = draw(st.integers(0, 4))
    shape = (batch, length) if regular else None
    id_dtypes = (*INTEGERS, torch.bool, torch.float32)
    tokens = draw(tensors(shape=shape, dtypes=id_dtypes, low=-2, high=V + 1, clean=(torch.long,)))
    targets = None
    if draw(st.booleans()):
        t_shape = tuple(tokens.shape) if draw(st.integers(0, 3)) else None
        targets = draw(tensors(shape=t_shape, dtypes=id_dtypes, low=-2, high=V + 1,
                               clean=(torch.long,)))  # fmt: skip
        if draw(st.booleans()) and targets.numel():
            targets = targets.clone()
            targets.view(-1)[0] = IGNORE_INDEX
    reset = None
    if draw(st.booleans()):
        r_shape = (batch,) if draw(st.integers(0, 3)) else None
        reset = draw(tensors(shape=r_shape, dtypes=(torch.bool, torch.long), clean=(torch.bool,)))
    use_state = draw(st.booleans())
    return model, state if use_state else None, tokens, targets, reset


def ids_ok(x: torch.Tensor, allow_ignore: bool) -> bool:
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        return False
    if x.dim() != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        return False
    x = x.long()
    ok = (x >= 0) & (x < V)
    if allow_ignore:
        ok |= x == IGNORE_INDEX
    return bool(ok.all())


def check_call(args):
    model, state, tokens, targets, reset = args
    call = lambda: model(tokens, state, targets=targets, reset=reset)  # noqa: E731
    problems = []
    if not ids_ok(tokens, allow_ignore=False):
        problems.append("tokens")
    elif tokens.shape[1] > C:
        problems.append("segment_len")
    if targets is not None and not (
        ids_ok(targets, allow_ignore=True) and targets.shape == tokens.shape
    ):
        problems.append("targets")
    batch = tokens.shape[0] if tokens.dim() else 0
    if reset is not None and not (reset.dtype == torch.bool and tuple(reset.shape) == (batch,)):
        problems.append("reset")
    all_reset = reset is not None and "reset" not in problems and bool(reset.all())
    if state is not None and state.batch_size != batch and not all_reset:
        problems.append("state")
    if problems:
        expect_error(call, *problems)
        return
    accepted()
    out = call()
    assert out.logits.shape == (*tokens.shape, V) and finite(out.logits)
    model.check_state(out.state)
    if targets is not None:
        counted = int((targets != IGNORE_INDEX).sum())
        assert finite(out.loss) and (counted == 0 or float(out.lm_loss.detach()) > 0)


@FAST
@given(args=call_args())
def test_fuzz_memory_lm_inputs(args):
    check_call(args)


@pytest.mark.slow
@MANY
@given(args=call_args())
def test_fuzz_memory_lm_inputs_many(args):
    check_call(args)


# ---------------------------------------------------------------- state fields
KINDS = ("valid", "valid", "dtype", "shape", "poison", "range", "device", "type")


def parts(state: MemoryState):
    return [(i, part) for i, layer in enumerate(state.layers)
            for part in ("short_term", "compressed", "long_term")
            if getattr(layer, part) is not None]  # fmt: skip


@st.composite
def mutated_model_states(draw):
    model_type, training = draw(models)
    model, state = model_and_state(model_type, training)
    i, part = draw(st.sampled_from(parts(state)))
    sub = getattr(state.layers[i], part)
    # (a squeeze's records: none for these models' squeezes, `records` stays {})
    names = [f.name for f in dataclasses.fields(sub) if f.name != "records"]
    name = draw(st.sampled_from(names))
    old = getattr(sub, name)
    kind = draw(st.sampled_from(KINDS))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    valid = kind == "valid"
    if kind == "valid":
        if name in ("memory", "coefficients"):
            new = torch.randn(old.shape, generator=g) * draw(st.sampled_from([0.0, 1.0, 50.0]))
        elif name == "length":
            new = torch.randint(0, sub.memory.shape[1] + 1, old.shape, generator=g)
        elif name == "attention_mass":
            new = torch.rand(old.shape, generator=g) + 1e-3
            new = new / new.sum(-1, keepdim=True)
        elif name == "observed":
            new = torch.randint(0, 1000, old.shape, generator=g).float()
        elif name == "stored":
            new = torch.randint(0, 10_000, old.shape, generator=g)
        else:  # empty
            new = torch.rand(old.shape, generator=g) < 0.5
    elif kind == "dtype":
        new = old.to(draw(st.sampled_from([d for d in ALL_DTYPES if d != old.dtype])))
    elif kind == "shape":
        shape = list(old.shape)
        how = draw(st.sampled_from(["batch", "last", "extra", "drop"]))
        if how == "batch":
            shape[0] += 1
        elif how == "last" and len(shape) > 1:
            shape[-1] += 1
        elif how == "extra" or len(shape) == 1:
            shape.append(1)
        else:
            shape.pop()
        new = torch.zeros(shape, dtype=old.dtype)
    elif kind == "poison" and old.is_floating_point() and old.numel():
        new = old.clone(memory_format=torch.contiguous_format)
        new.view(-1)[torch.randint(0, new.numel(), (1,), generator=g)] = draw(
            st.sampled_from([float("nan"), float("inf"), float("-inf")])
        )
    elif kind == "range" and name == "length":
        new = old + sub.memory.shape[1] + 1
    elif kind == "range" and name == "attention_mass":
        new = old * -1.0
    elif kind == "range" and name == "observed":
        new = old - 1.0 - old.max()
    elif kind == "range" and name == "stored":
        new = old - 1 - old.max()
    elif kind == "device":
        new = old.to("meta")
    elif kind == "type":
        new = draw(st.sampled_from([None, [0], 1.0]))
        # not given: `stored` counted from `empty`
        valid = name == "stored" and new is None
    else:
        new, valid = old, True  # nothing to break for this field
    where = f"layers[{i}].{part}"
    try:
        layer = dataclasses.replace(
            state.layers[i], **{part: dataclasses.replace(sub, **{name: new})}
        )
        layers = list(state.layers)
        layers[i] = layer
        mutated = MemoryState(tuple(layers))
    except (TypeError, ValueError) as err:
        assert name in str(err), err
        return model, err, where, False
    return model, mutated, where, valid


def check_state_fuzz(args):
    model, state, where, valid = args
    if isinstance(state, Exception):
        return  # refused while building the state
    tokens = torch.randint(0, V, (BATCH, 4), generator=torch.Generator().manual_seed(1))
    call = lambda: model(tokens, state, targets=tokens)  # noqa: E731
    if not valid:
        err = expect_error(call, where, "state has batch size", "state.layers[0].short_term")
        assert "state" in str(err)
        return
    accepted()
    out = call()
    assert finite(out.logits) and finite(out.loss)
    model.check_state(out.state)


@FAST
@given(args=mutated_model_states())
def test_fuzz_memory_lm_state_fields(args):
    check_state_fuzz(args)


@pytest.mark.slow
@MANY
@given(args=mutated_model_states())
def test_fuzz_memory_lm_state_fields_many(args):
    check_state_fuzz(args)


# ---------------------------------------------------------------- the models' own states
@st.composite
def streams(draw):
    model_type = draw(st.sampled_from(MODEL_TYPES))
    rate = draw(st.sampled_from([2, 3]))
    mem_len = 0 if model_type == "transformer" else draw(st.sampled_from([4, 8, 13]))
    calls = draw(st.lists(st.tuples(st.integers(1, C), st.lists(st.booleans(), min_size=2,
                                                                max_size=2)),
                          min_size=1, max_size=12))  # fmt: skip
    return model_type, rate, mem_len, calls, draw(st.integers(0, 2**31 - 1))


@functools.cache
def stream_model(model_type: str, rate: int, mem_len: int) -> MemoryLM:
    torch.manual_seed(0)
    config = tiny(model_type, compression_rate=rate, mem_len=mem_len, n_layers=1,
                  sticky=model_type == "infty")  # fmt: skip
    return MemoryLM(config).eval()


def check_stream(args):
    model_type, rate, mem_len, calls, seed = args
    model = stream_model(model_type, rate, mem_len)
    accepted()
    g = torch.Generator().manual_seed(seed)
    state = None
    with torch.no_grad():
        for n, reset in calls:
            out = model(torch.randint(0, V, (2, n), generator=g), state, reset=torch.tensor(reset))
            state = out.state
            model.check_state(state)  # never refused: the bounds fit every stream
            assert state.layers[0].short_term.memory.shape[1] <= model.config.max_short_term_len


@FAST
@given(args=streams())
def test_fuzz_every_state_a_model_makes_passes_its_check(args):
    check_stream(args)


@pytest.mark.slow
@MANY
@given(args=streams())
def test_fuzz_every_state_a_model_makes_passes_its_check_many(args):
    check_stream(args)
