"""Document-aware stream batching for long-document language modelling.

B rows are parallel streams. Each row walks through whole documents, segment by segment, so row i
of step t+1 continues row i of step t (the model carries row i's memory across steps). When a row's
document ends, the row takes the next document of a seeded, per-epoch shuffled order (free rows take
documents in ascending row order) and signals ``reset[i] = True`` on that document's first segment:
the model must clear row i's memory before processing it. A segment never holds two documents: the
rest of a segment after a document's last token is padding (input = eos id, target = -100).

Targets are the next token of the same document: position j of a document (input ``d[j]``) has
target ``d[j + 1]``, and -100 at the document's last token. Over a complete ``loop=False`` pass,
every token of every document except its first is a target exactly once (and every token is an
input exactly once).

Bits per byte is left to the evaluator: sum the target NLLs (nats) over a complete ``loop=False``
pass and divide by ``ln 2 * corpus.total_bytes`` (``doc_bytes`` holds the UTF-8 bytes of each
document). Per-document accounting can use ``StreamBatch.doc_ids`` / ``doc_end``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._checks import check_positive_int
from ..native.model import IGNORE_INDEX
from .corpus import TokenizedCorpus

_STATE_VERSION = 1


@dataclass(frozen=True)
class StreamBatch:
    """One step of B parallel document streams.

    inputs: [B, L] long; targets: [B, L] long (-100 = not scored: a document's last token, padding).
    reset: [B] bool, True when the row starts a new document at this segment (clear its memory).
    doc_ids: [B] long, the document each row is reading (-1: the row is idle, all padding).
    doc_pos: [B] long, the in-document offset of ``inputs[:, 0]`` (-1 for idle rows).
    doc_end: [B] bool, True when the row's document ends within this segment.
    num_targets: number of scored positions (targets != -100) in the batch.
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    reset: torch.Tensor
    doc_ids: torch.Tensor
    doc_pos: torch.Tensor
    doc_end: torch.Tensor
    num_targets: int

    def to(self, device: torch.device | str) -> StreamBatch:
        """The same batch with every tensor moved to `device`."""
        return StreamBatch(
            inputs=self.inputs.to(device),
            targets=self.targets.to(device),
            reset=self.reset.to(device),
            doc_ids=self.doc_ids.to(device),
            doc_pos=self.doc_pos.to(device),
            doc_end=self.doc_end.to(device),
            num_targets=self.num_targets,
        )


class DocumentStreams:
    """Iterate a :class:`TokenizedCorpus` as B parallel document streams of L-token segments.

    Deterministic given `seed` (epoch e uses the permutation drawn from ``SeedSequence([seed, e])``;
    ``shuffle=False`` keeps corpus order). ``loop=True`` (training) never ends: when the order runs
    out, the next epoch's order starts. ``loop=False`` (evaluation) ends once every document has
    been streamed; rows with nothing left yield padding (targets -100); :meth:`total_steps` gives
    the number of steps of such a pass. Empty documents are skipped.

    Resumable: :meth:`state_dict` (JSON-serialisable) captures the exact position between two
    steps; a new instance with the same arguments continues identically after
    :meth:`load_state_dict`. The object is its own iterator; :meth:`restart` rewinds it.
    """

    def __init__(
        self,
        corpus: TokenizedCorpus,
        batch_size: int,
        segment_len: int,
        seed: int = 0,
        shuffle: bool = True,
        loop: bool = True,
    ) -> None:
        if not isinstance(corpus, TokenizedCorpus):
            raise TypeError(f"corpus must be a TokenizedCorpus, got {type(corpus).__name__}")
        check_positive_int("batch_size", batch_size)
        check_positive_int("segment_len", segment_len)
        check_positive_int("seed", seed, minimum=0)
        for name, flag in (("shuffle", shuffle), ("loop", loop)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
        self.corpus = corpus
        self.batch_size = batch_size
        self.segment_len = segment_len
        self.seed = seed
        self.shuffle = shuffle
        self.loop = loop
        self._offsets = np.asarray(corpus.doc_offsets, dtype=np.int64)  # [D + 1]
        self._lengths = np.diff(self._offsets)  # [D]
        self._streamable = np.flatnonzero(self._lengths > 0)  # documents with >= 1 token
        if self._streamable.size == 0:
            raise ValueError("corpus has no non-empty document to stream")
        self._order_cache: tuple[int, np.ndarray] | None = None
        self.restart()

    # ------------------------------------------------------------------ state

    def restart(self) -> None:
        """Back to the very beginning (epoch 0, no document in flight)."""
        self.epoch = 0
        self.cursor = 0  # next position in the current epoch's order
        self.steps = 0  # batches yielded so far
        self.row_doc = [-1] * self.batch_size  # document in flight per row (-1 = none)
        self.row_pos = [0] * self.batch_size  # next token offset within that document

    def _fingerprint(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "segment_len": self.segment_len,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "loop": self.loop,
            "num_docs": self.corpus.num_docs,
            "num_tokens": self.corpus.num_tokens,
        }

    def state_dict(self) -> dict[str, Any]:
        """Exact position (between steps) plus the arguments it is valid for; JSON-serialisable."""
        return {
            "version": _STATE_VERSION,
            **self._fingerprint(),
            "epoch": self.epoch,
            "cursor": self.cursor,
            "steps": self.steps,
            "row_doc": list(self.row_doc),
            "row_pos": list(self.row_pos),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"state version must be {_STATE_VERSION}, got {state.get('version')}")
        for key, expected in self._fingerprint().items():
            if state.get(key) != expected:
                raise ValueError(
                    f"state[{key!r}] = {state.get(key)!r} does not match this stream ({expected!r})"
                )
        row_doc = [int(d) for d in state["row_doc"]]
        row_pos = [int(p) for p in state["row_pos"]]
        if len(row_doc) != self.batch_size or len(row_pos) != self.batch_size:
            raise ValueError(f"state rows must have {self.batch_size} entries")
        for d, p in zip(row_doc, row_pos, strict=True):
            if d >= self.corpus.num_docs or (d >= 0 and not 0 <= p < self._lengths[d]):
                raise ValueError(f"state row (doc {d}, pos {p}) is out of range for this corpus")
        self.epoch = int(state["epoch"])
        self.cursor = int(state["cursor"])
        self.steps = int(state["steps"])
        self.row_doc = row_doc
        self.row_pos = row_pos

    # ------------------------------------------------------------------ order

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Document indices in the order epoch `epoch` streams them."""
        if self._order_cache is not None and self._order_cache[0] == epoch:
            return self._order_cache[1]
        if self.shuffle:
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, epoch]))
            order = rng.permutation(self._streamable)
        else:
            order = self._streamable
        self._order_cache = (epoch, order)
        return order

    def _next_doc(self) -> int | None:
        order = self.epoch_order(self.epoch)
        if self.cursor >= order.size:
            if not self.loop:
                return None
            self.epoch += 1
            self.cursor = 0
            order = self.epoch_order(self.epoch)
        doc = int(order[self.cursor])
        self.cursor += 1
        return doc

    def total_steps(self) -> int:
        """Number of steps of a complete ``loop=False`` pass from the beginning."""
        if self.loop:
            raise ValueError("total_steps is only defined for loop=False")
        free = [(0, row) for row in range(self.batch_size)]  # (step the row is free, row)
        end = 0
        for doc in self.epoch_order(0):
            step, row = heapq.heappop(free)
            done = step + math.ceil(int(self._lengths[doc]) / self.segment_len)
            end = max(end, done)
            heapq.heappush(free, (done, row))
        return end

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[StreamBatch]:
        return self

    def __next__(self) -> StreamBatch:
        batch, length = self.batch_size, self.segment_len
        reset = np.zeros(batch, dtype=bool)  # [B]
        for row in range(batch):  # free rows take the next documents, in row order
            if self.row_doc[row] < 0:
                doc = self._next_doc()
                if doc is not None:
                    self.row_doc[row], self.row_pos[row] = doc, 0
                    reset[row] = True
        if all(d < 0 for d in self.row_doc):
            raise StopIteration

        tokens = self.corpus.tokens
        inputs = np.full((batch, length), self.corpus.eos_id, dtype=np.int64)  # [B, L]
        targets = np.full((batch, length), IGNORE_INDEX, dtype=np.int64)  # [B, L]
        doc_ids = np.full(batch, -1, dtype=np.int64)  # [B]
        doc_pos = np.full(batch, -1, dtype=np.int64)  # [B]
        doc_end = np.zeros(batch, dtype=bool)  # [B]
        num_targets = 0
        for row in range(batch):
            doc = self.row_doc[row]
            if doc < 0:
                continue
            pos, size = self.row_pos[row], int(self._lengths[doc])
            start = int(self._offsets[doc]) + pos
            k = min(length, size - pos)  # tokens of this document in the segment
            k_targets = min(length, size - pos - 1)  # of which have a next token in the document
            inputs[row, :k] = tokens[start : start + k]
            if k_targets > 0:
                targets[row, :k_targets] = tokens[start + 1 : start + 1 + k_targets]
                num_targets += k_targets
            doc_ids[row], doc_pos[row] = doc, pos
            self.row_pos[row] = pos + k
            if pos + k >= size:
                doc_end[row] = True
                self.row_doc[row], self.row_pos[row] = -1, 0
        self.steps += 1
        return StreamBatch(
            inputs=torch.from_numpy(inputs),
            targets=torch.from_numpy(targets),
            reset=torch.from_numpy(reset),
            doc_ids=torch.from_numpy(doc_ids),
            doc_pos=torch.from_numpy(doc_pos),
            doc_end=torch.from_numpy(doc_end),
            num_targets=num_targets,
        )
