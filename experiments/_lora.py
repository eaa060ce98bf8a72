"""Low-rank adapters on a frozen base, for the experiments in which the base learns beside the
continuous memory (LoRA, Hu et al. 2021, arXiv 2106.09685):

    h = W x + (α / r) B A x          A [r, in], B [out, r]; B = 0 at the start

so the base's outputs are its own until the adapters are trained. Trained with the memory, a
correction that lowers every book's loss (pg19's style, which the frozen base was not tuned on)
has a place of its own, and the memory is left to carry what the book said: the control is the
same trained weights with the memory empty (an empty memory reads exactly 0).

Each adapter is a forward hook on one of the base's linear layers, adding its term to the
layer's output: the base's modules and their state_dict stay as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

TARGETS = ("q_proj", "v_proj")  # the attention's query and value projections (LoRA's own)


@dataclass(frozen=True)
class LoRAConfig:
    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = TARGETS  # the last name of each linear layer adapted

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"rank must be an int ≥ 1, got {self.rank!r}")
        if not self.alpha > 0:
            raise ValueError(f"alpha must be > 0, got {self.alpha!r}")
        if not self.targets:
            raise ValueError("targets must name at least one linear layer")


class LoRA(nn.Module):
    """The adapters of `config.targets` in `base` (module doc): A and B per adapted layer, by
    the layer's path ("model.layers.0.self_attn.q_proj" → "model_layers_0_self_attn_q_proj")."""

    def __init__(self, base: nn.Module, config: LoRAConfig, seed: int = 0):
        super().__init__()
        self.config = config
        self.scale = config.alpha / config.rank
        layers = {
            name: m for name, m in base.named_modules()
            if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in config.targets
        }  # fmt: skip
        if not layers:
            raise ValueError(f"the base has no linear layer named {', '.join(config.targets)}")
        generator = torch.Generator().manual_seed(seed)
        self.a, self.b = nn.ParameterDict(), nn.ParameterDict()
        self._hooks = []
        for name, layer in layers.items():
            key = name.replace(".", "_")
            # A as nn.Linear's own start (Kaiming-uniform, a = √5), B zero: h = W x at the start
            bound = 1.0 / math.sqrt(layer.in_features)
            a = torch.empty(config.rank, layer.in_features)
            a.uniform_(-bound, bound, generator=generator)
            self.a[key] = nn.Parameter(a.to(layer.weight.dtype))
            self.b[key] = nn.Parameter(layer.weight.new_zeros(layer.out_features, config.rank))
            self._hooks.append(layer.register_forward_hook(self._hook(key)))

    def _hook(self, key: str):
        def add(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
            x = inputs[0]  # [..., in]
            return output + (x @ self.a[key].T) @ self.b[key].T * self.scale  # [..., out]

        return add

    def remove(self) -> None:
        """The hooks taken off: the base computes as it did before."""
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()


def lora_of(base: nn.Module, settings: dict, seed: int = 0) -> LoRA | None:
    """The adapters a training run's settings name (`lora_rank`, `lora_alpha`,
    `lora_targets`) hooked on `base`; None when they name none."""
    if not settings.get("lora_rank"):
        return None
    config = LoRAConfig(settings["lora_rank"], settings["lora_alpha"],
                        tuple(settings["lora_targets"]))  # fmt: skip
    return LoRA(base, config, seed)


__all__ = ["TARGETS", "LoRA", "LoRAConfig", "lora_of"]
