"""Saving and loading a MemoryState (safetensors + JSON metadata, atomic write)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from tiny_models import MODEL_TYPES, V
from tiny_models import tiny as _tiny

from inftyformer.config import ModelConfig
from inftyformer.model import MemoryLM
from inftyformer.state import MemoryState, load_state, save_state


def tiny(model_type: str, **kw) -> ModelConfig:
    kw.setdefault("sticky", model_type == "infty")
    return _tiny(model_type, **kw)


def ragged_state(model: MemoryLM) -> MemoryState:
    """A state whose rows are in different phases (one was reset mid-stream)."""
    g = torch.Generator().manual_seed(0)
    state = None
    for i, n in enumerate([8, 8, 5, 8, 3]):
        reset = torch.tensor([False, i == 2, False])
        state = model(torch.randint(0, V, (3, n), generator=g), state, reset=reset).state
    return state


def assert_same(a: MemoryState, b: MemoryState) -> None:
    ta, tb = a.tensors(), b.tensors()
    assert ta.keys() == tb.keys()
    for k in ta:
        assert ta[k].dtype == tb[k].dtype, k
        assert torch.equal(ta[k], tb[k]), k


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_save_load_round_trip_is_exact(tmp_path, model_type):
    torch.manual_seed(0)
    model = MemoryLM(tiny(model_type)).eval()
    state = ragged_state(model)
    path = tmp_path / "memory.safetensors"
    save_state(path, state)
    loaded = load_state(path)
    assert_same(state, loaded)
    tokens = torch.randint(0, V, (3, 8), generator=torch.Generator().manual_seed(1))
    assert torch.equal(model(tokens, state).logits, model(tokens, loaded).logits)
    assert [p.name for p in tmp_path.iterdir()] == ["memory.safetensors"]  # no temporary left


def test_fresh_state_round_trip_and_overwrite(tmp_path):
    model = MemoryLM(tiny("infty")).eval()
    path = tmp_path / "m.safetensors"
    save_state(path, ragged_state(model))
    fresh = model.init_state(2)
    save_state(path, fresh)  # replaces the old file atomically
    loaded = load_state(path)
    assert_same(fresh, loaded)
    assert loaded.layers[0].short_term.memory.shape == (2, 0, 32)


def test_load_rejects_foreign_files(tmp_path):
    path = tmp_path / "other.safetensors"
    save_file({"x": torch.zeros(2)}, str(path))
    with pytest.raises(ValueError, match="not an inftyformer memory state"):
        load_state(path)
    meta = json.dumps({"format": "something", "version": 1})
    save_file({"x": torch.zeros(2)}, str(path), metadata={"inftyformer": meta})
    with pytest.raises(ValueError, match="unsupported state format"):
        load_state(path)
    with pytest.raises(TypeError):
        save_state(path, {"not": "a state"})


def test_loaded_state_is_validated_against_the_model(tmp_path):
    path = tmp_path / "xl.safetensors"
    xl = MemoryLM(tiny("xl")).eval()
    save_state(path, ragged_state(xl))
    infty = MemoryLM(tiny("infty")).eval()
    with pytest.raises(ValueError, match="long_term"):
        infty(torch.zeros(3, 4, dtype=torch.long), load_state(path))
