"""The settings of retrieval of exact past blocks on a pretrained model
(`inftyformer.retrieval.model`; no transformers import)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .._checks import check_positive_int

SCORES = ("max", "mean", "attention")
DISTANCES = ("packed", "true")
ORDERS = ("stream", "score")
ANSWER_CHOICES = ("own", "question")


@dataclass(frozen=True)
class RetrievalConfig:
    """Retrieval of exact past blocks by the current queries (`inftyformer.retrieval.model`):
    each call of at most `segment_len` tokens attends, in every block of the base, to the
    stream's first `sink_blocks` blocks, to the `window` most recent tokens (kept as keys and
    values, not recomputed) and, from block `select_layer` on, to the `blocks` blocks of B =
    `block_size` tokens that the call's own queries at `select_layer` match best among all the
    older ones (`score`: a block's score is the best match of any query and head with any of
    its tokens, "max", or their mean over the call's queries, "mean", or the best attention
    weight any query and head gives one of its tokens attending over all the stored tokens,
    "attention"). The chosen blocks are read
    in stream order (`order="stream"`) or by score, the best right before the window
    (`order="score"`, packed distances only). The older blocks' keys and values are kept on disk
    (`store_dir`, None: a temporary folder). `query_map`: a trained map of the choosing block's
    queries (a `retrieval/query_map.py` file; None: the queries as they are). `answer_choice`: while
    an answer is generated, each new token chooses its own blocks ("own") or reads the blocks
    its prompt's last call chose ("question"). `select_queries`: the blocks are chosen by the
    call's last k queries only (a question at the end of a call whose first tokens are still
    the passage; 0: all of them)."""

    block_size: int = 64
    blocks: int = 16
    sink_blocks: int = 1
    window: int = 1024
    select_layer: int | None = None  # None: the middle block of the base
    read_from: int | None = None  # None: select_layer (no block below it reads the store)
    score: str = "max"
    neighbours: int = 0  # each of the best blocks brings this many blocks right after it
    # where the read slots sit: "packed" right before the call (every gap closed), or "true"
    # at their distance in the stream while the base's positions hold it (packed beyond)
    distances: str = "packed"
    order: str = "stream"  # the chosen blocks in stream order, or the best nearest the window
    segment_len: int = 256
    store_dir: str | None = None
    query_map: str | None = None  # a trained map of the choosing queries (retrieval/query_map.py)
    answer_choice: str = "own"  # new tokens choose their own blocks, or read the question's
    select_queries: int = 0  # the call's last k queries choose (0: every query of the call)

    def __post_init__(self) -> None:
        check_positive_int("block_size", self.block_size)
        for name in ("blocks", "sink_blocks", "window", "neighbours", "select_queries"):
            check_positive_int(name, getattr(self, name), minimum=0)
        check_positive_int("segment_len", self.segment_len)
        for name in ("select_layer", "read_from"):
            if getattr(self, name) is not None:
                check_positive_int(name, getattr(self, name), minimum=0)
        if self.distances not in DISTANCES:
            raise ValueError(f"distances must be one of {DISTANCES}, got {self.distances!r}")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")
        if self.order == "score" and self.distances != "packed":
            raise ValueError(
                "order='score' moves the chosen blocks out of stream order: it needs "
                "distances='packed' (with 'true' each block sits at its distance in the stream)"
            )
        if self.score not in SCORES:
            raise ValueError(f"score must be one of {SCORES}, got {self.score!r}")
        for name in ("store_dir", "query_map"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise TypeError(f"{name} must be a path or None, got {value!r}")
        if self.answer_choice not in ANSWER_CHOICES:
            raise ValueError(
                f"answer_choice must be one of {ANSWER_CHOICES}, got {self.answer_choice!r}"
            )

    @property
    def context(self) -> int:
        """P0: the positions before a call's first token (sink, retrieved blocks, window)."""
        B = self.block_size
        return (self.sink_blocks + self.blocks) * B + self.window + B - 1

    def replace(self, **changes: Any) -> RetrievalConfig:
        return dataclasses.replace(self, **changes)


__all__ = ["ANSWER_CHOICES", "DISTANCES", "ORDERS", "SCORES", "RetrievalConfig"]
