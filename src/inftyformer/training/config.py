"""The training configuration, and `key=value` overrides for any dataclass config.

`TrainConfig` holds everything about *how* a model is trained (optimiser, schedule, evaluation,
checkpoints, logging, data size); the model's own hyper-parameters live in the model's config.
Both are frozen dataclasses validated at construction, so a bad value fails before any work starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from .._checks import check_positive_int, check_range

DEVICES = ("cpu", "cuda", "auto")

# What a run IS: changing one of these when resuming changes the updates the run makes from then
# on (data, batch, optimiser, the learning-rate schedule, which runs to `steps`) or the result it
# reports (when it evaluates, keeps its best checkpoint, stops early, how much it tests). A resume
# refuses such changes unless they are allowed explicitly; allowed ones go into the run's history.
RUN_SETTINGS = (
    "seed",
    "steps",
    "batch_size",
    "grad_accum",
    "lr",
    "min_lr_ratio",
    "warmup_steps",
    "weight_decay",
    "beta1",
    "beta2",
    "adam_eps",
    "grad_clip",
    "eval_every",
    "eval_batches",
    "test_batches",
    "patience",
)
# How a run is executed: where and on what it runs, what it shows and logs, how often it writes
# its `last` checkpoint, where this session halts. A resume may change these freely: the
# continuation computes the same updates (up to the floating-point differences of another device
# or thread count) and reports the same result.
EXECUTION_SETTINGS = (
    "device",
    "threads",
    "out_dir",
    "log_every",
    "tensorboard",
    "progress",
    "save_every",
    "halt_after",
)


@dataclass(frozen=True)
class TrainConfig:
    """How to train, whatever the task. `steps` counts optimiser updates; `batch_size` is the
    global batch (summed over gradient-accumulation micro-batches and over distributed ranks).
    What the task itself needs (sequence length, data, tokenizer, …) lives in the task's own
    settings (`inftyformer.tasks.Task.Config`)."""

    task: str = "sorting"  # what to train on: sorting, recall, lm, facts or dialogue
    steps: int = 600  # optimiser steps
    batch_size: int = 8  # sequences per micro-batch
    grad_accum: int = 1  # micro-batches per optimiser step
    lr: float = 1e-3  # peak AdamW learning rate
    min_lr_ratio: float = 0.1  # the cosine decays to lr * min_lr_ratio
    warmup_steps: int = 50  # linear warm-up from 0, then cosine decay to `steps`
    weight_decay: float = 0.01  # AdamW; never on biases, norms and embeddings
    beta1: float = 0.9  # AdamW β₁
    beta2: float = 0.98  # AdamW β₂
    adam_eps: float = 1e-8  # AdamW ε
    grad_clip: float = 1.0  # max global grad norm; 0 turns clipping off
    eval_every: int = 100  # steps between evaluations on the valid split
    eval_batches: int = 4  # batches of `batch_size` per evaluation
    test_batches: int = 16  # batches of `batch_size` for the final test evaluation
    patience: int = 0  # stop after this many evaluations without improvement; 0 = never
    save_every: int = 0  # steps between `last` checkpoints; 0 = at every evaluation
    seed: int = 0  # seeds data order, initialisation and dropout
    device: str = "cpu"  # cpu, cuda, cuda:N, or auto
    # torch intra-op threads; 0 = torch's default (one per core). 1 by default: the models' small
    # kernels gain little from a second thread, and on a CPU whose cores are oversubscribed,
    # multi-threaded torch spins and runs several times slower
    threads: int = 1  # torch CPU threads
    out_dir: str = "runs/sorting"  # where checkpoints, metrics.csv and TensorBoard logs go
    log_every: int = 10  # steps between metric rows (CSV, TensorBoard)
    tensorboard: bool = True  # also write TensorBoard event files
    progress: bool = True  # tqdm progress bar
    halt_after: int = 0  # stop (with a checkpoint) once this step is reached; 0 = run to `steps`

    def __post_init__(self) -> None:
        if not isinstance(self.task, str) or not self.task:
            raise ValueError(f"task must be a non-empty string, got {self.task!r}")
        check_positive_int("steps", self.steps, minimum=1)
        check_positive_int("batch_size", self.batch_size, minimum=1)
        check_positive_int("grad_accum", self.grad_accum, minimum=1)
        if self.batch_size % self.grad_accum:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be divisible by grad_accum "
                f"({self.grad_accum})"
            )
        check_range("lr", self.lr, 0.0, low_open=True)
        check_range("min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)
        check_positive_int("warmup_steps", self.warmup_steps, minimum=0)
        check_range("weight_decay", self.weight_decay, 0.0)
        check_range("beta1", self.beta1, 0.0, 1.0, high_open=True)
        check_range("beta2", self.beta2, 0.0, 1.0, high_open=True)
        check_range("adam_eps", self.adam_eps, 0.0, low_open=True)
        check_range("grad_clip", self.grad_clip, 0.0)
        check_positive_int("eval_every", self.eval_every, minimum=1)
        check_positive_int("eval_batches", self.eval_batches, minimum=1)
        check_positive_int("test_batches", self.test_batches, minimum=0)
        check_positive_int("patience", self.patience, minimum=0)
        check_positive_int("save_every", self.save_every, minimum=0)
        check_positive_int("seed", self.seed, minimum=0)
        if not isinstance(self.device, str) or not (
            self.device in DEVICES or self.device.startswith("cuda:")
        ):
            raise ValueError(f"device must be one of {DEVICES} or cuda:N, got {self.device!r}")
        check_positive_int("threads", self.threads, minimum=0)
        if not isinstance(self.out_dir, str) or not self.out_dir:
            raise ValueError(f"out_dir must be a non-empty path, got {self.out_dir!r}")
        check_positive_int("log_every", self.log_every, minimum=1)
        for flag in ("tensorboard", "progress"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag} must be a bool, got {getattr(self, flag)!r}")
        check_positive_int("halt_after", self.halt_after, minimum=0)

    @property
    def checkpoint_every(self) -> int:
        return self.save_every or self.eval_every

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        if not isinstance(data, dict):
            raise TypeError(f"a TrainConfig dict is expected, got {type(data).__name__}")
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown TrainConfig keys: {', '.join(unknown)}")
        return cls(**data)


# --------------------------------------------------------------------------- overrides
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse_scalar(key: str, text: str, kind: Any) -> Any:
    if kind is bool:
        low = text.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(f"{key}: expected a boolean (true/false), got {text!r}")
    if kind is int:
        try:
            return int(text.strip().replace("_", ""))
        except ValueError:
            raise ValueError(f"{key}: expected an integer, got {text!r}") from None
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{key}: expected a number, got {text!r}") from None
    if kind is str:
        return text
    raise ValueError(f"{key}: values of type {kind} cannot be set from the command line")


def parse_value(key: str, text: str, annotation: Any) -> Any:
    """Convert the command-line string `text` to the type `annotation` of field `key`.

    Handles int, float, bool, str, `X | None` (write "none") and tuples (comma-separated).
    """
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if text.strip().lower() in {"none", "null"} and len(args) < len(
            typing.get_args(annotation)
        ):
            return None
        errors = []
        for arg in args:
            try:
                return parse_value(key, text, arg)
            except ValueError as err:
                errors.append(str(err))
        raise ValueError("; ".join(errors))
    if origin is tuple:
        args = typing.get_args(annotation)
        parts = [p for p in text.replace("(", "").replace(")", "").split(",") if p.strip()]
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(parse_value(key, p, args[0]) for p in parts)
        if len(parts) != len(args):
            raise ValueError(f"{key}: expected {len(args)} comma-separated values, got {text!r}")
        return tuple(parse_value(key, p, a) for p, a in zip(parts, args, strict=True))
    if origin is typing.Literal:
        choices = typing.get_args(annotation)
        for choice in choices:
            if str(choice) == text:
                return choice
        raise ValueError(f"{key}: expected one of {choices}, got {text!r}")
    return _parse_scalar(key, text, annotation)


def field_types(cls: type) -> dict[str, Any]:
    """Resolved type annotations of the fields of dataclass `cls` (init fields only); of a
    model's config, every setting by its flat name (its `setting_types`)."""
    if hasattr(cls, "setting_types"):  # a model's config: its settings flat
        return cls.setting_types()
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, str) for f in fields(cls) if f.init}


def split_assignment(item: str) -> tuple[str, str]:
    """'key=value' -> (key, value), with a clear error for anything else."""
    if "=" not in item:
        raise ValueError(f"expected key=value, got {item!r}")
    key, value = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ValueError(f"expected key=value, got {item!r}")
    return key, value


SETTINGS_HELP = "--set help lists every setting"


def unknown_setting(key: str, names: Iterable[str], what: str = "") -> str:
    """'unknown model setting 'num_base' (did you mean num_basis?); --set help lists every
    setting': the closest names only, since the full list is long."""
    close = difflib.get_close_matches(key, sorted(names), n=3, cutoff=0.6)
    text = f"unknown {what + ' ' if what else ''}setting {key!r}"
    if close:
        text += f" (did you mean {' or '.join(close)}?)"
    return f"{text}; {SETTINGS_HELP}"


def parse_overrides(cls: type, items: dict[str, str], what: str) -> dict[str, Any]:
    """Typed values for `items` (field name -> text) of dataclass `cls`; unknown keys are errors."""
    types_ = field_types(cls)
    out: dict[str, Any] = {}
    for key, text in items.items():
        if key not in types_:
            raise ValueError(unknown_setting(key, types_, what))
        out[key] = parse_value(key, text, types_[key])
    return out


__all__ = [
    "DEVICES",
    "EXECUTION_SETTINGS",
    "RUN_SETTINGS",
    "TrainConfig",
    "field_types",
    "parse_overrides",
    "parse_value",
    "split_assignment",
    "unknown_setting",
]
