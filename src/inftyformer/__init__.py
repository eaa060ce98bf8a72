"""inftyformer: the ∞-former (Infinite Memory Transformer) and its baselines in PyTorch.

The public API, by layer (see README "Where each idea lives"):

- math: `GaussianBasis` ψ(t), `continuous_softmax` E_p[ψ], `variance_kl`
  (ridge regression: `inftyformer.core.ridge`);
- memories and their explicit states: `LongTermMemory`/`LongTermState` (the ∞-former),
  `ShortTermState` (Transformer-XL), `CompressiveState` (Compressive Transformer);
- layers: `LongTermAttention` (continuous attention);
- models: `ModelConfig`, `MemoryLM`, `MemoryState` (+ `save_state`/`load_state`), and the
  segment-by-segment wrappers `stream_loss` and `generate`.

Tasks, training and the command line live in `inftyformer.tasks`, `inftyformer.training` and
`inftyformer.cli`; pretrained Hugging Face models in `inftyformer.hf` (extra `[hf]`).
"""

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

# each public name -> the module that defines it; imported on first use (PEP 562), so that
# `import inftyformer` (and so the command line's `--help`) does not import torch
_EXPORTS = {
    "GaussianBasis": "core.basis",
    "CompressiveState": "native.compressive_memory",
    "MODEL_TYPES": "native.model_config",
    "ModelConfig": "native.model_config",
    "continuous_softmax": "core.continuous_softmax",
    "variance_kl": "core.continuous_softmax",
    "LongTermAttention": "core.attention",
    "LongTermAttentionOutput": "core.attention",
    "LongTermConfig": "core.config",
    "LongTermMemory": "core.memory",
    "LongTermState": "core.state",
    "IGNORE_INDEX": "native.model",
    "LMOutput": "native.model",
    "MemoryLM": "native.model",
    "ShortTermState": "native.short_term_memory",
    "LayerState": "native.state",
    "MemoryState": "native.state",
    "load_state": "native.state",
    "save_state": "native.state",
    "generate": "native.streaming",
    "stream_loss": "native.streaming",
}

if TYPE_CHECKING:  # what a type checker and an editor see
    from .core.attention import LongTermAttention, LongTermAttentionOutput
    from .core.basis import GaussianBasis
    from .core.config import LongTermConfig
    from .core.continuous_softmax import continuous_softmax, variance_kl
    from .core.memory import LongTermMemory
    from .core.state import LongTermState
    from .native.compressive_memory import CompressiveState
    from .native.model import IGNORE_INDEX, LMOutput, MemoryLM
    from .native.model_config import MODEL_TYPES, ModelConfig
    from .native.short_term_memory import ShortTermState
    from .native.state import LayerState, MemoryState, load_state, save_state
    from .native.streaming import generate, stream_loss

__version__ = "0.1.0"


class _Package(types.ModuleType):
    """The package's module: importing its submodule `continuous_softmax` would set the
    package's attribute of that name to the module; the function of that name stays the
    attribute, as the public API has it."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _EXPORTS.get(name) == name:
            value = getattr(value, name)  # the submodule is loaded whole by now
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'inftyformer' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__all__ = [
    "IGNORE_INDEX",
    "MODEL_TYPES",
    "CompressiveState",
    "GaussianBasis",
    "LMOutput",
    "LayerState",
    "LongTermAttention",
    "LongTermAttentionOutput",
    "LongTermConfig",
    "LongTermMemory",
    "LongTermState",
    "MemoryLM",
    "MemoryState",
    "ModelConfig",
    "ShortTermState",
    "continuous_softmax",
    "generate",
    "load_state",
    "save_state",
    "stream_loss",
    "variance_kl",
]
