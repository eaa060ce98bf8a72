"""A memory state records the memory settings that give its numbers their meaning
(`state_record.py`): a state of a squeeze="fill" memory given to a by_length or fixed memory of
the same base is refused naming the settings, also through a saved file; the fields of the
newer states (salience, place records, window) are checked like the others; `load_state` checks
a state against a pretrained model too."""

from dataclasses import replace

import pytest
import torch
from tiny_hf import V, tiny_memory_model

from inftyformer.native.state import MemoryState, load_state, save_state
from inftyformer.native.state_record import STATE_SETTINGS, memory_record

# a squeeze="fill" memory (the mixture density, one sample per centre: 16 / 2 widths)
FILL = dict(squeeze="fill", density="mixture")


def stream(model, ids, state=None):
    with torch.no_grad():
        for start in range(0, ids.shape[1], 8):
            state = model(ids[:, start : start + 8], state=state).state
    return state


def ids(batch: int = 2, length: int = 32):
    return torch.randint(1, V, (batch, length), generator=torch.Generator().manual_seed(0))


def test_a_state_of_another_memory_is_refused_naming_the_settings(tmp_path):
    fill = tiny_memory_model("llama", **FILL)
    state = stream(fill, ids())
    assert state.memory == memory_record(fill.config.adapter.settings())
    assert set(state.memory) == set(STATE_SETTINGS) and state.memory["squeeze"] == "fill"
    for squeeze in ("by_length", "fixed"):
        other = tiny_memory_model("llama", squeeze=squeeze)
        assert other.state_source == fill.state_source  # the same base: only the memory differs
        with pytest.raises(ValueError, match=f"other settings .*squeeze: 'fill' -> '{squeeze}'"):
            other(ids()[:, :8], state=state)
    kept = tiny_memory_model("llama", **FILL, keep_first=2)
    with pytest.raises(ValueError, match="keep_first: 0 -> 2"):
        kept(ids()[:, :8], state=state)
    # kept through detach, to, reset, repeat_rows and a saved file
    for same in (state.detach(), state.to("cpu"), state.reset(torch.tensor([True, False])),
                 state.repeat_rows(1)):  # fmt: skip
        assert same.memory == state.memory
    path = tmp_path / "state.safetensors"
    save_state(path, state)
    loaded = load_state(path, model=fill)  # a pretrained model checks it (was a TypeError)
    assert loaded.memory == state.memory and loaded.source == state.source
    with pytest.raises(ValueError, match=f"{path}: .*squeeze: 'fill' -> 'by_length'"):
        load_state(path, model=tiny_memory_model("llama", squeeze="by_length"))
    with pytest.raises(ValueError, match=f"{path}: state has batch size 2"):
        load_state(path, model=_Batch3(fill))


class _Batch3:
    """A model that checks states for 3 rows (load_state passes the state's own batch size:
    the model's refusal is the file's)."""

    def __init__(self, model):
        self.model = model

    def check_state(self, state, batch_size):
        return self.model.check_state(state, batch_size + 1 if batch_size == 2 else batch_size)


def test_the_newer_fields_of_a_state_are_checked_by_name():
    model = tiny_memory_model("llama", **FILL, keep_first=1, keep_salient=2)
    state = stream(model, ids())
    assert state.salience is not None and state.layers[0].long_term.records["places"].shape[1] == 8
    x = ids()[:, :8]
    # a salience with other rows than the batch: a raw RuntimeError deep inside before
    for bad, match in (
        (state.salience[:1], r"state.salience must have shape \(2, "),
        (torch.cat([state.salience, state.salience]), r"state.salience must have shape \(2, "),
        (state.salience.float(), "state.salience must be float64"),
        (torch.full_like(state.salience, float("nan")), "state.salience must be finite"),
    ):
        with pytest.raises((ValueError, TypeError), match=match):
            model(x, state=replace(state, salience=bad))
    # place spans far outside the stream
    lt = state.layers[0].long_term
    held = lt.records["places"][..., 2] > 0
    assert bool(held.any())
    for value in (1e6, -5.0):
        places = lt.records["places"].clone()
        places[..., 0] = torch.where(held, value, places[..., 0])
        layers = (replace(state.layers[0], long_term=replace(lt, records={"places": places})),
                  *state.layers[1:])  # fmt: skip
        with pytest.raises(ValueError, match=r"\['places'\] must hold spans of token indices"):
            model(x, state=MemoryState(layers, state.window, state.source, state.salience,
                                       state.memory))  # fmt: skip
    # the window's surprisal and salience: finite and >= 0
    window = replace(state.window, surprisal=torch.full_like(state.window.surprisal, -1.0))
    with pytest.raises(ValueError, match="window.surprisal must be finite and >= 0"):
        model(x, state=replace(state, window=window))
    model(x, state=state)  # the state itself is fine


def test_a_state_the_model_returned_is_taken_back_without_a_second_check(monkeypatch):
    """The state a call returned was checked when it was made: the next call takes that very
    object back as it is; any other object (a copy by `replace`, `detach`, a file) is checked."""
    import inftyformer.hf.memory as memories

    model = tiny_memory_model("llama")
    checked = []
    check = memories.check_state
    monkeypatch.setattr(memories, "check_state", lambda *a: checked.append(1) or check(*a))
    state = model(ids()[:, :8]).state
    state = model(ids()[:, 8:16], state=state).state
    assert checked == []
    model(ids()[:, 16:24], state=replace(state))
    model(ids()[:, 16:24], state=state.detach())
    assert checked == [1, 1]
    other = tiny_memory_model("llama")  # another model of the same shapes: its states differ
    other(ids()[:, :8], state=state)
    assert checked == [1, 1, 1]
