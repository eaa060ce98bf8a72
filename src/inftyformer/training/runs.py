"""Saved runs: rebuild a trained model and its task from a checkpoint, and evaluate it.

A run directory holds the checkpoints `best` and `last` (see `checkpoint.py`); each records the
model, train and task settings beside the weights. `load_run` rebuilds the model (weights only,
evaluation mode), optionally with other memory settings (`ModelConfig.with_memory_settings`, e.g.
a longer short-term memory at evaluation), and `SavedRun.task` builds the task, optionally with
other task settings (e.g. another data directory). A run whose pretrained base moved is pointed
at its new folder with `base_model` (its weights are checked when the checkpoint refers to a
frozen base instead of holding it, `checkpoint_weights.py`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..model_kinds import build_model, config_from_dict
from ..tasks import Evaluation, RunContext, Shard, Task, TaskConfig, get_task
from .checkpoint import Checkpoint, CheckpointError, load_checkpoint
from .checkpoint_weights import check_base, load_model_tensors, relocate
from .config import TrainConfig
from .distributed import resolve_device


@dataclass
class SavedRun:
    """A trained model and the settings it was trained with."""

    model: torch.nn.Module  # MemoryLM, or a pretrained model with memory (inftyformer.model_kinds)
    model_config: Any
    train_config: TrainConfig
    task_config: TaskConfig
    checkpoint: Checkpoint

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def task(
        self,
        overrides: dict[str, Any] | None = None,
        batch_size: int | None = None,
        progress: bool = False,
    ) -> Task:
        """The run's task, with task settings `overrides` and another batch size if given."""
        task_cls = get_task(self.train_config.task)
        config = self.task_config
        if overrides:
            config = dataclasses.replace(config, **overrides)
        context = RunContext(
            batch_size=batch_size or self.train_config.batch_size,
            seed=self.train_config.seed,
            device=self.device,
            progress=progress,
        )
        return task_cls(config, self.model_config, context)


def read_configs(
    path: str | Path, base_model: str | None = None
) -> tuple[TrainConfig, TaskConfig, Any]:
    """(train, task, model) settings stored in a checkpoint (a run directory reads `last`),
    with the pretrained base in folder `base_model` if given (see `checkpoint_weights.relocate`)."""
    return _configs(load_checkpoint(_default_name(path, "last")), base_model)


def _default_name(path: str | Path, name: str) -> Path:
    path = Path(path)
    return path / name if path.is_dir() else path


def _configs(
    ckpt: Checkpoint, base_model: str | None = None
) -> tuple[TrainConfig, TaskConfig, Any]:
    meta = ckpt.meta
    missing = [k for k in ("model_config", "train_config", "task_config") if k not in meta]
    if missing:
        raise CheckpointError(f"{ckpt.path}: the metadata lacks {', '.join(missing)}")
    relocate(meta, base_model, ckpt.path)
    try:
        train_cfg = TrainConfig.from_dict(meta["train_config"])
        task_cfg = get_task(train_cfg.task).Config.from_dict(meta["task_config"])
        model_cfg = config_from_dict(meta.get("model_kind", "native"), meta["model_config"])
    except (TypeError, ValueError, FileNotFoundError) as err:
        raise CheckpointError(f"{ckpt.path}: invalid settings in the checkpoint: {err}") from None
    return train_cfg, task_cfg, model_cfg


def load_run(
    path: str | Path,
    device: str | torch.device = "cpu",
    memory_settings: dict[str, Any] | None = None,
    base_model: str | None = None,
) -> SavedRun:
    """The model saved at `path` (a run directory: its best checkpoint, else its last), in
    evaluation mode, with other `memory_settings` if given (the weights are the checkpoint's),
    its pretrained base loaded from `base_model` if given (else from where it was)."""
    ckpt = load_checkpoint(path)
    train_cfg, task_cfg, model_cfg = _configs(ckpt, base_model)
    model_cfg = model_cfg.with_memory_settings(memory_settings)
    check_base(ckpt, model_cfg)
    model = build_model(model_cfg)
    try:
        load_model_tensors(model, ckpt)
    except RuntimeError as err:
        raise CheckpointError(f"{ckpt.path}: weights do not fit the model: {err}") from None
    bad = [name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:
        raise CheckpointError(
            f"{ckpt.path}: the weights hold NaN or inf values ({', '.join(bad[:3])}"
            f"{', ...' if len(bad) > 3 else ''}): the run had diverged before this checkpoint"
        )
    dev = resolve_device(device) if isinstance(device, str) else device
    model.to(dev).eval()
    return SavedRun(model, model_cfg, train_cfg, task_cfg, ckpt)


def evaluate_run(
    path: str | Path,
    split: str = "test",
    num_batches: int | None = None,
    device: str = "cpu",
    memory_settings: dict[str, Any] | None = None,
    task_settings: dict[str, Any] | None = None,
    batch_size: int | None = None,
    progress: bool = False,
    base_model: str | None = None,
) -> tuple[dict[str, float], Evaluation, Task]:
    """The metrics of a saved model on `split` (default number of batches: the run's
    `test_batches`), the raw evaluation (sums and details) and the task that measured them."""
    run = load_run(path, device, memory_settings, base_model)
    task = run.task(task_settings, batch_size=batch_size, progress=progress)
    n = num_batches if num_batches is not None else max(1, run.train_config.test_batches)
    evaluation = task.evaluate(run.model, split, n, Shard())
    return task.eval_metrics(evaluation.sums), evaluation, task


__all__ = ["SavedRun", "evaluate_run", "load_run", "read_configs"]
