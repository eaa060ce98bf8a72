"""The task contract: what the trainer asks of a task, and the registry of tasks by name.

A task owns its data and its settings (a frozen dataclass, `Task.Config`); the trainer owns the
loop. Per optimiser update the trainer

1. asks for the global batch of the step: ``batch = task.batch(step)``;
2. cuts it into the rows each process and micro-batch takes (``rows``, a slice of the batch) and
   asks for their loss: ``task.loss(model, batch, rows, part)`` → :class:`StepOutput`;
3. sums the statistics over micro-batches and processes, steps the optimiser, then calls
   ``task.end_step(step)`` (a task that carries something from step to step, e.g. the language
   model's memory, commits it there);
4. shows the metrics the task declares (:attr:`Task.metrics`, :meth:`Task.train_metrics`).

Evaluation works the same way: ``task.evaluate(model, split, num_batches, shard)`` returns sums
over this process's share of the work (:class:`Shard`), the trainer adds them up over processes,
and :meth:`Task.eval_metrics` turns the totals into metrics.

Tasks register by name (``@register_task("sorting")``); the command line lists and dispatches
them from :data:`TASKS`. Adding a task is one module that defines and registers it, plus its import
in ``inftyformer/tasks/__init__.py``.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from ..data import TextTokenizer, load_tokenizer
from ..native.model import IGNORE_INDEX


# --------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class TaskConfig:
    """Base of the task settings: a frozen dataclass, validated in ``__post_init__``."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskConfig:
        if not isinstance(data, dict):
            raise TypeError(f"{cls.__name__} expects a dict, got {type(data).__name__}")
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown {cls.__name__} settings: {', '.join(unknown)}")
        return cls(**data)


@dataclass(frozen=True)
class RunContext:
    """What a task needs to know about the run besides its own settings."""

    batch_size: int  # the global batch (all processes and micro-batches)
    seed: int
    device: torch.device = torch.device("cpu")
    progress: bool = False  # may show progress bars (main process only)


@dataclass(frozen=True)
class Shard:
    """This process's part of a piece of work: part `index` of `count`."""

    index: int = 0
    count: int = 1

    def rows(self, total: int) -> slice:
        """Equal contiguous rows of a batch of `total` rows."""
        if total % self.count:
            raise ValueError(f"a batch of {total} rows does not split into {self.count} parts")
        size = total // self.count
        return slice(self.index * size, (self.index + 1) * size)

    def items(self, total: int) -> range:
        """Round-robin items (e.g. documents) of `total`."""
        return range(self.index, total, self.count)


@dataclass(frozen=True)
class Metric:
    """A metric a task reports: its name, how it is shown, and for the metric that selects the
    best checkpoint whether higher or lower is better."""

    name: str
    fmt: str = ".4f"
    higher_is_better: bool | None = None  # set on the headline metric only


@dataclass
class StepOutput:
    """What :meth:`Task.loss` returns for its rows.

    loss   the scalar to back-propagate: the mean over these rows
    sums   statistics summed over micro-batches and processes (counts, summed losses, "tokens")
    means  values averaged over micro-batches and processes (e.g. auxiliary losses)
    """

    loss: torch.Tensor
    sums: dict[str, float] = field(default_factory=dict)
    means: dict[str, float] = field(default_factory=dict)


@dataclass
class Evaluation:
    """What :meth:`Task.evaluate` returns: sums over this process's share, and optional details
    (JSON-able: per document, per position, …) for reports."""

    sums: dict[str, float]
    details: dict[str, Any] = field(default_factory=dict)


def fitting_tokenizer(tokenizer: TextTokenizer, model_config: Any) -> TextTokenizer:
    """`tokenizer`, refused when it has more ids than the model's vocabulary."""
    if tokenizer.vocab_size > model_config.vocab_size:
        raise ValueError(
            f"the tokenizer has {tokenizer.vocab_size} ids, the model's vocabulary "
            f"only {model_config.vocab_size}"
        )
    return tokenizer


def tokenizer_near_data(name: str, data_dir: str | None) -> TextTokenizer:
    """Tokenizer `name` (bytes, gpt2 or a tokenizer.json); "gpt2" is looked for beside the
    data directory first."""
    near = Path(data_dir).expanduser() if data_dir else None
    return load_tokenizer(name, near if near is not None and near.is_dir() else None)


def add_sums(total: dict[str, float], more: dict[str, float], weight: float = 1.0) -> None:
    """total[k] += weight · more[k]."""
    for key, value in more.items():
        total[key] = total.get(key, 0.0) + weight * float(value)


SUMS_CHUNK_ELEMENTS = 1 << 22  # positions × V that `scored_sums` works on at a time


def scored_sums(
    logits: torch.Tensor, targets: torch.Tensor, chunk_elements: int = SUMS_CHUNK_ELEMENTS
) -> dict[str, float]:
    """nll (summed cross-entropy), correct (argmax hits) and count over the positions whose target
    is not ignored. logits [..., V], targets [...]. Computed over chunks of positions, so that no
    copy or log-probabilities of the whole logits are made (a large vocabulary's logits of a
    training batch are hundreds of MB)."""
    mask = targets != IGNORE_INDEX
    count = float(mask.sum())
    if count == 0:
        return {"nll": 0.0, "correct": 0.0, "count": 0.0}
    vocab = logits.shape[-1]
    flat, tg = logits.detach().reshape(-1, vocab), targets.reshape(-1)
    rows = max(1, chunk_elements // max(vocab, 1))
    nll = correct = torch.zeros((), dtype=torch.float64, device=flat.device)
    for start in range(0, flat.shape[0], rows):
        lg, t = flat[start : start + rows].float(), tg[start : start + rows]
        if not bool((t != IGNORE_INDEX).any()):
            continue
        nll = nll + nn.functional.cross_entropy(lg, t, ignore_index=IGNORE_INDEX, reduction="sum")
        correct = correct + (lg.argmax(-1) == t).sum()  # an ignored target (−100) never hits
    return {"nll": float(nll), "correct": float(correct), "count": count}


# --------------------------------------------------------------------------- the contract
class Task(ABC):
    """One task. An instance lives in one process and sees only that process's share."""

    name: ClassVar[str]  # set by `register_task`
    summary: ClassVar[str] = ""  # one line for the command line's help
    Config: ClassVar[type[TaskConfig]] = TaskConfig
    metrics: ClassVar[tuple[Metric, ...]] = ()  # the one with higher_is_better set is headline
    progress_metrics: ClassVar[tuple[str, ...]] = ()  # train metrics the progress bar shows

    def __init__(self, config: TaskConfig, model_config: Any, context: RunContext) -> None:
        if not isinstance(config, self.Config):
            raise TypeError(
                f"task {self.name!r} needs a {self.Config.__name__}, got {type(config).__name__}"
            )
        self.config = config
        self.model_config = model_config
        self.context = context

    # ---- model side
    @classmethod
    def model_overrides(cls, config: TaskConfig) -> dict[str, Any]:
        """Model settings the task imposes (e.g. its vocabulary size)."""
        return {}

    @classmethod
    def check(cls, config: TaskConfig, model_config: Any) -> None:
        """Raise ValueError/FileNotFoundError when the settings do not fit this task: cheap, and
        called by the trainer before any work starts (a task built only to evaluate or generate
        may lack its training data)."""
        return None

    @classmethod
    def notes(cls, config: TaskConfig) -> list[str]:
        """Lines `inftyformer train` prints before training: what a user should know about the
        run that the settings do not say (e.g. that the data is a fallback)."""
        return []

    # ---- training
    @abstractmethod
    def batch(self, step: int) -> Any:
        """The global batch of optimiser update `step` (the same whatever the number of
        processes and micro-batches)."""

    @abstractmethod
    def loss(self, model: nn.Module, batch: Any, rows: slice, part: int) -> StepOutput:
        """Loss and statistics of rows `rows` of `batch`. `model` may be wrapped for
        distributed training (call it; read its config from the task). `part` numbers the
        micro-batches of a step within this process (0, 1, …)."""

    def loss_weight(self, batch: Any, rows: slice) -> float:
        """How much rows `rows` of `batch` weigh in the step's loss, before any model runs: the
        trainer scales each micro-batch's (mean) loss by its share of the global batch's weight,
        so the gradient is the same however the batch is cut into processes and micro-batches.
        Default: the number of rows (every example weighs the same). A task whose loss is a mean
        over a varying number of scored positions returns that number."""
        return float(rows.stop - rows.start)

    def end_step(self, step: int) -> None:
        """Called after optimiser update `step`: commit what carries over to the next step."""
        return None

    def train_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """Metrics of a training step from its summed statistics."""
        return {"lm_loss": sums["nll"] / sums["count"]} if sums.get("count") else {}

    # ---- evaluation
    def check_data(self, splits: Sequence[str]) -> None:
        """Load the evaluation `splits` a run will use, so that a missing, broken or empty one
        is refused before training instead of after it (tasks with generated data load nothing;
        what is loaded is kept for the evaluations)."""
        return None

    def data_fingerprint(self, splits: Sequence[str]) -> dict[str, str]:
        """{split: a hash of its contents} of the data a run trains (`train`) and evaluates on,
        recorded in checkpoints: a resume refuses data whose contents changed. Empty for tasks
        whose data is generated from the settings (those are compared as settings)."""
        return {}

    def eval_calls(self, split: str, num_batches: int | None) -> int | None:
        """How many model calls `evaluate(…, split, num_batches, …)` makes, each on at most
        `batch_size` rows of one segment (for the run's time estimate); None when the task does
        not count them."""
        return None

    @abstractmethod
    def evaluate(
        self, model: nn.Module, split: str, num_batches: int | None, shard: Shard
    ) -> Evaluation:
        """Sums over this process's share of `split` (num_batches None: the whole split, or the
        task's full evaluation)."""

    @abstractmethod
    def eval_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """Metrics from the evaluation sums of every process."""

    def chance(self) -> dict[str, float]:
        """Named chance levels of the headline metric (empty when it has none)."""
        return {}

    # ---- resumable position (data cursor, carried memory)
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        return None

    # ---- inspection
    def inspection_stream(self, split: str, length: int) -> torch.Tensor:
        """One stream of about `length` token ids [L] from `split`, as the model reads it (no
        document boundary inside), for `inftyformer inspect`."""
        raise ValueError(f"task {self.name!r} provides no stream to inspect")

    # ---- generation
    def encode_prompt(self, text: str) -> tuple[torch.Tensor, list[int] | None]:
        """Token ids [L] for a prompt, and the expected continuation when it is known."""
        raise ValueError(f"task {self.name!r} does not support generation")

    def decode(self, tokens: list[int]) -> str:
        return " ".join(str(t) for t in tokens)

    def default_new_tokens(self) -> int:
        return 32

    def default_sampling(self) -> dict[str, float]:
        """How `inftyformer generate` decodes when not told (temperature, and top_k / top_p if
        any): greedy (temperature 0), for tasks with one right answer."""
        return {"temperature": 0.0}

    # ---- the declared metrics
    @classmethod
    def headline(cls) -> Metric:
        for metric in cls.metrics:
            if metric.higher_is_better is not None:
                return metric
        raise TypeError(f"task {cls.name!r} declares no headline metric")

    @classmethod
    def format_metric(cls, name: str, value: float) -> str:
        fmt = next((m.fmt for m in cls.metrics if m.name == name), ".4f")
        return format(value, fmt)

    def describe(self, metrics: dict[str, float]) -> str:
        """'accuracy 0.7340 (chance: uniform 0.050, format-only 0.180)'."""
        head = self.headline()
        text = f"{head.name} {self.format_metric(head.name, metrics.get(head.name, math.nan))}"
        chance = self.chance()
        if chance:
            text += " (chance: " + ", ".join(f"{k} {v:.3f}" for k, v in chance.items()) + ")"
        return text


# --------------------------------------------------------------------------- the registry
TASKS: dict[str, type[Task]] = {}


def register_task(name: str) -> Callable[[type[Task]], type[Task]]:
    def deco(cls: type[Task]) -> type[Task]:
        if name in TASKS:
            raise ValueError(f"task {name!r} is already registered")
        cls.name = name
        cls.headline()  # a task must declare the metric that selects its best checkpoint
        TASKS[name] = cls
        return cls

    return deco


def get_task(name: str) -> type[Task]:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; available tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name]


__all__ = [
    "TASKS",
    "Evaluation",
    "Metric",
    "RunContext",
    "Shard",
    "StepOutput",
    "Task",
    "TaskConfig",
    "add_sums",
    "get_task",
    "register_task",
    "scored_sums",
]
