"""Saving and loading a MemoryState (safetensors + JSON metadata, atomic write)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from tiny_models import MODEL_TYPES, V
from tiny_models import tiny as _tiny

from inftyformer.native.model import MemoryLM
from inftyformer.native.model_config import ModelConfig
from inftyformer.native.state import MemoryState, load_state, save_state


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


def _rewrite(path, tensors, meta) -> None:
    save_file(tensors, str(path), metadata={"inftyformer": meta})


@pytest.mark.parametrize(
    "damage, error, match",
    [
        (lambda t, m: (t, "{not json"), ValueError, "metadata is not valid JSON"),
        (lambda t, m: (t, "[1, 2]"), ValueError, "must be a JSON object"),
        (lambda t, m: (t, json.dumps({**m, "num_layers": None})), ValueError, "num_layers"),
        (lambda t, m: (t, json.dumps({**m, "batch_size": "3"})), ValueError, "batch_size"),
        (lambda t, m: (t, json.dumps({**m, "num_layers": 3})), ValueError, r"layers\[2\]"),
        (
            lambda t, m: ({k: v for k, v in t.items() if not k.endswith("long_term.empty")},
                          json.dumps(m)),
            ValueError, "missing tensors",
        ),
        (lambda t, m: ({**t, "extra": torch.zeros(1)}, json.dumps(m)), ValueError, "unexpected"),
        (
            lambda t, m: ({**t, "layers.1.short_term.memory": torch.zeros(2, 4, 32)},
                          json.dumps(m)),
            ValueError, r"layers\[1\]\.short_term\.memory must have shape \(3, ",
        ),
        (
            lambda t, m: ({**t, "layers.0.long_term.coefficients": torch.zeros(3, 16, 30)},
                          json.dumps(m)),
            ValueError, "different widths",
        ),
        (
            lambda t, m: ({**t, "layers.0.long_term.empty": torch.zeros(3, dtype=torch.uint8)},
                          json.dumps(m)),
            TypeError, "empty must have dtype torch.bool",
        ),
    ],
)  # fmt: skip
def test_load_state_names_the_file_and_the_problem(tmp_path, damage, error, match):
    """Bad metadata, missing keys and wrong shapes are reported by load_state with the file's
    name (a wrong shape used to surface later as a misleading batch-size error)."""
    from safetensors.torch import load_file

    path = tmp_path / "state.safetensors"
    save_state(path, ragged_state(MemoryLM(tiny("infty")).eval()))
    tensors = load_file(str(path))
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["inftyformer"])
    _rewrite(path, *damage(tensors, meta))
    with pytest.raises(error, match=match) as info:
        load_state(path)
    assert str(path) in str(info.value)


def test_load_state_refuses_files_that_are_not_states(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_state(tmp_path / "missing.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 3)
    with pytest.raises(ValueError, match="is not a safetensors file"):
        load_state(junk)


def test_load_state_checks_against_a_model_when_given_one(tmp_path):
    path = tmp_path / "infty.safetensors"
    save_state(path, ragged_state(MemoryLM(tiny("infty")).eval()))
    load_state(path, model=MemoryLM(tiny("infty")))
    with pytest.raises(ValueError, match=f"{path.name}.*long_term must be absent"):
        load_state(path, model=MemoryLM(tiny("xl", mem_len=40)))


def test_a_state_saved_before_records_had_their_own_slot_still_loads(tmp_path):
    """Versions 1–2 wrote the fill squeeze's place records as `long_term.places` (also empty,
    [batch, 0, 4], for every other squeeze); they load into `LongTermState.records`. A version-3
    file with that key is refused: the key is no longer written."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    model = MemoryLM(tiny("infty")).eval()
    state = ragged_state(model)
    path = tmp_path / "state.safetensors"
    save_state(path, state)
    tensors = load_file(str(path))
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["inftyformer"])
    assert meta["version"] == 3 and not any("places" in k for k in tensors)
    layers = range(len(state.layers))
    old = {**tensors, **{f"layers.{i}.long_term.places": torch.zeros(3, 0, 4) for i in layers}}
    _rewrite(path, old, json.dumps({**meta, "version": 2}))
    loaded = load_state(path, model=model)
    assert_same(state, loaded)
    assert all(layer.long_term.records == {} for layer in loaded.layers)
    # a keep_salient memory's records: the same numbers under their new name
    records = torch.rand(3, 5, 4, dtype=torch.float64)
    _rewrite(
        path, {**tensors, "layers.0.long_term.places": records}, json.dumps(meta | {"version": 2})
    )
    loaded = load_state(path)
    assert torch.equal(loaded.layers[0].long_term.records["places"], records)
    assert "layers.0.long_term.records.places" in loaded.tensors()
    _rewrite(path, old, json.dumps(meta))
    with pytest.raises(ValueError, match=r"unexpected tensors \['layers.0.long_term.places'"):
        load_state(path)
