"""The trainer's whole state in a checkpoint: weights (or, over a frozen base, what trains),
optimiser moments, step, the schedule, the best-so-far and early-stopping counters, every rank's
RNG states and its task's data position and carried memory, the run's settings and history.
Saved as `best` or `last`; restored on resume."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from ..base_weights import BaseReference
from ..model_kinds import model_kind
from ..tasks import Task, TaskConfig
from .checkpoint import (
    Checkpoint,
    CheckpointError,
    flatten_optimizer,
    rng_state,
    save_checkpoint,
    set_rng_state,
    unflatten_optimizer,
)
from .checkpoint_weights import CONFIG_KEY, META_KEY, load_model_tensors, model_tensors
from .config import TrainConfig
from .distributed import DistEnv, all_gather_object, barrier
from .optim import SCHEDULE_KIND, lr_factor


class RunState:
    """The trainer's part that saves and restores its state (a part of `Trainer`)."""

    cfg: TrainConfig
    task_cfg: TaskConfig
    model_cfg: Any
    env: DistEnv
    out_dir: Path
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    task: Task
    base_reference: BaseReference | None
    base_config: dict[str, Any] | None
    step: int
    best_metric: float | None
    best_step: int | None
    best_loss: float | None
    evals_since_best: int
    tokens_seen: float
    history: list[dict[str, Any]]

    def _rank_state(self, rng: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "rng": rng if rng is not None else rng_state(),
            "task": self.task.state_dict(),
            "tensors": {k: v.detach().cpu() for k, v in self.task.state_tensors().items()},
        }

    def save(self, name: str, rng: dict[str, Any] | None = None) -> None:
        """Write checkpoint `name` (rank 0 writes; every rank contributes its state)."""
        ranks = all_gather_object(self._rank_state(rng), self.env)
        if not self.env.is_main:
            barrier(self.env)
            return
        opt_tensors, opt_info = flatten_optimizer(self.optimizer.state_dict())
        model = model_tensors(self.model, self.base_reference)
        tensors = {f"model/{k}": v for k, v in model.items()}
        tensors.update({f"optim/{k}": v for k, v in opt_tensors.items()})
        rank_meta = []
        for r, state in enumerate(ranks):
            tensors.update({f"task/{r}/{k}": v for k, v in state["tensors"].items()})
            rank_meta.append({"rng": state["rng"], "task": state["task"]})
        from .. import __version__

        meta = {
            "inftyformer_version": __version__,
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "step": self.step,
            "task": self.cfg.task,
            "model_type": self.model_cfg.model_type,
            "model_kind": model_kind(self.model_cfg),
            "model_config": self.model_cfg.to_dict(),
            "train_config": self.cfg.to_dict(),
            "task_config": self.task_cfg.to_dict(),
            "scheduler": {
                "kind": SCHEDULE_KIND,
                "step": self.step,
                "lr_factor": lr_factor(min(self.step, self.cfg.steps - 1), self.cfg),
            },
            "optimizer": opt_info,
            "trainer": {
                "best_metric": self.best_metric,
                "best_step": self.best_step,
                "best_loss": self.best_loss,
                "evals_since_best": self.evals_since_best,
                "tokens_seen": self.tokens_seen,
                "metric": self.task.headline().name,
            },
            "world_size": self.env.world_size,
            "ranks": rank_meta,
            "history": self.history,  # changes allowed on resume: step, time, {setting: [old, new]}
            "data_fingerprint": self._fingerprint(),
        }
        if self.base_reference is not None:
            meta[META_KEY] = self.base_reference.to_dict()
        if self.base_config is not None:
            meta[CONFIG_KEY] = self.base_config
        save_checkpoint(self.out_dir, name, tensors, meta)
        barrier(self.env)  # nobody reads it before it is whole

    def _restore(self, ckpt: Checkpoint) -> None:
        try:
            self._restore_from(ckpt)
        except CheckpointError:
            raise
        except (RuntimeError, KeyError, ValueError, TypeError, AttributeError, IndexError) as err:
            raise CheckpointError(
                f"{ckpt.path}: cannot restore the run from this checkpoint "
                f"({type(err).__name__}: {err})"
            ) from None

    def _restore_from(self, ckpt: Checkpoint) -> None:
        meta = ckpt.meta
        try:
            load_model_tensors(self.model, ckpt)
            self.optimizer.load_state_dict(
                unflatten_optimizer(ckpt.section("optim"), meta["optimizer"])
            )
        except (RuntimeError, KeyError, ValueError) as err:
            raise CheckpointError(
                f"{ckpt.path}: cannot restore the model/optimizer: {err}"
            ) from None
        self.step = int(meta["step"])
        t = meta.get("trainer", {})
        self.best_metric = t.get("best_metric")
        self.best_step = t.get("best_step")
        self.best_loss = t.get("best_loss")
        self.evals_since_best = int(t.get("evals_since_best", 0))
        self.tokens_seen = float(t.get("tokens_seen", 0.0))
        ranks = meta.get("ranks", [])
        if meta.get("world_size") != self.env.world_size:
            self.echo(
                f"note: the checkpoint was written by {meta.get('world_size')} process(es), this "
                f"run has {self.env.world_size}; the continuation is not bit-identical"
            )
        if self.env.rank < len(ranks):
            mine = ranks[self.env.rank]
            set_rng_state(mine["rng"])
            self.task.load_state_dict(mine.get("task", {}))
            prefix = f"task/{self.env.rank}"
            if not getattr(self, "_fresh_memory", False):  # else each stream starts anew
                self.task.load_state_tensors(ckpt.section(prefix))


__all__ = ["RunState"]
