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
