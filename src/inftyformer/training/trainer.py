"""The training loop: AdamW, linear warm-up + cosine schedule, gradient accumulation and clipping,
periodic evaluation with a best checkpoint, early stopping, exact resumption, DDP.

One step = one optimiser update on the global batch `batch_size`, cut into `grad_accum`
micro-batches per rank. Everything the continuation depends on — weights, optimiser moments, step,
RNG states of every rank, the task's data position and carried memory, early-stopping counters —
goes into the `last` checkpoint, so a run stopped at any point (Ctrl-C, SIGTERM, kill -9) and
resumed with ``resume=True`` logs exactly the losses an uninterrupted run would have logged.

This module holds the loop; its parts live beside it: the optimiser and schedule (`optim`), one
update (`step`), evaluation with the best checkpoint (`evaluation`), opening or resuming a run's
directory (`resume`) and the trainer's state in a checkpoint (`run_state`).
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from .._progress import progress
from ..model_kinds import build_model
from ..tasks import RunContext, Task, TaskConfig, get_task
from .checkpoint import CheckpointError, rng_state
from .checkpoint_weights import base_config, base_reference
from .config import TrainConfig
from .density import DensityMonitor
from .distributed import DistEnv, all_reduce_sum, resolve_device, wrap_model
from .estimate import RunEstimate, valid_evaluations
from .evaluation import Evaluation
from .logger import MetricsLogger
from .optim import build_optimizer, lr_factor, param_groups, rank_seed, seed_everything
from .resume import RunDirectory
from .run_state import RunState
from .step import DivergedError, TrainStep


# --------------------------------------------------------------------------- pieces
def _minutes(since: float) -> str:
    return f"{(time.perf_counter() - since) / 60:.1f} min"


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
    """First SIGINT/SIGTERM asks for a clean stop at the next step boundary (then a checkpoint),
    and `acknowledge` says so at once; a second one interrupts at once."""

    def __init__(self, acknowledge: Callable[[], None] = lambda: None) -> None:
        self.requested = False
        self.acknowledge = acknowledge
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.acknowledge()

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
class Trainer(RunDirectory, RunState, TrainStep, Evaluation):
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

        self._lock = None
        try:
            self._start(resume, overwrite, allow_changes)
        except BaseException:
            self._release_run_dir(started=False)
            raise

    def _start(self, resume: bool, overwrite: bool, allow_changes: bool) -> None:
        """The rest of `__init__`, once the run directory is locked by `_open_run_dir`."""
        train_cfg, task_cfg, model_cfg = self.cfg, self.task_cfg, self.model_cfg
        task_cls = get_task(train_cfg.task)
        checkpoint = self._open_run_dir(resume, overwrite, allow_changes)
        # with a frozen base, checkpoints hold what trains and refer to the base
        # (checkpoint_weights.py)
        self.base_reference = base_reference(model_cfg)
        self.base_config = base_config(model_cfg)  # what the base's config.json computes

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

    # ------------------------------------------------------------------ the loop
    def fit(self) -> TrainResult:
        """Train to `steps` (or an early stop, Ctrl-C, SIGTERM, `halt_after`); then the run
        directory is free for another run (`--resume`)."""
        try:
            return self._fit()
        finally:
            self._release_run_dir()

    def close(self) -> None:
        """Free the run directory without training (`fit` frees it when it ends): while a
        Trainer holds it, another Trainer on the same `out_dir` is refused."""
        self._release_run_dir()

    def _fit(self) -> TrainResult:
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
        estimate: RunEstimate | None = None
        timed = 0  # steps of this session

        def acknowledge() -> None:  # said at once, from the signal handler
            self.echo(
                "stopping: will stop after the current step and save a checkpoint (press Ctrl-C "
                "again to stop at once)"
            )

        try:
            with _StopRequest(acknowledge) as stop:
                while self.step < cfg.steps:
                    self._rng_at_step_start = rng_state()
                    started = time.perf_counter()
                    metrics = self.train_step()
                    step = self.step
                    timed += 1
                    # the second step of a session is timed: the first runs without the memory
                    # and window a stream carries (half the work on a pretrained model)
                    if estimate is None and (timed == 2 or step == cfg.steps):
                        estimate = self._estimate(time.perf_counter() - started)
                        for line in estimate.start_lines():
                            self.echo(line)
                    result.history.append(metrics)
                    if step % cfg.log_every == 0 or step == cfg.steps:
                        logger.log(step, "train", metrics)
                    bar.update(1)
                    bar.set_postfix(self._postfix(metrics), refresh=False)
                    if step % cfg.eval_every == 0 or step == cfg.steps:
                        started = time.perf_counter()
                        if self._evaluate_and_keep_best(logger):
                            result.stopped_early = True
                        if (
                            estimate is not None
                            and estimate.call_seconds is None
                            and step < cfg.steps
                        ):
                            seconds = time.perf_counter() - started
                            estimate = replace(estimate, call_seconds=seconds)
                            line = estimate.measured_line(estimate.valid_calls or 0, seconds)
                            if line is not None:
                                self.echo(line)
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

    def _estimate(self, step_seconds: float) -> RunEstimate:
        """The run's time estimate from its step just timed (`estimate.py`)."""
        cfg = self.cfg
        return RunEstimate(
            step=self.step,
            steps=cfg.steps,
            step_seconds=step_seconds,
            valid_evals=valid_evaluations(self.step - 1, cfg.steps, cfg.eval_every),
            valid_calls=self.task.eval_calls("valid", cfg.eval_batches),
            test_calls=self.task.eval_calls("test", cfg.test_batches) if cfg.test_batches else 0,
        )

    def _postfix(self, metrics: dict[str, float]) -> dict[str, str]:
        post = {"loss": f"{metrics['loss']:.3f}"}
        for name in self.task.progress_metrics:
            if name in metrics:
                post[name] = self.task.format_metric(name, metrics[name])
        post["tok/s"] = f"{metrics['tokens_per_s']:.0f}"
        return post


__all__ = [
    "DivergedError",
    "TrainResult",
    "Trainer",
    "build_optimizer",
    "lr_factor",
    "param_groups",
]
