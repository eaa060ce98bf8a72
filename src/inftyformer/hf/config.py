"""`InftyformerConfig`: a pretrained causal LM's own config plus how the long-term memory is added
to it, both nested as transformers nests sub-configs:

    text_config     the base model's config (GPT2Config, LlamaConfig, ...), so `from_pretrained`
                    rebuilds the base with `AutoModelForCausalLM`
    adapter         an `AdapterConfig` (`inftyformer.pretrained_config`): the memory (nested
                    `long_term`, with its density and squeeze), how a block uses its read, the
                    segment, the window and the blocks with a memory; config.json holds its JSON

The constructor also takes the adapter's settings by their flat names
(``InftyformerConfig(text_config=base.config, num_basis=256, memory_read="heads")``), as
`add_long_term_memory` passes them. What depends on the base is decided and checked here: the
memory's number of heads (None: the base's), the window (None: one segment, as far as the base's
positions allow), W + L within the base's positions, the blocks, and whether the base's heads
and positions suit the read.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from transformers import AutoConfig, PretrainedConfig
from transformers.configuration_utils import SubConfigSpec

from .._checks import check_memory_layers
from ..core.config import LongTermConfig
from ..pretrained_config import AdapterConfig, decide_lengths
from .adapters import adapter_for


class InftyformerConfig(PretrainedConfig):
    model_type = "inftyformer"
    sub_configs_defaults = {
        "text_config": SubConfigSpec(config_class=AutoConfig, model_type="gpt2")
    }

    text_config: dict | PretrainedConfig | None = None
    adapter: dict | AdapterConfig | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        flat = {k: kwargs.pop(k) for k in list(kwargs) if k in AdapterConfig.setting_types()}
        super().__post_init__(**kwargs)
        adapter = self.adapter
        if adapter is None:
            adapter = AdapterConfig()
        elif isinstance(adapter, dict):
            adapter = AdapterConfig.from_dict(adapter)
        elif not isinstance(adapter, AdapterConfig):
            raise TypeError(f"adapter must be an AdapterConfig or a dict, got {adapter!r}")
        if flat:
            adapter = replace(adapter, **flat)
        self.adapter = self._decide(adapter)

    def _decide(self, adapter: AdapterConfig) -> AdapterConfig:
        """What depends on the base, decided and checked."""
        text = self.text_config
        architecture = self.base_architecture
        adapter_for(architecture)  # a clear error for an unsupported base
        heads = int(text.num_attention_heads)
        if adapter.long_term.num_heads is None:
            adapter = replace(adapter, long_term=replace(adapter.long_term, num_heads=heads))
        limit = getattr(text, "max_position_embeddings", None)
        adapter = decide_lengths(adapter, None if limit is None else int(limit))
        check_memory_layers(adapter.memory_layers, getattr(text, "num_hidden_layers", None))
        self.long_term_config_of(adapter)  # the memory's settings and its update's gain
        read = adapter.memory_read
        if read.heads and adapter.long_term.num_heads != heads:
            raise ValueError(
                f"memory_read='heads' reads with the base's {heads} heads, got "
                f"num_heads={adapter.long_term.num_heads}"
            )
        positions = getattr(read, "memory_positions", "window")
        if positions != "window" and not adapter_for(architecture).rotary:
            raise ValueError(
                f"memory_positions={positions!r} turns the read by rotary positions; "
                f"{architecture} has absolute ones (use memory_positions='window')"
            )
        return adapter

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if isinstance(self.adapter, AdapterConfig):
            out["adapter"] = self.adapter.to_dict()
        return out

    @property
    def memory_blocks(self) -> list[int]:
        """The blocks with a long-term memory, in order."""
        if self.adapter.memory_layers is not None:
            return list(self.adapter.memory_layers)
        return list(range(int(self.text_config.num_hidden_layers)))

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

    def long_term_config_of(self, adapter: AdapterConfig) -> LongTermConfig:
        e = self.hidden_size
        return adapter.long_term.sized(
            dim=e, out_dim=e, query_projection=True, segment_len=adapter.segment_len
        )

    def long_term_config(self) -> LongTermConfig:
        """Each block's memory: e = the base's hidden size, own W^Q, output of size e, its
        update's gain checked for segments of L = segment_len."""
        return self.long_term_config_of(self.adapter)


__all__ = ["InftyformerConfig"]
