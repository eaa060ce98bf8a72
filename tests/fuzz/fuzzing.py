"""What the fuzz tests share: example budgets and strategies for tensors of any dtype, shape and
values (NaN, ±inf, negative, huge, zero), and an oracle helper.

Every fuzz test states, for each drawn input, whether it is valid; then a valid input must give a
correct result and an invalid one a TypeError/ValueError naming the argument, raised before any
computation. Any other exception (a RuntimeError from deep inside torch, a ZeroDivisionError, …)
or a silently wrong result is a finding.

The default suite runs `FAST` examples per function; the `slow` copies run `MANY` (2000, so
that CI stays near 20 minutes; `INFTYFORMER_FUZZ_EXAMPLES` overrides it, as the full run of
`scripts/fuzz_report.py` does with 3000).
"""

from __future__ import annotations

import os
import re

import pytest
import torch
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st

FAST_EXAMPLES = 25
MANY_EXAMPLES = int(os.environ.get("INFTYFORMER_FUZZ_EXAMPLES", "2000"))
_COMMON = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
FAST = settings(max_examples=FAST_EXAMPLES, **_COMMON)
MANY = settings(max_examples=MANY_EXAMPLES, **_COMMON)

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTEGERS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
ALL_DTYPES = (*FLOATS, *INTEGERS, torch.bool, torch.complex64)
POISONS = (None, None, float("nan"), float("inf"), float("-inf"), -1.0, 0.0, 1e30, -1e30)


@st.composite
def tensors(
    draw,
    shape: tuple[int, ...] | None = None,
    dtypes: tuple[torch.dtype, ...] = ALL_DTYPES,
    low: float = -2.0,
    high: float = 2.0,
    poisons: tuple = POISONS,
    max_dims: int = 4,
    max_side: int = 5,
    clean: tuple[torch.dtype, ...] = (torch.float32, torch.float64),
) -> torch.Tensor:
    """A tensor of a drawn dtype and shape; floating values uniform in [low, high) with, maybe,
    a few entries replaced by a drawn poison (NaN, ±inf, −1, 0, ±1e30); integers in
    [low, high]. Half of the draws are clean (a dtype of `clean`, no poison), so that valid
    inputs are explored as much as invalid ones. The values come from a drawn seed, so an
    example stays small."""
    if shape is None:
        shape = tuple(draw(st.lists(st.integers(0, max_side), max_size=max_dims)))
    is_clean = bool(clean) and draw(st.booleans())
    dtype = draw(st.sampled_from(clean if is_clean else dtypes))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    if dtype.is_floating_point or dtype.is_complex:
        x = torch.rand(shape, generator=g, dtype=torch.float64) * (high - low) + low
        poison = None if is_clean else draw(st.sampled_from(poisons))
        if poison is not None and x.numel():
            count = draw(st.integers(1, max(1, min(3, x.numel()))))
            where = torch.randint(0, x.numel(), (count,), generator=g)
            x.view(-1)[where] = poison
        return x.to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    info = torch.iinfo(dtype)
    lo, hi = max(int(low), info.min), min(int(high), info.max)
    return torch.randint(lo, hi + 1, shape, generator=g).to(dtype)


def is_floating(x: object) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


def finite(x: torch.Tensor) -> bool:
    return bool(torch.isfinite(x).all())


def expect_error(call, *names: str):
    """`call()` must raise TypeError/ValueError whose message names one of `names` (any name
    when none are given; "a|b" stands for either); returns the error."""
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    event(f"refused ({type(info.value).__name__})")
    if names:
        message = str(info.value)
        options = [n for name in names for n in name.split("|")]
        assert any(re.search(re.escape(n), message) for n in options), (names, message)
    return info.value


def accepted() -> None:
    """Count a valid input in the statistics (pytest --hypothesis-show-statistics)."""
    event("accepted")
