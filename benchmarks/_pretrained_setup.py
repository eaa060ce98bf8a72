"""The set-up of `bench_pretrained.py`: its common flags, the base
model (a converted checkpoint, or a random tiny Llama with --tiny), a random GPT-2 (learned
positions, beside the Llama family's rotary ones) and the ids the checks and timings run on (a
pg19-mini test book when the tokenizer and the data are there, else seeded random ids)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch

from inftyformer._measure import default_base_model

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = Path(default_base_model())
OUT = ROOT / "docs" / "results" / "benchmarks"


def data_dir() -> Path | None:
    """$INFTYFORMER_DATA, or ../shared/data beside the repository (or its parent folder)."""
    env = os.environ.get("INFTYFORMER_DATA")
    candidates = [Path(env)] if env else [p / "shared" / "data" for p in ROOT.parents[:2]]
    return next((p for p in candidates if p.is_dir()), None)


def tiny_llama(vocab: int = 512):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).eval()


def random_gpt2(tiny: bool):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    shape = (
        dict(n_embd=64, n_layer=2, n_head=4) if tiny else dict(n_embd=768, n_layer=12, n_head=12)
    )
    return GPT2LMHeadModel(GPT2Config(vocab_size=50257, n_positions=1024, **shape)).eval()


def book_ids(tokenizer, vocab: int, rows: int, length: int) -> tuple[torch.Tensor, str]:
    """[rows, length] ids: consecutive text of pg19-mini test books when the tokenizer and the
    data are there, else seeded random ids."""
    root = data_dir()
    books = sorted((root / "pg19-mini" / "test").glob("*.txt")) if root else []
    if tokenizer is not None and books:
        text = books[0].read_text(encoding="utf-8")[: 12 * rows * length]
        ids = tokenizer(text, return_tensors="pt").input_ids[0]
        if ids.numel() >= rows * length:
            return ids[: rows * length].view(rows, length), f"pg19-mini test/{books[0].name}"
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (rows, length), generator=g), "random ids"


def parser(doc: str, repeats: int) -> argparse.ArgumentParser:
    """The flags both scripts take (`repeats`: the default number of timed rounds)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=None, help="a causal LM directory")
    p.add_argument("--tiny", action="store_true", help="a random tiny Llama instead")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--segment-len", type=int, default=256)
    p.add_argument("--repeats", type=int, default=repeats)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out-dir", type=Path, default=OUT)
    return p


def load_base(args: argparse.Namespace, p: argparse.ArgumentParser) -> tuple[Any, Any, str]:
    """(base model in eval mode, its tokenizer or None, its name) as the flags ask: a random tiny
    Llama with --tiny, else --model or the default directory, which must exist."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.tiny:
        return tiny_llama(), None, "random tiny Llama"
    path = args.model or DEFAULT_MODEL
    if not path.is_dir():
        p.error(
            f"no model directory at {path}: convert one first "
            "(inftyformer convert-gguf smollm2 DIR), pass --model DIR, or use --tiny"
        )
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return base, AutoTokenizer.from_pretrained(path), path.name
