"""Training tasks: what a step feeds the model and what an evaluation measures.

The trainer is task-agnostic; a task turns (step, micro-batch, rank) into a loss and a few summed
statistics, evaluates a split, and knows its model-side needs (vocabulary) and its chance level.
Tasks register themselves by name in `TASKS`; `inftyformer train NAME` looks them up there.
To add one (e.g. language modelling), subclass :class:`Task` and decorate it with
``@register_task("lm")``.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from ..tasks.sorting import (
    IGNORE_INDEX,
    NUM_SYMBOLS,
    NUM_TARGETS,
    SEP,
    SORTING_VOCAB,
    SortingDataset,
    chance_accuracy,
    segment_bounds,
)
from .config import TrainConfig
from .distributed import DistEnv, all_reduce_sum, shard_rows


@dataclass
class StepStats:
    """Sums over what one micro-batch saw (summed again over micro-batches and ranks)."""

    loss: float = 0.0  # optimised loss (LM + weighted auxiliary), already divided by #chunks
    lm_loss_sum: float = 0.0  # cross-entropy summed over scored positions
    correct: float = 0.0  # scored positions predicted right (argmax)
    count: float = 0.0  # scored positions
    tokens: float = 0.0  # tokens fed to the model (memory-building segments included)
    aux: dict[str, float] = field(default_factory=dict)  # auxiliary losses, divided by #chunks

    def add(self, other: StepStats) -> None:
        self.loss += other.loss
        self.lm_loss_sum += other.lm_loss_sum
        self.correct += other.correct
        self.count += other.count
        self.tokens += other.tokens
        for k, v in other.aux.items():
            self.aux[k] = self.aux.get(k, 0.0) + v

    def reduce(self, env: DistEnv) -> StepStats:
        """Sum over ranks (auxiliary keys must be the same on every rank)."""
        keys = sorted(self.aux)
        values = [self.loss, self.lm_loss_sum, self.correct, self.count, self.tokens]
        out = all_reduce_sum(values + [self.aux[k] for k in keys], env)
        return StepStats(*out[:5], aux=dict(zip(keys, out[5:], strict=True)))


def _scalar(x: Any) -> float:
    return float(x.detach()) if isinstance(x, torch.Tensor) else float(x)


def scored_stats(logits: torch.Tensor, targets: torch.Tensor) -> tuple[float, float, float]:
    """(summed cross-entropy, correct, count) over positions whose target is not ignored."""
    mask = targets != IGNORE_INDEX
    count = float(mask.sum())
    if count == 0:
        return 0.0, 0.0, 0.0
    lg = logits.detach()[mask].float()  # [n, V]
    tg = targets[mask]
    ce = float(nn.functional.cross_entropy(lg, tg, reduction="sum"))
    correct = float((lg.argmax(-1) == tg).sum())
    return ce, correct, count


class Task(ABC):
    """One training task. Instances live on one rank and see only that rank's data."""

    name: ClassVar[str]
    metric: ClassVar[str]  # the headline evaluation metric ("accuracy", "ppl", ...)
    higher_is_better: ClassVar[bool]

    def __init__(self, train_cfg: TrainConfig, model_cfg: Any, env: DistEnv) -> None:
        self.train_cfg = train_cfg
        self.model_cfg = model_cfg
        self.env = env

    # ---- defaults and model side
    @classmethod
    def train_defaults(cls) -> dict[str, Any]:
        """TrainConfig values this task uses unless the user sets them (the CLI applies them
        over the TrainConfig defaults, which are the sorting main job's)."""
        return {}

    @classmethod
    def model_overrides(cls, train_cfg: TrainConfig) -> dict[str, Any]:
        """Model-config values the task imposes (e.g. its vocabulary size)."""
        return {}

    @classmethod
    def check_configs(cls, train_cfg: TrainConfig, model_cfg: Any) -> None:  # noqa: B027
        """Raise ValueError when the two configs do not fit this task."""
        return None

    # ---- training
    @abstractmethod
    def train_micro_batch(
        self, model: nn.Module, raw_model: nn.Module, step: int, micro: int, num_micro: int
    ) -> tuple[torch.Tensor, StepStats]:
        """Loss (to back-propagate, already divided by the number of chunks) and statistics."""

    # ---- evaluation
    @abstractmethod
    def evaluate(self, raw_model: nn.Module, split: str, num_batches: int) -> dict[str, float]:
        """Metrics on `split`, reduced over ranks."""

    def chance(self) -> dict[str, float]:
        """Named chance levels of the headline metric (empty when it has none)."""
        return {}

    def train_metrics(self, stats: StepStats) -> dict[str, float]:
        """What the log shows for a training step."""
        out = {"loss": stats.loss}
        if stats.count:
            out["lm_loss"] = stats.lm_loss_sum / stats.count
        out.update({f"aux/{k}": v for k, v in stats.aux.items()})
        return out

    # ---- resumable position (data cursor, carried memory)
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027
        pass

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:  # noqa: B027
        pass

    # ---- generation
    def encode_prompt(self, text: str) -> tuple[torch.Tensor, list[int] | None]:
        """Token ids [L] for a prompt, and the expected continuation when it is known."""
        raise NotImplementedError(f"task {self.name!r} does not support generation")

    def decode(self, tokens: list[int]) -> str:
        return " ".join(str(t) for t in tokens)

    def default_new_tokens(self) -> int:
        return 32


TASKS: dict[str, type[Task]] = {}


def register_task(name: str) -> Callable[[type[Task]], type[Task]]:
    def deco(cls: type[Task]) -> type[Task]:
        if name in TASKS:
            raise ValueError(f"task {name!r} is already registered")
        cls.name = name
        TASKS[name] = cls
        return cls

    return deco


def get_task(name: str) -> type[Task]:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; available tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name]


# --------------------------------------------------------------------------- sorting
@register_task("sorting")
class SortingTask(Task):
    """The paper's sorting task (§4.1). Each step draws a fresh global batch (a pure function of
    seed and step), streams all but the last segment without gradients to build the memory (fresh
    state per batch), then the last segment with gradients; loss and accuracy only on the 20 target
    positions, with teacher forcing. Each rank takes its rows of the global batch, so the data of a
    step does not depend on the number of processes or micro-batches."""

    metric = "accuracy"
    higher_is_better = True

    def __init__(self, train_cfg: TrainConfig, model_cfg: Any, env: DistEnv) -> None:
        super().__init__(train_cfg, model_cfg, env)
        self.check_configs(train_cfg, model_cfg)
        self.datasets = {
            split: SortingDataset(
                seq_len=train_cfg.seq_len,
                batch_size=train_cfg.batch_size,
                split=split,
                seed=train_cfg.seed,
            )
            for split in ("train", "valid", "test")
        }
        self.bounds = segment_bounds(self.datasets["train"].total_len, model_cfg.segment_len)
        self._cached: tuple[int, tuple[torch.Tensor, torch.Tensor]] | None = None

    def _train_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The global batch of `step` (drawn once per step, shared by its micro-batches)."""
        if self._cached is None or self._cached[0] != step:
            self._cached = (step, self.datasets["train"].batch(step))
        return self._cached[1]

    @classmethod
    def model_overrides(cls, train_cfg: TrainConfig) -> dict[str, Any]:
        # Every step draws fresh sequences, so there is nothing to overfit: dropout only slows
        # learning down (and costs ~15% of a CPU step). `--set dropout=...` still applies.
        return {"vocab_size": SORTING_VOCAB, "dropout": 0.0}

    @classmethod
    def check_configs(cls, train_cfg: TrainConfig, model_cfg: Any) -> None:  # noqa: B027
        if model_cfg.vocab_size < SORTING_VOCAB:
            raise ValueError(
                f"the sorting task needs vocab_size >= {SORTING_VOCAB}, got {model_cfg.vocab_size}"
            )
        seg = model_cfg.segment_len
        if seg > train_cfg.seq_len:
            raise ValueError(
                f"segment_len ({seg}) is longer than the sequence (seq_len T = "
                f"{train_cfg.seq_len}): nothing would be left for the memory; use a longer "
                "--seq-len or a shorter segment (--set segment_len=...)"
            )
        if seg < NUM_TARGETS + 1:
            raise ValueError(
                f"segment_len must be >= {NUM_TARGETS + 1} so that the {NUM_TARGETS} answer "
                f"positions fit in the last segment, got {seg}"
            )

    def _run(
        self,
        model: nn.Module,
        raw_model: nn.Module,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        with_grad: bool,
    ) -> tuple[Any, torch.Tensor]:
        """Stream every segment but the last without gradients, then the last one."""
        device = self.env.device
        inputs = inputs.to(device)
        targets = targets.to(device)
        state = raw_model.init_state(inputs.shape[0], device)
        *memory, (start, end) = self.bounds
        with torch.no_grad():
            for a, b in memory:
                state = raw_model(inputs[:, a:b], state=state).state
        last_targets = targets[:, start:end]
        with torch.set_grad_enabled(with_grad):
            out = model(inputs[:, start:end], state=state, targets=last_targets)
        return out, last_targets

    def train_micro_batch(
        self, model: nn.Module, raw_model: nn.Module, step: int, micro: int, num_micro: int
    ) -> tuple[torch.Tensor, StepStats]:
        inputs, targets = self._train_batch(step)
        rows = shard_rows(inputs.shape[0], self.env, micro, num_micro)
        out, last_targets = self._run(model, raw_model, inputs[rows], targets[rows], True)
        chunks = self.env.world_size * num_micro
        ce, correct, count = scored_stats(out.logits, last_targets)
        aux = {k: _scalar(v) / chunks for k, v in (getattr(out, "aux", None) or {}).items()}
        stats = StepStats(
            loss=_scalar(out.loss) / chunks,
            lm_loss_sum=ce,
            correct=correct,
            count=count,
            tokens=float(inputs[rows].numel()),
            aux=aux,
        )
        return out.loss / num_micro, stats

    def train_metrics(self, stats: StepStats) -> dict[str, float]:
        out = super().train_metrics(stats)
        if stats.count:
            out["accuracy"] = stats.correct / stats.count
        return out

    @torch.no_grad()
    def evaluate(self, raw_model: nn.Module, split: str, num_batches: int) -> dict[str, float]:
        if split not in self.datasets:
            raise ValueError(f"split must be one of {sorted(self.datasets)}, got {split!r}")
        was_training = raw_model.training
        raw_model.eval()
        total = StepStats()
        try:
            for index in range(num_batches):
                inputs, targets = self.datasets[split].batch(index)
                rows = shard_rows(inputs.shape[0], self.env)
                out, last_targets = self._run(
                    raw_model, raw_model, inputs[rows], targets[rows], False
                )
                ce, correct, count = scored_stats(out.logits, last_targets)
                total.add(StepStats(lm_loss_sum=ce, correct=correct, count=count))
        finally:
            raw_model.train(was_training)
        total = total.reduce(self.env)
        return {
            "loss": total.lm_loss_sum / max(total.count, 1.0),
            "accuracy": total.correct / max(total.count, 1.0),
            "examples": total.count / NUM_TARGETS,
        }

    def chance(self) -> dict[str, float]:
        return {
            "uniform": chance_accuracy(),
            "format-only": chance_accuracy(exclude_seen=True),
        }

    # ---- generation: the prompt is the symbols; the model answers after the separator
    def encode_prompt(self, text: str) -> tuple[torch.Tensor, list[int] | None]:
        """`text`: symbols 0–19 separated by spaces/commas, or "random" / "random:T" for a test
        sequence of length T (default: the training T). The separator is appended."""
        text = text.strip()
        match = re.fullmatch(r"random(?::(\d+))?", text)
        if match:
            length = int(match.group(1) or self.train_cfg.seq_len)
            data = SortingDataset(seq_len=length, batch_size=1, split="test", seed=0)
            inputs, targets = data.batch(0)
            prompt = inputs[0, : length + 1]
            return prompt, targets[0, -NUM_TARGETS:].tolist()
        parts = [p for p in re.split(r"[\s,]+", text) if p]
        try:
            symbols = [int(p) for p in parts]
        except ValueError:
            raise ValueError(
                f"a sorting prompt is symbols 0-{NUM_SYMBOLS - 1} separated by spaces, or "
                f"'random[:T]'; got {text[:40]!r}"
            ) from None
        if not symbols or min(symbols) < 0 or max(symbols) >= NUM_SYMBOLS:
            raise ValueError(f"sorting symbols must be in 0..{NUM_SYMBOLS - 1} (at least one)")
        return torch.tensor(symbols + [SEP], dtype=torch.long), None

    def default_new_tokens(self) -> int:
        return NUM_TARGETS


def headline(task: Task, metrics: dict[str, float]) -> str:
    """'accuracy 0.734 (chance: uniform 0.050, format-only 0.180)'."""
    value = metrics.get(task.metric, math.nan)
    chance = task.chance()
    text = f"{task.metric} {value:.4f}"
    if chance:
        text += " (chance: " + ", ".join(f"{k} {v:.3f}" for k, v in chance.items()) + ")"
    return text


__all__ = [
    "TASKS",
    "SortingTask",
    "StepStats",
    "Task",
    "get_task",
    "headline",
    "register_task",
    "scored_stats",
]
