"""Training: the loop (`trainer`, with its parts `optim`, `step`, `evaluation`, `resume` and
`run_state`), its settings (`config`), checkpoints, saved runs (`runs`), metric logs and the
distributed set-up. It knows the task contract (`inftyformer.tasks`), never a particular task."""

from .checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from .config import TrainConfig, parse_overrides
from .distributed import DistEnv, init_distributed, shutdown_distributed
from .logger import MetricsLogger, read_metrics
from .runs import SavedRun, evaluate_run, load_run, read_configs
from .trainer import DivergedError, Trainer, TrainResult, lr_factor

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "DistEnv",
    "DivergedError",
    "MetricsLogger",
    "SavedRun",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "evaluate_run",
    "init_distributed",
    "load_checkpoint",
    "load_run",
    "lr_factor",
    "parse_overrides",
    "read_configs",
    "read_metrics",
    "save_checkpoint",
    "shutdown_distributed",
]
