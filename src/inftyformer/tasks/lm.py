"""Long-document language modelling (``inftyformer train lm``; paper §4.2).

Data (``data_dir``): a corpus directory with ``train/``, ``valid/``, ``test/`` folders of UTF-8
``.txt`` files (one file = one document; the shared ``pg19-mini`` books), a data root holding
``pg19-mini/`` (the default: the shared data directory), or a flat folder of ``.txt`` files,
split deterministically by file name (1 in 20 to valid, 1 in 20 to test:
:func:`inftyformer.data.corpus.flat_split_of`). Text is tokenised once and cached.
``eval_data`` evaluates on other text instead: any of those layouts (a flat folder: every file), a
WikiText-103 directory (``wiki.<split>.tokens``), a single ``.txt`` file, or ``-`` for standard
input (:func:`inftyformer.data.load_split`). ``tokenizer`` is ``bytes``, ``gpt2`` or a path to a
``tokenizer.json`` (:func:`inftyformer.data.load_tokenizer`).

Training: the batch's B rows are parallel document streams (:class:`DocumentStreams`, shuffled per
epoch with the run's seed). Each step is one segment of ``segment_len`` tokens per row; the memory
of each row is carried from step to step (detached: truncated back-propagation over one segment)
and cleared when the row starts a new document. Every document is prefixed with the end-of-text id
as a beginning-of-document token, so its first token is a target too (the evaluation does the
same). The stream cursor and the carried memory are committed at the end of each step and saved in
the checkpoint, so a resumed run continues exactly.

Evaluation: whole documents streamed with memory (:func:`lm_eval.evaluate_lm`), optionally only
the first ``max_docs`` documents and a prefix of ``max_tokens`` tokens of each. On ``valid`` (the
periodic check during training) ``num_batches`` segments per row from the start of each document;
the test split is always scored whole. Metrics: ``loss`` (nats/token), ``ppl``, ``bpb`` (bits per
UTF-8 byte) and ``tokens``; the headline is perplexity (lower is better).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._checks import check_positive_int
from ..data import (
    DocumentStreams,
    TextTokenizer,
    TokenizedCorpus,
    check_split,
    load_split,
)
from ..data.corpus import (
    STDIN,
    text_layout,
    token_byte_lengths,
    truncate_documents,
    with_bos,
)
from ..data.paths import embedded_fallback_note, training_source
from ..integrations.lm_eval import LMEvalConfig, evaluate_lm
from ..native.model import IGNORE_INDEX
from ..native.state import MemoryState
from .base import (
    Evaluation,
    Metric,
    RunContext,
    Shard,
    StepOutput,
    Task,
    TaskConfig,
    fitting_tokenizer,
    register_task,
    tokenizer_near_data,
)


@dataclass(frozen=True)
class LMConfig(TaskConfig):
    """Settings of the language-modelling task."""

    data_dir: str | None = None  # training text: corpus directory, data root or flat folder
    tokenizer: str = "gpt2"  # bytes, gpt2, or a path to a tokenizer.json
    eval_data: str | None = None  # evaluate on this text instead of data_dir's valid/test
    max_docs: int | None = None  # evaluation: only the first N documents of a split
    max_tokens: int | None = None  # evaluation: only the first N tokens of each document
    # evaluation: also report the loss over the positions [0, 256), [256, 2048), [2048, ∞)
    position_edges: tuple[int, ...] = (256, 2048)

    def __post_init__(self) -> None:
        for name in ("data_dir", "eval_data"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise TypeError(f"{name} must be a non-empty string or None, got {value!r}")
        if not isinstance(self.tokenizer, str) or not self.tokenizer:
            raise ValueError(f"tokenizer must be a non-empty string, got {self.tokenizer!r}")
        for name in ("max_docs", "max_tokens"):
            if getattr(self, name) is not None:
                check_positive_int(name, getattr(self, name))


def _tokenizer(config: LMConfig) -> TextTokenizer:
    """`config.tokenizer`; "gpt2" is looked for beside the training data first."""
    return tokenizer_near_data(config.tokenizer, config.data_dir)


@register_task("lm")
class LanguageModelTask(Task):
    """See the module docstring."""

    summary = "long-document language modelling on a folder of books (§4.2)"
    Config = LMConfig
    metrics = (
        Metric("ppl", ".3f", higher_is_better=False),
        Metric("loss", ".4f"),
        Metric("bpb", ".4f"),
        Metric("tokens", ".0f"),
    )
    progress_metrics = ("ppl",)

    def __init__(self, config: LMConfig, model_config: Any, context: RunContext) -> None:
        super().__init__(config, model_config, context)
        self.tokenizer = fitting_tokenizer(_tokenizer(config), model_config)
        self.token_bytes = token_byte_lengths(self.tokenizer)
        self._splits: dict[str, TokenizedCorpus] = {}
        self._streams: DocumentStreams | None = None
        # committed position: the stream cursor before update `_step` and the memory carried
        # into it, one per micro-batch part
        self._step = 0
        self._cursor: dict[str, Any] | None = None
        self._memory: dict[int, MemoryState] = {}
        # the update in flight (committed by `end_step`)
        self._next_cursor: dict[str, Any] | None = None
        self._next_memory: dict[int, MemoryState] = {}
        self._parts: list[int] = []  # parts whose memory a checkpoint holds (while resuming)
        self._records: dict[str, Any] = {}  # and their provenance and memory records

    # ------------------------------------------------------------------ model side
    @classmethod
    def model_overrides(cls, config: LMConfig) -> dict[str, Any]:
        return {"vocab_size": _tokenizer(config).vocab_size}

    @classmethod
    def notes(cls, config: LMConfig) -> list[str]:
        note = embedded_fallback_note(config.data_dir)
        return [] if note is None else [note]

    @classmethod
    def check(cls, config: LMConfig, model_config: Any) -> None:
        """Cheap checks before any work: the data exists, the vocabulary fits."""
        if config.eval_data is None:
            text_layout(training_source(config.data_dir), "train")
        elif (
            config.eval_data != STDIN
            and ":" not in config.eval_data
            and not Path(config.eval_data).expanduser().exists()
        ):
            raise FileNotFoundError(f"evaluation data not found: {config.eval_data}")
        if model_config.vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {model_config.vocab_size}")

    # ------------------------------------------------------------------ data
    def split(self, name: str) -> TokenizedCorpus:
        """The tokenised split `name` (loaded once): the training text's, or for valid/test the
        evaluation text's when `eval_data` is set (a flat folder counts whole there)."""
        if name not in self._splits:
            check_split(name)
            c, progress = self.config, self.context.progress
            if c.eval_data is not None and name != "train":
                corpus = load_split(c.eval_data, name, self.tokenizer, progress, whole=True)
                source = c.eval_data
            else:
                source = training_source(c.data_dir)
                corpus = load_split(source, name, self.tokenizer, progress)
            if corpus.num_tokens == 0:
                raise ValueError(f"the {name} split of {source} holds no text")
            self._splits[name] = corpus
        return self._splits[name]

    def data_fingerprint(self, splits: Sequence[str]) -> dict[str, str]:
        return {name: self.split(name).fingerprint() for name in splits}

    def check_data(self, splits: Sequence[str]) -> None:
        for name in splits:
            self.split(name)  # refuses a split without text

    @property
    def streams(self) -> DocumentStreams:
        if self._streams is None:
            self._streams = DocumentStreams(
                with_bos(self.split("train")),
                batch_size=self.context.batch_size,
                segment_len=self.model_config.segment_len,
                seed=self.context.seed,
                shuffle=True,
                loop=True,
            )
            if self._cursor is None:
                self._cursor = self._streams.state_dict()
        return self._streams

    # ------------------------------------------------------------------ training
    def batch(self, step: int) -> Any:
        if step != self._step:
            raise RuntimeError(
                f"the language-model stream is positioned before step {self._step}, "
                f"but step {step} was requested"
            )
        streams = self.streams
        streams.load_state_dict(self._cursor)  # a step that was cut short is drawn again
        batch = next(streams)
        self._next_cursor = streams.state_dict()
        self._next_memory = {}
        return batch

    def loss(self, model: nn.Module, batch: Any, rows: slice, part: int) -> StepOutput:
        device = self.context.device
        inputs = batch.inputs[rows].to(device)
        targets = batch.targets[rows].to(device)
        reset = batch.reset[rows].to(device)
        out = model(inputs, state=self._memory.get(part), targets=targets, reset=reset)
        if out.state is not None:  # a model without memory carries nothing
            self._next_memory[part] = out.state.detach()
        # the NLL the model computed (0 where ignored): no second pass over the logits, which a
        # pretrained model with a frozen head does not even make unless asked
        # (`hf/pretrained_lm.py`)
        nll = out.token_loss.detach().sum()
        sums = {"nll": float(nll), "count": float((targets != IGNORE_INDEX).sum())}
        sums["tokens"] = float(inputs.numel())
        return StepOutput(out.loss, sums, {k: float(v.detach()) for k, v in out.aux.items()})

    def loss_weight(self, batch: Any, rows: slice) -> float:
        # the loss is a mean over scored targets, and rows hold fewer where a document ended
        return float((batch.targets[rows] != IGNORE_INDEX).sum())

    def end_step(self, step: int) -> None:
        self._step = step + 1
        self._cursor = self._next_cursor
        self._memory = self._next_memory

    def train_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        out = super().train_metrics(sums)
        if "lm_loss" in out:
            out["ppl"] = math.exp(min(out["lm_loss"], 50.0))
        return out

    # ------------------------------------------------------------------ resumable state
    def state_dict(self) -> dict[str, Any]:
        # the carried memory's provenance and record go with it (a resumed model checks them)
        records = {
            str(part): {"source": state.source, "memory": state.memory}
            for part, state in self._memory.items()
        }
        return {
            "step": self._step,
            "stream": self._cursor,
            "parts": sorted(self._memory),
            "records": records,
        }

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {
            f"memory.{part}.{k}": v.detach().cpu()
            for part, state in self._memory.items()
            for k, v in state.tensors().items()
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self._step = int(state["step"])
        self._cursor = state["stream"]
        self.streams.load_state_dict(self._cursor)  # validates it against this corpus
        self._parts = [int(p) for p in state.get("parts", [])]
        self._records = state.get("records", {})  # saved before records were kept: none

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        memory = {}
        for part in self._parts:
            prefix = f"memory.{part}."
            mine = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
            if not mine:
                raise ValueError(f"the checkpoint lacks the carried memory of part {part}")
            record = self._records.get(str(part), {})
            state = MemoryState.from_tensors(mine, None, record.get("source"), record.get("memory"))
            memory[part] = state.to(self.context.device)
        self._memory = memory

    # ------------------------------------------------------------------ evaluation
    def eval_corpus(self, split: str) -> TokenizedCorpus:
        """`split` as evaluated: the first `max_docs` documents, each cut to `max_tokens`."""
        corpus = self.split(split)
        c = self.config
        if c.max_docs is None and c.max_tokens is None:
            return corpus
        return truncate_documents(corpus, c.max_tokens, c.max_docs, self.token_bytes)

    def _eval_rows(self, corpus: TokenizedCorpus) -> int:
        return max(1, min(self.context.batch_size, int((corpus.doc_lengths > 0).sum())))

    def eval_calls(self, split: str, num_batches: int | None) -> int | None:
        corpus = self.eval_corpus(split)
        rows, segment_len = self._eval_rows(corpus), self.model_config.segment_len
        streams = DocumentStreams(with_bos(corpus), rows, segment_len, shuffle=False, loop=False)
        total = streams.total_steps()
        return total if split == "test" or num_batches is None else min(total, num_batches)

    @torch.no_grad()
    def evaluate(
        self, model: nn.Module, split: str, num_batches: int | None, shard: Shard
    ) -> Evaluation:
        corpus = self.eval_corpus(split)
        mine = list(shard.items(corpus.num_docs))
        if not mine:
            return Evaluation({"nll": 0.0, "tokens": 0.0, "bytes": 0.0})
        if shard.count > 1:
            corpus = corpus.subset(mine)
        cfg = LMEvalConfig(
            batch_size=self._eval_rows(corpus),
            position_edges=tuple(self.config.position_edges),
            max_steps=0 if split == "test" or num_batches is None else num_batches,
            progress=self.context.progress,
        )
        result = evaluate_lm(model, corpus, cfg, token_bytes=self.token_bytes)
        sums = {
            "nll": result.nll_sum,
            "tokens": float(result.num_tokens),
            "bytes": float(result.num_bytes),
        }
        return Evaluation(sums, details=result.to_dict())

    def eval_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        nll, tokens, nbytes = sums.get("nll", 0.0), sums.get("tokens", 0.0), sums.get("bytes", 0.0)
        loss = nll / max(tokens, 1.0)
        return {
            "loss": loss,
            "ppl": math.exp(min(loss, 700.0)),
            "bpb": nll / (math.log(2) * nbytes) if nbytes else math.nan,
            "tokens": tokens,
        }

    # ------------------------------------------------------------------ inspection
    def inspection_stream(self, split: str, length: int) -> torch.Tensor:
        """The first `length` tokens of the split's first document that long (else of its
        longest), after the beginning-of-document id."""
        check_positive_int("length", length)
        corpus = with_bos(self.split(split))
        lengths = corpus.doc_lengths
        long_enough = (lengths >= length).nonzero()[0]
        doc = int(long_enough[0]) if len(long_enough) else int(lengths.argmax())
        return torch.from_numpy(corpus.document(doc)[:length].astype("int64"))

    # ------------------------------------------------------------------ generation
    def encode_prompt(self, text: str) -> tuple[torch.Tensor, list[int] | None]:
        ids = [self.tokenizer.eos_id] + self.tokenizer.encode(text)
        return torch.tensor(ids, dtype=torch.long), None

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens)

    def default_new_tokens(self) -> int:
        return 200

    def default_sampling(self) -> dict[str, float]:
        """Nucleus sampling (temperature 0.8, top-p 0.9): greedy decoding of text falls into
        loops (a small model repeats one sentence), sampling from the likely tokens does not."""
        return {"temperature": 0.8, "top_p": 0.9}


__all__ = ["LMConfig", "LanguageModelTask"]
