"""Checkpoints: tensors in safetensors, everything else in JSON, committed by a manifest.

A checkpoint called `name` in a directory is three files::

    name.safetensors     model weights, optimizer moments, any carried stream state (tensors only)
    name.json            model config, train config, step, schedule, data position, RNG states ...
    name.manifest.json   sha256 and size of the two files above; written last

Saving writes the two data files under pending names, then atomically replaces the manifest (the
commit point), then renames the pending files into place. Loading reads the manifest and accepts a
data file only if its sha256 matches, looking at the final name and at the pending name. So a
process killed at any instant (even by SIGKILL) leaves either the previous checkpoint or the new
one readable, never a mixture, and a truncated or corrupted file is reported, never loaded.
Nothing is unpickled: safetensors and JSON only.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from .._files import fsync_dir, naming, write_atomic

FORMAT = "inftyformer-checkpoint"
VERSION = 1
TENSORS_SUFFIX = ".safetensors"
META_SUFFIX = ".json"
MANIFEST_SUFFIX = ".manifest.json"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupt or does not fit what it is loaded into."""


@dataclass
class Checkpoint:
    """What a checkpoint holds once read: flat tensors and the JSON metadata."""

    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]
    path: Path  # the manifest

    def section(self, prefix: str) -> dict[str, torch.Tensor]:
        """The tensors saved under `prefix/`, with the prefix removed."""
        p = prefix + "/"
        return {k[len(p) :]: v for k, v in self.tensors.items() if k.startswith(p)}


# --------------------------------------------------------------------------- file names
def _paths(directory: Path, name: str) -> dict[str, Path]:
    return {
        "tensors": directory / f"{name}{TENSORS_SUFFIX}",
        "meta": directory / f"{name}{META_SUFFIX}",
        "manifest": directory / f"{name}{MANIFEST_SUFFIX}",
    }


def _pending(path: Path) -> Path:
    return path.with_name(f".{path.name}.pending")


def resolve_checkpoint(path: str | os.PathLike[str]) -> tuple[Path, str]:
    """(directory, name) of the checkpoint that `path` designates.

    Accepts `dir/name.safetensors`, `dir/name.json`, `dir/name.manifest.json`, `dir/name`, or a
    run directory (then `best` if it exists, else `last`).
    """
    p = Path(path).expanduser()
    if p.is_dir():
        for name in ("best", "last"):
            if (p / f"{name}{MANIFEST_SUFFIX}").exists():
                return p, name
        raise CheckpointError(f"no checkpoint (best or last) in directory {p}")
    text = p.name
    for suffix in (MANIFEST_SUFFIX, TENSORS_SUFFIX, META_SUFFIX):
        if text.endswith(suffix):
            return p.parent, text[: -len(suffix)]
    return p.parent, text


def checkpoint_exists(directory: str | os.PathLike[str], name: str) -> bool:
    return _paths(Path(directory), name)["manifest"].exists()


# --------------------------------------------------------------------------- low-level I/O
def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_bytes(path: Path, data: bytes, shown: Path) -> None:
    """Write `data` to `path` durably (fsync); a failed write leaves no partial file and its
    error names `shown` (the checkpoint file `path` stands for)."""
    try:
        with naming(shown), open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _read_manifest(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise CheckpointError(f"checkpoint manifest not found: {path} (no complete checkpoint)")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"checkpoint manifest {path} is unreadable: {err}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an inftyformer checkpoint manifest")
    if manifest.get("version") != VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format version {manifest.get('version')} is not supported "
            f"(this code reads version {VERSION})"
        )
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise CheckpointError(f"{path}: the manifest's 'files' must be an object listing the files")
    for role in ("tensors", "meta"):
        entry = files.get(role)
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("sha256"), str)
            and isinstance(entry.get("bytes"), int)
        ):
            raise CheckpointError(
                f"{path}: the manifest's files.{role} must be an object with 'sha256' (text) and "
                f"'bytes' (an integer), got {entry!r:.80}"
            )
    return manifest


def _find_valid(final: Path, entry: dict[str, Any]) -> tuple[Path, bytes] | None:
    """The file (final or pending name) whose content matches the manifest entry."""
    for candidate in (final, _pending(final)):
        try:
            data = candidate.read_bytes()
        except OSError:
            continue
        if len(data) == entry.get("bytes") and _sha256(data) == entry.get("sha256"):
            return candidate, data
    return None


def _recover(paths: dict[str, Path]) -> None:
    """Finish a save that was interrupted after its manifest was committed."""
    if not paths["manifest"].exists():
        return
    try:
        manifest = _read_manifest(paths["manifest"])
    except CheckpointError:
        return
    for role in ("tensors", "meta"):
        entry = manifest.get("files", {}).get(role, {})
        found = _find_valid(paths[role], entry)
        if found is not None and found[0] != paths[role]:
            os.replace(found[0], paths[role])


def clean_stale_files(directory: str | os.PathLike[str]) -> list[Path]:
    """Tidy a run directory after a kill: finish the saves that were committed (their manifest
    written) but not renamed into place, then remove what a killed save left behind — temporary
    manifests (`.NAME.manifest.json.tmpPID`) and pending data files (`.NAME.*.pending`) that no
    committed manifest needs any more. Only the process that writes checkpoints calls this, at
    the start of a run, when no save is under way. Returns the files removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    for manifest in directory.glob(f"*{MANIFEST_SUFFIX}"):
        if not manifest.name.startswith("."):
            _recover(_paths(directory, manifest.name[: -len(MANIFEST_SUFFIX)]))
    removed = []
    for stale in (
        *directory.glob(f".*{MANIFEST_SUFFIX}.tmp*"),
        *directory.glob(f".*{TENSORS_SUFFIX}.pending"),
        *directory.glob(f".*{META_SUFFIX}.pending"),
    ):
        try:
            stale.unlink()
            removed.append(stale)
        except FileNotFoundError:
            pass
    return removed


# --------------------------------------------------------------------------- save / load
def save_checkpoint(
    directory: str | os.PathLike[str],
    name: str,
    tensors: dict[str, torch.Tensor],
    meta: dict[str, Any],
) -> Path:
    """Write checkpoint `name` in `directory` (see the module docstring); returns the manifest."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = _paths(directory, name)
    _recover(paths)
    # independent contiguous CPU copies: safetensors refuses shared storage (tied weights)
    flat = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    blobs = {
        "tensors": st_save(flat, metadata={"format": FORMAT}),
        "meta": json.dumps(meta, indent=1, sort_keys=True).encode(),
    }
    for role, data in blobs.items():
        _write_bytes(_pending(paths[role]), data, paths[role])
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "name": name,
        "step": meta.get("step"),
        "files": {
            role: {"file": paths[role].name, "sha256": _sha256(data), "bytes": len(data)}
            for role, data in blobs.items()
        },
    }
    write_atomic(paths["manifest"], json.dumps(manifest, indent=1).encode(), durable=True)  # commit
    for role in blobs:
        os.replace(_pending(paths[role]), paths[role])
    fsync_dir(directory)
    return paths["manifest"]


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read and verify the checkpoint designated by `path` (see :func:`resolve_checkpoint`)."""
    directory, name = resolve_checkpoint(path)
    paths = _paths(directory, name)
    given = Path(path).expanduser()
    if not given.exists() and not paths["manifest"].exists():
        raise CheckpointError(_no_such_path(given))
    manifest = _read_manifest(paths["manifest"])
    files = manifest["files"]
    data: dict[str, bytes] = {}
    for role in ("tensors", "meta"):
        found = _find_valid(paths[role], files.get(role, {}))
        if found is None:
            raise CheckpointError(
                f"checkpoint file {paths[role]} is missing, truncated or corrupt "
                "(its size or sha256 does not match the manifest)"
            )
        data[role] = found[1]
    try:
        tensors = st_load(data["tensors"])
        meta = json.loads(data["meta"])
    except Exception as err:  # noqa: BLE001 - any decoding failure is a corrupt checkpoint
        raise CheckpointError(f"checkpoint {directory / name} cannot be decoded: {err}") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{paths['meta']}: metadata must be a JSON object")
    return Checkpoint(tensors=tensors, meta=meta, path=paths["manifest"])


def _no_such_path(path: Path) -> str:
    """'runs/lm-infy does not exist (did you mean runs/lm-infty?)': a mistyped run directory
    is named as such, not as a missing manifest file."""
    import difflib

    text = f"{path} does not exist"
    parent = path.parent
    if path.name in ("best", "last") and parent.is_dir():
        return f"{parent} holds no checkpoint (no complete '{path.name}' saved there)"
    if not parent.is_dir():
        return f"{text} ({parent} does not exist either)"
    names = [p.name for p in parent.iterdir() if p.is_dir() or p.name.endswith(MANIFEST_SUFFIX)]
    names = [n[: -len(MANIFEST_SUFFIX)] if n.endswith(MANIFEST_SUFFIX) else n for n in names]
    close = difflib.get_close_matches(path.name, sorted(set(names)), n=3, cutoff=0.6)
    if close:
        return f"{text} (did you mean {' or '.join(str(parent / n) for n in close)}?)"
    return f"{text}: give a run directory (as --out-dir was in training) or a checkpoint file"


# --------------------------------------------------------------------------- optimizer
def flatten_optimizer(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split `optimizer.state_dict()` into tensors (per-parameter state) and JSON (the rest)."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, per_param in state["state"].items():
        for key, value in per_param.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{idx}/{key}"] = value
            else:
                scalars.setdefault(str(idx), {})[key] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def unflatten_optimizer(tensors: dict[str, torch.Tensor], info: dict[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`flatten_optimizer`."""
    per_param: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        idx, name = key.split("/", 1)
        per_param.setdefault(int(idx), {})[name] = value
    for idx, values in info.get("scalars", {}).items():
        per_param.setdefault(int(idx), {}).update(values)
    groups = []
    for group in info["param_groups"]:
        g = dict(group)
        for key in ("betas",):
            if isinstance(g.get(key), list):
                g[key] = tuple(g[key])
        groups.append(g)
    return {"state": per_param, "param_groups": groups}


# --------------------------------------------------------------------------- RNG states
def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def _unb64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def rng_state(generators: dict[str, torch.Generator] | None = None) -> dict[str, Any]:
    """Every random state the training loop depends on, JSON-encodable."""
    py = random.getstate()
    np_state = np.random.get_state()  # noqa: NPY002 - the legacy global RNG
    out: dict[str, Any] = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [
            np_state[0],
            np_state[1].tolist(),
            int(np_state[2]),
            int(np_state[3]),
            float(np_state[4]),
        ],
        "torch": _b64(torch.get_rng_state()),
        "generators": {k: _b64(g.get_state()) for k, g in (generators or {}).items()},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return out


def set_rng_state(
    state: dict[str, Any], generators: dict[str, torch.Generator] | None = None
) -> None:
    """Restore what :func:`rng_state` returned."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    keys_arr = np.asarray(keys, dtype=np.uint32)
    np.random.set_state((kind, keys_arr, pos, has_gauss, cached))  # noqa: NPY002
    torch.set_rng_state(_unb64(state["torch"]))
    for key, gen in (generators or {}).items():
        if key in state.get("generators", {}):
            gen.set_state(_unb64(state["generators"][key]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]])


__all__ = [
    "Checkpoint",
    "CheckpointError",
    "checkpoint_exists",
    "clean_stale_files",
    "flatten_optimizer",
    "load_checkpoint",
    "resolve_checkpoint",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
    "unflatten_optimizer",
]
