"""The exact keys and values of a retrieval memory's past blocks, on disk (`retrieval/model.py`).

A stream's tokens leave the short-term window in blocks of B; a block's keys (before their
rotary positions) and values are written once, for every layer that retrieves, and read back
when a call selects the block. They live in one file per layer, appended block after block, so
the process's memory does not grow with the stream: what is read is copied out with `os.pread`
(the operating system's page cache holds the files, not the process). A block is never changed
once written, so a state that refers to blocks 0 … n − 1 stays valid while the store grows.

    record of one block in layer l's file:  [2, H_kv, B, d] in the store's dtype (keys, values)

The store's dtype follows the base's (`store_dtype`): bfloat16 for a bfloat16 base (float16
would turn values past 65,504 into inf), float16 otherwise (the disk use halves for a float32
base; a value past float16's range is refused by name, never stored as inf). Disk use per token:
2 · H_kv · d · 2 bytes per retrieving layer (SmolLM2-135M: 768 bytes per layer; 15 layers:
11.5 KB per token, 0.75 GB per 64K tokens).

Each store owns a folder of its own, `inftyformer-blocks-PID-XXXX` (PID: its process) in the
temporary folder or in `store_dir`, locked (`flock` on `.lock`) while the store is open and
removed when it closes: two streams given one `store_dir` never share files. A killed process
leaves its folder; the next store made in that place removes the folders whose process is gone
and whose lock is free (`_files.remove_stale_folders`). Appends are whole or nothing (a short
write is continued, a failing one raises naming the file and leaves no half block recorded)
and safe from several threads; a closed store refuses reads and appends.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import threading
import weakref
from pathlib import Path

import torch

from .._files import naming, remove_stale_folders

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: folders of their own, unlocked
    fcntl = None

PREFIX = "inftyformer-blocks-"
LOCK = ".lock"
FLOAT16_MAX = float(torch.finfo(torch.float16).max)


def store_dtype(base_dtype: torch.dtype) -> torch.dtype:
    """The dtype a base's blocks are stored in (module doc)."""
    return torch.bfloat16 if base_dtype == torch.bfloat16 else torch.float16


def narrowed(x: torch.Tensor, dtype: torch.dtype, what: str) -> torch.Tensor:
    """`x` in `dtype`; a ValueError naming `what` when float16 cannot hold it."""
    if dtype == torch.float16 and x.dtype != torch.float16:
        # (one reduction; NaN passes it: a NaN stays NaN in any dtype)
        top = float(x.detach().abs().amax()) if x.numel() else 0.0
        if top > FLOAT16_MAX:
            raise ValueError(
                f"{what} holds {top:.4g}, past float16's range (±{FLOAT16_MAX:g}) the store "
                f"keeps a {x.dtype} base's blocks in: it would read back as inf; run the base "
                "in bfloat16 (its blocks are stored in bfloat16)"
            )
    return x.detach().to(dtype)


class ClosedStoreError(ValueError):
    """A read or append on a closed store (its file descriptors may belong to other files)."""


class BlockStore:
    """Append-only block files of `layers` (their indices), records [2, heads, B, d] of
    `dtype`, in a folder of their own inside `folder` (None: the temporary folder)."""

    def __init__(
        self,
        layers: list[int],
        heads: int,
        block: int,
        dim: int,
        folder: str | os.PathLike | None = None,
        dtype: torch.dtype = torch.float16,
        *,
        existing: bool = False,
    ) -> None:
        """`existing`: `folder` is a store's own folder, kept when it closes (a saved
        session's, `reopen`; the session guards it), not a parent to make a folder of this
        store's in."""
        self.layers = list(layers)
        self.shape = (2, heads, block, dim)
        self.dtype = dtype
        self.record = 2 * heads * block * dim * torch.empty(0, dtype=dtype).element_size()
        if existing:
            self.folder, owned = Path(str(folder)), None
            self.folder.mkdir(parents=True, exist_ok=True)
        else:
            parent = Path(tempfile.gettempdir() if folder is None else folder)
            parent.mkdir(parents=True, exist_ok=True)
            remove_stale_folders(parent, PREFIX, _lock_free)  # what killed processes left
            self.folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=parent))
            owned = self.folder
        fds: list[int] = []
        self._fds = {}
        try:  # a failure half way (no descriptors left): nothing stays open, the folder goes
            fds.append(os.open(self.folder / LOCK, os.O_RDWR | os.O_CREAT, 0o600))
            if fcntl is not None and not existing:  # (a session's folder: the session's)
                try:
                    fcntl.flock(fds[0], fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    pass  # a file system without locks: the pid in the name still guards it
            for layer in self.layers:
                self._fds[layer] = os.open(self._path(layer), os.O_RDWR | os.O_CREAT, 0o600)
                fds.append(self._fds[layer])
        except BaseException:
            _close(fds, owned)
            raise
        self.count = 0  # blocks written (ids 0 … count − 1)
        self._lock = threading.Lock()  # an append's ids and writes, a read, a close: one at a time
        self._finalizer = weakref.finalize(self, _close, fds, owned)

    def _path(self, layer: int) -> Path:
        return self.folder / f"layer{layer}.bin"

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def _check_open(self, doing: str) -> None:
        if self.closed:
            raise ClosedStoreError(
                f"cannot {doing}: the block store {self.folder} is closed (its stream's state "
                "ended with state.store.close()); start the stream again with a new state"
            )

    @classmethod
    def reopen(
        cls,
        layers: list[int],
        heads: int,
        block: int,
        dim: int,
        folder: str,
        count: int,
        dtype: torch.dtype = torch.float16,
    ) -> BlockStore:
        """The store of an existing `folder` whose first `count` blocks a saved state refers to
        (`retrieval/session.py`); later blocks are written over from `count` on. The folder is
        kept when the store closes."""
        store = cls(layers, heads, block, dim, folder, dtype, existing=True)
        for layer in store.layers:
            size = os.fstat(store._fds[layer]).st_size
            if size < count * store.record:
                store.close()
                raise ValueError(
                    f"{store.folder}/layer{layer}.bin holds {size // store.record} blocks of "
                    f"{store.record} bytes, fewer than the {count} the saved state refers to"
                )
        store.count = count
        return store

    def append(self, blocks: dict[int, torch.Tensor]) -> torch.Tensor:
        """Write n blocks of each layer (`blocks[layer]` [n, 2, heads, B, d]); returns their ids
        int64 [n]. Whole or nothing: on an error no file keeps part of them."""
        n = next(iter(blocks.values())).shape[0]
        data = {  # every layer converted (and its range checked) before anything is written
            layer: narrowed(blocks[layer], self.dtype, f"layer {layer}'s block keys/values")
            .to("cpu")
            .contiguous()
            for layer in self.layers
        }
        with self._lock:
            self._check_open("append blocks")
            start = self.count * self.record
            try:
                for layer in self.layers:
                    raw = memoryview(data[layer].view(-1).view(torch.uint8).numpy())
                    with naming(self._path(layer)):
                        _write_all(self._fds[layer], raw, start)
            except BaseException:
                for layer in self.layers:  # back to the blocks recorded
                    try:
                        os.ftruncate(self._fds[layer], start)
                    except OSError:
                        pass
                raise
            ids = torch.arange(self.count, self.count + n, dtype=torch.int64)
            self.count += n
        return ids

    def read(self, layer: int, ids: torch.Tensor, keys_only: bool = False) -> torch.Tensor:
        """The blocks `ids` (int64, any shape) of `layer` → [*ids.shape, 2, heads, B, d] in the
        store's dtype; with `keys_only`, their keys alone [*ids.shape, heads, B, d] (the first
        half of each record: half the bytes read)."""
        flat = ids.reshape(-1).tolist()
        shape = self.shape[1:] if keys_only else self.shape
        size = self.record // 2 if keys_only else self.record
        out = torch.empty(len(flat), *shape, dtype=self.dtype)
        raw = out.view(torch.uint8).reshape(len(flat), size).numpy()  # [n, size] bytes
        with self._lock:
            self._check_open("read blocks")
            if flat and not 0 <= min(flat) <= max(flat) < self.count:
                raise IndexError(f"block ids {ids.tolist()} outside the {self.count} stored")
            fd = self._fds[layer]
            for i, block in enumerate(flat):  # one contiguous record each
                got = os.preadv(fd, [raw[i]], block * self.record)
                if got != size:
                    raise OSError(errno.EIO, f"block {block}: read {got} of {size} bytes",
                                  str(self._path(layer)))  # fmt: skip
        return out.view(*ids.shape, *shape)

    def disk_bytes(self) -> int:
        return self.count * self.record * len(self.layers)

    def close(self) -> None:
        """Close the files and remove the store's folder (reads and appends refused after)."""
        with self._lock:
            self._finalizer()


def _write_all(fd: int, raw: memoryview, offset: int) -> None:
    """`raw` at `offset`, however many calls it takes; an OSError when a call writes nothing
    (a short write is continued: the next call says why it cannot, e.g. Errno 27)."""
    done = 0
    while done < len(raw):
        wrote = os.pwrite(fd, raw[done:], offset + done)
        if wrote <= 0:
            raise OSError(errno.EIO, f"a write stopped after {done} of {len(raw)} bytes")
        done += wrote


def _lock_free(folder: Path) -> bool:
    """Whether no process holds `folder`'s lock (a store of a process elsewhere, e.g. another
    container sharing the folder, keeps it)."""
    if fcntl is None:
        return True
    try:
        fd = os.open(folder / LOCK, os.O_RDWR)
    except OSError:
        return True  # no lock file: made before the lock, or its store never finished opening
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)  # frees the lock taken
    return True


def _close(fds: list[int], folder: Path | None) -> None:
    if folder is not None:  # a folder of the store's own (not a session's)
        shutil.rmtree(folder, ignore_errors=True)  # removed while still locked
    for fd in reversed(fds):  # the lock's last
        try:
            os.close(fd)
        except OSError:
            pass


__all__ = ["BlockStore", "ClosedStoreError", "PREFIX", "narrowed", "store_dtype"]
