"""Where the long-term memory plugs into a pretrained causal LM: one small adapter per
architecture (paper §4.2, fine-tuning GPT-2; `docs/hf.md`).

An adapter names three places, as dotted attribute paths:

    blocks            the ModuleList of transformer blocks, from the *ForCausalLM model
    attention_input   inside a block: the norm whose output is the attention's input. Its output
                      [batch, T, d] is what the block stores in the long-term memory and what the
                      memory's queries are computed from.
    attention_output  inside a block: the attention's output projection. Its output [batch, T, d]
                      gets the long-term read added, before the residual connection.
    attention         inside a block: the attention module (its projections, for a memory read
                      by the base's own heads, `head_read.py`)
    rotary            from the *ForCausalLM model: the rotary embedding module, or "" when
                      positions are absolute

                       GPT2LMHeadModel    LlamaForCausalLM (SmolLM2, TinyLlama, Llama-3 shapes)
    blocks             transformer.h      model.layers
    attention_input    ln_1               input_layernorm
    attention_output   attn.c_proj        self_attn.o_proj
    attention          attn               self_attn
    rotary             (absolute)         model.rotary_emb

Adding an architecture is one more entry in `ADAPTERS` whose block has a pre-norm attention and a
separate output projection; `tests/hf` shows how to check it (parity at initialisation).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn


def _resolve(root: nn.Module, path: str) -> nn.Module:
    module = root
    for name in path.split("."):
        module = getattr(module, name)
    return module


@dataclass(frozen=True)
class BlockAdapter:
    architecture: str  # class name of the *ForCausalLM model
    blocks: str
    attention_input: str
    attention_output: str
    attention: str
    rotary: str

    def block_list(self, model: nn.Module) -> list[nn.Module]:
        return list(_resolve(model, self.blocks))

    def attention_inputs(self, model: nn.Module) -> list[nn.Module]:
        """The norm module of each block whose output the memory stores and queries with."""
        return [_resolve(block, self.attention_input) for block in self.block_list(model)]

    def attention_outputs(self, model: nn.Module) -> list[nn.Module]:
        """The attention output projection of each block (the read is added to its output)."""
        return [_resolve(block, self.attention_output) for block in self.block_list(model)]

    def attentions(self, model: nn.Module) -> list[nn.Module]:
        """The attention module of each block."""
        return [_resolve(block, self.attention) for block in self.block_list(model)]

    def rotary_embedding(self, model: nn.Module) -> nn.Module | None:
        """The rotary embedding module (called as `rotary(x, position_ids)` → cos, sin), or None
        for absolute positions."""
        return _resolve(model, self.rotary) if self.rotary else None


ADAPTERS: dict[str, BlockAdapter] = {
    adapter.architecture: adapter
    for adapter in (
        BlockAdapter("GPT2LMHeadModel", "transformer.h", "ln_1", "attn.c_proj", "attn", ""),
        BlockAdapter(
            "LlamaForCausalLM",
            "model.layers",
            "input_layernorm",
            "self_attn.o_proj",
            "self_attn",
            "model.rotary_emb",
        ),
    )
}


def supported_architectures() -> tuple[str, ...]:
    return tuple(sorted(ADAPTERS))


def adapter_for(architecture: str) -> BlockAdapter:
    """The adapter of a *ForCausalLM class name, or a ValueError listing the supported ones."""
    adapter = ADAPTERS.get(architecture)
    if adapter is None:
        raise ValueError(
            f"long-term memory is not available for {architecture!r}; supported architectures: "
            f"{', '.join(supported_architectures())}"
        )
    return adapter


__all__ = ["ADAPTERS", "BlockAdapter", "adapter_for", "supported_architectures"]
