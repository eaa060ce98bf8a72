"""Associative recall at a chosen distance (``inftyformer train recall``).

How far back can a model retrieve something? A few key→value pairs open the stream, then G filler
tokens, then the keys again (in a random order) as queries: the model must answer each query with
the value that followed that key. This is the multi-query associative-recall labelling of the MQAR
benchmark (Arora et al. 2023, "Zoology"), with the distance G as the variable: sweep G past a
model's short-term memory (a pretrained model's window) and its accuracy shows how far its
memory reaches.

Vocabulary (K keys, V values, F fillers; disjoint ranges)::

    keys 0..K-1     values K..K+V-1     fillers K+V..K+V+F-1

Layout of one example with P pairs and gap G, S = pad + 4P + G positions::

    inputs  = [f .. f | k_1 v_1 .. k_P v_P | f_1 .. f_G | q_1 a_1 .. q_P a_P]
    targets = [-100 .....................................| a_1 -100 .. a_P -100]

Keys are P distinct draws from the K keys, values independent uniform draws from the V values
(with replacement: nothing but the memory tells a value, so chance is exactly 1/V), fillers
uniform over the F fillers, and the queries q_1..q_P a random permutation of the keys, each
followed by its answer (teacher forcing). Loss and accuracy are scored on the P query positions
only: the position of q_i predicts a_i. `pad` = (−(4P + G)) mod C filler tokens come first, so the
stream is a whole number of blocks of C = `segment_len` and the queries end the last block.

As a training task: each batch draws one (P, G) from the settings' lists (all rows of a batch
share them, so the blocks of every row line up), streams every block but the last without
gradients to build the memory (fresh state per batch), then the last block, which holds the
queries, with gradients. Earlier blocks need no gradient: every memory detaches what it stores,
so no gradient could reach them anyway. Evaluating at other distances or loads is a task-settings
override: ``evaluate_run(run, task_settings={"gap": 768, "num_pairs": 8})``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._checks import check_positive_int
from ..data import SPLITS, check_split
from ..native.model import IGNORE_INDEX
from .base import (
    Metric,
    RunContext,
    TaskConfig,
    register_task,
)
from .streamed import LastBlockTask

# Split-specific entropy mixed into every batch's SeedSequence: splits draw from disjoint streams.
_SPLIT_ENTROPY = {"train": 0xEC11_0001, "valid": 0xEC11_0002, "test": 0xEC11_0003}


def _int_tuple(name: str, value: object, minimum: int) -> tuple[int, ...]:
    """An int or a non-empty sequence of ints, each >= minimum, as a tuple."""
    items = (value,) if isinstance(value, int) and not isinstance(value, bool) else value
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence) or not items:
        raise TypeError(f"{name} must be an int or a non-empty sequence of ints, got {value!r}")
    for item in items:
        check_positive_int(name, item, minimum=minimum)
    return tuple(int(i) for i in items)


@dataclass(frozen=True)
class RecallConfig(TaskConfig):
    """Settings of the recall task. `num_pairs` and `gap` are lists: each batch draws one value
    of each (a single value fixes it, e.g. to evaluate at one distance)."""

    num_pairs: tuple[int, ...] = (4,)  # P: key→value pairs per example
    gap: tuple[int, ...] = (0, 32, 64, 128, 256)  # G: filler tokens between pairs and queries
    num_keys: int = 16  # K
    num_values: int = 16  # V: chance is 1/V
    num_fillers: int = 16  # F (1: one constant filler token)

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_pairs", _int_tuple("num_pairs", self.num_pairs, 1))
        object.__setattr__(self, "gap", _int_tuple("gap", self.gap, 0))
        for name in ("num_keys", "num_values", "num_fillers"):
            check_positive_int(name, getattr(self, name))
        if max(self.num_pairs) > self.num_keys:
            raise ValueError(
                f"num_pairs ({max(self.num_pairs)}) cannot exceed num_keys ({self.num_keys}): "
                "the keys of an example are distinct"
            )

    @property
    def vocab_size(self) -> int:
        return self.num_keys + self.num_values + self.num_fillers

    @property
    def first_value(self) -> int:
        return self.num_keys

    @property
    def first_filler(self) -> int:
        return self.num_keys + self.num_values


def recall_example(
    config: RecallConfig,
    num_pairs: int,
    gap: int,
    batch_size: int,
    rng: np.random.Generator,
    block: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """(inputs [B, S], targets [B, S]) int64 for P = `num_pairs` pairs and gap G = `gap`, padded
    in front with filler to a multiple of `block` tokens (see the module docstring)."""
    check_positive_int("num_pairs", num_pairs)
    check_positive_int("gap", gap, minimum=0)
    check_positive_int("batch_size", batch_size)
    check_positive_int("block", block)
    if num_pairs > config.num_keys:
        raise ValueError(f"num_pairs ({num_pairs}) cannot exceed num_keys ({config.num_keys})")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    B, P = batch_size, num_pairs
    pad = (-(4 * P + gap)) % block
    # P distinct keys per row: the first P of a random permutation             [B, P]
    keys = np.argsort(rng.random((B, config.num_keys)), axis=1)[:, :P]
    values = config.first_value + rng.integers(0, config.num_values, size=(B, P))  # [B, P]
    order = np.argsort(rng.random((B, P)), axis=1)  # query order               [B, P]
    queries = np.take_along_axis(keys, order, axis=1)
    answers = np.take_along_axis(values, order, axis=1)
    fillers = config.first_filler + rng.integers(0, config.num_fillers, size=(B, pad + gap))
    pairs = np.stack([keys, values], axis=2).reshape(B, 2 * P)  # k_1 v_1 .. k_P v_P
    asked = np.stack([queries, answers], axis=2).reshape(B, 2 * P)  # q_1 a_1 .. q_P a_P
    inputs = np.concatenate([fillers[:, :pad], pairs, fillers[:, pad:], asked], axis=1)
    targets = np.full_like(inputs, IGNORE_INDEX)
    targets[:, -2 * P :: 2] = answers  # the position of q_i predicts a_i
    return inputs.astype(np.int64), targets.astype(np.int64)


def chance_accuracy(config: RecallConfig) -> float:
    """Accuracy without memory: values are uniform and independent of everything else, so no
    guess beats 1/V."""
    return 1.0 / config.num_values


@dataclass(frozen=True)
class RecallDataset:
    """Batches of recall examples; `batch(index)` is a pure function of (seed, split, index),
    which also draws the batch's (P, G) from the settings' lists."""

    config: RecallConfig
    batch_size: int
    block: int
    split: str = "train"
    seed: int = 0

    def __post_init__(self) -> None:
        check_positive_int("batch_size", self.batch_size)
        check_positive_int("block", self.block)
        check_split(self.split)
        check_positive_int("seed", self.seed, minimum=0)

    def rng(self, index: int) -> np.random.Generator:
        check_positive_int("index", index, minimum=0)
        seq = np.random.SeedSequence([self.seed, _SPLIT_ENTROPY[self.split]], spawn_key=(index,))
        return np.random.default_rng(seq)

    def layout(self, index: int) -> tuple[int, int]:
        """(P, G) of batch `index`."""
        rng = self.rng(index)
        return self._draw(rng)

    def _draw(self, rng: np.random.Generator) -> tuple[int, int]:
        c = self.config
        return int(rng.choice(c.num_pairs)), int(rng.choice(c.gap))

    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs [B, S], targets [B, S]) LongTensors of batch `index`."""
        rng = self.rng(index)
        num_pairs, gap = self._draw(rng)
        inputs, targets = recall_example(
            self.config, num_pairs, gap, self.batch_size, rng, self.block
        )
        return torch.from_numpy(inputs), torch.from_numpy(targets)


# --------------------------------------------------------------------------- the task
@register_task("recall")
class RecallTask(LastBlockTask):
    """See the module docstring."""

    summary = "associative recall across a gap of G filler tokens (how far the memory reaches)"
    Config = RecallConfig
    metrics = (
        Metric("accuracy", ".4f", higher_is_better=True),
        Metric("loss", ".4f"),
        Metric("queries", ".0f"),
    )
    progress_metrics = ("accuracy",)

    def __init__(self, config: RecallConfig, model_config: Any, context: RunContext) -> None:
        super().__init__(config, model_config, context)
        self.datasets = {
            split: RecallDataset(
                config, context.batch_size, model_config.segment_len, split, context.seed
            )
            for split in SPLITS
        }

    @classmethod
    def model_overrides(cls, config: RecallConfig) -> dict[str, Any]:
        # fresh examples every step: nothing to overfit, dropout only slows learning down
        return {"vocab_size": config.vocab_size, "dropout": 0.0}

    @classmethod
    def check(cls, config: RecallConfig, model_config: Any) -> None:
        if model_config.vocab_size < config.vocab_size:
            raise ValueError(
                f"the recall task needs vocab_size >= {config.vocab_size} (keys + values + "
                f"fillers), got {model_config.vocab_size}"
            )
        if 2 * max(config.num_pairs) > model_config.segment_len:
            raise ValueError(
                f"the {max(config.num_pairs)} queries and answers ({2 * max(config.num_pairs)} "
                f"tokens) must fit in the last segment (segment_len {model_config.segment_len})"
            )

    def blocks(self, length: int, segment_len: int) -> list[tuple[int, int]]:
        # the stream is a whole number of blocks of C = segment_len; the last holds the queries
        return [(start, start + segment_len) for start in range(0, length, segment_len)]

    def eval_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        return {**self.scored_metrics(sums), "queries": sums.get("count", 0.0)}

    def chance(self) -> dict[str, float]:
        return {"uniform": chance_accuracy(self.config)}

    # ---- inspection: one example of the split, its gap stretched to the length asked
    def inspection_stream(self, split: str, length: int) -> torch.Tensor:
        num_pairs = max(self.config.num_pairs)
        check_positive_int("length", length, minimum=4 * num_pairs)
        rng = self.datasets[check_split(split)].rng(0)
        C = self.model_config.segment_len
        inputs, _ = recall_example(self.config, num_pairs, length - 4 * num_pairs, 1, rng, C)
        return torch.from_numpy(inputs[0])

    # ---- generation: a test example up to its first query; the answer is its value
    def encode_prompt(self, text: str) -> tuple[torch.Tensor, list[int] | None]:
        """`text`: "random" or "random:G" (a test example with gap G, default: the largest of
        the settings), cut after its first query; the expected answer is that key's value."""
        match = re.fullmatch(r"random(?::(\d+))?", text.strip())
        if not match:
            raise ValueError(f"a recall prompt is 'random' or 'random:G', got {text[:40]!r}")
        gap = int(match.group(1)) if match.group(1) else max(self.config.gap)
        num_pairs = max(self.config.num_pairs)
        rng = self.datasets["test"].rng(0)
        inputs, targets = recall_example(self.config, num_pairs, gap, 1, rng)
        first = inputs.shape[1] - 2 * num_pairs  # position of q_1
        return torch.from_numpy(inputs[0, : first + 1]), [int(targets[0, first])]

    def decode(self, tokens: list[int]) -> str:
        c = self.config

        def name(t: int) -> str:
            if t < c.first_value:
                return f"k{t}"
            if t < c.first_filler:
                return f"v{t - c.first_value}"
            return "."

        return " ".join(name(t) for t in tokens)

    def default_new_tokens(self) -> int:
        return 1


__all__ = ["RecallConfig", "RecallDataset", "RecallTask", "chance_accuracy", "recall_example"]
