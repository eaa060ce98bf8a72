"""Facts hidden in real books, asked for later (``inftyformer train facts``): a retrieval signal
for training a memory on natural text, and the pass-key test on held-out books.

Plain language-model loss on books gives a memory little reason to retrieve anything precise;
this task asks for it. Each example is a passage of a real book with one fact written into it,
d tokens before a question about it; the answer's tokens are scored::

    [book text … | FACT | book text … | QUESTION | ANSWER]
                         <-------- d tokens ------->

    training (train books):   "Mara's locker number is 4821." … "What is Mara's locker
                              number? It is" → " 4821"   (several wordings, 3-4 and 6-7 digits)
    evaluation (valid/test):  "The pass key is 48213. Remember it. 48213 is the pass key." …
                              "What is the pass key? The pass key is" → " 48213"

Evaluation facts differ from training ones in wording and key format (five digits are never
trained), and come from other books (the corpus's valid/test splits), so a model that scores on
them retrieves rather than remembers. Each batch draws one distance d from ``distance`` (all rows
share it, so their blocks line up); every row draws its book passage, wording and key. The stream
is a whole number of segments of C = ``segment_len`` and the answer ends the last one: every
segment but the last streams into the memory without gradients (as in sorting and recall,
`streamed.py`), the last is scored, so the answer and the token before it must fit in one
segment: an answer that does not is refused (`check_answer_fits`), never scored in part. The
loss is the answer's mean NLL plus ``lm_weight`` × the mean next-token NLL of the rest of the
last segment (ordinary language modelling, so the model keeps reading books well).

``read_weight`` > 0 adds read supervision: the key's place in the memory is known (blocks of C,
a window of 0 or C tokens, no sticky sampling: `read_targets`), so the loss also holds the mean
NLL of that place under the answer's reads, N(t*; μ, σ²), over every memory layer and head
(paper §3.2's densities, told where to look while training; evaluation never sees it). With
``read_target="token"`` the query that predicts the answer's j-th token is pointed at the key's
j-th token (each step reads the digit it has to write); with "start", every answer query at the
key's first token.

Metrics: ``exact`` (the share of answers whose every token is the argmax: greedy decoding would
write the answer exactly; the headline), ``accuracy`` (per answer token), ``loss`` (answer NLL
per token), ``examples``. With a pretrained model the task uses the base's tokenizer
(``--base-model`` sets ``tokenizer``); evaluating at other distances is a task-settings override,
e.g. ``evaluate_run(run, task_settings={"distance": 4000})``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from .._checks import check_positive_int, check_range
from ..core.attention import record_reads
from ..core.ridge import squeezed_position
from ..data import TextTokenizer, check_split, load_split
from ..data.corpus import text_layout
from ..data.paths import embedded_fallback_note, training_source
from ..model_kinds import model_kind
from ..native.model import IGNORE_INDEX, token_losses
from .base import (
    Metric,
    RunContext,
    StepOutput,
    TaskConfig,
    fitting_tokenizer,
    register_task,
    scored_sums,
    tokenizer_near_data,
)
from .streamed import LastBlockTask

# (statement, question); the answer is " {key}"
TRAIN_FACTS = (
    ("{name}'s locker number is {key}.", "What is {name}'s locker number? It is"),
    ("The code to the {place} is {key}. Do not forget it.", "The code to the {place} is"),
    ("Remember this: the {place} ticket reads {key}.", "What did the {place} ticket read? It read"),
    ("{name} wrote the number {key} on a slip of paper.", "What number did {name} write? It was"),
)
EVAL_FACTS = (
    (
        "The pass key is {key}. Remember it. {key} is the pass key.",
        "What is the pass key? The pass key is",
    ),
)
NAMES = ("Mara", "Tobias", "Ines", "Walter", "Odile", "Ruben", "Hana", "Piet", "Lucia", "Anton")
PLACES = ("garden gate", "north tower", "cellar", "harbour office", "old mill", "library annex")
# digits per key: five is never trained, so the pass-key test is a format the model has not seen
TRAIN_DIGITS = (3, 4, 6, 7)
EVAL_DIGITS = (5,)
_SPLIT_ENTROPY = {"train": 0xFAC7_0001, "valid": 0xFAC7_0002, "test": 0xFAC7_0003}


@dataclass(frozen=True)
class FactsConfig(TaskConfig):
    data_dir: str | None = None  # books: a corpus directory or a data root with pg19-mini/
    tokenizer: str = "gpt2"  # bytes, gpt2, or a tokenizer.json (a pretrained run: the base's)
    distance: tuple[int, ...] = (300, 700, 1500)  # tokens from the fact's end to the question's
    lm_weight: float = 0.1  # weight of the last segment's language-model loss
    lead: int = 16  # at least this many book tokens before the fact
    # weight of the read supervision: the NLL of the key's place in the memory under each read's
    # density at the answer's queries (every memory layer and head); 0: none
    read_weight: float = 0.0
    read_target: str = "token"  # "token": answer token j reads key token j; "start": the key

    def __post_init__(self) -> None:
        if self.data_dir is not None and (not isinstance(self.data_dir, str) or not self.data_dir):
            raise TypeError(f"data_dir must be a non-empty string or None, got {self.data_dir!r}")
        if not isinstance(self.tokenizer, str) or not self.tokenizer:
            raise ValueError(f"tokenizer must be a non-empty string, got {self.tokenizer!r}")
        items = (self.distance,) if isinstance(self.distance, int) else self.distance
        if isinstance(items, (str, bytes)) or not isinstance(items, (tuple, list)) or not items:
            raise TypeError(f"distance must be an int or a non-empty list of ints, got {items!r}")
        for d in items:
            check_positive_int("distance", d)
        object.__setattr__(self, "distance", tuple(int(d) for d in items))
        check_range("lm_weight", self.lm_weight, 0.0)
        check_range("read_weight", self.read_weight, 0.0)
        if self.read_target not in ("token", "start"):
            raise ValueError(f"read_target must be 'token' or 'start', got {self.read_target!r}")
        check_positive_int("lead", self.lead, minimum=0)


@dataclass(frozen=True)
class Fact:
    statement: list[int]  # the fact as tokens, between newlines
    question: list[int]  # the question, after a newline
    answer: list[int]  # " {key}"
    key: str


class FactsDataset:
    """Batches of one split: `batch(index)` is a pure function of (seed, split, index)."""

    def __init__(
        self,
        config: FactsConfig,
        tokenizer: TextTokenizer,
        books: Any,  # TokenizedCorpus of the split
        batch_size: int,
        block: int,
        split: str,
        seed: int,
    ) -> None:
        self.config, self.tokenizer, self.books = config, tokenizer, books
        self.batch_size, self.block, self.split, self.seed = batch_size, block, split, seed
        self.templates = TRAIN_FACTS if split == "train" else EVAL_FACTS
        self.digits = TRAIN_DIGITS if split == "train" else EVAL_DIGITS
        lengths = np.diff(books.doc_offsets)
        if lengths.size == 0 or int(lengths.max()) < 1:
            raise ValueError(f"the {split} split holds no book text")
        self._lengths = lengths

    def rng(self, index: int) -> np.random.Generator:
        seq = np.random.SeedSequence([self.seed, _SPLIT_ENTROPY[self.split]], spawn_key=(index,))
        return np.random.default_rng(seq)

    def fact(self, rng: np.random.Generator) -> Fact:
        statement, question = self.templates[int(rng.integers(len(self.templates)))]
        digits = int(rng.choice(self.digits))
        key = str(int(rng.integers(10 ** (digits - 1), 10**digits)))
        names = {"name": NAMES[int(rng.integers(len(NAMES)))], "key": key}
        names["place"] = PLACES[int(rng.integers(len(PLACES)))]
        enc = self.tokenizer.encode
        return Fact(
            enc("\n" + statement.format(**names) + "\n"),
            enc("\n" + question.format(**names)),
            enc(" " + key),
            key,
        )

    def book_text(self, rng: np.random.Generator, length: int) -> np.ndarray:
        """`length` consecutive tokens of one book (books shorter than that are repeated)."""
        doc = int(rng.integers(len(self._lengths)))
        start, n = int(self.books.doc_offsets[doc]), int(self._lengths[doc])
        tokens = np.asarray(self.books.tokens[start : start + n], dtype=np.int64)
        if n < length:
            tokens = np.tile(tokens, -(-length // n))
        offset = int(rng.integers(len(tokens) - length + 1))
        return tokens[offset : offset + length]

    def batch(self, index: int, distance: int | None = None):
        """(inputs, answer targets, language-model targets), LongTensors [B, S], the batch's
        distance d, and where each row's key begins in the stream (LongTensor [B])."""
        check_positive_int("index", index, minimum=0)
        rng = self.rng(index)
        d = int(rng.choice(self.config.distance)) if distance is None else distance
        facts = [self.fact(rng) for _ in range(self.batch_size)]
        for f in facts:
            if len(f.question) > d:
                raise ValueError(f"distance {d} is shorter than the question ({len(f.question)})")
            check_answer_fits(len(f.answer), self.block, repr(" " + f.key))
        need = max(self.config.lead + len(f.statement) + d + len(f.answer) for f in facts)
        S = -(-need // self.block) * self.block
        inputs = np.empty((self.batch_size, S), dtype=np.int64)
        answer = np.full((self.batch_size, S), IGNORE_INDEX, dtype=np.int64)
        key_at = np.empty(self.batch_size, dtype=np.int64)
        for row, f in enumerate(facts):
            text = self.book_text(rng, S)  # one passage of a book, cut where the parts go
            lead = S - len(f.statement) - d - len(f.answer)
            after = d - len(f.question)
            parts = [text[:lead], f.statement, text[lead : lead + after], f.question, f.answer]
            inputs[row] = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
            first = S - len(f.answer)  # position of the answer's first token
            answer[row, first - 1 : S - 1] = f.answer  # position i predicts token i + 1
            key_at[row] = lead + _find(f.statement, f.answer)
        lm = np.full_like(inputs, IGNORE_INDEX)
        lm[:, :-1] = inputs[:, 1:]
        lm[answer != IGNORE_INDEX] = IGNORE_INDEX  # the answer is scored once, as the answer
        tensors = (torch.from_numpy(a) for a in (inputs, answer, lm))
        return *tensors, d, torch.from_numpy(key_at)


def check_answer_fits(answer_tokens: int, segment_len: int, answer: str = "an answer") -> None:
    """Only the last segment of a stream is scored, and its first position predicts the
    segment's second token: an answer of A tokens is scored whole only when A + 1 ≤ C. A
    longer one would be scored in part (its last C − 1 tokens), and exact match would count
    an answer right whose first tokens were never scored: refused instead."""
    if answer_tokens + 1 > segment_len:
        raise ValueError(
            f"{answer} is {answer_tokens} tokens, but with segment_len={segment_len} only the "
            f"last segment is scored and it holds {segment_len - 1} of them (the answer and "
            f"the token before it must fit in one segment): use segment_len >= "
            f"{answer_tokens + 1}"
        )


def _find(tokens: list[int], part: list[int]) -> int:
    """The index of `part` in `tokens` (the key in its statement), else the statement's middle."""
    n = len(part)
    for i in range(len(tokens) - n + 1):
        if tokens[i : i + n] == part:
            return i
    return len(tokens) // 2


def fitted_blocks(length: int, segment_len: int, window: int) -> int:
    """Blocks in the long-term memory when the last block of a stream of `length` tokens is read:
    all but that block and the W/C blocks of the window (W ∈ {0, C})."""
    return length // segment_len - 1 - window // segment_len


def read_targets(
    key_at: torch.Tensor, length: int, segment_len: int, window: int, tau: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each row's key lies in the long-term memory when the last block of a stream of
    `length` tokens is read (blocks of C = `segment_len`, a window of 0 or C tokens,
    no sticky sampling), float64 [B], and whether it is there at all (not still in the window
    or the block) [B] bool. The memory then holds blocks 0 … n − 2 − W/C, block b fitted after
    b other fits."""
    C = segment_len
    fitted = fitted_blocks(length, C, window)
    block = key_at // C
    cell = (key_at % C).double().add(0.5).div(C)
    age = (fitted - 1 - block).clamp(min=0)
    t = squeezed_position(cell, block == 0, age, tau)
    return t, block < fitted


def _answer_sums(logits: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """`scored_sums` of the answer tokens, plus exact answers (every token the argmax) and
    examples, per batch."""
    mask = targets != IGNORE_INDEX  # [B, C]
    hit = (logits.detach().argmax(-1) == targets) | ~mask  # [B, C]
    rows = mask.any(-1)
    return {
        **scored_sums(logits, targets),
        "exact": float((hit.all(-1) & rows).sum()),
        "examples": float(rows.sum()),
    }


@register_task("facts")
class FactsTask(LastBlockTask):
    """See the module docstring."""

    summary = "facts written into books and asked for later (retrieval on real text)"
    Config = FactsConfig
    metrics = (
        Metric("exact", ".4f", higher_is_better=True),
        Metric("accuracy", ".4f"),
        Metric("loss", ".4f"),
        Metric("examples", ".0f"),
    )
    progress_metrics = ("exact",)

    def __init__(self, config: FactsConfig, model_config: Any, context: RunContext) -> None:
        super().__init__(config, model_config, context)
        self.tokenizer = fitting_tokenizer(_tokenizer(config), model_config)
        self._datasets: dict[str, FactsDataset] = {}

    def dataset(self, split: str) -> FactsDataset:
        if split not in self._datasets:
            books = load_split(
                training_source(self.config.data_dir),
                check_split(split),
                self.tokenizer,
                self.context.progress,
            )
            self._datasets[split] = FactsDataset(
                self.config,
                self.tokenizer,
                books,
                self.context.batch_size,
                self.model_config.segment_len,
                split,
                self.context.seed,
            )
        return self._datasets[split]

    @classmethod
    def model_overrides(cls, config: FactsConfig) -> dict[str, Any]:
        return {"vocab_size": _tokenizer(config).vocab_size}

    def blocks(self, length: int, segment_len: int) -> list[tuple[int, int]]:
        return [(start, start + segment_len) for start in range(0, length, segment_len)]

    # ---- training: the answer's loss plus lm_weight × the last segment's LM loss
    def batch(self, step: int) -> Any:
        return self.dataset("train").batch(step)

    @classmethod
    def notes(cls, config: FactsConfig) -> list[str]:
        note = embedded_fallback_note(config.data_dir)
        return [] if note is None else [note]

    @classmethod
    def check(cls, config: FactsConfig, model_config: Any) -> None:
        text_layout(training_source(config.data_dir), "train")
        # " " + key, at most one token per character: the longest answer fits, so that every
        # answer is scored whole (each batch checks its own answers too)
        longest = 1 + max(TRAIN_DIGITS + EVAL_DIGITS)
        check_answer_fits(longest, model_config.segment_len, f"an answer (up to {longest} tokens)")
        if config.read_weight > 0:
            C = model_config.segment_len
            pretrained = model_kind(model_config) == "pretrained"
            if not pretrained or _window(model_config) not in (0, C):
                raise ValueError(
                    "read_weight needs a pretrained model (--base-model) whose window is 0 or "
                    f"one segment ({C}); the key's place in the memory is known only then"
                )
            squeeze = model_config.long_term.squeeze
            if squeeze.kind != "fixed":
                raise ValueError(
                    "read_weight needs squeeze='fixed': the key's place in the memory is "
                    "computed for a fixed τ"
                )
            if squeeze.sticky:
                raise ValueError(
                    "read_weight needs sticky=false: sticky sampling moves the past unevenly, "
                    "so the key's place in the memory is not known"
                )

    def loss(self, model: nn.Module, batch: Any, rows: slice, part: int) -> StepOutput:
        inputs, answer, lm, _, key_at = batch
        if self.config.read_weight > 0:
            with record_reads(model) as reads:
                out, last_answer = self._run(model, inputs[rows], answer[rows], with_grad=True)
        else:
            out, last_answer = self._run(model, inputs[rows], answer[rows], with_grad=True)
        C = last_answer.shape[1]
        lm_last = lm[rows, -C:].to(out.logits.device)
        loss = out.loss
        if self.config.lm_weight > 0 and bool((lm_last != IGNORE_INDEX).any()):
            lm_loss = token_losses(out.logits, lm_last)[1]  # mean NLL of the book's tokens
            loss = loss + self.config.lm_weight * lm_loss
        means = {k: float(v.detach()) for k, v in out.aux.items()}
        if self.config.read_weight > 0:
            c = self.model_config
            scored = (last_answer != IGNORE_INDEX).cpu()  # [B, C]: the answer's queries
            target = read_positions(scored, key_at[rows], self.config.read_target == "token")
            t, known = read_targets(target.flatten(), inputs.shape[1], C, _window(c), c.tau)
            t, known = t.view_as(target), known.view_as(target)
            read_nll = _read_nll([r[-1] for r in reads], last_answer, t, known)
            loss = loss + self.config.read_weight * read_nll
            means["read_nll"] = float(read_nll.detach())
        sums = self.batch_sums(out.logits, last_answer)
        sums["tokens"] = float(inputs[rows].numel())
        return StepOutput(loss, sums, means)

    def train_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        out = super().train_metrics(sums)
        if sums.get("examples"):
            out["exact"] = sums["exact"] / sums["examples"]
        return out

    # ---- evaluation: the shared loop (`streamed.py`), on this task's batches and sums
    def eval_batch(self, split: str, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, answer, *_ = self.dataset(split).batch(index)
        return inputs, answer

    def batch_sums(self, logits: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        return _answer_sums(logits, targets)

    def eval_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        examples = max(sums.get("examples", 0.0), 1.0)
        return {
            **self.scored_metrics(sums),
            "exact": sums.get("exact", 0.0) / examples,
            "examples": sums.get("examples", 0.0),
        }


def read_positions(scored: torch.Tensor, key_at: torch.Tensor, per_token: bool) -> torch.Tensor:
    """The stream position each query of a block should read, LongTensor [B, C]: the key's
    first token, or (`per_token`) for the query predicting the answer's j-th token (the j-th
    of `scored` [B, C] bool) the key's j-th token. key_at [B]."""
    target = key_at[:, None].expand_as(scored)
    if per_token:
        target = target + (scored.long().cumsum(1) - 1).clamp(min=0)
    return target


def stream_positions(
    t: torch.Tensor, length: int, segment_len: int, window: int, tau: float
) -> torch.Tensor:
    """The inverse of `read_targets`: the stream position (tokens, fractional) that the place
    t ∈ [0, 1] of the memory holds when the last block is read, float64 of t's shape; with
    `tokens_per_unit`, the scale of a read's σ in tokens."""
    C = segment_len
    fitted = fitted_blocks(length, C, window)
    if fitted < 1:
        return torch.full_like(t, math.nan, dtype=torch.float64)
    t = t.double().clamp(1e-300, 1.0)
    first_end = tau ** (fitted - 1)  # block 0 lies in [0, τ^(F−1)]
    age = torch.floor(torch.log(t) / math.log(tau)).clamp(0, max(fitted - 2, 0))
    in_first = t < first_end
    cell = torch.where(in_first, t / first_end, (t / tau**age - tau) / (1 - tau))
    block = torch.where(in_first, torch.zeros_like(age), fitted - 1 - age)
    return block * C + cell * C - 0.5


def tokens_per_unit(key_at: torch.Tensor, length: int, segment_len: int, window: int, tau: float):
    """Stream tokens per unit of t around each key's place (1 / (dt/dposition)), float64 [B]."""
    C = segment_len
    fitted = fitted_blocks(length, C, window)
    block = key_at // C
    age = (fitted - 1 - block).clamp(min=0).double()
    slope = torch.where(block == 0, tau ** (fitted - 1.0) / C, (1 - tau) * tau**age / C)
    return 1.0 / slope


def _window(model_config: Any) -> int:
    """A pretrained model's short-term window W (None: one segment, `hf/config.py`)."""
    window = model_config.window
    return model_config.segment_len if window is None else window


def _read_nll(
    reads: list[Any], targets: torch.Tensor, t: torch.Tensor, known: torch.Tensor
) -> torch.Tensor:
    """Mean over memory layers, heads and the answer's queries (targets [B, C] not ignored,
    whose place t [B, C] is in the memory: `known` [B, C]) of −log N(t*; μ, σ²), the reads'
    density at the place each query should read."""
    C = targets.shape[1]
    mask = (targets != IGNORE_INDEX) & known.to(targets.device)  # [B, C]
    if not bool(mask.any()):
        return sum(r.mu.sum() * 0.0 for r in reads)
    t = t.to(targets.device, torch.float32)[:, None, :]  # [B, 1, C]
    total = []
    for read in reads:
        mu, var = read.mu[..., -C:].float(), read.sigma_sq[..., -C:].float()  # [B, H, C]
        nll = 0.5 * torch.log(2 * torch.pi * var) + (t - mu) ** 2 / (2 * var)  # [B, H, C]
        total.append(nll.mean(1)[mask].mean())
    return torch.stack(total).mean()


def _tokenizer(config: FactsConfig) -> TextTokenizer:
    return tokenizer_near_data(config.tokenizer, config.data_dir)


__all__ = [
    "EVAL_FACTS",
    "TRAIN_FACTS",
    "check_answer_fits",
    "FactsConfig",
    "FactsDataset",
    "FactsTask",
    "fitted_blocks",
    "read_positions",
    "read_targets",
    "stream_positions",
    "tokens_per_unit",
]
