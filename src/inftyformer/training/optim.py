"""The optimiser set-up of a run: AdamW over the model's own parameter groups, the linear
warm-up + cosine learning-rate schedule, and the seeds of every process's randomness."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import torch
from torch import nn

from .config import TrainConfig

SCHEDULE_KIND = "linear-warmup-cosine"


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of the base learning rate for update number `step` (0-based)."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, step: int, cfg: TrainConfig) -> float:
    """Set every group's rate for update `step` (its peak `base_lr` × the schedule); returns the
    scheduled rate of the base learning rate."""
    factor = lr_factor(step, cfg)
    for g in optimizer.param_groups:
        g["lr"] = g["base_lr"] * factor
    return cfg.lr * factor


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


__all__ = [
    "SCHEDULE_KIND",
    "build_optimizer",
    "lr_factor",
    "param_groups",
    "rank_seed",
    "seed_everything",
    "set_lr",
]
