"""The memory's weights in an `InftyformerForCausalLM` (`model.py`): how they start (by role,
`init_weights`, what HF's `_init_weights` calls for the modules whose weights were not loaded)
and whether the weights loaded from a folder fit the model its config describes
(`check_loaded`). The base keeps its own (pretrained) weights.

At initialisation the read's output projection is zero (weight and bias), so the logits equal
the base model's exactly (`tests/hf`); W^Q, W^K, W^V ~ N(0, initializer_range²)
(memory_read="heads": taken from the base's heads, `head_read.init_from_heads`).

This module does not import `model.py` (the model imports it): the model is passed in.
"""

from __future__ import annotations

import math

from torch import nn

from .._init import init_projection
from ..core.basis import GaussianBasis
from .head_read import init_from_heads

# the heads read's CNN gate at initialisation: sigmoid(b) = 0.99, nearly the identity
OPEN_GATE_BIAS = math.log(99.0)


def init_std(config) -> float:
    return float(getattr(config.text_config, "initializer_range", None) or 0.02)


def memory_roles(model: nn.Module) -> dict[int, str]:
    """id(module) → its role among the memory's modules: "projection" (W^Q, W^K, W^V), "zero"
    (the read's output projection), "density" (w_μ, w_σ), "default" (the CNN gate), "basis"."""
    roles: dict[int, str] = {}
    for layer in getattr(model, "long_term", ()):
        attention, memory = layer.attention, layer.memory
        for projection in (attention.query, attention.key, attention.value):
            roles[id(projection)] = "projection"
        roles[id(attention.out)] = "zero"
        roles[id(attention.mu_head)] = roles[id(attention.sigma_head)] = "density"
        if memory.gate is not None:
            roles[id(memory.gate)] = "default"
        roles[id(memory.basis)] = "basis"
    return roles


def init_weights(model: nn.Module, module: nn.Module) -> None:
    """Only the memory's modules (by role, see `LayerMemory.reset_parameters`): the base
    keeps its own (pretrained) weights. HF calls this per leaf module, for the modules whose
    weights were not loaded; the basis buffers are constants recomputed from the config."""
    config = model.config
    role = memory_roles(model).get(id(module))
    if role == "projection" and config.adapter.heads_read:
        # rotary bases: W^Q turned Δ = W back (every place just beyond the window), or not at
        # all when each place is read at its own position (head_read.py)
        adapter = config.adapter
        delta = 0 if adapter.positions != "window" else adapter.window or adapter.segment_len
        for i, layer in enumerate(model.long_term):  # W^Q, W^K, W^V from the base's head
            if module is layer.attention.query:
                init_from_heads(
                    layer,
                    model._blocks(model.adapter.attentions)[i],
                    config.adapter.long_term.num_heads,
                    model.adapter.rotary_embedding(model.base),
                    delta,
                )
    elif role == "projection":
        init_projection(module, init_std(config))
    elif role == "zero":
        nn.init.zeros_(module.weight)
        nn.init.zeros_(module.bias)
    elif role == "default":
        module.reset_parameters()
        if config.adapter.heads_read:  # the CNN gate starts open: X ⊙ sigmoid(b) with
            nn.init.zeros_(module.weight)  # sigmoid(b) = 0.99 stores the states the heads
            nn.init.constant_(module.bias, OPEN_GATE_BIAS)  # read, not randomly scaled ones
    elif role == "density":  # w_μ, w_σ: PyTorch's default, then σ where the config puts it
        module.reset_parameters()
        if config.adapter.heads_read:  # a head reads where its content matches:
            nn.init.zeros_(module.weight)  # no prior over places, no extra variance
        for layer in model.long_term:
            if module is layer.attention.sigma_head:
                layer.attention.init_sigma_bias()
    elif role == "basis":
        fresh = GaussianBasis(module.num_basis, module.width_values)
        for name, buffer in fresh.named_buffers():
            getattr(module, name).copy_(buffer)


def check_loaded(where: object, model: nn.Module, info: dict) -> None:
    """Refuse weights that do not fit the config: a tensor missing from the files (e.g. the
    memory's, or a layer after the layer count in config.json was raised) would otherwise be
    initialised at random without a word, and an unexpected one (the layer count lowered)
    dropped. `info`: HF's loading info."""
    tied = set(getattr(model, "all_tied_weights_keys", None) or ())
    missing = sorted(k for k in info.get("missing_keys", ()) if k not in tied)
    unexpected = sorted(info.get("unexpected_keys", ()))
    mismatched = sorted(str(k) for k in info.get("mismatched_keys", ()))
    problems = [
        f"{len(found)} {what} (e.g. {', '.join(found[:3])})"
        for what, found in (
            ("missing (they would be initialised at random)", missing),
            ("unexpected", unexpected),
            ("of another shape", mismatched),
        )
        if found
    ]
    if problems:
        raise ValueError(
            f"{where}: the weights do not fit the model its config.json describes: "
            + "; ".join(problems)
        )


__all__ = ["check_loaded", "init_std", "init_weights", "memory_roles"]
