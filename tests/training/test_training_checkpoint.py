"""Checkpoint files: round trip, atomic commit, corruption detection, optimizer and RNG states."""

import json
import os
import random

import numpy as np
import pytest
import torch

from inftyformer.training.checkpoint import (
    CheckpointError,
    checkpoint_exists,
    flatten_optimizer,
    load_checkpoint,
    resolve_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
    unflatten_optimizer,
)


def _tensors(scale=1.0):
    return {"model/w": torch.arange(6.0).view(2, 3) * scale, "model/b": torch.ones(3) * scale}


def test_round_trip_and_path_forms(tmp_path):
    save_checkpoint(tmp_path, "last", _tensors(), {"step": 3, "x": [1, 2]})
    for form in ("last", "last.safetensors", "last.json", "last.manifest.json"):
        ck = load_checkpoint(tmp_path / form)
        assert ck.meta["step"] == 3
        assert torch.equal(ck.section("model")["w"], _tensors()["model/w"])
    assert resolve_checkpoint(tmp_path) == (tmp_path, "last")  # no best -> last
    save_checkpoint(tmp_path, "best", _tensors(2.0), {"step": 2})
    assert resolve_checkpoint(tmp_path) == (tmp_path, "best")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "best.json",
        "best.manifest.json",
        "best.safetensors",
        "last.json",
        "last.manifest.json",
        "last.safetensors",
    ]


def test_tied_weights_are_saved(tmp_path):
    w = torch.randn(4, 3)
    save_checkpoint(tmp_path, "c", {"a": w, "b": w}, {})
    ck = load_checkpoint(tmp_path / "c")
    assert torch.equal(ck.tensors["a"], ck.tensors["b"])


@pytest.mark.parametrize("target", ["safetensors", "json"])
def test_truncated_or_corrupt_files_are_refused(tmp_path, target):
    save_checkpoint(tmp_path, "last", _tensors(), {"step": 1})
    path = tmp_path / f"last.{target}"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(tmp_path / "last")
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, one bit flipped
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(tmp_path / "last")


def test_missing_or_garbage_manifest(tmp_path):
    with pytest.raises(CheckpointError, match="nothing does not exist"):
        load_checkpoint(tmp_path / "nothing")
    (tmp_path / "nothing.safetensors").write_bytes(b"")  # the data without its manifest
    with pytest.raises(CheckpointError, match="manifest not found"):
        load_checkpoint(tmp_path / "nothing.safetensors")
    (tmp_path / "x.manifest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(tmp_path / "x")
    (tmp_path / "y.manifest.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(CheckpointError, match="not an inftyformer checkpoint"):
        load_checkpoint(tmp_path / "y")
    with pytest.raises(CheckpointError, match="no checkpoint"):
        resolve_checkpoint(tmp_path)


def test_a_crash_at_any_point_of_a_save_leaves_a_valid_checkpoint(tmp_path, monkeypatch):
    """Simulate a kill after each file operation of a save: the checkpoint read back is always
    either the old one or the new one, whole."""
    import inftyformer.training.checkpoint as ck

    save_checkpoint(tmp_path, "last", _tensors(1.0), {"step": 1})
    real_replace, real_write = os.replace, ck._write_bytes
    for crash_after in range(1, 8):
        ops = {"n": 0}

        class Killed(Exception):
            pass

        def counting(fn, ops=ops, crash_after=crash_after):
            def wrapped(*args, **kwargs):
                ops["n"] += 1
                if ops["n"] > crash_after:
                    raise Killed
                return fn(*args, **kwargs)

            return wrapped

        monkeypatch.setattr(ck.os, "replace", counting(real_replace))
        monkeypatch.setattr(ck, "_write_bytes", counting(real_write))
        try:
            save_checkpoint(tmp_path, "last", _tensors(2.0), {"step": 2})
            completed = True
        except Killed:
            completed = False
        monkeypatch.setattr(ck.os, "replace", real_replace)
        monkeypatch.setattr(ck, "_write_bytes", real_write)
        got = load_checkpoint(tmp_path / "last")
        step = got.meta["step"]
        assert step in (1, 2)
        assert torch.equal(got.tensors["model/w"], _tensors(float(step))["model/w"])
        if completed:
            assert step == 2
        # the next complete save always wins, and restores the plain layout
        save_checkpoint(tmp_path, "last", _tensors(1.0), {"step": 1})
        assert load_checkpoint(tmp_path / "last").meta["step"] == 1
    assert checkpoint_exists(tmp_path, "last")


def test_optimizer_state_round_trip():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    tensors, info = flatten_optimizer(opt.state_dict())
    info = json.loads(json.dumps(info))  # must survive JSON
    opt2 = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt2.load_state_dict(unflatten_optimizer(tensors, info))
    a, b = opt.state_dict(), opt2.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for idx in a["state"]:
        for key in a["state"][idx]:
            assert torch.equal(a["state"][idx][key], b["state"][idx][key])


def _draw(gen, n):
    legacy = np.random.rand()  # noqa: NPY002 - the legacy global RNG is what is saved
    return random.random(), legacy, torch.rand(n), torch.rand(n, generator=gen)


def test_rng_states_round_trip_through_json():
    gen = torch.Generator().manual_seed(5)
    saved = json.loads(json.dumps(rng_state({"g": gen})))
    expected = _draw(gen, 2)
    _draw(gen, 3)
    set_rng_state(saved, {"g": gen})
    got = _draw(gen, 2)
    assert got[0] == expected[0] and got[1] == expected[1]
    assert torch.equal(got[2], expected[2]) and torch.equal(got[3], expected[3])


# ---------------------------------------------------------------- manifests of the wrong shape
@pytest.mark.parametrize(
    "files, match",
    [
        (None, "'files' must be an object"),
        ([], "'files' must be an object"),
        ({"tensors": "x", "meta": {}}, r"files\.tensors must be an object"),
        ({"tensors": {"sha256": "a", "bytes": "12"}, "meta": {}}, r"files\.tensors"),
        ({"tensors": {"sha256": "a", "bytes": 1}}, r"files\.meta must be an object"),
    ],
)
def test_a_manifest_of_the_wrong_json_shape_is_refused_by_name(tmp_path, files, match):
    manifest = {"format": "inftyformer-checkpoint", "version": 1, "files": files}
    (tmp_path / "c.manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(tmp_path / "c")


# ---------------------------------------------------------------- what a kill leaves behind
def _dot_files(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def test_stale_temporary_files_are_cleaned_and_committed_saves_finished(tmp_path, monkeypatch):
    import inftyformer.training.checkpoint as ck

    save_checkpoint(tmp_path, "last", _tensors(1.0), {"step": 1})
    # a kill while writing the manifest, and one before the commit: leftovers, no new checkpoint
    (tmp_path / ".last.manifest.json.tmp4242").write_text('{"half": ')
    (tmp_path / ".last.safetensors.pending").write_bytes(b"partial")
    (tmp_path / ".best.json.pending").write_bytes(b"{")
    removed = ck.clean_stale_files(tmp_path)
    assert sorted(p.name for p in removed) == [
        ".best.json.pending", ".last.manifest.json.tmp4242", ".last.safetensors.pending",
    ]  # fmt: skip
    assert _dot_files(tmp_path) == [] and load_checkpoint(tmp_path / "last").meta["step"] == 1

    # a kill after the commit point (manifest replaced) but before the data files were renamed
    real_replace = os.replace
    calls = {"n": 0}

    def killed_after_commit(src, dst):
        calls["n"] += 1
        if calls["n"] > 1:  # the first replace is the manifest's commit
            raise KeyboardInterrupt
        return real_replace(src, dst)

    monkeypatch.setattr(ck.os, "replace", killed_after_commit)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, "last", _tensors(2.0), {"step": 2})
    monkeypatch.setattr(ck.os, "replace", real_replace)
    assert _dot_files(tmp_path)  # pending data files of the committed save
    ck.clean_stale_files(tmp_path)
    assert _dot_files(tmp_path) == []
    got = load_checkpoint(tmp_path / "last")
    assert got.meta["step"] == 2 and torch.equal(got.tensors["model/w"], _tensors(2.0)["model/w"])
