"""`ModelConfig`: one typed, validated configuration for the four models on one backbone.

    model_type      what the memory is (README, "Use it from Python")
    "transformer"   vanilla: attention inside the current block only (mem_len must be 0)
    "xl"            Transformer-XL: + short-term memory of the m recent layer inputs
    "compressive"   Compressive Transformer: + n_cm slots of c:1 compressed older states
    "infty"         ∞-former: + continuous long-term memory (N basis functions) per layer

All four share the backbone (pre-LayerNorm blocks, relative positional attention, GELU FFN) and
the block semantics described in `block.py`: `segment_len` (C) is both the largest number of
tokens one call may hold and the unit in which states leave the short-term memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._checks import check_positive_int, check_range, check_segment_len
from ..core.config import DERIVED_SETTINGS, LongTermConfig
from ..core.config import changeable_settings as long_term_changeable
from ..core.squeeze import FixedSqueeze
from ..extensions.densities import NormalizedDensity
from ..presets import preset_settings
from .memory_settings import WithLongTerm, takes_long_term_settings

MODEL_TYPES = ("transformer", "xl", "compressive", "infty")

# Fields a trained model may change without touching its weights' shapes: how much memory is kept
# and how it is updated (and dropout), beside the long-term memory's (`changeable_settings`).
# Everything else (sizes, vocabulary, N, widths, the model type) is fixed by the weights.
# `segment_len` only bounds the tokens per call.
MEMORY_SETTINGS = ("segment_len", "mem_len", "compressed_len", "dropout", "attention_dropout")


def changeable_settings() -> tuple[str, ...]:
    """Every setting a trained native model may change: `MEMORY_SETTINGS` and the long-term
    memory's (`core.config.changeable_settings`: the paper's and its strategies')."""
    return (*MEMORY_SETTINGS[:3], *long_term_changeable(), *MEMORY_SETTINGS[3:])


# the native model's long-term memory by default: cpu-small's N = M = 128, standardised scores
NATIVE_LONG_TERM = LongTermConfig(
    num_basis=128, density=NormalizedDensity(), squeeze=FixedSqueeze(num_samples=128)
)


@takes_long_term_settings
@dataclass(frozen=True)
class ModelConfig(WithLongTerm):
    """Typed settings of a native model. The long-term memory's are nested (`long_term`) and
    also go by their own names (`WithLongTerm`): ``ModelConfig(vocab_size=256, num_basis=256)``,
    ``config.replace(tau=0.5)``, ``config.num_basis``."""

    vocab_size: int  # tokens the model reads and predicts (the task's or tokenizer's)
    model_type: str = "infty"  # transformer, xl, compressive or infty (the ∞-former)
    # ---- backbone
    d_model: int = 128  # width of the residual stream
    n_layers: int = 3  # transformer blocks
    n_heads: int = 4  # attention heads (also the memory's H)
    d_ff: int = 512  # width of the feed-forward layer
    dropout: float = 0.1  # on residual branches and embeddings
    attention_dropout: float = 0.0  # on attention probabilities
    layer_norm_eps: float = 1e-5  # ε of every LayerNorm
    tie_embeddings: bool = True  # the output projection shares the token embedding
    # ---- segments and short-term (XL) memory
    segment_len: int = 128  # C: the most tokens per call, and the unit in which states leave
    mem_len: int = 128  # m: short-term memory of recent layer inputs (0 for "transformer")
    # ---- compressive memory (Rae et al. 2020)
    compression_rate: int = 4  # c: states per compressed slot (Conv1d kernel = stride = c)
    compressed_len: int = 128  # n_cm: compressed slots kept per layer (oldest dropped)
    reconstruction_weight: float = 1.0  # weight of the compressive attention-reconstruction loss
    # ---- ∞-former long-term memory (paper §3): N, widths, λ, τ, M, … (`LongTermConfig`; its
    # dim e and heads H are the model's d_model and n_heads, `long_term_config()`)
    use_long_term: bool = True  # False: an "infty" model without long-term memory (= "xl")
    long_term: LongTermConfig = NATIVE_LONG_TERM

    # the memory's size and heads are the model's
    MODEL_DECIDES = (*DERIVED_SETTINGS, "num_heads")

    def __post_init__(self) -> None:
        self._check_long_term()
        if self.long_term.squeeze.wants_salience:
            raise ValueError(
                "long_term.keep_salient chooses places by the surprisal of a pretrained model's "
                "logits (inftyformer.hf); a native model does not compute it: leave it 0"
            )
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {self.model_type!r}")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff"):
            check_positive_int(name, getattr(self, name))
        check_segment_len(self.segment_len)
        for name in ("mem_len", "compressed_len"):
            check_positive_int(name, getattr(self, name), minimum=0)
        check_positive_int("compression_rate", self.compression_rate)
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if self.d_model % 2:
            raise ValueError(
                f"d_model must be even (sinusoidal relative encodings), got {self.d_model}"
            )
        check_range("dropout", self.dropout, 0.0, 1.0, high_open=True)
        check_range("attention_dropout", self.attention_dropout, 0.0, 1.0, high_open=True)
        check_range("layer_norm_eps", self.layer_norm_eps, 0.0, low_open=True)
        check_range("reconstruction_weight", self.reconstruction_weight, 0.0)
        for name in ("tie_embeddings", "use_long_term"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
        if self.model_type == "transformer" and self.mem_len != 0:
            raise ValueError(
                f"mem_len must be 0 for model_type 'transformer' (got {self.mem_len}); "
                "use model_type 'xl' for a short-term memory"
            )
        if self.model_type == "infty":
            self.long_term_config()  # the update's gain for this L, with named errors

    # ------------------------------------------------------------------ derived
    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def has_compressive(self) -> bool:
        return self.model_type == "compressive" and self.compressed_len > 0

    @property
    def has_long_term(self) -> bool:
        return self.model_type == "infty" and self.use_long_term

    @property
    def max_short_term_len(self) -> int:
        """The most states a short-term memory made by this model holds between calls (block
        semantics, `short_term_memory.py`): the m kept states plus the unfinished block (< C).
        The ∞-former moves whole blocks out only at the start of the next call, so it may hold
        one more call (≤ C); the compressive model keeps a leftover (< c) until a whole chunk of
        c can leave. A state beyond this bound was made by another model (e.g. an XL state given
        to a transformer without memory) and is refused."""
        m, C = self.mem_len, self.segment_len
        if self.has_long_term:
            return m + 2 * C - 1
        if self.has_compressive:
            return m + C - 1 + self.compression_rate - 1
        return m + C - 1

    def long_term_config(self) -> LongTermConfig:
        """Each layer's memory: e = d_model, H = n_heads, queries from the layer's own W_q, its
        update's gain checked for segments of L = segment_len."""
        return self.long_term.sized(
            dim=self.d_model,
            num_heads=self.n_heads,
            out_dim=self.d_model,
            query_projection=False,
            segment_len=self.segment_len,
        )

    # ------------------------------------------------------------------ (de)serialisation
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """A saved config (`to_dict`, flat; the memory's settings may be nested)."""
        return cls._from_saved(data, {})

    def describe(self) -> str:
        """A name for the start line: the model type."""
        return self.model_type

    def with_memory_settings(self, overrides: dict[str, Any] | None = None) -> ModelConfig:
        """This config with other memory settings for evaluation (e.g. ``mem_len=512``): only
        the fields in `changeable_settings()` may change, since they leave every weight's shape
        alone; anything else raises ValueError naming it. A "transformer" keeps mem_len = 0."""
        if not overrides:
            return self
        allowed = changeable_settings()
        bad = sorted(set(overrides) - set(allowed))
        if bad:
            raise ValueError(
                f"cannot change {', '.join(bad)} of a trained model (it changes the weights or "
                f"the model); allowed: {', '.join(allowed)}"
            )
        if self.model_type == "transformer" and overrides.get("mem_len", 0) != 0:
            raise ValueError("a 'transformer' model has no short-term memory: mem_len must stay 0")
        return self.replace(**overrides)

    # ------------------------------------------------------------------ presets
    @classmethod
    def preset(cls, name: str, model_type: str = "infty", **overrides: Any) -> ModelConfig:
        """A native preset (`inftyformer.presets`: cpu-small, paper-sorting, paper). The
        vocabulary defaults to the sorting task's 22 symbols (0–19, separator 20, pad 21); pass
        `vocab_size=` for anything else. A "transformer" gets mem_len 0 unless overridden."""
        values: dict[str, Any] = preset_settings(name, "native")
        values["model_type"] = model_type
        if model_type == "transformer":
            values["mem_len"] = 0
        values.update(overrides)
        return cls(**values)


__all__ = [
    "MEMORY_SETTINGS",
    "MODEL_TYPES",
    "NATIVE_LONG_TERM",
    "ModelConfig",
    "changeable_settings",
]
