"""Training and evaluation: the trainer loop, checkpoints, logging, distributed set-up, tasks.

Imports models and tasks; nothing below the interface layer imports this package.
"""

from .checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from .config import TrainConfig, parse_overrides
from .distributed import DistEnv, init_distributed, shutdown_distributed
from .lm_task import LanguageModelTask  # registers the "lm" task
from .logger import MetricsLogger, read_metrics
from .tasks import TASKS, SortingTask, StepStats, Task, get_task, headline, register_task
from .trainer import (
    Trainer,
    TrainResult,
    evaluate_checkpoint,
    load_run_configs,
    lr_factor,
    model_from_checkpoint,
)

__all__ = [
    "TASKS",
    "Checkpoint",
    "CheckpointError",
    "DistEnv",
    "LanguageModelTask",
    "MetricsLogger",
    "SortingTask",
    "StepStats",
    "Task",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "evaluate_checkpoint",
    "get_task",
    "headline",
    "init_distributed",
    "load_checkpoint",
    "load_run_configs",
    "lr_factor",
    "model_from_checkpoint",
    "parse_overrides",
    "read_metrics",
    "register_task",
    "save_checkpoint",
    "shutdown_distributed",
]
