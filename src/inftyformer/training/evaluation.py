"""Evaluation during and after training: the task's metrics over every process's share, the
best checkpoint (by the task's headline metric, ties broken by validation loss), early stopping,
and the final test of the best weights written to `results.json`."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

from torch import nn

from .._checks import NonFiniteError
from .._files import write_atomic
from ..tasks import Shard, Task
from .checkpoint import checkpoint_exists, load_checkpoint
from .checkpoint_weights import load_model_tensors
from .config import TrainConfig
from .distributed import DistEnv, reduce_sums
from .logger import MetricsLogger
from .step import DivergedError


class Evaluation:
    """The trainer's part that evaluates and keeps the best (a part of `Trainer`)."""

    cfg: TrainConfig
    env: DistEnv
    out_dir: Path
    model: nn.Module
    task: Task
    step: int
    best_metric: float | None
    best_step: int | None
    best_loss: float | None
    evals_since_best: int
    echo: Callable[[str], None]
    save: Callable[..., None]
    _diverged: Callable[..., DivergedError]

    def evaluate(self, split: str = "valid", num_batches: int | None = None) -> dict[str, float]:
        """The task's metrics on `split`, over every process's share."""
        n = self.cfg.eval_batches if num_batches is None else num_batches
        shard = Shard(self.env.rank, self.env.world_size)
        sums = self.task.evaluate(self.model, split, n, shard).sums
        return self.task.eval_metrics(reduce_sums(sums, self.env))

    def _improved(self, value: float, loss: float | None) -> bool:
        """Better on the headline metric, or level with it and lower in validation loss (an
        exact-match metric that stays 0 would otherwise keep the first evaluation as 'best')."""
        if self.best_metric is None or math.isnan(self.best_metric):
            return not math.isnan(value)
        if value == self.best_metric:
            return loss is not None and self.best_loss is not None and loss < self.best_loss
        if self.task.headline().higher_is_better:
            return value > self.best_metric
        return value < self.best_metric

    def _evaluate_and_keep_best(self, logger: MetricsLogger) -> bool:
        """Evaluate on valid, keep the best checkpoint; True when early stopping triggers."""
        try:
            metrics = self.evaluate("valid")
        except NonFiniteError as err:
            raise self._diverged(f"evaluating it, {err}", after_update=True) from None
        bad = [k for k, v in metrics.items() if isinstance(v, float) and math.isnan(v)]
        if bad:
            raise self._diverged(f"its validation {', '.join(bad)} became NaN", after_update=True)
        logger.log(self.step, "valid", metrics)
        value = metrics[self.task.headline().name]
        loss = metrics.get("loss")
        loss = float(loss) if isinstance(loss, (int, float)) and not math.isnan(loss) else None
        if self._improved(value, loss):
            self.best_metric, self.best_step, self.best_loss = value, self.step, loss
            self.evals_since_best = 0
            self.save("best")
            mark = " (best)"
        else:
            self.evals_since_best += 1
            mark = ""
        self.echo(f"step {self.step}: valid {self.task.describe(metrics)}{mark}")
        return bool(self.cfg.patience) and self.evals_since_best >= self.cfg.patience

    def _final_test(self, logger: MetricsLogger) -> dict[str, float] | None:
        if not self.cfg.test_batches:
            return None
        if checkpoint_exists(self.out_dir, "best"):
            best = load_checkpoint(self.out_dir / "best")
            load_model_tensors(self.model, best)
        metrics = self.evaluate("test", self.cfg.test_batches)
        logger.log(self.step, "test", metrics)
        if self.env.is_main:
            summary = {
                "step": self.step,
                "best_step": self.best_step,
                "best_valid": self.best_metric,
                "test": metrics,
                "chance": self.task.chance(),
                "metric": self.task.headline().name,
            }
            write_atomic(self.out_dir / "results.json", json.dumps(summary, indent=1))
        return metrics


__all__ = ["Evaluation"]
