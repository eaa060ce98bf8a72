"""`inftyformer train`: build the run's settings from the options, train (under torchrun: one
process per rank) and report the result."""

from __future__ import annotations

import time
from typing import Any

import typer

from ..configure import build_configs
from ..errors import EXIT_INTERRUPTED


def run_train(
    task: str,
    *,
    model: str | None,
    preset: str | None,
    settings: list[str],
    options: dict[str, Any],
    task_options: dict[str, Any],
    resume: bool,
    overwrite: bool,
    allow_changes: bool,
    base_model: str | None,
    freeze_base: bool,
) -> None:
    """Train `task` with the command line's settings (`options`: the train settings given as
    options, None where not given; `task_options` likewise); see `inftyformer train --help`."""
    from ..training import Trainer, init_distributed, shutdown_distributed

    if allow_changes and not resume:
        raise ValueError("--allow-changes only applies with --resume")
    train_cfg, task_cfg, model_cfg = build_configs(
        task,
        model=model,
        preset=preset,
        settings=settings,
        options=options,
        task_options=task_options,
        resume=resume,
        base_model=base_model,
        freeze_base=freeze_base,
    )
    env = init_distributed(train_cfg.device)
    if env.is_main:
        from ..tasks import get_task

        for line in get_task(task).notes(task_cfg):
            typer.echo(line)
    try:
        trainer = Trainer(
            train_cfg,
            task_cfg,
            model_cfg,
            resume=resume,
            overwrite=overwrite,
            allow_changes=allow_changes,
            env=env,
        )
        if env.is_main:
            params = list(trainer.model.parameters())
            n_params = sum(p.numel() for p in params)
            n_trained = sum(p.numel() for p in params if p.requires_grad)
            size = f"{n_params / 1e6:.2f}M parameters"
            if n_trained != n_params:
                size += f", {n_trained / 1e6:.2f}M trained"
            what = model_cfg.describe()
            shown = ", ".join(f"{k}={v}" for k, v in task_cfg.to_dict().items() if v is not None)
            typer.echo(
                f"training {what} ({size}) on "
                f"{train_cfg.task} ({shown}): segment {model_cfg.segment_len}, "
                f"batch {train_cfg.batch_size}, {train_cfg.steps} steps, "
                f"{env.world_size} process(es) -> {train_cfg.out_dir}"
            )
        start = time.perf_counter()
        result = trainer.fit()
    finally:
        shutdown_distributed()
    if not env.is_main:
        return
    minutes = (time.perf_counter() - start) / 60
    if result.interrupted:  # the trainer said where it stopped and how to continue
        if result.step < train_cfg.steps and train_cfg.halt_after == 0:
            raise typer.Exit(EXIT_INTERRUPTED)
        return
    typer.echo(
        f"done: {result.step} steps in {minutes:.1f} min (best valid at step {result.best_step})"
    )
    if result.test is not None:
        typer.echo(f"test {trainer.task.describe(result.test)}")
