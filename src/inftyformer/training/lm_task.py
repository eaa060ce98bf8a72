"""Long-document language modelling as a training task (``inftyformer train lm``).

Data: a corpus directory with ``train/``, ``valid/``, ``test/`` folders of UTF-8 ``.txt`` files
(one file = one document; the shared ``pg19-mini`` books), tokenised once and cached
(:func:`inftyformer.tasks.load_corpus`). ``TrainConfig.data_dir`` is that directory, or a data
root holding ``pg19-mini/`` (default: the shared data directory). ``TrainConfig.tokenizer`` is
``bytes`` (UTF-8 bytes, vocabulary 257), ``gpt2`` (the shared GPT-2 BPE, looked for in
``<data_dir>/gpt2-tokenizer``, its parent and the shared data directory) or a path to a
``tokenizer.json``.

Training: the batch's B rows are parallel document streams (:class:`DocumentStreams`, shuffled
per epoch with the run's seed). Each step is one segment of ``segment_len`` tokens per row; the
memory of each row is carried from step to step (detached: truncated back-propagation over one
segment) and cleared when the row starts a new document. Every document is prefixed with the
end-of-text id as a beginning-of-document token, so the first token of a document is a target too
(the evaluation does the same, see ``lm_eval``). The data position (stream cursor) and the carried
memory are part of the checkpoint, so a resumed run continues exactly.

Evaluation: whole documents streamed with memory (``lm_eval.evaluate_lm``). On ``valid`` (the
periodic check during training) ``num_batches`` segments per row from the start of each document;
on ``test`` always the whole split. Metrics: ``loss`` (nats/token), ``ppl``, ``bpb`` (bits per
UTF-8 byte) and ``tokens``. The headline metric is perplexity (lower is better).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..tasks import (
    ByteTokenizer,
    DocumentStreams,
    GPT2Tokenizer,
    TextTokenizer,
    TokenizedCorpus,
    default_data_dir,
    load_corpus,
    load_wikitext,
    resolve_data_dir,
)
from .config import TrainConfig
from .distributed import DistEnv, all_reduce_sum, shard_rows
from .lm_eval import (
    LMEvalConfig,
    LMEvalResult,
    eval_model_config,
    evaluate_lm,
    token_byte_lengths,
    truncate_documents,
    with_bos,
)
from .tasks import StepStats, Task, _scalar, register_task, scored_stats

CORPUS_SUBDIR = "pg19-mini"
WIKITEXT_SUBDIR = "wikitext103-eval"
GPT2_FILE = Path("gpt2-tokenizer") / "tokenizer.json"
LM_SPLITS = ("train", "valid", "test")


# --------------------------------------------------------------------------- data lookup
def resolve_corpus_dir(data_dir: str | Path | None) -> Path:
    """The corpus directory (with ``train/``) designated by `data_dir`: the directory itself, or
    its ``pg19-mini/`` subfolder; None means the shared data directory."""
    root = resolve_data_dir(data_dir)
    for candidate in (root, root / CORPUS_SUBDIR):
        if (candidate / "train").is_dir():
            return candidate
    raise FileNotFoundError(
        f"{root} is not a corpus directory: expected {root}/train/*.txt (with valid/ and test/) "
        f"or a data root with {CORPUS_SUBDIR}/"
    )


def is_wikitext_dir(path: Path) -> bool:
    return any(path.glob("wiki.*.tokens"))


def load_text_tokenizer(spec: str, near: Path | None = None) -> TextTokenizer:
    """``bytes``, ``gpt2`` (``gpt2-tokenizer/tokenizer.json`` in `near`, its parent or the shared
    data directory) or a path to a GPT-2-style ``tokenizer.json``."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"tokenizer must be 'bytes', 'gpt2' or a path, got {spec!r}")
    if spec == "bytes":
        return ByteTokenizer()
    if spec == "gpt2":
        tried: list[Path] = []
        roots = [near, near.parent] if near is not None else []
        shared = default_data_dir()
        if shared is not None:
            roots.append(shared)
        for root in roots:
            path = root / GPT2_FILE
            tried.append(path)
            if path.is_file():
                return GPT2Tokenizer(path)
        raise FileNotFoundError(
            "GPT-2 tokenizer file not found (tried "
            + ", ".join(str(p) for p in tried)
            + "); pass --tokenizer PATH/tokenizer.json or --tokenizer bytes"
        )
    path = Path(spec).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file not found: {path}")
    return GPT2Tokenizer(path)


def load_eval_corpus(
    path: str | Path, split: str, tokenizer: TextTokenizer, progress: bool = False
) -> TokenizedCorpus:
    """A split of a corpus directory (``<path>/<split>/*.txt``) or of WikiText-103
    (``<path>/wiki.<split>.tokens``, one article per document)."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"evaluation data directory not found: {path}")
    if is_wikitext_dir(path):
        return load_wikitext(path, split, tokenizer, progress=progress)
    return load_corpus(resolve_corpus_dir(path), split, tokenizer, progress=progress)


@dataclass
class LMData:
    """The tokenizer and the three tokenised splits of one corpus."""

    corpus_dir: Path
    tokenizer: TextTokenizer
    splits: dict[str, TokenizedCorpus]

    @classmethod
    def load(cls, data_dir: str | None, tokenizer: str, progress: bool = False) -> LMData:
        corpus_dir = resolve_corpus_dir(data_dir)
        tok = load_text_tokenizer(tokenizer, corpus_dir)
        splits = {s: load_corpus(corpus_dir, s, tok, progress=progress) for s in LM_SPLITS}
        for name, corpus in splits.items():
            if corpus.num_tokens == 0:
                raise ValueError(f"the {name} split of {corpus_dir} holds no text")
        return cls(corpus_dir, tok, splits)


def _vocab_size(train_cfg: TrainConfig) -> int:
    near = None
    if train_cfg.tokenizer == "gpt2":
        try:
            near = resolve_corpus_dir(train_cfg.data_dir)
        except FileNotFoundError:
            near = None
    return load_text_tokenizer(train_cfg.tokenizer, near).vocab_size


# --------------------------------------------------------------------------- the task
def _state_tensors(state: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in state.tensors().items()}


@register_task("lm")
class LanguageModelTask(Task):
    """See the module docstring."""

    metric = "ppl"
    higher_is_better = False

    def __init__(self, train_cfg: TrainConfig, model_cfg: Any, env: DistEnv) -> None:
        super().__init__(train_cfg, model_cfg, env)
        self.check_configs(train_cfg, model_cfg)
        self.data = LMData.load(
            train_cfg.data_dir, train_cfg.tokenizer, progress=train_cfg.progress and env.is_main
        )
        if self.data.tokenizer.vocab_size > model_cfg.vocab_size:
            raise ValueError(
                f"the tokenizer has {self.data.tokenizer.vocab_size} ids, the model's vocabulary "
                f"only {model_cfg.vocab_size}"
            )
        self.token_bytes = token_byte_lengths(self.data.tokenizer)
        self.streams = DocumentStreams(
            with_bos(self.data.splits["train"]),
            batch_size=train_cfg.batch_size,
            segment_len=model_cfg.segment_len,
            seed=train_cfg.seed,
            shuffle=True,
            loop=True,
        )
        num_micro = train_cfg.grad_accum
        # Position *before* step `_step`: stream cursor and carried memory (one per micro-batch).
        self._step = 0
        self._stream_before = self.streams.state_dict()
        self._memory: list[Any] = [None] * num_micro
        # The step in flight: its global batch, the stream cursor after it, the new memory.
        self._batch: Any = None
        self._stream_after: dict[str, Any] | None = None
        self._memory_after: list[Any] = [None] * num_micro
        self._done: list[bool] = [False] * num_micro
        self._in_flight = False  # the batch of `_step` has been drawn in this process
        self._after_ready = False  # every micro-batch of `_step` ran: the "after" state is valid
        self._pending_after: dict[str, Any] | None = None

    # ------------------------------------------------------------------ model side
    @classmethod
    def model_overrides(cls, train_cfg: TrainConfig) -> dict[str, Any]:
        return {"vocab_size": _vocab_size(train_cfg)}

    @classmethod
    def check_configs(cls, train_cfg: TrainConfig, model_cfg: Any) -> None:
        """Cheap checks before any work: the corpus layout exists, the vocabulary fits."""
        corpus_dir = resolve_corpus_dir(train_cfg.data_dir)
        for split in LM_SPLITS:
            folder = corpus_dir / split
            if not folder.is_dir():
                raise FileNotFoundError(f"split folder not found: {folder}")
            if not any(p.is_file() for p in folder.glob("*.txt")):
                raise ValueError(f"no .txt files in {folder}")
        if model_cfg.vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {model_cfg.vocab_size}")

    # ------------------------------------------------------------------ data position
    def _begin(self, step: int) -> None:
        """Make the batch of `step` current (committing the previous step if it finished)."""
        if step == self._step and self._in_flight:
            return
        if step == self._step + 1 and self._after_ready:
            self._step = step
            self._stream_before = self._stream_after
            self._memory = list(self._memory_after)
        elif step != self._step:
            raise RuntimeError(
                f"the language-model data stream is positioned before step {self._step}, "
                f"but step {step} was requested"
            )
        self.streams.load_state_dict(self._stream_before)
        self._batch = next(self.streams)
        self._stream_after = self.streams.state_dict()
        self._memory_after = [None] * len(self._memory)
        self._done = [False] * len(self._memory)
        self._in_flight, self._after_ready = True, False

    def train_micro_batch(
        self, model: nn.Module, raw_model: nn.Module, step: int, micro: int, num_micro: int
    ) -> tuple[torch.Tensor, StepStats]:
        self._begin(step)
        batch = self._batch
        rows = shard_rows(batch.inputs.shape[0], self.env, micro, num_micro)
        device = self.env.device
        inputs = batch.inputs[rows].to(device)
        targets = batch.targets[rows].to(device)
        reset = batch.reset[rows].to(device)
        state = self._memory[micro]
        out = model(inputs, state=state, targets=targets, reset=reset)
        self._memory_after[micro] = out.state.detach()
        self._done[micro] = True
        self._after_ready = all(self._done)
        chunks = self.env.world_size * num_micro
        ce, correct, count = scored_stats(out.logits, targets)
        aux = {k: _scalar(v) / chunks for k, v in (getattr(out, "aux", None) or {}).items()}
        stats = StepStats(
            loss=_scalar(out.loss) / chunks,
            lm_loss_sum=ce,
            correct=correct,
            count=count,
            tokens=float(inputs.numel()),
            aux=aux,
        )
        return out.loss / num_micro, stats

    def train_metrics(self, stats: StepStats) -> dict[str, float]:
        out = super().train_metrics(stats)
        if stats.count:
            out["ppl"] = math.exp(min(stats.lm_loss_sum / stats.count, 50.0))
        return out

    # ------------------------------------------------------------------ resumable state
    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self._step,
            "stream": self._stream_before,
            "stream_after": self._stream_after if self._after_ready else None,
            "has_memory": [m is not None for m in self._memory],
        }

    def state_tensors(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for i, state in enumerate(self._memory):
            if state is not None:
                out.update({f"before.{i}.{k}": v for k, v in _state_tensors(state).items()})
        if self._after_ready:
            for i, state in enumerate(self._memory_after):
                out.update({f"after.{i}.{k}": v for k, v in _state_tensors(state).items()})
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self._step = int(state["step"])
        self._stream_before = state["stream"]
        self.streams.load_state_dict(self._stream_before)  # validates it against this corpus
        self._pending_after = state.get("stream_after")
        self._in_flight = self._after_ready = False

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        from ..state import MemoryState

        n_layers = self.model_cfg.n_layers
        device = self.env.device

        def group(prefix: str) -> dict[str, torch.Tensor]:
            return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}

        memory: list[Any] = []
        after: list[Any] = []
        for i in range(len(self._memory)):
            before_i, after_i = group(f"before.{i}."), group(f"after.{i}.")
            memory.append(
                MemoryState.from_tensors(before_i, n_layers).to(device) if before_i else None
            )
            after.append(
                MemoryState.from_tensors(after_i, n_layers).to(device) if after_i else None
            )
        self._memory = memory
        pending = getattr(self, "_pending_after", None)
        if pending is not None and all(a is not None for a in after):
            # the saved step had finished: it becomes current once the trainer asks for step + 1
            self._stream_after = pending
            self._memory_after = after
            self._after_ready = True
        self._pending_after = None

    # ------------------------------------------------------------------ evaluation
    def _shard(self, corpus: TokenizedCorpus) -> TokenizedCorpus | None:
        """This rank's documents (round robin over ranks)."""
        if self.env.world_size == 1:
            return corpus
        mine = list(range(self.env.rank, corpus.num_docs, self.env.world_size))
        if not mine:
            return None
        return TokenizedCorpus.from_documents(
            [corpus.document(i) for i in mine],
            vocab_size=corpus.vocab_size,
            eos_id=corpus.eos_id,
            names=[corpus.doc_names[i] for i in mine],
            doc_bytes=[int(corpus.doc_bytes[i]) for i in mine],
            tokenizer_name=corpus.tokenizer_name,
        )

    @torch.no_grad()
    def evaluate(self, raw_model: nn.Module, split: str, num_batches: int) -> dict[str, float]:
        if split not in self.data.splits:
            raise ValueError(f"split must be one of {LM_SPLITS}, got {split!r}")
        corpus = self._shard(self.data.splits[split])
        nll = tokens = nbytes = 0.0
        if corpus is not None:
            docs = int((corpus.doc_lengths > 0).sum())
            cfg = LMEvalConfig(
                batch_size=max(1, min(self.train_cfg.batch_size, docs)),
                max_steps=0 if split == "test" else num_batches,
            )
            result = evaluate_lm(raw_model, corpus, cfg, token_bytes=self.token_bytes)
            nll, tokens, nbytes = result.nll_sum, float(result.num_tokens), float(result.num_bytes)
        nll, tokens, nbytes = all_reduce_sum([nll, tokens, nbytes], self.env)
        loss = nll / max(tokens, 1.0)
        return {
            "loss": loss,
            "ppl": math.exp(min(loss, 700.0)),
            "bpb": nll / (math.log(2) * nbytes) if nbytes else math.nan,
            "tokens": tokens,
        }

    # ------------------------------------------------------------------ generation
    def encode_prompt(self, text: str) -> tuple[torch.Tensor, str | None]:
        ids = [self.data.tokenizer.eos_id] + self.data.tokenizer.encode(text)
        return torch.tensor(ids, dtype=torch.long), None

    def decode(self, tokens: list[int]) -> str:
        return self.data.tokenizer.decode(tokens)

    def default_new_tokens(self) -> int:
        return 200


# --------------------------------------------------------------------------- saved models
@dataclass
class CheckpointEval:
    """What :func:`evaluate_lm_checkpoint` measured, and on what."""

    result: LMEvalResult
    model_config: Any  # the evaluation model's config (training config + overrides)
    train_config: TrainConfig
    data: str  # the evaluated directory
    split: str
    tokenizer: str


def evaluate_lm_checkpoint(
    path: str | Path,
    data_dir: str | Path | None = None,
    split: str = "test",
    overrides: dict[str, Any] | None = None,
    batch_size: int | None = None,
    max_docs: int | None = None,
    max_tokens: int | None = None,
    device: str = "cpu",
    progress: bool = False,
) -> CheckpointEval:
    """Perplexity, bits per byte and per-position loss of a saved language model over whole
    documents of `split` (``max_docs`` / ``max_tokens`` keep the first documents / a prefix of
    each). `data_dir`: a corpus directory, a data root with ``pg19-mini/``, or a WikiText-103
    directory (``wiki.<split>.tokens``); default: the run's training corpus. `overrides`: memory
    settings of the evaluation model (:data:`lm_eval.EVAL_OVERRIDABLE`, e.g. a longer
    ``mem_len``); the weights are the checkpoint's."""
    from ..config import ModelConfig
    from .distributed import resolve_device
    from .trainer import model_from_checkpoint

    def config_factory(saved: dict[str, Any]) -> ModelConfig:
        return eval_model_config(ModelConfig.from_dict(saved), overrides)

    dev = resolve_device(device)
    model, model_cfg, train_cfg, _ = model_from_checkpoint(path, dev, config_factory=config_factory)
    if train_cfg.task != "lm":
        raise ValueError(f"{path} holds a {train_cfg.task!r} model, not a language model")
    if data_dir is None:
        target = resolve_corpus_dir(train_cfg.data_dir)
    else:
        target = Path(data_dir).expanduser()
        if not target.is_dir():
            raise FileNotFoundError(f"evaluation data directory not found: {target}")
        if not is_wikitext_dir(target):
            target = resolve_corpus_dir(target)
    near = target if not is_wikitext_dir(target) else target.parent
    try:
        tokenizer = load_text_tokenizer(train_cfg.tokenizer, near)
    except FileNotFoundError:
        tokenizer = load_text_tokenizer(train_cfg.tokenizer, resolve_corpus_dir(train_cfg.data_dir))
    if tokenizer.vocab_size > model_cfg.vocab_size:
        raise ValueError(
            f"the tokenizer has {tokenizer.vocab_size} ids, the model only {model_cfg.vocab_size}"
        )
    corpus = load_eval_corpus(target, split, tokenizer, progress=progress)
    token_bytes = token_byte_lengths(tokenizer)
    if max_docs is not None or max_tokens is not None:
        corpus = truncate_documents(corpus, max_tokens, max_docs, token_bytes)
    docs = int((corpus.doc_lengths > 0).sum())
    rows = batch_size if batch_size is not None else max(1, min(train_cfg.batch_size, docs))
    cfg = LMEvalConfig(batch_size=rows, progress=progress)
    result = evaluate_lm(model, corpus, cfg, token_bytes=token_bytes)
    return CheckpointEval(
        result=result,
        model_config=model_cfg,
        train_config=train_cfg,
        data=str(target),
        split=split,
        tokenizer=train_cfg.tokenizer,
    )


__all__ = [
    "CheckpointEval",
    "evaluate_lm_checkpoint",
    "LMData",
    "LanguageModelTask",
    "is_wikitext_dir",
    "load_eval_corpus",
    "load_text_tokenizer",
    "resolve_corpus_dir",
]
