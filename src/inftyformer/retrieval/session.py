"""A retrieval memory saved to a folder, so that a document is read once and asked many times,
or a conversation goes on after a restart (`retrieval/ask.py`, `inftyformer ask` / `chat`).

    DIR/session.json            what was read and with what: the base (its folder and weights
                                hash), the preset and settings, the document's hash and tokens,
                                the turns of a conversation, which files hold the state
    DIR/state-N.safetensors     the RetrievalState's tensors (window, sink, block ids, choice,
                                the last partial chunk of the choosing keys), N-th save
    DIR/keys-J.safetensors      the J-th full chunk of the choosing keys (written once: a full
                                chunk never changes, so a long conversation's save costs the
                                fixed-size state and at most one chunk)
    DIR/blocks/layerL.bin       the block store (`retrieval/store.py`), append-only

Every file is written whole under a temporary name and renamed (`_files.atomic_path`), and
session.json last: a save interrupted at any point leaves the previous save readable (its
state file is removed only after the new session.json names the new one). The blocks a state
refers to are never changed: the store only appends, and a document's session is asked with a
`ReadOnlyStore` (a question's blocks go to a temporary store, never to the session's files).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from .._files import atomic_path, write_atomic
from .state import CHUNK_BLOCKS, RetrievalState, StateRecord
from .store import BlockStore, store_dtype

FORMAT = 1
INFO = "session.json"
BLOCKS = "blocks"
KINDS = ("document", "chat")
# the state's tensors by name (batch first, or [L, b, …] for the window and sink)
TENSORS = ("window_k", "window_v", "window_len", "sink_k", "sink_v", "sink_len", "block_ids",
           "blocks", "selected", "chosen", "tokens")  # fmt: skip


@dataclass(frozen=True)
class ModelKey:
    """What a memory was read with: the base (its folder, `path`, and `base_weights.
    weights_hash`, `sha256`; empty when unknown), the preset's name, the settings given on top
    of it (recorded) and the resolved retrieval settings (`config`, the store's folder left
    out: what `check` compares)."""

    path: str
    sha256: str
    preset: str | None
    settings: dict[str, Any]
    config: dict[str, Any]

    @classmethod
    def of(
        cls, base_dir: str | Path | None, preset: str | None, settings: dict[str, Any], config
    ) -> ModelKey:
        from ..base_weights import weights_hash

        path = "" if base_dir is None else str(Path(base_dir).expanduser().resolve())
        sha = "" if base_dir is None else weights_hash(path)
        return cls(path, sha, preset, dict(settings), config_dict(config))

    def check(self, saved: ModelKey, where: str) -> None:
        """Refuse (ValueError naming both) a session read with another base, preset or
        settings than this key's: its memory would not be what this model would have read."""
        if saved.sha256 and self.sha256 and saved.sha256 != self.sha256:
            raise ValueError(
                f"{where} was read by the base in {saved.path} (weights sha256 "
                f"{saved.sha256[:16]}…), not by {self.path} (sha256 {self.sha256[:16]}…): "
                "give that base's folder, or another session folder"
            )
        if saved.preset != self.preset:
            raise ValueError(
                f"{where} was read with the preset {saved.preset!r}, not {self.preset!r}: "
                f"ask with --preset {saved.preset}, or give another session folder"
            )
        # the settings as the model resolved them (the same window given by the preset or by
        # --set is the same memory)
        ours, theirs = self.config, saved.config
        differ = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
        if differ:
            shown = ", ".join(
                f"{k}={theirs.get(k, 'unset')!r} (now {ours.get(k, 'unset')!r})" for k in differ
            )
            raise ValueError(
                f"{where} was read with other settings ({shown}): give the same settings, or "
                "another session folder"
            )


def config_dict(config: Any) -> dict[str, Any]:
    """The retrieval settings as JSON values (the store's folder left out: where the blocks
    live is not what was read)."""
    values = config.to_dict() if hasattr(config, "to_dict") else vars(config)
    values = {k: v for k, v in values.items() if k != "store_dir"}
    return json.loads(json.dumps(values, sort_keys=True, default=repr))


@dataclass
class SessionInfo:
    """session.json: `kind` "document" (a document read, saved before any question) or "chat"
    (a conversation, saved after every turn); `document` its text's sha256 and tokens;
    `opens` what text opens the next user turn (`retrieval/ask.py`); `turns` answered."""

    kind: str
    key: ModelKey
    tokens: int = 0  # tokens the state has read
    document: dict[str, Any] | None = None  # {"sha256", "tokens"}
    opens: str = "start"
    turns: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")


def is_session(folder: str | Path) -> bool:
    return (Path(folder) / INFO).is_file()


def read_info(folder: str | Path) -> tuple[SessionInfo, dict[str, Any]]:
    """The session's info and the raw JSON (with the files it names)."""
    path = Path(folder) / INFO
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, this version reads {FORMAT}")
        info = SessionInfo(
            kind=data["kind"], key=ModelKey(**data["key"]), tokens=int(data["tokens"]),
            document=data.get("document"), opens=data.get("opens", "start"),
            turns=int(data.get("turns", 0)), extra=dict(data.get("extra", {})),
        )  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is not a session this version reads: {err}") from None
    return info, data


def _ours(name: str) -> bool:
    """Whether a folder entry is one a session writes (or a temporary of one)."""
    name = name[1:].split(".tmp")[0] if name.startswith(".") else name
    return name in (INFO, BLOCKS) or any(
        name.startswith(prefix) and name.endswith(".safetensors") for prefix in ("state-", "keys-")
    )


def clear(folder: str | Path) -> None:
    """Empty a session folder for a new memory: session.json first (the folder is then no
    session at all, never a half-written one), then the state files and the blocks. A folder
    holding anything else is refused (a session is given a folder of its own)."""
    folder = Path(folder)
    others = (
        sorted(p.name for p in folder.iterdir() if not _ours(p.name)) if folder.is_dir() else []
    )
    if others:
        raise ValueError(
            f"{folder} holds files a session does not write ({', '.join(others[:3])}"
            f"{', …' if len(others) > 3 else ''}): give a new or empty folder for the session"
        )
    (folder / INFO).unlink(missing_ok=True)
    for pattern in ("state-*.safetensors", "keys-*.safetensors"):
        for path in folder.glob(pattern):
            path.unlink()
    shutil.rmtree(folder / BLOCKS, ignore_errors=True)


def blocks_folder(folder: str | Path) -> str:
    return str(Path(folder) / BLOCKS)


def save_session(folder: str | Path, state: RetrievalState, info: SessionInfo) -> RetrievalState:
    """Save `state` (one row) and `info` to `folder` (module doc). The state's store is the
    folder's own (`blocks_folder`), or its blocks are copied there (the folder emptied first)
    and the state returned reads them there (the next save copies nothing)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if state.batch_size != 1:
        raise ValueError(f"a session holds one stream, the state has {state.batch_size} rows")
    if state.continuous is not None:
        raise ValueError("a session keeps the blocks, not a continuous memory: save the state "
                         "of a retrieval without `memory`")  # fmt: skip
    old = read_info(folder)[1] if is_session(folder) else {}
    store = state.store
    count = int(state.block_ids.max()) + 1 if state.block_ids.numel() else 0  # the state's
    if not _owns(folder, store):  # a memory read elsewhere: a new session here
        clear(folder)
        old = {}
        _copy_store(store, folder / BLOCKS, count)
        store = BlockStore.reopen(store.layers, *store.shape[1:], blocks_folder(folder), count,
                                  store.dtype)  # fmt: skip
    elif isinstance(store, ReadOnlyStore) and count > store.base_count:
        raise ValueError(f"a state read from session {folder} is saved to it: read it anew")
        state = replace(state, store=store)
    chunk = CHUNK_BLOCKS * state.store.shape[2]  # tokens per chunk of keys
    full = [c for c in state.keys if c.shape[1] == chunk]
    if len(full) < len(state.keys) - 1:
        raise ValueError("the choosing keys are not in chunks of CHUNK_BLOCKS blocks")
    for j, keys in enumerate(full):  # a full chunk never changes: written once
        path = folder / f"keys-{j}.safetensors"
        if j >= int(old.get("key_chunks", 0)) or not path.is_file():
            with atomic_path(path) as tmp:
                save_file({"keys": keys.detach().cpu().contiguous()}, str(tmp))
    tensors = {name: getattr(state, name).detach().cpu().contiguous() for name in TENSORS}
    if len(state.keys) > len(full):
        tensors["keys_tail"] = state.keys[-1].detach().cpu().contiguous()
    if state.question is not None:
        tensors["question"] = state.question.detach().cpu().contiguous()
    saves = int(old.get("saves", 0)) + 1
    name = f"state-{saves}.safetensors"
    with atomic_path(folder / name) as tmp:
        save_file(tensors, str(tmp))
    data = {
        "format": FORMAT, "kind": info.kind, "key": dataclasses.asdict(info.key),
        "tokens": info.tokens, "document": info.document, "opens": info.opens,
        "turns": info.turns, "extra": info.extra, "saves": saves, "state": name,
        "key_chunks": len(full), "blocks": count, "block_bytes": state.store.record,
        "layers": state.store.layers,
    }  # fmt: skip
    write_atomic(folder / INFO, json.dumps(data, indent=1, sort_keys=True) + "\n", durable=True)
    for path in folder.glob("state-*.safetensors"):  # the previous saves, now unnamed
        if path.name != name:
            path.unlink(missing_ok=True)
    for path in folder.glob("keys-*.safetensors"):
        index = path.name[len("keys-") : -len(".safetensors")]
        if index.isdigit() and int(index) >= len(full):
            path.unlink(missing_ok=True)
    return state


def _owns(folder: Path, store: BlockStore) -> bool:
    target = folder / BLOCKS
    return target.exists() and target.resolve() == Path(store.folder).resolve()


def _copy_store(store: BlockStore, target: Path, count: int) -> None:
    """The first `count` blocks of `store` into `target` (a new folder)."""
    with atomic_path(target) as tmp:
        tmp.mkdir()
        for layer in store.layers:
            source = Path(store.folder) / f"layer{layer}.bin"
            with open(source, "rb") as f, open(tmp / source.name, "wb") as out:
                left = count * store.record
                while left:
                    data = f.read(min(left, 2**24))
                    if not data:
                        raise ValueError(f"{source} ends before its {count} blocks")
                    out.write(data)
                    left -= len(data)


class ReadOnlyStore:
    """A saved store read as it is and never written: its first `count` blocks from `saved`,
    the blocks appended after them (a question's and its answer's) in a temporary store of
    their own. So a session's files do not change while it is asked, and two processes may ask
    the same session at once."""

    def __init__(self, saved: BlockStore, count: int) -> None:
        self.saved, self.base_count = saved, count
        self.layers, self.shape, self.record = saved.layers, saved.shape, saved.record
        self.dtype = saved.dtype
        self.folder = saved.folder
        self.scratch: BlockStore | None = None

    @property
    def count(self) -> int:
        return self.base_count + (self.scratch.count if self.scratch is not None else 0)

    def append(self, blocks: dict[int, torch.Tensor]) -> torch.Tensor:
        if self.scratch is None:
            self.scratch = BlockStore(self.layers, *self.shape[1:], dtype=self.dtype)
        return self.scratch.append(blocks) + self.base_count

    def read(self, layer: int, ids: torch.Tensor, keys_only: bool = False) -> torch.Tensor:
        old = ids < self.base_count
        if bool(old.all()):
            return self.saved.read(layer, ids, keys_only)
        shape = self.shape[1:] if keys_only else self.shape
        out = torch.empty(*ids.shape, *shape, dtype=self.dtype)
        out[old] = self.saved.read(layer, ids[old], keys_only)
        out[~old] = self.scratch.read(layer, ids[~old] - self.base_count, keys_only)
        return out

    def disk_bytes(self) -> int:
        return self.count * self.record * len(self.layers)

    def close(self) -> None:
        self.saved.close()
        if self.scratch is not None:
            self.scratch.close()


def load_session(folder: str | Path, model, key: ModelKey | None = None, read_only=False):
    """(state, info): the session in `folder` for `model` (a RetrievalLM), refused when `key`
    (what this model was built with) is not the session's (`ModelKey.check`). `read_only`:
    its block files are never written (`ReadOnlyStore`: what is stored after the saved blocks
    goes to a temporary store)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    info, data = read_info(folder)
    if key is not None:
        key.check(info.key, f"session {folder}")
    p = model._param()
    try:
        tensors = load_file(str(folder / data["state"]), device=str(p.device))
        keys = [
            load_file(str(folder / f"keys-{j}.safetensors"), device=str(p.device))["keys"]
            for j in range(int(data["key_chunks"]))
        ]
    except (OSError, KeyError, ValueError) as err:
        raise ValueError(f"session {folder}: its state cannot be read: {err}") from None
    if "keys_tail" in tensors:
        keys.append(tensors.pop("keys_tail"))
    question = tensors.pop("question", None)
    missing = [name for name in TENSORS if name not in tensors]
    if missing:
        raise ValueError(f"session {folder}: its state lacks {', '.join(missing)}")
    c = model.config
    L, H, d, B = model.num_layers, model.kv_heads, model.head_dim, c.block_size
    expected = {
        "window_k": (L, 1, H, c.window + B - 1, d),
        "sink_k": (L, 1, H, c.sink_blocks * B, d),
    }
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise ValueError(
                f"session {folder}: its {name} is {tuple(tensors[name].shape)}, this model's "
                f"{shape}: another base or settings"
            )
    dtype = store_dtype(next(model.base.parameters()).dtype)
    store = BlockStore.reopen(model.retrieving, H, B, d, blocks_folder(folder), int(data["blocks"]),
                              dtype)  # fmt: skip
    if read_only:
        store = ReadOnlyStore(store, int(data["blocks"]))
    state = RetrievalState(**tensors, keys=tuple(keys), store=store, question=question,
                           record=StateRecord.of(model))  # fmt: skip
    return state, info


__all__ = [
    "BLOCKS",
    "FORMAT",
    "INFO",
    "ModelKey",
    "ReadOnlyStore",
    "SessionInfo",
    "blocks_folder",
    "clear",
    "config_dict",
    "is_session",
    "load_session",
    "read_info",
    "save_session",
]
