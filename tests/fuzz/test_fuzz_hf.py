"""Fuzzing the pretrained adapter's public functions: `add_long_term_memory` with fuzzed settings
(types, non-finite numbers, ranges, expanding updates) and `InftyformerForCausalLM.forward` with
fuzzed input_ids, labels, attention_mask, reset and memory. An accepted setting must give a
model whose logits equal the base's (the read starts at zero); an accepted call finite logits of
the right shape and a memory the model accepts back; anything refused a TypeError/ValueError
naming the argument."""

from __future__ import annotations

import functools
import math
import numbers

import pytest
import torch
from fuzzing import FAST, INTEGERS, MANY, accepted, expect_error, finite, tensors
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("transformers")

from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402

from inftyformer.core.basis import MAX_WIDTH, MIN_WIDTH  # noqa: E402
from inftyformer.core.ridge import update_gain  # noqa: E402
from inftyformer.core.squeeze import MAX_UPDATE_GAIN  # noqa: E402
from inftyformer.hf import add_long_term_memory  # noqa: E402
from inftyformer.native.model import IGNORE_INDEX  # noqa: E402

V, D, HEADS, POSITIONS, L = 61, 32, 4, 64, 8
BATCH = 2


def make_base(arch: str):
    torch.manual_seed(0)
    if arch == "gpt2":
        config = GPT2Config(vocab_size=V, n_embd=D, n_layer=1, n_head=HEADS, n_positions=POSITIONS,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
        return GPT2LMHeadModel(config).eval()
    config = LlamaConfig(vocab_size=V, hidden_size=D, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=HEADS, num_key_value_heads=2,
                         max_position_embeddings=POSITIONS)  # fmt: skip
    return LlamaForCausalLM(config).eval()


base = functools.cache(make_base)  # shared by the settings examples (each unwraps it again)


# ---------------------------------------------------------------- settings
GOOD = {
    "num_heads": [1, 2, 4, 8],
    "num_basis": [8, 16, 32],
    "widths": [(0.05,), (0.01, 0.05), [0.1, 0.2]],
    "ridge_lambda": [0.5, 1.0, 10],
    "tau": [0.25, 0.5, 0.75],
    "num_samples": [16, 32, 64],
    "edge_padding": [True, False],
    "conv_gate": [True, False],
    "sticky": [True, False],
    "sticky_bins": [1, 16, 128],
    "sigma_0": [0.05, 1],
    "min_sigma_sq": [1e-4, 1e-3],
    "segment_len": [1, L, POSITIONS],
    "kl_weight": [0, 1e-6, 1.0],
}
BAD = [None, "1", "false", True, 0, -1, 1.5, math.nan, math.inf, -math.inf, 1e300, 3, [], ["0.1"],
       [True], (0.0,), (2e3,), POSITIONS + 1, 7]  # fmt: skip
BOOLS = ("edge_padding", "conv_gate", "sticky")
INTS = ("num_heads", "num_basis", "num_samples", "sticky_bins", "segment_len")


@st.composite
def settings_of(draw):
    names = draw(st.lists(st.sampled_from(sorted(GOOD)), max_size=5, unique=True))
    out = {"num_basis": 16, "num_samples": 16, "segment_len": L}
    for name in names:
        out[name] = draw(st.sampled_from(GOOD[name] if draw(st.booleans()) else BAD))
    return draw(st.sampled_from(["gpt2", "llama"])), out


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def problems_of(s: dict) -> list[str]:
    """The settings a correct validation refuses (by name), in a check's order."""
    bad = []
    for name in INTS:
        if name in ("num_heads", "segment_len") and s.get(name, 0) is None:
            continue  # None: the base's number of heads, the default segment
        if name in s and not (_int(s[name]) and s[name] >= 1):
            bad.append(name)
    if "segment_len" not in bad and (s["segment_len"] or 0) > POSITIONS:
        bad.append("segment_len")
    heads = s.get("num_heads") or HEADS
    if "num_heads" not in bad and D % heads:
        bad.append("num_heads")
    widths = s.get("widths", (0.005, 0.01))
    ok_widths = (
        isinstance(widths, (list, tuple))
        and widths
        and all(_real(w) and MIN_WIDTH <= w <= MAX_WIDTH for w in widths)
    )
    if not ok_widths:
        bad.append("widths")
    elif "num_basis" not in bad and s["num_basis"] % len(widths):
        bad.append("num_basis")
    for name, low_open, high in (("ridge_lambda", True, math.inf), ("sigma_0", True, MAX_WIDTH),
                                 ("min_sigma_sq", True, 1.0),  # a model's floor: ≤ 1
                                 ("kl_weight", False, math.inf)):  # fmt: skip
        if name in s:
            v = s[name]
            if not (_real(v) and math.isfinite(v) and (v > 0 if low_open else v >= 0)
                    and v <= high):  # fmt: skip
                bad.append(name)
    if "tau" in s and not (_real(s["tau"]) and 0 < s["tau"] < 1):
        bad.append("tau")
    for name in BOOLS:
        if name in s and not isinstance(s[name], bool):
            bad.append(name)
    return bad


def check_settings(args):
    arch, settings = args
    model_base = base(arch)
    call = lambda: add_long_term_memory(model_base, **settings)  # noqa: E731
    bad = problems_of(settings)
    if bad:
        expect_error(call, *bad)
        return
    if settings["segment_len"] is None:  # the default: 256 within the positions, half of them
        settings = {**settings, "segment_len": min(256, POSITIONS // 2)}
    widths = tuple(float(w) for w in settings.get("widths", (0.005, 0.01)))
    gain = update_gain(settings["num_basis"], widths, float(settings.get("ridge_lambda", 0.5)),
                       float(settings.get("tau", 0.5)), settings["num_samples"],
                       settings["segment_len"], settings.get("edge_padding", True))  # fmt: skip
    if gain > MAX_UPDATE_GAIN:
        expect_error(call, "expands")
        return
    accepted()
    model = call().eval()
    ids = torch.randint(0, V, (BATCH, min(settings["segment_len"], L)))
    with torch.no_grad():
        out = model(ids)
        assert torch.allclose(out.logits, model_base(ids).logits, atol=1e-5)
        again = model(ids, state=out.state)  # the first segment is now the window
        again = model(ids, state=again.state)  # and now in the memory, read back
    assert finite(again.logits)
    model.unwrap()  # the base is shared: the next example wraps it afresh


@FAST
@given(args=settings_of())
def test_fuzz_hf_settings(args):
    check_settings(args)


@pytest.mark.slow
@MANY
@given(args=settings_of())
def test_fuzz_hf_settings_many(args):
    check_settings(args)


# ---------------------------------------------------------------- forward
@functools.cache
def model_and_memory(arch: str):
    torch.manual_seed(0)
    model = add_long_term_memory(make_base(arch), num_basis=16, num_samples=16, segment_len=L)
    model = model.eval()
    with torch.no_grad():
        memory = model(torch.randint(0, V, (BATCH, L))).state
    return model, memory


def ids_ok(x: torch.Tensor, allow_ignore: bool) -> bool:
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        return False
    if x.dim() != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        return False
    ok = (x.long() >= 0) & (x.long() < V)
    if allow_ignore:
        ok |= x.long() == IGNORE_INDEX
    return bool(ok.all())


@st.composite
def forward_args(draw):
    arch = draw(st.sampled_from(["gpt2", "llama"]))
    batch = draw(st.sampled_from([BATCH, BATCH, 1]))
    if draw(st.booleans()):  # half of the draws: a valid call
        g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
        lengths = [1, 2, L, L + 1, POSITIONS, POSITIONS + 1]  # past a segment: streamed
        ids = torch.randint(0, V, (BATCH, draw(st.sampled_from(lengths))), generator=g)
        labels = None
        if draw(st.booleans()):
            labels = torch.randint(-1, V, ids.shape, generator=g)
            labels[labels < 0] = IGNORE_INDEX
        mask = torch.ones_like(ids) if draw(st.booleans()) else None
        reset = (torch.rand(BATCH, generator=g) < 0.5) if draw(st.booleans()) else None
        return arch, ids, labels, mask, reset, draw(st.booleans())
    length = draw(st.sampled_from([1, L, POSITIONS, POSITIONS + 1, 0]))
    id_dtypes = (*INTEGERS, torch.bool, torch.float32)
    shape = (batch, length) if draw(st.integers(0, 4)) else None
    ids = draw(tensors(shape=shape, dtypes=id_dtypes, low=-2, high=V + 1, clean=(torch.long,)))
    labels = None
    if draw(st.booleans()):
        l_shape = tuple(ids.shape) if draw(st.integers(0, 3)) else None
        labels = draw(tensors(shape=l_shape, dtypes=id_dtypes, low=-2, high=V + 1,
                              clean=(torch.long,)))  # fmt: skip
    mask = None
    if draw(st.booleans()) and ids.dim() == 2:
        mask = torch.ones(ids.shape, dtype=torch.long)
        if draw(st.booleans()):
            mask = mask[:, :-1] if mask.shape[1] else mask[None]
    reset = None
    if draw(st.booleans()):
        r_shape = (batch,) if draw(st.integers(0, 3)) else None
        reset = draw(tensors(shape=r_shape, dtypes=(torch.bool, torch.long), clean=(torch.bool,)))
    return arch, ids, labels, mask, reset, draw(st.booleans())


def check_forward(args):
    arch, ids, labels, mask, reset, use_memory = args
    model, memory = model_and_memory(arch)
    memory = memory if use_memory else None
    kwargs = dict(labels=labels, attention_mask=mask, reset=reset, state=memory)
    call = lambda: model(ids, **kwargs)  # noqa: E731
    bad = []
    if not ids_ok(ids, allow_ignore=False):
        bad.append("input_ids")
    if labels is not None and not (ids_ok(labels, True) and labels.shape == ids.shape):
        bad.append("labels")
    batch = ids.shape[0] if ids.dim() else 0
    if mask is not None and not (
        mask.dim() == 2
        and mask.shape[0] == batch
        and mask.shape[1] >= (ids.shape[1] if ids.dim() == 2 else 0)
    ):
        bad.append("attention_mask")  # fmt: skip
    if reset is not None and not (reset.dtype == torch.bool and tuple(reset.shape) == (batch,)):
        bad.append("reset")
    all_reset = reset is not None and "reset" not in bad and bool(reset.all())
    if memory is not None and memory.batch_size != batch and not all_reset:
        bad.append("state")
    # any length is accepted: past a segment it is streamed, each call within the positions
    if bad:
        expect_error(call, *bad)
        return
    accepted()
    with torch.no_grad():
        out = call()
    assert out.logits.shape == (*ids.shape, V) and finite(out.logits)
    model.check_state(out.state, batch)
    if labels is not None:
        assert torch.isfinite(out.loss) or int((labels[:, 1:] != IGNORE_INDEX).sum()) == 0


@FAST
@given(args=forward_args())
def test_fuzz_hf_forward(args):
    check_forward(args)


@pytest.mark.slow
@MANY
@given(args=forward_args())
def test_fuzz_hf_forward_many(args):
    check_forward(args)
