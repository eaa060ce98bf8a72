"""The exact keys and values of a retrieval memory's past blocks, on disk (`retrieval.py`).

A stream's tokens leave the short-term window in blocks of B; a block's keys (before their
rotary positions) and values are written once, for every layer that retrieves, and read back
when a call selects the block. They live in one file per layer, appended block after block, so
the process's memory does not grow with the stream: what is read is copied out with `os.pread`
(the operating system's page cache holds the files, not the process). A block is never changed
once written, so a state that refers to blocks 0 … n − 1 stays valid while the store grows.

    record of one block in layer l's file:  [2, H_kv, B, d] float16  (keys, then values)

Disk use per token: 2 · H_kv · d · 2 bytes per retrieving layer (SmolLM2-135M: 768 bytes per
layer; 15 layers: 11.5 KB per token, 0.75 GB per 64K tokens).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from pathlib import Path

import numpy as np
import torch

DTYPE = np.float16


class BlockStore:
    """Append-only block files of `layers` (their indices), records [2, heads, B, d]."""

    def __init__(
        self, layers: list[int], heads: int, block: int, dim: int, folder: str | None = None
    ) -> None:
        self.layers = list(layers)
        self.shape = (2, heads, block, dim)
        self.record = int(np.prod(self.shape)) * np.dtype(DTYPE).itemsize
        owned = folder is None
        self.folder = Path(tempfile.mkdtemp(prefix="inftyformer-blocks-") if owned else folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._fds = {
            layer: os.open(self.folder / f"layer{layer}.bin", os.O_RDWR | os.O_CREAT, 0o600)
            for layer in self.layers
        }
        self.count = 0  # blocks written (ids 0 … count − 1)
        fds = list(self._fds.values())
        self._finalizer = weakref.finalize(self, _close, fds, self.folder if owned else None)

    @classmethod
    def reopen(
        cls, layers: list[int], heads: int, block: int, dim: int, folder: str, count: int
    ) -> BlockStore:
        """The store of an existing `folder` whose first `count` blocks a saved state refers to
        (`retrieval/session.py`); later blocks are written over from `count` on."""
        store = cls(layers, heads, block, dim, folder)
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
        int64 [n]."""
        n = next(iter(blocks.values())).shape[0]
        for layer in self.layers:
            data = blocks[layer].detach().to("cpu", torch.float16).numpy().astype(DTYPE)
            os.pwrite(self._fds[layer], data.tobytes(), self.count * self.record)
        ids = torch.arange(self.count, self.count + n, dtype=torch.int64)
        self.count += n
        return ids

    def read(self, layer: int, ids: torch.Tensor) -> torch.Tensor:
        """The blocks `ids` (int64, any shape) of `layer` → float16 [*ids.shape, 2, heads, B, d]."""
        flat = ids.reshape(-1).tolist()
        out = np.empty((len(flat), *self.shape), dtype=DTYPE)
        fd = self._fds[layer]
        for i, block in enumerate(flat):  # one contiguous record each
            out[i] = np.frombuffer(
                os.pread(fd, self.record, block * self.record), dtype=DTYPE
            ).reshape(self.shape)
        return torch.from_numpy(out).view(*ids.shape, *self.shape)

    def disk_bytes(self) -> int:
        return self.count * self.record * len(self.layers)

    def close(self) -> None:
        self._finalizer()


def _close(fds: list[int], folder: Path | None) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


__all__ = ["BlockStore"]
