"""Fuzzing what comes from outside: memory-state files (truncated, bytes flipped, metadata
rewritten) and the command line's --set items."""

from __future__ import annotations

import functools
import json
import struct
import tempfile
from pathlib import Path

import pytest
import torch
from fuzzing import FAST, MANY, accepted, finite
from hypothesis import event, given
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from tiny_models import MODEL_TYPES, V, tiny

from inftyformer import MemoryLM
from inftyformer.configure import build_configs
from inftyformer.native.model_config import ModelConfig
from inftyformer.native.state import load_state, save_state
from inftyformer.training.config import TrainConfig, field_types


# ---------------------------------------------------------------- memory-state files
@functools.cache
def saved_state(model_type: str) -> tuple[bytes, MemoryLM]:
    torch.manual_seed(0)
    model = MemoryLM(tiny(model_type, sticky=model_type == "infty")).eval()
    g = torch.Generator().manual_seed(0)
    state = None
    for n in (8, 8, 5):
        state = model(torch.randint(0, V, (2, n), generator=g), state).state
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.safetensors"
        save_state(path, state)
        return path.read_bytes(), model


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 5), st.floats(allow_nan=False),
              st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8,
)  # fmt: skip


@st.composite
def corrupted_files(draw):
    model_type = draw(st.sampled_from(MODEL_TYPES))
    data, model = saved_state(model_type)
    how = draw(st.sampled_from(["truncate", "flip", "flip_header", "metadata", "meta_keys"]))
    data = bytearray(data)
    header_len = struct.unpack("<Q", bytes(data[:8]))[0]
    if how == "truncate":
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif how in ("flip", "flip_header"):
        lo, hi = (0, 8 + header_len) if how == "flip_header" else (8 + header_len, len(data))
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(lo, hi - 1))
            data[i] = draw(st.integers(0, 255))
    else:
        tensors = load_file_bytes(bytes(data))
        if how == "metadata":
            meta = json.dumps(draw(json_values))
        else:  # the right keys, fuzzed values
            meta = {"format": "inftyformer.MemoryState", "version": 2, "num_layers": 2,
                    "batch_size": 2}  # fmt: skip
            key = draw(st.sampled_from(sorted(meta)))
            meta[key] = draw(json_values)
            meta = json.dumps(meta)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "s.safetensors"
            save_file(tensors, str(path), metadata={"inftyformer": meta})
            data = bytearray(path.read_bytes())
    return bytes(data), model


def load_file_bytes(data: bytes) -> dict[str, torch.Tensor]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.safetensors"
        path.write_bytes(data)
        return load_file(str(path))


def check_corrupted(args, tmp_dir: Path):
    data, model = args
    path = tmp_dir / "fuzzed.safetensors"
    path.write_bytes(data)
    try:
        state = load_state(path)
    except (ValueError, TypeError) as err:
        event(f"refused ({type(err).__name__})")
        assert str(path) in str(err), err  # names the file
        return
    accepted()
    # whatever loads is a consistent state: it passes the layout check, and the model either
    # takes it or refuses it by name (e.g. a flipped length byte), never fails inside torch
    state.check_layout()
    try:
        model.check_state(state)
    except (ValueError, TypeError) as err:
        assert "state" in str(err)
        return
    out = model(torch.zeros(2, 3, dtype=torch.long), state)
    assert finite(out.logits)


@FAST
@given(args=corrupted_files())
def test_fuzz_load_state_corrupted_files(args, tmp_path_factory):
    check_corrupted(args, tmp_path_factory.getbasetemp())


@pytest.mark.slow
@MANY
@given(args=corrupted_files())
def test_fuzz_load_state_corrupted_files_many(args, tmp_path_factory):
    check_corrupted(args, tmp_path_factory.getbasetemp())


# ---------------------------------------------------------------- --set KEY=VALUE
MODEL_KEYS = sorted(field_types(ModelConfig))
TRAIN_KEYS = sorted(set(field_types(TrainConfig)) - {"task"})
TASK_KEYS = ["seq_len"]
VALUES = ["0", "1", "-1", "2", "8", "64", "0.5", "1e-3", "nan", "inf", "-inf", "1e309", "true",
          "false", "none", "", " ", "0.01,0.05", "(0.1,)", "1_000", "abc", "=", "xl", "cpu",
          "cuda:0", "1,2,3"]  # fmt: skip


GOOD = {
    "d_model": ["16", "32", "64"], "n_heads": ["1", "2", "4"], "segment_len": ["32", "64"],
    "mem_len": ["0", "16", "32"], "sticky": ["true", "false"], "dropout": ["0", "0.1"],
    "num_basis": ["8", "16"], "widths": ["0.05", "0.01,0.05"], "lr": ["1e-3", "0.01"],
    "warmup_steps": ["0", "10"], "grad_clip": ["0", "1"], "task.seq_len": ["64", "128"],
    "kl_weight": ["0", "1e-6"], "tau": ["0.5", "0.75"], "batch_size": ["2", "4"],
}  # fmt: skip


@st.composite
def set_items(draw):
    if draw(st.booleans()):  # half of the draws: well-formed settings, mostly valid together
        keys = draw(st.lists(st.sampled_from(sorted(GOOD)), min_size=1, max_size=4, unique=True))
        return [f"{k}={draw(st.sampled_from(GOOD[k]))}" for k in keys]
    items = []
    for _ in range(draw(st.integers(1, 4))):
        group = draw(st.sampled_from(["", "model.", "train.", "task.", "nope.", "model.train."]))
        key = draw(st.one_of(st.sampled_from(MODEL_KEYS + TRAIN_KEYS + TASK_KEYS),
                             st.text(max_size=6)))  # fmt: skip
        value = draw(st.one_of(st.sampled_from(VALUES), st.text(max_size=6)))
        sep = draw(st.sampled_from(["=", "=", "==", ":", ""]))
        items.append(f"{group}{key}{sep}{value}")
    return items


def check_set_items(items):
    """Parsing --set items and building the configs either gives valid configs or a
    TypeError/ValueError (which the command line prints as one line): nothing else."""
    try:
        train, task, model = build_configs("sorting", model=None, preset=None, settings=items,
                                           options={}, task_options={}, resume=False)  # fmt: skip
    except (TypeError, ValueError) as err:
        event(f"refused ({type(err).__name__})")
        assert str(err)
        return
    accepted()
    assert isinstance(train, TrainConfig) and isinstance(model, ModelConfig)
    assert task.seq_len >= 1


@FAST
@given(items=set_items())
def test_fuzz_cli_set_items(items):
    check_set_items(items)


@pytest.mark.slow
@MANY
@given(items=set_items())
def test_fuzz_cli_set_items_many(items):
    check_set_items(items)
