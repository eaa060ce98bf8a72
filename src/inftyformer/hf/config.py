"""`InftyformerConfig`: a pretrained causal LM's own config plus the long-term memory's settings.

    text_config     the base model's config (GPT2Config, LlamaConfig, ...), saved nested in
                    config.json, so `from_pretrained` rebuilds the base with `AutoModelForCausalLM`
    num_heads ...   the `LongTermConfig` fields (paper §3), flat as Hugging Face saves them
                    (`long_term` is them as one LongTermConfig); `dim` and `out_dim` are the
                    base's hidden size, and the memory has its own query projection W^Q
                    (`model.py`); kl_weight weights the variance-KL term in the loss
    segment_len     L: tokens per call when a long document is streamed (`streaming.py`)
    window          W: how many of the stream's previous tokens each call recomputes as context
                    before its own (the short-term window, `model.py`); the long-term memory
                    holds what left it. None: one segment (W = L), as far as the base's positions
                    allow (W + L ≤ max_position_embeddings); 0: each call attends within itself
    memory_read     how a block uses its read: "added" (the paper's: its own projections, the
                    read added to the attention output, zero at initialisation) or "heads"
                    (ours: the base's own heads read the memory and merge it by attention mass,
                    `head_read.py`; needs density="content" and the base's number of heads)
    memory_positions where a heads read puts the memory's places (rotary bases): "window" (every
                    place at one distance, just beyond the window), "places" (each place at
                    its own stream position, squeeze="fill"; `head_read.py`) or "ranks" (each
                    place at its rank: the places as the last tokens before the window)
    memory_layers   the blocks (0-based) that get a long-term memory; None: every block. A few
                    late blocks train far fewer parameters, and the backward pass stops at the
                    first of them when the base is frozen (`docs/hf.md`)

Defaults are the paper's GPT-2 settings (§4.2, `docs/hf.md`; `GPT2_LONG_TERM`, also the defaults
of the training command's `PretrainedMemoryConfig`): N = 512, widths {0.005, 0.01}, λ = 0.5,
τ = 0.5, M = 512, KL weight 1e-6.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from transformers import AutoConfig, PretrainedConfig
from transformers.configuration_utils import SubConfigSpec

from .._checks import check_memory_layers, check_positive_int
from ..core.basis import check_widths
from ..core.config import (
    DERIVED_SETTINGS,
    GPT2_LONG_TERM,
    LongTermConfig,
    check_memory_positions,
    check_memory_read,
)
from .adapters import adapter_for

# the LongTermConfig fields a user may set; dim, out_dim and query_projection follow from the base
MEMORY_FIELDS = tuple(f.name for f in fields(LongTermConfig) if f.name not in DERIVED_SETTINGS)
MODEL_FIELDS = ("segment_len", "window", "memory_layers", "memory_read", "memory_positions")
_LT = GPT2_LONG_TERM


class InftyformerConfig(PretrainedConfig):
    model_type = "inftyformer"
    sub_configs_defaults = {
        "text_config": SubConfigSpec(config_class=AutoConfig, model_type="gpt2")
    }

    text_config: dict | PretrainedConfig | None = None
    # the memory's settings (`LongTermConfig`), the paper's GPT-2 values by default
    num_heads: int | None = _LT.num_heads  # None: the base's number of attention heads
    num_basis: int = _LT.num_basis
    widths: tuple[float, ...] | list[float] = _LT.widths
    ridge_lambda: float = _LT.ridge_lambda
    tau: float = _LT.tau
    squeeze: str = _LT.squeeze  # "fixed" (paper), "by_length" or "fill" (SQUEEZES)
    num_samples: int = _LT.num_samples
    edge_padding: bool = _LT.edge_padding
    conv_gate: bool = _LT.conv_gate
    sticky: bool = _LT.sticky
    sticky_bins: int = _LT.sticky_bins
    sigma_0: float = _LT.sigma_0
    kl_weight: float = _LT.kl_weight
    min_sigma_sq: float = _LT.min_sigma_sq
    density: str = _LT.density  # "paper", "normalized" or "content" (core/attention.py)
    sharpness: float = _LT.sharpness  # "content": β of the discrete attention over the centres
    sink_edge: float = _LT.sink_edge  # "content": centres before it are not read
    token_mass: bool = _LT.token_mass  # heads read: the memory's mass counts its tokens
    keep_first: int = _LT.keep_first  # "fill": the first tokens never merged (attention sink)
    keep_last: int = _LT.keep_last  # "fill": the most recent tokens never merged
    keep_salient: int = _LT.keep_salient  # "fill": places for the most surprising tokens
    salient_before: int = _LT.salient_before  # keep_salient: tokens before a burst salient too
    sigma_init: float | None = _LT.sigma_init  # σ at initialisation; None: the paper's (≈ 0.83)
    # the model's
    memory_read: str = "added"  # "added" (paper) or "heads" (head_read.py)
    memory_positions: str = "window"  # heads read: "window", "places" or "ranks" (MEMORY_POSITIONS)
    segment_len: int = 512
    window: int | None = None  # None: one segment, within the base's positions; 0: none
    memory_layers: list[int] | None = None  # None: every block

    def __post_init__(self, **kwargs: Any) -> None:
        super().__post_init__(**kwargs)
        self.widths = check_widths(self.widths)
        text = self.text_config
        architecture = self.base_architecture
        adapter_for(architecture)  # a clear error for an unsupported base
        if self.num_heads is None:
            self.num_heads = int(text.num_attention_heads)
        # the same checks as the native ModelConfig (types, finiteness, ranges)
        check_positive_int("segment_len", self.segment_len)
        limit = getattr(text, "max_position_embeddings", None)
        if self.segment_len < 1 or (limit is not None and self.segment_len > limit):
            raise ValueError(
                f"segment_len must be in [1, {limit}] (the base's max_position_embeddings), "
                f"got {self.segment_len}"
            )
        if self.window is None:  # one segment, never positions past the base's
            room = self.segment_len if limit is None else int(limit) - self.segment_len
            self.window = min(self.segment_len, room)
        check_positive_int("window", self.window, minimum=0)
        if limit is not None and self.window + self.segment_len > limit:
            raise ValueError(
                f"window + segment_len must be at most {limit} (the base's "
                f"max_position_embeddings), got {self.window} + {self.segment_len}"
            )
        self.memory_layers = check_memory_layers(
            self.memory_layers, getattr(text, "num_hidden_layers", None)
        )
        self.long_term_config()  # the memory's settings and its update's gain, named errors
        check_memory_read(self.memory_read, self.density)
        if self.memory_read == "heads":
            if self.num_heads != int(text.num_attention_heads):
                raise ValueError(
                    f"memory_read='heads' reads with the base's {text.num_attention_heads} "
                    f"heads, got num_heads={self.num_heads}"
                )
        self._check_memory_positions(architecture)
        if self.salient_before > self.window:  # a token's salience is final when it leaves
            raise ValueError(
                f"salient_before ({self.salient_before}) must be at most the window "
                f"({self.window}): a token's salience looks that far ahead, at tokens that "
                "come after it while it is still in the window"
            )

    def _check_memory_positions(self, architecture: str) -> None:
        check_memory_positions(self.memory_positions, self.memory_read, self.squeeze)
        if self.memory_positions != "window" and not adapter_for(architecture).rotary:
            raise ValueError(
                f"memory_positions={self.memory_positions!r} turns the read by rotary "
                f"positions; {architecture} "
                "has absolute ones (use memory_positions='window')"
            )

    @property
    def memory_blocks(self) -> list[int]:
        """The blocks with a long-term memory, in order."""
        if self.memory_layers is not None:
            return list(self.memory_layers)
        return list(range(int(self.text_config.num_hidden_layers)))

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> InftyformerConfig:
        # a config.json saved before the density setting existed reads the scores as the paper,
        # one saved before the window existed attends within each segment
        return super().from_dict({"density": "paper", "window": 0, **config_dict}, **kwargs)

    @property
    def base_architecture(self) -> str:
        """The *ForCausalLM class the base is built with (e.g. "GPT2LMHeadModel")."""
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        model_type = self.text_config.model_type
        name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
        if name is None:
            adapter_for(f"<no causal LM for model_type {model_type!r}>")
        return name

    @property
    def hidden_size(self) -> int:
        return int(self.text_config.hidden_size)

    @property
    def long_term(self) -> LongTermConfig:
        """The memory's settings as one LongTermConfig (what the model decides left unset)."""
        return LongTermConfig(**{name: getattr(self, name) for name in MEMORY_FIELDS})

    def long_term_config(self) -> LongTermConfig:
        """Each block's memory: e = the base's hidden size, own W^Q, output of size e, its
        update's gain checked for segments of L = segment_len."""
        e = self.hidden_size
        return self.long_term.sized(
            dim=e, out_dim=e, query_projection=True, segment_len=self.segment_len
        )


__all__ = ["MEMORY_FIELDS", "MODEL_FIELDS", "InftyformerConfig"]
