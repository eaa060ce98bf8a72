"""The training loop: AdamW, linear warm-up + cosine schedule, gradient accumulation and clipping,
periodic evaluation with a best checkpoint, early stopping, exact resumption, DDP.

One step = one optimiser update on the global batch `batch_size`, cut into `grad_accum`
micro-batches per rank. Everything the continuation depends on — weights, optimiser moments, step,
RNG states of every rank, the task's data position and carried memory, early-stopping counters —
goes into the `last` checkpoint, so a run stopped at any point (Ctrl-C, SIGTERM, kill -9) and
resumed with ``resume=True`` logs exactly the losses an uninterrupted run would have logged.
"""

from __future__ import annotations

import contextlib
import math
import random
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from .._checks import NonFiniteError
from .._progress import progress
from ..models import build_model, changeable_settings, model_kind
from ..tasks import RunContext, Shard, Task, TaskConfig, get_task
from ..tasks.base import add_sums
from .checkpoint import (
    Checkpoint,
    CheckpointError,
    checkpoint_exists,
    clean_stale_files,
    flatten_optimizer,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
    unflatten_optimizer,
)
from .config import RUN_SETTINGS, TrainConfig
from .density import DensityMonitor
from .distributed import (
    DistEnv,
    all_gather_object,
    all_reduce_sum,
    barrier,
    chunk_rows,
    reduce_sums,
    resolve_device,
    wrap_model,
)
from .logger import CSV_NAME, MetricsLogger
from .weights import (
    META_KEY,
    base_reference,
    check_base,
    load_model_tensors,
    model_tensors,
    relocate,
)

SCHEDULE_KIND = "linear-warmup-cosine"
RUN_FILES = ("best", "last")


# --------------------------------------------------------------------------- pieces
def _minutes(since: float) -> str:
    return f"{(time.perf_counter() - since) / 60:.1f} min"


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of the base learning rate for update number `step` (0-based)."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def param_groups(model: nn.Module, lr: float, weight_decay: float) -> list[dict[str, Any]]:
    """The model's own optimiser groups (`param_groups(lr, weight_decay)` of the model contract:
    decay for weight matrices, none for biases, norms and embeddings; a pretrained model's
    memory at its own rate), each with its peak rate recorded as `base_lr`."""
    groups = model.param_groups(lr, weight_decay)
    for group in groups:
        group["base_lr"] = group["lr"]
    return groups


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        param_groups(model, cfg.lr, cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.adam_eps,
        weight_decay=cfg.weight_decay,
    )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 - third-party code may use the global RNG
    torch.manual_seed(seed)


def rank_seed(seed: int, rank: int) -> int:
    """Seed of rank `rank`'s own randomness (dropout, sticky sampling); rank 0 keeps `seed`."""
    return seed if rank == 0 else (seed * 1_000_003 + rank * 7_919) % 2**63


def changed(a: dict[str, Any], b: dict[str, Any], keys: Any = None) -> dict[str, list[Any]]:
    """{key: [old, new]} for the keys (default: all) whose values differ."""
    keys = sorted(set(a) | set(b)) if keys is None else keys
    return {k: [a.get(k), b.get(k)] for k in keys if a.get(k) != b.get(k)}


class DivergedError(FloatingPointError):
    """Training diverged: a loss, a gradient or a carried memory state became NaN or infinite.
    Raised before the optimiser step, so the weights and the last checkpoint stay as they were."""


@dataclass
class TrainResult:
    out_dir: Path
    step: int  # optimiser steps completed
    finished: bool  # reached `steps` or stopped early (then the test split was evaluated)
    stopped_early: bool = False
    interrupted: bool = False  # Ctrl-C / SIGTERM / halt_after: a `last` checkpoint was saved
    best_metric: float | None = None
    best_step: int | None = None
    test: dict[str, float] | None = None
    chance: dict[str, float] = field(default_factory=dict)
    elapsed: float = 0.0  # seconds of training in this process (evaluations included)
    history: list[dict[str, float]] = field(default_factory=list)  # per step, this process


class _StopRequest:
    """First SIGINT/SIGTERM asks for a clean stop at the next step boundary (then a checkpoint);
    a second one interrupts at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> _StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


# --------------------------------------------------------------------------- trainer
class Trainer:
    """Train `model_cfg`'s model on task `train_cfg.task` with settings `task_cfg`; see the module
    docstring."""

    def __init__(
        self,
        train_cfg: TrainConfig,
        task_cfg: TaskConfig,
        model_cfg: Any,
        *,
        resume: bool = False,
        overwrite: bool = False,
        allow_changes: bool = False,
        env: DistEnv | None = None,
        echo: Callable[[str], None] | None = None,
    ) -> None:
        """`resume`: continue the run in `train_cfg.out_dir` from its `last` checkpoint. A resume
        refuses settings that change what the run is (the train settings in
        `training.config.RUN_SETTINGS`, any task setting, the model's memory settings) unless
        `allow_changes`; allowed changes are recorded in the checkpoint's `history`."""
        self.cfg = train_cfg
        self.task_cfg = task_cfg
        self.model_cfg = model_cfg
        self.env = env or DistEnv(device=resolve_device(train_cfg.device))
        self._echo = echo or print
        self.out_dir = Path(train_cfg.out_dir)
        task_cls = get_task(train_cfg.task)
        if not isinstance(task_cfg, task_cls.Config):
            raise TypeError(
                f"task {train_cfg.task!r} needs a {task_cls.Config.__name__}, "
                f"got {type(task_cfg).__name__}"
            )
        task_cls.check(task_cfg, model_cfg)

        self.history: list[dict[str, Any]] = []
        self._renamed_base = ""  # a hint when data "changes" because the base's folder did
        if self.env.is_main:
            clean_stale_files(self.out_dir)  # what a killed save left behind
        barrier(self.env)
        checkpoint: Checkpoint | None = None
        if resume:
            if not checkpoint_exists(self.out_dir, "last"):
                raise CheckpointError(
                    f"cannot resume: no checkpoint 'last' in {self.out_dir} "
                    "(start without --resume, or point --out-dir at the run)"
                )
            try:
                checkpoint = load_checkpoint(self.out_dir / "last")
            except CheckpointError as err:
                raise CheckpointError(f"{err}. {self._fallback(err)}") from None
            # a pretrained base in another folder is the same run (its weights are checked)
            moved = relocate(checkpoint.meta, model_cfg.to_dict().get("base_model"), self.out_dir)
            self._check_resumable(checkpoint, allow_changes)
            check_base(checkpoint, model_cfg)
            if moved is not None:
                now = model_cfg.to_dict()["base_model"]
                if Path(moved).name != Path(now).name:
                    self._renamed_base = (
                        f" (or is it the base model's folder, renamed from {Path(moved).name} to "
                        f"{Path(now).name}? its tokenizer is named after it: keep the old name)"
                    )
                self.echo(f"note: the base model is now {model_cfg.to_dict()['base_model']} "
                          f"(was {moved})")  # fmt: skip
        elif any(checkpoint_exists(self.out_dir, n) for n in RUN_FILES):
            if not overwrite:
                raise FileExistsError(
                    f"{self.out_dir} already holds a run; pass --resume to continue it, "
                    "--overwrite to start over, or choose another --out-dir"
                )
            barrier(self.env)  # every rank has looked before rank 0 clears
            if self.env.is_main:
                self._clear_run_dir()
        barrier(self.env)
        # with a frozen base, checkpoints hold what trains and refer to the base (weights.py)
        self.base_reference = base_reference(model_cfg)

        if train_cfg.threads:
            torch.set_num_threads(train_cfg.threads)
        seed_everything(train_cfg.seed)
        self.model = build_model(model_cfg).to(self.env.device)
        self.model.train()
        self.density = DensityMonitor(self.model)  # per-layer σ and μ spread of every step
        self.optimizer = build_optimizer(self.model, train_cfg)
        if self.env.rank:
            seed_everything(rank_seed(train_cfg.seed, self.env.rank))
        context = RunContext(
            batch_size=train_cfg.batch_size,
            seed=train_cfg.seed,
            device=self.env.device,
            progress=train_cfg.progress and self.env.is_main,
        )
        self.task: Task = task_cls(task_cfg, model_cfg, context)

        self.step = 0
        self.best_metric: float | None = None
        self.best_step: int | None = None
        self.best_loss: float | None = None  # the best's validation loss: breaks ties
        self.evals_since_best = 0
        self.tokens_seen = 0.0
        self._in_update = False
        self._rng_at_step_start: dict[str, Any] | None = None
        self._data_fingerprint: dict[str, str] | None = None
        if checkpoint is not None:
            self._check_same_data(checkpoint, allow_changes)
            try:
                self._restore(checkpoint)
            except CheckpointError as err:
                raise CheckpointError(f"{err}. {self._fallback(err)}") from None
        self.ddp_model = wrap_model(self.model, self.env)

    # ------------------------------------------------------------------ helpers
    def echo(self, text: str) -> None:
        if self.env.is_main:
            self._echo(text)

    def _clear_run_dir(self) -> None:
        for name in RUN_FILES:
            for suffix in (".safetensors", ".json", ".manifest.json"):
                path = self.out_dir / f"{name}{suffix}"
                if path.exists():
                    path.unlink()
        for extra in (CSV_NAME, "results.json"):
            if (self.out_dir / extra).exists():
                (self.out_dir / extra).unlink()
        shutil.rmtree(self.out_dir / "tensorboard", ignore_errors=True)

    def _fallback(self, error: CheckpointError) -> str:
        """What a run whose newest checkpoint is damaged can do: whether the 'best' one is
        intact (and how to continue from it), or that nothing is left to resume."""
        out = self.out_dir
        if not checkpoint_exists(out, "best"):
            return "There is no other checkpoint to resume from: start again with --overwrite"
        try:
            best = load_checkpoint(out / "best")
        except CheckpointError as err:
            return f"The 'best' checkpoint is damaged too ({err}): start again with --overwrite"
        return (
            f"The 'best' checkpoint (step {best.meta.get('step')}) is intact: to continue from "
            f'it, copy it over the newest (cd {out} && for f in best.*; do cp "$f" '
            f'"last${{f#best}}"; done) and resume; `inftyformer evaluate {out / "best"}` '
            "evaluates it as it is"
        )

    def _check_resumable(self, ckpt: Checkpoint, allow_changes: bool) -> None:
        meta = ckpt.meta
        saved_model = meta.get("model_config", {})
        if not isinstance(saved_model, dict):
            raise CheckpointError(f"{ckpt.path}: the metadata's model_config is not an object")
        if meta.get("model_kind", "native") != model_kind(self.model_cfg):
            raise CheckpointError(
                f"{ckpt.path}: the checkpoint holds a {meta.get('model_kind', 'native')} model, "
                f"not a {model_kind(self.model_cfg)} one"
            )
        if meta.get("model_type") != self.model_cfg.model_type:
            raise CheckpointError(
                f"{ckpt.path}: the checkpoint holds a {meta.get('model_type')!r} model, "
                f"not a {self.model_cfg.model_type!r} one"
            )
        if meta.get("task") != self.cfg.task:
            raise CheckpointError(
                f"{ckpt.path}: the checkpoint was trained on task {meta.get('task')!r}, "
                f"not {self.cfg.task!r}"
            )
        model_now = self.model_cfg.to_dict()
        changeable = changeable_settings(self.model_cfg)
        fixed = changed(saved_model, model_now, sorted(set(model_now) - set(changeable)))
        if fixed:
            raise CheckpointError(
                f"{ckpt.path}: the model configuration differs from the checkpoint's: "
                + "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in fixed.items())
                + " (these fix the weights; start a new run to change them)"
            )
        changes = {
            **{f"train.{k}": v for k, v in changed(
                meta.get("train_config", {}), self.cfg.to_dict(), RUN_SETTINGS).items()},
            **{f"task.{k}": v for k, v in changed(
                meta.get("task_config", {}), self.task_cfg.to_dict()).items()},
            **{f"model.{k}": v for k, v in changed(
                saved_model, model_now, changeable).items()},
        }  # fmt: skip
        history = meta.get("history", [])
        self.history = list(history) if isinstance(history, list) else []
        if not changes:
            return
        shown = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changes.items())
        if not allow_changes:
            raise CheckpointError(
                f"resuming would change the run in {self.out_dir}: {shown}. Resume without "
                "these settings to continue the run as it was, or allow the change explicitly "
                "(--allow-changes; it is recorded in the run's history)"
            )
        self.history.append(
            {
                "step": int(meta.get("step", 0)),
                "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "changes": changes,
            }
        )
        self.echo(f"note: changing the run from step {meta.get('step')}: {shown}")

    def _fingerprint(self) -> dict[str, str]:
        if self._data_fingerprint is None:  # the data does not change during a run
            self._data_fingerprint = self.task.data_fingerprint(self._data_splits())
        return self._data_fingerprint

    def _data_splits(self) -> list[str]:
        """The splits a run reads: train, and those it evaluates."""
        evaluated = (("valid", self.cfg.eval_batches), ("test", self.cfg.test_batches))
        return ["train", *(split for split, batches in evaluated if batches)]

    def _check_same_data(self, ckpt: Checkpoint, allow_changes: bool) -> None:
        """Refuse to resume on data whose contents changed since the checkpoint (the same
        number of files with other text included), like a changed setting."""
        saved = ckpt.meta.get("data_fingerprint")
        if not isinstance(saved, dict) or not saved:
            return  # a checkpoint from before fingerprints, or generated data
        now = self.task.data_fingerprint(sorted(saved))
        moved = sorted(split for split in saved if now.get(split) != saved[split])
        if not moved:
            return
        shown = ", ".join(moved)
        if not allow_changes:
            raise CheckpointError(
                f"resuming would change the run in {self.out_dir}: the contents of the "
                f"{shown} data changed since step {ckpt.meta.get('step')} (same settings, "
                "other text). Restore the data to continue the run as it was, or allow the "
                "change explicitly (--allow-changes; it is recorded in the run's history)"
                + self._renamed_base
            )
        changes = {f"data.{split}": [saved[split], now.get(split)] for split in moved}
        self.history.append(
            {
                "step": int(ckpt.meta.get("step", 0)),
                "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "changes": changes,
            }
        )
        self.echo(f"note: the {shown} data changed since step {ckpt.meta.get('step')}")

    # ------------------------------------------------------------------ checkpoints
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
            self.task.load_state_tensors(ckpt.section(prefix))

    # ------------------------------------------------------------------ one step
    def _set_lr(self, step: int) -> float:
        factor = lr_factor(step, self.cfg)
        for g in self.optimizer.param_groups:
            g["lr"] = g["base_lr"] * factor
        return self.cfg.lr * factor

    def train_step(self) -> dict[str, float]:
        """One optimiser update; returns the step's training metrics (global)."""
        lr = self._set_lr(self.step)
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

    # ------------------------------------------------------------------ the loop
    def fit(self) -> TrainResult:
        cfg = self.cfg
        result = TrainResult(out_dir=self.out_dir, step=self.step, finished=False)
        result.chance = self.task.chance()
        resumed_at = self.step if self.step else None
        logger = MetricsLogger(
            self.out_dir,
            enabled=self.env.is_main,
            tensorboard=cfg.tensorboard,
            resume_step=resumed_at,
        )
        bar = progress(
            total=cfg.steps,
            initial=self.step,
            enabled=cfg.progress and self.env.is_main,
            dynamic_ncols=True,
            desc=f"{cfg.task}/{self.model_cfg.model_type}",
        )
        echo_before = self._echo
        if isinstance(bar, tqdm) and not bar.disable:
            self._echo = tqdm.write
        if resumed_at is not None:
            self.echo(f"resumed from {self.out_dir / 'last'} at step {self.step}")
        # an empty or broken evaluation split is found now, not after the training
        evaluated = (("valid", cfg.eval_batches), ("test", cfg.test_batches))
        self.task.check_data([split for split, batches in evaluated if batches])
        t0 = time.perf_counter()
        halt = cfg.halt_after if cfg.halt_after else math.inf
        try:
            with _StopRequest() as stop:
                while self.step < cfg.steps:
                    self._rng_at_step_start = rng_state()
                    metrics = self.train_step()
                    step = self.step
                    result.history.append(metrics)
                    if step % cfg.log_every == 0 or step == cfg.steps:
                        logger.log(step, "train", metrics)
                    bar.update(1)
                    bar.set_postfix(self._postfix(metrics), refresh=False)
                    if step % cfg.eval_every == 0 or step == cfg.steps:
                        if self._evaluate_and_keep_best(logger):
                            result.stopped_early = True
                    flag = all_reduce_sum([1.0 if stop.requested else 0.0], self.env)[0] > 0
                    if (
                        step % cfg.checkpoint_every == 0
                        or step == cfg.steps
                        or flag
                        or (result.stopped_early or step >= halt)
                    ):
                        self.save("last")
                    if flag or step >= halt:
                        result.interrupted = True
                        self.echo(
                            f"stopped at step {step} after {_minutes(t0)}; checkpoint saved, "
                            "continue with --resume"
                        )
                        break
                    if result.stopped_early:
                        self.echo(
                            f"early stop at step {step}: no improvement in "
                            f"{cfg.patience} evaluations"
                        )
                        break
        except KeyboardInterrupt:
            result.interrupted = True
            if not self._in_update and self._rng_at_step_start is not None:
                # the interrupted step is lost; the RNG goes back to where it began
                self.save("last", rng=self._rng_at_step_start)
                # one line, printed by whoever catches it (the command line does)
                raise KeyboardInterrupt(
                    f"interrupted at step {self.step} after {_minutes(t0)}; checkpoint saved, "
                    "continue with --resume"
                ) from None
            raise
        finally:
            bar.close()
            self._echo = echo_before
            result.step = self.step
            result.elapsed = time.perf_counter() - t0
            result.best_metric, result.best_step = self.best_metric, self.best_step
            logger.flush()
            if result.interrupted:
                logger.close()
        if not result.interrupted:
            result.finished = True
            result.test = self._final_test(logger)
        logger.close()
        return result

    def _postfix(self, metrics: dict[str, float]) -> dict[str, str]:
        post = {"loss": f"{metrics['loss']:.3f}"}
        for name in self.task.progress_metrics:
            if name in metrics:
                post[name] = self.task.format_metric(name, metrics[name])
        post["tok/s"] = f"{metrics['tokens_per_s']:.0f}"
        return post

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
            import json

            summary = {
                "step": self.step,
                "best_step": self.best_step,
                "best_valid": self.best_metric,
                "test": metrics,
                "chance": self.task.chance(),
                "metric": self.task.headline().name,
            }
            (self.out_dir / "results.json").write_text(json.dumps(summary, indent=1))
        return metrics


__all__ = [
    "DivergedError",
    "TrainResult",
    "Trainer",
    "build_optimizer",
    "lr_factor",
    "param_groups",
]
