"""Initialisation by role, shared by the models: projections draw from N(0, std²) with zero
biases (GPT-2's scheme, std 0.02 for every model here)."""

from __future__ import annotations

from torch import nn


def init_projection(module: nn.Linear | nn.Embedding, std: float) -> None:
    """weight ~ N(0, std²), bias = 0."""
    nn.init.normal_(module.weight, std=std)
    bias = getattr(module, "bias", None)
    if bias is not None:
        nn.init.zeros_(bias)
