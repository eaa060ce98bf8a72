"""Tiny random GPT-2 and Llama models built in the test (nothing is downloaded)."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from inftyformer.hf import add_long_term_memory

V = 61  # vocabulary
L = 8  # segment length
ARCHITECTURES = ("gpt2", "llama")
MEMORY = dict(num_basis=16, num_samples=16, segment_len=L)


def memory(**settings) -> dict:
    """The tiny models' memory settings with `settings`; a fill squeeze takes no num_samples (it
    never resamples: its places are the K centres)."""
    out = {**MEMORY, **settings}
    if out.get("squeeze") == "fill":
        del out["num_samples"]
    return out


def tiny_base(arch: str, seed: int = 0, **overrides):
    """A random GPT-2 or Llama of 2 blocks, 4 heads, width 32; `overrides` go to its config."""
    torch.manual_seed(seed)
    if arch == "gpt2":
        settings = dict(
            vocab_size=V,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            bos_token_id=0,
            eos_token_id=None,
            pad_token_id=0,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        return GPT2LMHeadModel(GPT2Config(**{**settings, **overrides})).eval()
    settings = dict(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention, as in SmolLM2 / Llama-3
        max_position_embeddings=64,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=None,
        pad_token_id=0,
    )
    config = LlamaConfig(**{**settings, **overrides})
    return LlamaForCausalLM(config).eval()


def tiny_memory_model(arch: str, seed: int = 0, active: bool = True, **settings):
    """The tiny base with a long-term memory. `active`: the read's output projection gets
    nonzero weights (it starts at zero), so that the memory changes the logits."""
    model = add_long_term_memory(tiny_base(arch, seed), **memory(**settings)).eval()
    if active:
        generator = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for layer in model.long_term:
                w = layer.attention.out.weight
                w.copy_(torch.randn(w.shape, generator=generator) * 0.3)
    return model


def with_settings(model, **changes):
    """A model with the same weights (base and memory) and other settings, e.g. a longer
    segment_len: the reference that runs a text longer than a segment in one call."""
    from inftyformer.hf import InftyformerForCausalLM

    config = type(model.config).from_dict(
        {**model.config.to_dict(), "adapter": model.config.adapter.replace(**changes)}
    )
    other = InftyformerForCausalLM(config).eval()
    other.load_state_dict(model.state_dict())
    return other


@torch.no_grad()
def forty_token_retrieval():
    """A tiny Llama with retrieval that has read 40 random tokens in blocks of 4: tokens 0-3
    the sink, 4-23 five stored blocks, 24-39 the window. (model, ids [1, 40], state)."""
    from inftyformer.retrieval.model import RetrievalLM

    model = RetrievalLM(
        tiny_base("llama", max_position_embeddings=512),
        block_size=4, blocks=2, sink_blocks=1, window=16, segment_len=8,
    ).eval()  # fmt: skip
    ids = torch.randint(1, V, (1, 40), generator=torch.Generator().manual_seed(0))
    return model, ids, model(ids).state
