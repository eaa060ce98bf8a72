"""A quick training-speed benchmark: seconds per sorting step and tokens/s for each model type."""

from __future__ import annotations

import time
from typing import Any

import torch

from ..config import ModelConfig
from ..model import MemoryLM
from ..tasks import RunContext, SortingConfig, SortingTask
from .config import TrainConfig
from .trainer import build_optimizer, seed_everything


def quick_benchmark(
    models: list[str],
    *,
    preset: str = "cpu-small",
    seq_len: int = 1024,
    batch_size: int = 8,
    steps: int = 3,
    seed: int = 0,
    threads: int = 0,
) -> list[dict[str, Any]]:
    """Time `steps` training steps (after one untimed warm-up step) per model type."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if threads < 0:
        raise ValueError(f"threads must be >= 0, got {threads}")
    if threads:
        torch.set_num_threads(threads)
    rows = []
    task_cfg = SortingConfig(seq_len=seq_len)
    train_cfg = TrainConfig(batch_size=batch_size, seed=seed, out_dir="-")
    for name in models:
        model_cfg = ModelConfig.preset(
            preset, model_type=name, **SortingTask.model_overrides(task_cfg)
        )
        seed_everything(seed)
        model = MemoryLM(model_cfg)
        model.train()
        optimizer = build_optimizer(model, train_cfg)
        task = SortingTask(task_cfg, model_cfg, RunContext(batch_size=batch_size, seed=seed))
        elapsed = 0.0
        tokens = 0.0
        for step in range(steps + 1):
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            out = task.loss(model, task.batch(step), slice(None), 0)
            out.loss.backward()
            optimizer.step()
            if step:  # the first step pays one-off costs (caches, allocator)
                elapsed += time.perf_counter() - start
                tokens += out.sums["tokens"]
        rows.append(
            {
                "model": name,
                "params": sum(p.numel() for p in model.parameters()),
                "seconds_per_step": elapsed / steps,
                "tokens_per_s": tokens / max(elapsed, 1e-9),
                "threads": torch.get_num_threads(),
            }
        )
    return rows


__all__ = ["quick_benchmark"]
