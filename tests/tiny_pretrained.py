"""Tiny random model directories for smoke runs and tests; nothing is downloaded.

A byte-level BPE trained on the given texts, and a random GPT-2 or Llama (2 layers, width 32) of its
vocabulary, saved as a Hugging Face model directory that ``--base-model`` and
``AutoModelForCausalLM.from_pretrained`` take. With ``chat=True`` the tokenizer also knows ChatML's
``<|im_start|>`` / ``<|im_end|>`` and the directory carries a ChatML chat template, as
SmolLM2-Instruct's does.

    write_tiny_model(path)                           # Llama, a 300-id tokenizer
    write_tiny_model(path, "gpt2", corpus=my_texts)  # GPT-2
    write_tiny_model(path, chat=True)                # with ChatML and a chat template
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant"
    "\n' }}{% endif %}"
)
ARCHITECTURES = ("gpt2", "llama")


def write_tiny_model(
    directory: str | Path,
    arch: str = "llama",
    *,
    corpus: Iterable[str] = ("the memory of a long book, said the signal",) * 20,
    vocab_size: int = 300,
    chat: bool = False,
    template_in_config: bool = False,
    max_positions: int = 64,
    seed: int = 0,
) -> Path:
    """Write the tokenizer and a random model of `arch` to `directory`; returns it.

    `corpus`: the texts the BPE is trained on (repeat a text to weigh it); `vocab_size`: the BPE's
    target size; `chat`: ChatML special tokens and a chat template (in `chat_template.jinja`, or in
    `tokenizer_config.json` with `template_in_config`); `max_positions`: the model's positions;
    `seed`: its weights (the global random state is left as it was)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {', '.join(ARCHITECTURES)}, got {arch!r}")
    directory = Path(directory)
    special = ["<|endoftext|>", *(["<|im_start|>", "<|im_end|>"] if chat else [])]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(list(corpus), trainer)
    vocab = tokenizer.get_vocab_size()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if arch == "gpt2":
            config = GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4,
                                n_positions=max_positions)  # fmt: skip
            model = GPT2LMHeadModel(config)
        else:
            config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                 max_position_embeddings=max_positions)  # fmt: skip
            model = LlamaForCausalLM(config)
    model.save_pretrained(directory)
    tokenizer.save(str(directory / "tokenizer.json"))
    if chat:
        settings = {"eos_token": "<|im_end|>", "bos_token": "<|im_start|>"}
        if template_in_config:
            settings["chat_template"] = CHATML
        else:
            (directory / "chat_template.jinja").write_text(CHATML, encoding="utf-8")
        (directory / "tokenizer_config.json").write_text(json.dumps(settings), encoding="utf-8")
    return directory


__all__ = ["CHATML", "write_tiny_model"]
