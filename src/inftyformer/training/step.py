"""One training step: one optimiser update on the global batch, cut into micro-batches per
process and weighted so that the update is the same whatever their number; gradient clipping;
the step's metrics; and the error, with what to try, when a step goes NaN or infinite."""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._checks import NonFiniteError
from ..tasks import Task
from ..tasks.base import add_sums
from .checkpoint import checkpoint_exists
from .config import TrainConfig
from .density import DensityMonitor
from .distributed import DistEnv, chunk_rows, reduce_sums
from .optim import lr_factor, set_lr


class DivergedError(FloatingPointError):
    """Training diverged: a loss, a gradient or a carried memory state became NaN or infinite.
    Raised before the optimiser step, so the weights and the last checkpoint stay as they were."""


class TrainStep:
    """The trainer's part that makes one update (a part of `Trainer`)."""

    cfg: TrainConfig
    env: DistEnv
    out_dir: Path
    model: nn.Module
    ddp_model: Any
    optimizer: torch.optim.Optimizer
    density: DensityMonitor
    task: Task
    step: int
    tokens_seen: float
    _in_update: bool

    def train_step(self) -> dict[str, float]:
        """One optimiser update; returns the step's training metrics (global)."""
        lr = set_lr(self.optimizer, self.step, self.cfg)
        self.optimizer.zero_grad(set_to_none=True)
        num_micro = self.cfg.grad_accum
        chunks = num_micro * self.env.world_size
        sums: dict[str, float] = {}
        means: dict[str, float] = {"loss": 0.0}
        start = time.perf_counter()
        self.density.start()
        batch = self.task.batch(self.step)
        # every process holds the whole global batch, cut into `chunks` chunks rank-major; each
        # chunk's mean loss is scaled by its share of the batch's weight (× the number of
        # processes, since DDP averages the gradients over them), so the update is the same
        # whatever the number of processes and micro-batches
        weights = [
            self.task.loss_weight(batch, chunk_rows(self.cfg.batch_size, c, chunks))
            for c in range(chunks)
        ]
        total = sum(weights)
        for micro in range(num_micro):
            chunk = self.env.rank * num_micro + micro
            rows = chunk_rows(self.cfg.batch_size, chunk, chunks)
            share = weights[chunk] / total if total > 0 else 1.0 / chunks
            sync = micro == num_micro - 1 or not self.env.distributed
            with contextlib.nullcontext() if sync else self.ddp_model.no_sync():
                try:
                    out = self.task.loss(self.ddp_model, batch, rows, micro)
                except NonFiniteError as err:  # inside the model, or in a carried memory
                    raise self._diverged(
                        f"the model's values became NaN or infinite ({err})"
                    ) from None
                loss = out.loss.detach()
                if not torch.isfinite(loss):
                    raise self._diverged(f"the loss became {float(loss)}")
                (out.loss * (share * self.env.world_size)).backward()
            add_sums(sums, out.sums)
            add_sums(means, {"loss": float(loss), **out.means}, weight=share)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if self.cfg.grad_clip > 0:
            grad_norm = float(
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
            )
        elif grads:
            norms = torch.stack([torch.linalg.vector_norm(g.detach().float()) for g in grads])
            grad_norm = float(torch.linalg.vector_norm(norms))
        else:
            grad_norm = 0.0
        if not math.isfinite(grad_norm):
            raise self._diverged(f"the gradient norm became {grad_norm}")
        self._in_update = True
        self.optimizer.step()
        self.task.end_step(self.step)
        self.step += 1
        self._in_update = False
        elapsed = time.perf_counter() - start
        sums = reduce_sums(sums, self.env)
        means = reduce_sums(means, self.env)
        self.tokens_seen += sums.get("tokens", 0.0)
        metrics = {"loss": means.pop("loss")}
        metrics.update(self.task.train_metrics(sums))
        metrics.update({f"aux/{k}": v for k, v in means.items()})
        metrics.update(self.density.metrics(self.env))
        metrics["lr"] = lr
        metrics["grad_norm"] = grad_norm
        metrics["tokens_per_s"] = sums.get("tokens", 0.0) / max(elapsed, 1e-9)
        return metrics

    def _diverged(self, what: str, after_update: bool = False) -> DivergedError:
        """The error for a step that went non-finite: what happened, where, and what to try.
        `after_update`: found by the evaluation after update `self.step` (else: in update
        `self.step + 1`, before the optimiser changed the weights)."""
        cfg = self.cfg
        step = self.step if after_update else self.step + 1
        last = "no checkpoint yet"
        if checkpoint_exists(self.out_dir, "last"):
            last = "the last checkpoint is intact"
        if after_update:
            stopped = f"the run stopped without saving it, {last}"
        else:
            stopped = f"the run stopped before updating the weights, {last}"
        hints = [f"a lower learning rate (--lr {cfg.lr / 3:.3g}; now {cfg.lr:g})"]
        hints.append(f"a longer warm-up (--set warmup_steps={max(2 * cfg.warmup_steps, 100)})")
        if cfg.grad_clip == 0:
            hints.append("gradient clipping (--set grad_clip=1.0)")
        lr = cfg.lr * lr_factor(step - 1, cfg)
        return DivergedError(
            f"training diverged at step {step} (learning rate {lr:.3g}): {what}; {stopped}. Try "
            + ", ".join(hints)
            + "; to continue this run with such a change: --resume --allow-changes"
        )


__all__ = ["DivergedError", "TrainStep"]
