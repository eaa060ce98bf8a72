"""Validation happens where a user's tensors enter (the model's forward, the pretrained model's
call, the public methods of the memory pieces), once; the library's own calls inside a step run
unchecked, and a step reads all its checks' values with one host synchronisation."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from public_entries import refuse_public_calls
from tiny_models import MODEL_TYPES, V, tiny

from inftyformer import _checks


def run_steps(model, calls: int = 3) -> None:
    g = torch.Generator().manual_seed(0)
    state = None
    for _ in range(calls):
        tokens = torch.randint(0, V, (2, 8), generator=g)
        out = model(tokens, state, targets=tokens, generator=g)
        out.loss.backward()
        state = out.state


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_a_training_step_calls_no_checked_entry_inside(model_type, monkeypatch):
    from inftyformer import MemoryLM

    torch.manual_seed(0)
    model = MemoryLM(tiny(model_type, sticky=model_type == "infty")).train()
    refuse_public_calls(monkeypatch)
    run_steps(model)  # would raise AssertionError at the first checked call


def count_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many conditions each `ValueChecks.run` read (runs with none queued are not
    synchronisations and are not counted)."""
    reads: list[int] = []
    run = _checks.ValueChecks.run

    def counted(self):
        if self._failed:
            reads.append(len(self._failed))
        return run(self)

    monkeypatch.setattr(_checks.ValueChecks, "run", counted)
    return reads


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_a_model_call_reads_its_checks_with_one_synchronisation(model_type, monkeypatch):
    from inftyformer import MemoryLM

    torch.manual_seed(0)
    model = MemoryLM(tiny(model_type))
    tokens = torch.randint(0, V, (2, 8))
    state = model(tokens).state
    state = model(tokens, state).state  # the memories hold something
    reads = count_reads(monkeypatch)
    model(tokens, state, targets=tokens)
    # tokens, targets and every layer's state fields: all in one read
    assert len(reads) == 1 and reads[0] > 2


def test_the_model_boundary_still_refuses_bad_values_with_clear_messages():
    from inftyformer import MemoryLM

    torch.manual_seed(0)
    model = MemoryLM(tiny("infty"))
    tokens = torch.randint(0, V, (2, 8))
    state = model(tokens).state
    state = model(tokens, state).state
    with pytest.raises(ValueError, match=r"tokens must be in \[0, 13\); found \[13, 99\]"):
        model(torch.tensor([[1, 13, 99, 13]] * 2), state)
    with pytest.raises(ValueError, match=r"targets must be in \[0, 13\) or -100; found \[-5\]"):
        model(tokens, state, targets=torch.full_like(tokens, -5))
    layer = state.layers[1]
    bad = replace(layer.long_term, coefficients=layer.long_term.coefficients * math.nan)
    broken = type(state)((state.layers[0], replace(layer, long_term=bad)))
    with pytest.raises(_checks.NonFiniteError, match=r"state.layers\[1\].long_term.coefficients"):
        model(tokens, broken)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize(
    "bad, finite_fails, bounded_fails",
    [
        (None, False, False),
        (float("nan"), True, True),
        (float("inf"), True, True),
        (-float("inf"), True, True),
        (-3.0, False, True),  # beyond the bound of 2, finite
        (2.0, False, False),  # on the bound
    ],
)
def test_value_checks_finite_and_bounded(dtype, bad, finite_fails, bounded_fails):
    """`finite` fails on NaN and ±inf anywhere, `bounded` also on |x| beyond the bound, in any
    floating dtype; an empty tensor passes both."""
    x = torch.linspace(-1.5, 1.5, 37, dtype=dtype).reshape(1, 37)
    if bad is not None:
        x[0, 17] = bad
    for kind, fails in (("finite", finite_fails), ("bounded", bounded_fails)):
        values = _checks.ValueChecks()
        getattr(values, kind)("x", x, *((2.0,) if kind == "bounded" else ()))
        values.finite("empty", torch.empty(0, 3, dtype=dtype))
        values.bounded("empty", torch.empty(0, dtype=dtype), 2.0)
        if fails:
            with pytest.raises(_checks.NonFiniteError, match="x contains NaN"):
                values.run()
        else:
            values.run()
