"""Language-model evaluation over whole documents, streamed with memory.

    corpus ──with_bos──▶ DocumentStreams(loop=False) ──▶ model(inputs, state, reset) ──▶ NLL [B, L]
                                                            │ state carried row by row,
                                                            │ cleared at each document start
    sum NLL (nats) ─▶ loss = Σ/n_tokens, perplexity = e^loss, bits/byte = Σ / (ln 2 · bytes)

Conventions:

- Every token of every document is scored exactly once. A beginning-of-document token (the
  tokenizer's end-of-text id) is put in front of each document (:func:`with_bos`), so the first
  token is predicted too and bits per byte divides the NLL of *all* tokens by *all* bytes. Training
  uses the same layout (see ``lm_task``), so the model has seen that token in that role.
- The loss is the plain next-token cross entropy from the logits; auxiliary losses (the
  ∞-former's KL term, the compressive reconstruction loss) are not part of it.
- Rows are parallel streams: row i of one step continues row i of the previous one and the model's
  memory of that row is cleared when it starts a new document (``reset``). The evaluation model may
  use memory settings other than training's (longer short-term memory, more resampled points):
  see :func:`eval_model_config`.
- Per-position loss: the mean loss of tokens grouped by their 0-based position in their document,
  in log-scale buckets (``buckets_per_octave`` buckets per doubling of ``position + 1``).

Bits per byte compares models with different tokenizers: Σ NLL over the same text in bits, divided
by the text's UTF-8 byte count (for the byte tokenizer it equals bits per token).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from .._progress import progress as show_progress
from ..data import DocumentStreams, TokenizedCorpus
from ..data.corpus import with_bos
from ..native.model import IGNORE_INDEX, token_losses


@dataclass(frozen=True)
class LMEvalConfig:
    """How to stream a corpus through a model for evaluation.

    batch_size: parallel document streams (rows); bos: score every token by prefixing each
    document with the end-of-text id; buckets_per_octave: resolution of the per-position loss;
    position_edges: also total the loss (and bytes) over the position ranges [0, e_1), [e_1,
    e_2), …, [e_k, ∞); max_steps: stop early (partial pass, for smoke tests; 0 = the whole
    corpus).

    The tokens per call are not a setting of the evaluation: each call holds the model's
    ``config.segment_len`` (declared once, in the model's config), so that an evaluation always
    cuts the stream as the model was configured to be called.
    """

    batch_size: int = 8
    bos: bool = True
    buckets_per_octave: int = 2
    position_edges: tuple[int, ...] = ()
    max_steps: int = 0
    progress: bool = False

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.buckets_per_octave < 1:
            raise ValueError(f"buckets_per_octave must be >= 1, got {self.buckets_per_octave}")
        if self.max_steps < 0:
            raise ValueError(f"max_steps must be >= 0, got {self.max_steps}")
        edges = tuple(self.position_edges)
        if any(e < 1 for e in edges) or list(edges) != sorted(set(edges)):
            raise ValueError(f"position_edges must be increasing positive ints, got {edges}")


@dataclass
class PositionLoss:
    """Mean loss by position in the document. Bucket k holds positions [start[k], stop[k])."""

    start: list[int]
    stop: list[int]
    count: list[int]
    mean_loss: list[float]


@dataclass
class PositionRange:
    """Totals over the tokens whose 0-based position in their document is in [start, stop)
    (stop None: to the end)."""

    start: int
    stop: int | None
    tokens: int
    nll_sum: float
    bytes: int  # UTF-8 bytes of those tokens (0 when bytes per token are not known)

    @property
    def loss(self) -> float:
        return self.nll_sum / max(self.tokens, 1)

    @property
    def bits_per_byte(self) -> float:
        return self.nll_sum / (math.log(2) * self.bytes) if self.bytes else math.nan


@dataclass
class LMEvalResult:
    """Totals of one evaluation pass. Losses in nats per token; bits per byte over the UTF-8
    bytes of the scored documents."""

    num_tokens: int  # scored tokens
    num_docs: int
    num_bytes: int  # all bytes (complete pass) or those of the scored tokens (partial pass)
    nll_sum: float  # nats
    loss: float
    perplexity: float
    bits_per_token: float
    bits_per_byte: float
    complete: bool  # the whole corpus was scored (False after max_steps)
    seconds: float
    doc_names: list[str] = field(default_factory=list)
    doc_tokens: list[int] = field(default_factory=list)
    doc_nll: list[float] = field(default_factory=list)
    position: PositionLoss | None = None
    ranges: list[PositionRange] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        return {
            "loss": self.loss,
            "perplexity": self.perplexity,
            "bits_per_byte": self.bits_per_byte,
            "tokens": float(self.num_tokens),
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _bucket(positions: torch.Tensor, per_octave: int) -> torch.Tensor:
    """floor(k · log2(position + 1)), exact at powers of two (float64)."""
    return torch.floor(torch.log2(positions.double() + 1.0) * per_octave + 1e-9).long()


def _bucket_start(b: int, per_octave: int) -> int:
    """Smallest position p >= 0 with bucket(p) >= b."""
    return max(0, math.ceil(2.0 ** (b / per_octave) - 1e-9) - 1)


def _model_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


@torch.no_grad()
def _vocab_size(model: nn.Module) -> int:
    """The model's vocabulary: its config's, or its base's (a retrieval's config holds only
    how it reads the base)."""
    vocab = getattr(model.config, "vocab_size", None)
    return int(vocab if vocab is not None else model.base.config.vocab_size)


@torch.no_grad()
def evaluate_lm(
    model: nn.Module,
    corpus: TokenizedCorpus,
    config: LMEvalConfig | None = None,
    token_bytes: np.ndarray | None = None,
) -> LMEvalResult:
    """Stream every document of `corpus` through `model` with memory; see the module docstring.

    `model` follows the ``MemoryLM`` contract: ``config.segment_len``, ``config.vocab_size`` (a
    retrieval's: its base's), ``init_state(B, device)`` and ``model(inputs, state=, reset=)``
    returning ``.logits`` [B, L, V] and ``.state``.
    Bits per byte divides by the documents' UTF-8 bytes after a complete pass; after a partial
    one (``max_steps``) by the bytes of the scored tokens, which needs `token_bytes` ([vocab]
    bytes per id, :func:`token_byte_lengths`; NaN without it).
    """
    cfg = config or LMEvalConfig()
    if not isinstance(corpus, TokenizedCorpus):
        raise TypeError(f"corpus must be a TokenizedCorpus, got {type(corpus).__name__}")
    segment_len = model.config.segment_len  # the model's calls, as its config declares them
    vocab = _vocab_size(model)
    if corpus.vocab_size > vocab:
        raise ValueError(
            f"corpus vocabulary ({corpus.vocab_size}) is larger than the model's ({vocab})"
        )
    device = _model_device(model)
    source = with_bos(corpus) if cfg.bos else corpus
    # position (in the original document) of the token predicted at column j of a segment that
    # starts at in-stream offset doc_pos: doc_pos + j with a BOS in front, else doc_pos + j + 1
    shift = 0 if cfg.bos else 1
    # more rows than documents would only stream padding: rows are independent, so capping them
    # changes nothing but the time
    rows = max(1, min(cfg.batch_size, int((corpus.doc_lengths > 0).sum())))
    streams = DocumentStreams(source, rows, segment_len, seed=0, shuffle=False, loop=False)
    total = streams.total_steps()
    steps = min(total, cfg.max_steps) if cfg.max_steps else total

    was_training = model.training
    model.eval()
    start_time = time.perf_counter()
    num_docs = corpus.num_docs
    doc_nll = torch.zeros(num_docs, dtype=torch.float64)
    doc_count = torch.zeros(num_docs, dtype=torch.int64)
    bucket_sum = torch.zeros(64 * cfg.buckets_per_octave, dtype=torch.float64)
    bucket_count = torch.zeros(64 * cfg.buckets_per_octave, dtype=torch.int64)
    edges = torch.tensor(cfg.position_edges, dtype=torch.long)
    range_nll = torch.zeros(len(edges) + 1, dtype=torch.float64)  # [ranges]
    range_tokens = torch.zeros(len(edges) + 1, dtype=torch.int64)
    range_bytes = torch.zeros(len(edges) + 1, dtype=torch.int64)
    columns = torch.arange(segment_len)  # [L]
    byte_table = None if token_bytes is None else torch.as_tensor(np.asarray(token_bytes))
    scored_bytes = 0
    state = model.init_state(rows, device)
    try:
        for _ in show_progress(range(steps), desc="evaluating", enabled=cfg.progress, leave=False):
            batch = next(streams)
            inputs = batch.inputs.to(device)
            targets = batch.targets  # [B, L] (cpu)
            out = model(inputs, state=state, reset=batch.reset.to(device))
            state = out.state
            nll, _ = token_losses(out.logits, targets.to(device))  # [B, L]; 0 where not scored
            nll = nll.double().cpu()
            scored = targets != IGNORE_INDEX  # [B, L]
            rows = batch.doc_ids >= 0
            doc_nll.index_add_(0, batch.doc_ids[rows], nll[rows].sum(1))
            doc_count.index_add_(0, batch.doc_ids[rows], scored[rows].sum(1))
            positions = batch.doc_pos[:, None] + columns[None, :] + shift  # [B, L]
            buckets = _bucket(positions[scored], cfg.buckets_per_octave)
            bucket_sum.index_add_(0, buckets, nll[scored])
            bucket_count.index_add_(0, buckets, torch.ones_like(buckets))
            ranges = torch.bucketize(positions[scored], edges, right=True)  # range of each token
            range_nll.index_add_(0, ranges, nll[scored])
            range_tokens.index_add_(0, ranges, torch.ones_like(ranges))
            if byte_table is not None:
                token_bytes_ = byte_table[targets[scored]]
                scored_bytes += int(token_bytes_.sum())
                range_bytes.index_add_(0, ranges, token_bytes_.long())
    finally:
        model.train(was_training)

    complete = steps == total
    num_tokens = int(doc_count.sum())
    nll_sum = float(doc_nll.sum())
    counted_docs = doc_count > 0 if not complete else torch.ones(num_docs, dtype=torch.bool)
    if complete:
        num_bytes = corpus.total_bytes
    else:
        num_bytes = scored_bytes if byte_table is not None else 0
    loss = nll_sum / max(num_tokens, 1)
    used = torch.nonzero(bucket_count).flatten().tolist()
    k = cfg.buckets_per_octave
    position = PositionLoss(
        start=[_bucket_start(b, k) for b in used],
        stop=[_bucket_start(b + 1, k) for b in used],
        count=[int(bucket_count[b]) for b in used],
        mean_loss=[float(bucket_sum[b] / bucket_count[b]) for b in used],
    )
    return LMEvalResult(
        num_tokens=num_tokens,
        num_docs=int(counted_docs.sum()),
        num_bytes=num_bytes,
        nll_sum=nll_sum,
        loss=loss,
        perplexity=math.exp(min(loss, 700.0)),
        bits_per_token=loss / math.log(2),
        bits_per_byte=nll_sum / (math.log(2) * num_bytes) if num_bytes else float("nan"),
        complete=complete,
        seconds=time.perf_counter() - start_time,
        doc_names=list(corpus.doc_names),
        doc_tokens=doc_count.tolist(),
        doc_nll=doc_nll.tolist(),
        position=position,
        ranges=[
            PositionRange(
                start=([0] + list(cfg.position_edges))[i],
                stop=(list(cfg.position_edges) + [None])[i],
                tokens=int(range_tokens[i]),
                nll_sum=float(range_nll[i]),
                bytes=int(range_bytes[i]),
            )
            for i in range(len(edges) + 1)
        ],
    )


__all__ = ["LMEvalConfig", "LMEvalResult", "PositionLoss", "PositionRange", "evaluate_lm"]
