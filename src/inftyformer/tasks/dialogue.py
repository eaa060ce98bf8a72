"""Document-grounded dialogue on CMU-DoG (``inftyformer train dialogue``; paper §4.3).

A conversation about a movie; the movie's Wikipedia document is given and the model generates the
next reply. The paper fine-tuned GPT-2 small with a continuous long-term memory, wrote the whole
document into the memory before the dialogue, and scored generated replies from the fourth
utterance on (F1 9.01, ROUGE-1 15.37, ROUGE-L 12.56, METEOR 7.55 with sticky memories; its ROUGE
is a recall: :mod:`inftyformer.metrics`). Data: :mod:`inftyformer.data.cmu_dog` (``data_dir``: the
``cmu-dog`` folder or a data root holding it).

Examples. One example per turn with at least ``min_history`` earlier turns (3: from the fourth
utterance on, as the authors scored) and a non-blank text; the document is all four sections
(``grounding="full"``, what the paper kept in memory) or the section on screen when the reply was
written (``"section"``, CMU-DoG's own setting). Training uses the train conversations that do not
also occur in valid or test (CMU-DoG repeats 108 of them); valid and test are used as they are.
``merge_turns`` joins consecutive turns of one speaker first (off by default: every utterance is
one example, as the authors scored them).

Speakers: :mod:`inftyformer.tasks.chat` (a chat template, or speaker marks).

The reply's call and where the document goes (``placement``):
:mod:`inftyformer.tasks.dialogue_examples`.

``other_document`` (a control) gives each conversation the document of another movie (the next
document id, cyclically) instead of its own.

Batches. All conversations are about 30 documents, so a training batch is drawn from one
document: one example of the training set drawn uniformly (the step's rng), then the batch's other
rows from the examples about the same document (sections: the same section). The document then
streams through the model once per step, at batch 1 (micro-batches of a step reuse it: the weights
do not change within a step), and its memory is repeated for the rows; the calls
of different lengths are right-padded (the pad is never attended to by real tokens, and its
targets are −100). A batch is a pure function of (seed, step): resuming needs no data cursor.

Evaluation (``evaluate(model, split, num_batches, shard)``): a fixed subset of the split's
examples, ``eval_examples`` of them drawn with ``seed`` (None: all); on ``valid`` (the periodic
check while training) only the first ``num_batches × batch_size`` of them. Per document the memory
is built once; each example's reply is scored by teacher forcing (loss, perplexity) and generated
as the authors did: nucleus sampling ``top_p`` 0.9, ``temperature`` 1, at most ``max_new_tokens``
50 new tokens, one example at a time with its own seed (from ``seed``, the conversation and the
turn: the same reply whatever the sharding), cut at the end-of-turn token. The generated replies
are scored with :func:`inftyformer.metrics.dialogue_scores` (percent): ``f1``,
``rouge1``, ``rougeL``, ``meteor``, ``rouge1_authors``, ``rougeL_authors`` as sums of the
per-example scores, and corpus ``bleu`` from sacreBLEU's sufficient statistics (matching and total
n-grams, hypothesis and reference lengths), which add up over shards. ``generate=False`` scores by
teacher forcing only (the generation metrics are then absent). The reply perplexity ``ppl``, defined
either way, selects the best checkpoint. Predictions, references and
per-example scores go into ``Evaluation.details``.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from ..data import TextTokenizer, check_split, load_tokenizer
from ..data.cmu_dog import (
    DialogueExample,
    dialogue_examples,
    load_cmu_dog,
    load_documents,
    merge_consecutive_turns,
    resolve_cmu_dog_dir,
)
from ..metrics import bleu_from_statistics, bleu_statistics
from ..model_kinds import unwrap
from ..native.model import IGNORE_INDEX
from .base import (
    Evaluation,
    Metric,
    RunContext,
    Shard,
    StepOutput,
    Task,
    add_sums,
    fitting_tokenizer,
    register_task,
    scored_sums,
)
from .chat import speaker_format
from .dialogue_config import GROUNDINGS, PLACEMENTS, DialogueConfig  # noqa: F401  (re-exported)
from .dialogue_examples import (
    DOCUMENT_HEADER,
    SECTION_SEPARATOR,
    EncodedExample,
    document_key,
    example_seed,
    generate_reply,
    lay_out,
    pad_batch,
    push_document,
)

GENERATION_METRICS = ("f1", "rouge1", "rougeL", "meteor", "rouge1_authors", "rougeL_authors")


# --------------------------------------------------------------------------- the task
@dataclass
class DialogueBatch:
    examples: list[EncodedExample]  # all about one document
    memory: tuple[int, ...] = field(default_factory=tuple)
    # the memory after the document (batch 1), made by the step's first micro-batch: the weights
    # do not change before the step's last one, so the others reuse it
    document_state: Any = field(default=None, compare=False, repr=False)


@register_task("dialogue")
class DialogueTask(Task):
    """See the module docstring."""

    summary = "document-grounded dialogue on CMU-DoG, the document in long-term memory (§4.3)"
    Config = DialogueConfig
    metrics = (
        Metric("f1", ".2f"),
        Metric("rouge1", ".2f"),
        Metric("rougeL", ".2f"),
        Metric("meteor", ".2f"),
        Metric("bleu", ".2f"),
        Metric("rouge1_authors", ".2f"),
        Metric("rougeL_authors", ".2f"),
        Metric("loss", ".4f"),
        # selects the best checkpoint: defined with or without generation (the valid check
        # while training is usually teacher-forced only, far cheaper than sampling replies)
        Metric("ppl", ".2f", higher_is_better=False),
        Metric("examples", ".0f"),
        Metric("generated", ".0f"),
        Metric("reply_tokens", ".1f"),
    )
    progress_metrics = ("ppl",)

    def describe(self, metrics: dict[str, float]) -> str:
        """'ppl 24.31', and the reply scores when replies were generated."""
        text = super().describe(metrics)
        scores = [
            f"{name} {metrics[name]:.2f}"
            for name in ("f1", "rougeL", "meteor", "bleu")
            if name in metrics
        ]
        return ", ".join([text, *scores])

    def __init__(self, config: DialogueConfig, model_config: Any, context: RunContext) -> None:
        super().__init__(config, model_config, context)
        self.tokenizer = fitting_tokenizer(_tokenizer(config), model_config)
        self.format = speaker_format(
            self.tokenizer, config.tokenizer, config.speaker_format, config.instruction
        )
        self.end_ids = sorted({self.format.eot, self.tokenizer.eos_id})
        self._documents: dict | None = None
        self._examples: dict[str, list[DialogueExample]] = {}
        self._pools: dict[tuple, list[int]] | None = None
        self._doc_cache: dict[tuple, tuple[list[int], tuple[int, ...]]] = {}

    # ------------------------------------------------------------------ model side
    @classmethod
    def model_overrides(cls, config: DialogueConfig) -> dict[str, Any]:
        return {"vocab_size": _tokenizer(config).vocab_size}

    @classmethod
    def check(cls, config: DialogueConfig, model_config: Any) -> None:
        resolve_cmu_dog_dir(config.data_dir)
        if config.placement == "memory" and model_config.model_type == "transformer":
            raise ValueError(
                "placement 'memory' needs a model with memory; this one has none "
                "(choose placement context or none)"
            )
        if model_config.segment_len <= config.max_reply + 1:
            raise ValueError(
                f"segment_len ({model_config.segment_len}) leaves no room before the reply "
                f"(max_reply {config.max_reply}): raise segment_len or lower max_reply"
            )

    # ------------------------------------------------------------------ data
    @property
    def documents(self) -> dict:
        if self._documents is None:
            self._documents = load_documents(self.config.data_dir)
        return self._documents

    def check_data(self, splits: Sequence[str]) -> None:
        for split in splits:
            self.examples(split)  # refuses a split without examples

    def data_fingerprint(self, splits: Sequence[str]) -> dict[str, str]:
        """A hash of the files each split's examples come from: the documents and the split's
        conversations (train's also depend on the held-out valid and test ones)."""
        folder = resolve_cmu_dog_dir(self.config.data_dir)
        out = {}
        for split in splits:
            digest = hashlib.sha256()
            sources = ("train", "valid", "test") if split == "train" else (split,)
            for name in ("docs.json", *(f"{s}.jsonl" for s in sources)):
                digest.update(name.encode() + b"\0" + (folder / name).read_bytes())
            out[split] = digest.hexdigest()[:32]
        return out

    def examples(self, split: str) -> list[DialogueExample]:
        """The examples of `split` (train: without the conversations valid or test also hold)."""
        check_split(split)
        if split not in self._examples:
            c = self.config
            conversations = load_cmu_dog(c.data_dir, split)
            if split == "train":
                held_out = {
                    conv.conversation_id
                    for other in ("valid", "test")
                    for conv in load_cmu_dog(c.data_dir, other)
                }
                conversations = [v for v in conversations if v.conversation_id not in held_out]
            documents = self.documents
            if c.other_document:  # each movie's conversations get the next movie's document
                ids = sorted(documents)
                documents = {a: documents[b] for a, b in zip(ids, ids[1:] + ids[:1], strict=True)}
            out = []
            for conv in conversations:
                if c.merge_turns:
                    conv = merge_consecutive_turns(conv)
                out += dialogue_examples(
                    conv, documents, grounding=c.grounding, min_history=c.min_history
                )
            if not out:
                raise ValueError(f"the {split} split of CMU-DoG gives no examples")
            self._examples[split] = out
        return self._examples[split]

    def _document(self, example: DialogueExample) -> tuple[list[int], tuple[int, ...]]:
        """(the document's tokens, its tokens for the memory), cached per document."""
        key = document_key(example)
        if key not in self._doc_cache:
            text = SECTION_SEPARATOR.join(example.document)
            memory = ()
            if self.config.placement == "memory":
                memory = tuple(self.format.system(DOCUMENT_HEADER + text))
            self._doc_cache[key] = (self.tokenizer.encode(text), memory)
        return self._doc_cache[key]

    def encode(self, example: DialogueExample) -> EncodedExample:
        """Lay `example` out for the model (`dialogue_examples.lay_out`)."""
        c = self.config
        document, memory = self._document(example)
        return lay_out(
            example,
            self.format,
            document,
            memory,
            self.model_config.segment_len,
            c.max_context,
            c.max_reply,
            c.placement,
        )

    # ------------------------------------------------------------------ training
    def batch(self, step: int) -> DialogueBatch:
        examples = self.examples("train")
        if self._pools is None:
            pools: dict[tuple, list[int]] = defaultdict(list)
            for i, example in enumerate(examples):
                pools[document_key(example)].append(i)
            self._pools = dict(pools)
        rng = np.random.default_rng([self.context.seed, step, 0xD1A])
        pool = self._pools[document_key(examples[int(rng.integers(len(examples)))])]
        size = self.context.batch_size
        chosen = rng.choice(len(pool), size=size, replace=len(pool) < size)
        rows = [self.encode(examples[pool[int(i)]]) for i in chosen]
        return DialogueBatch(rows, rows[0].memory)

    def _state(self, model: nn.Module, memory: Sequence[int], rows: int) -> Any:
        state = push_document(unwrap(model), memory, self.context.device)
        return None if state is None else state.repeat_rows(rows)

    def loss(self, model: nn.Module, batch: DialogueBatch, rows: slice, part: int) -> StepOutput:
        mine = batch.examples[rows]
        if batch.document_state is None and batch.memory:
            batch.document_state = push_document(unwrap(model), batch.memory, self.context.device)
        state = batch.document_state
        state = None if state is None else state.repeat_rows(len(mine))
        inputs, targets = pad_batch(mine, self.format.eot)
        inputs, targets = inputs.to(self.context.device), targets.to(self.context.device)
        out = model(inputs, state=state, targets=targets)
        sums = scored_sums(out.logits, targets)
        sums["examples"] = float(len(mine))
        sums["tokens"] = float(sum(len(r.tokens) - 1 for r in mine) + len(batch.memory))
        return StepOutput(out.loss, sums, {k: float(v.detach()) for k, v in out.aux.items()})

    def train_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        out = super().train_metrics(sums)
        if "lm_loss" in out:
            out["ppl"] = math.exp(min(out["lm_loss"], 50.0))
        return out

    # ------------------------------------------------------------------ evaluation
    def eval_subset(self, split: str, num_batches: int | None) -> list[DialogueExample]:
        """The evaluated examples: `eval_examples` drawn with `seed` (the same for every model),
        on valid only the first num_batches × batch_size of them; in the split's order."""
        examples = self.examples(split)
        order = np.random.default_rng([self.config.seed, 0xE7A1]).permutation(len(examples))
        count = len(examples) if self.config.eval_examples is None else self.config.eval_examples
        if split == "valid" and num_batches is not None:
            count = min(count, num_batches * self.context.batch_size)
        return [examples[int(i)] for i in sorted(order[:count].tolist())]

    @torch.no_grad()
    def evaluate(
        self, model: nn.Module, split: str, num_batches: int | None, shard: Shard
    ) -> Evaluation:
        subset = self.eval_subset(split, num_batches)
        encoded = [self.encode(subset[i]) for i in shard.items(len(subset))]
        groups: dict[tuple, list[EncodedExample]] = defaultdict(list)
        for example in encoded:
            groups[example.key].append(example)
        raw = unwrap(model)
        was_training = raw.training
        raw.eval()
        sums: dict[str, float] = {"nll": 0.0, "count": 0.0, "examples": 0.0}
        details: list[dict[str, Any]] = []
        try:
            for rows in groups.values():
                memory = push_document(raw, rows[0].memory, self.context.device)
                for start in range(0, len(rows), self.context.batch_size):
                    chunk = rows[start : start + self.context.batch_size]
                    state = None if memory is None else memory.repeat_rows(len(chunk))
                    details += self._score(raw, chunk, state, sums)
                if self.config.generate:
                    for row, detail in zip(rows, details[-len(rows) :], strict=True):
                        detail.update(self._generate(raw, row, memory))
        finally:
            raw.train(was_training)
        if self.config.generate and details:
            add_sums(sums, self._generation_sums(details))
        c = self.config
        info = {
            "split": split,
            "placement": c.placement,
            "other_document": c.other_document,
            "speaker_format": self.format.name,
            "generation": {
                "top_p": c.top_p,
                "temperature": c.temperature,
                "max_new_tokens": c.max_new_tokens,
                "seed": c.seed,
            },
            "examples": details,
        }
        return Evaluation(sums, info)

    def _score(
        self, model: nn.Module, rows: list[EncodedExample], state: Any, sums: dict[str, float]
    ) -> list[dict[str, Any]]:
        """Teacher-forced reply loss of `rows` (one call); adds to `sums`, returns details."""
        inputs, targets = pad_batch(rows, self.format.eot)
        inputs, targets = inputs.to(self.context.device), targets.to(self.context.device)
        out = model(inputs, state=state, targets=targets)
        add_sums(sums, scored_sums(out.logits, targets))
        sums["examples"] += len(rows)
        scored = (targets != IGNORE_INDEX).sum(1)  # [B]
        nll = out.token_loss.detach().float().sum(1)  # [B]
        return [
            {
                "conversation_id": r.conversation_id,
                "reply_index": r.reply_index,
                "doc_id": r.doc_id,
                "previous": r.previous,
                "reference": r.reference,
                "prompt_tokens": r.prompt_len,
                "memory_tokens": len(r.memory),
                "nll": float(nll[i]),
                "reply_tokens": int(scored[i]),
            }
            for i, r in enumerate(rows)
        ]

    def _generate(self, model: nn.Module, row: EncodedExample, memory: Any) -> dict[str, Any]:
        c = self.config
        start = time.perf_counter()
        new = generate_reply(
            model,
            row.tokens[: row.prompt_len],
            memory,
            self.end_ids,
            max_new_tokens=c.max_new_tokens,
            temperature=c.temperature,
            top_p=c.top_p,
            seed=example_seed(c.seed, row.conversation_id, row.reply_index),
        )
        prediction = self.tokenizer.decode(new).strip()
        return {
            "prediction": prediction,
            "new_tokens": len(new),
            "seconds": time.perf_counter() - start,
        }

    def _generation_sums(self, details: list[dict[str, Any]]) -> dict[str, float]:
        """Per-example scores (into `details`) and their sums, plus the BLEU statistics."""
        from ..metrics import dialogue_scores

        sums = {name: 0.0 for name in GENERATION_METRICS}
        for detail in details:
            scores = dialogue_scores([detail["prediction"]], [detail["reference"]])
            for name in GENERATION_METRICS:
                detail[name] = scores[name]
                sums[name] += scores[name]
        predictions = [d["prediction"] for d in details]
        sums.update(bleu_statistics(predictions, [d["reference"] for d in details]))
        sums["generated"] = float(len(details))
        sums["new_tokens"] = float(sum(d["new_tokens"] for d in details))
        return sums

    def eval_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        count = sums.get("count", 0.0)
        loss = sums.get("nll", 0.0) / count if count else math.nan
        out = {"loss": loss, "ppl": math.exp(min(loss, 700.0)) if count else math.nan}
        generated = sums.get("generated", 0.0)
        out["examples"] = sums.get("examples", 0.0)
        out["generated"] = generated
        if generated:  # a teacher-forced evaluation (generate=False) has no reply scores at all
            for name in GENERATION_METRICS:
                out[name] = sums[name] / generated
            out["bleu"] = bleu_from_statistics(sums)
            out["reply_tokens"] = sums["new_tokens"] / generated
        return out

    # ------------------------------------------------------------------ generation
    def encode_prompt(self, text: str) -> tuple[torch.Tensor, list[int] | None]:
        """`text`: the dialogue so far, one turn a line, speakers alternating; the reply is the
        next speaker's (no document: placement none)."""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if not lines:
            raise ValueError("a dialogue prompt needs at least one turn (one per line)")
        n = len(lines)
        history = [("user" if (n - i) % 2 else "assistant", t) for i, t in enumerate(lines)]
        turns, prompt, _ = self.format.dialogue(history, "")
        ids = self.format.system(self.format.instruction) + sum(turns, []) + prompt
        return torch.tensor(ids, dtype=torch.long), None

    def decode(self, tokens: list[int]) -> str:
        ends = set(self.end_ids)
        cut = next((i for i, t in enumerate(tokens) if t in ends), len(tokens))
        return self.tokenizer.decode(tokens[:cut]).strip()

    def default_new_tokens(self) -> int:
        return self.config.max_new_tokens


def _tokenizer(config: DialogueConfig) -> TextTokenizer:
    """`config.tokenizer`; "gpt2" is looked for beside the data first."""
    try:
        near = resolve_cmu_dog_dir(config.data_dir)
    except FileNotFoundError:
        near = None
    return load_tokenizer(config.tokenizer, near)


__all__ = ["DialogueBatch", "DialogueConfig", "DialogueTask"]
