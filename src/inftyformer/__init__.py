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

from .compressive_memory import CompressiveState
from .config import MODEL_TYPES, ModelConfig
from .core.attention import LongTermAttention, LongTermAttentionOutput
from .core.basis import GaussianBasis
from .core.continuous_softmax import continuous_softmax, variance_kl
from .core.memory import LongTermConfig, LongTermMemory, LongTermState
from .model import IGNORE_INDEX, LMOutput, MemoryLM
from .short_term_memory import ShortTermState
from .state import LayerState, MemoryState, load_state, save_state
from .streaming import generate, stream_loss

__version__ = "0.1.0"

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
