"""`LayerMemory`: one block's long-term memory and the continuous attention that reads it, the
module `InftyformerForCausalLM` adds per memory block (`model.long_term[i]`). Its own module so
that the model, its weights' start (`init_weights.py`) and its checks name one class: the
memory (`core.memory.LongTermMemory`) and its read (`core.attention.LongTermAttention`, with its
own W^Q) share one basis ψ."""

from __future__ import annotations

from torch import nn

from ..core.attention import LongTermAttention
from ..core.config import LongTermConfig
from ..core.memory import LongTermMemory


class LayerMemory(nn.Module):
    """One block's long-term memory and its continuous attention (one basis ψ for both)."""

    def __init__(self, config: LongTermConfig, designs: dict | None = None) -> None:
        super().__init__()
        self.memory = LongTermMemory(config, designs)
        self.attention = LongTermAttention(config, self.memory.basis)

    def reset_parameters(self, std: float) -> None:
        """W^Q, W^K, W^V ~ N(0, std²); the read's output projection zero (weight and bias), so
        the block's output is the base's at initialisation; w_μ, w_σ and the CNN gate keep
        PyTorch's default initialisation, as in the native model."""
        self.attention.reset_projections(std)
        nn.init.zeros_(self.attention.out.weight)
        nn.init.zeros_(self.attention.out.bias)
        self.attention.reset_density()
        if self.memory.gate is not None:
            self.memory.gate.reset_parameters()


__all__ = ["LayerMemory"]
