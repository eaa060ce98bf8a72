"""inftyformer: the ∞-former (Infinite Memory Transformer) and its baselines in PyTorch."""

from .basis import GaussianBasis
from .continuous_softmax import continuous_softmax, variance_kl
from .long_term_attention import LongTermAttention, LongTermAttentionOutput
from .long_term_memory import LongTermConfig, LongTermMemory, LongTermState
from .ridge import RidgeRegression, evaluate_signal, fit_coefficients, ridge_design_matrix

__version__ = "0.1.0"

__all__ = [
    "GaussianBasis",
    "LongTermAttention",
    "LongTermAttentionOutput",
    "LongTermConfig",
    "LongTermMemory",
    "LongTermState",
    "RidgeRegression",
    "continuous_softmax",
    "evaluate_signal",
    "fit_coefficients",
    "ridge_design_matrix",
    "variance_kl",
]

# models on one backbone (config, memories, MemoryLM, explicit state)
from .config import ModelConfig  # noqa: E402
from .model import LMOutput, MemoryLM  # noqa: E402
from .state import LayerState, MemoryState, load_state, save_state  # noqa: E402

__all__ += ["LMOutput", "LayerState", "MemoryLM", "MemoryState", "ModelConfig"]
__all__ += ["load_state", "save_state"]
from .streaming import generate, stream_loss  # noqa: E402

__all__ += ["generate", "stream_loss"]
