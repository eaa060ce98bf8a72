"""A saved memory model that Hugging Face tools load by themselves, without importing inftyformer
first: `save_pretrained` writes `inftyformer_auto.py` beside `config.json` and names its classes
in the config's `auto_map`, so that

    AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)
    lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True ...

find the model (transformers imports the file from the folder). The file holds no model code:
it imports the installed inftyformer (`pip install 'inftyformer[hf]'`), so a folder never runs
code of another version than the one installed. Its classes are subclasses, so that what
transformers records on them (`register_for_auto_class`) stays off the library's own classes.
Without `trust_remote_code`, the folder loads wherever `inftyformer.hf` was imported (the model
type is registered with AutoConfig / AutoModelForCausalLM on import).
"""

from __future__ import annotations

from pathlib import Path

from .._files import write_atomic

LOADER = "inftyformer_auto"  # the module's name in the folder (LOADER.py)
AUTO_MAP = {
    "AutoConfig": f"{LOADER}.InftyformerConfig",
    "AutoModelForCausalLM": f"{LOADER}.InftyformerForCausalLM",
}
SOURCE = '''"""Loads this folder with the installed inftyformer (pip install 'inftyformer[hf]'):
AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True). Written by
InftyformerForCausalLM.save_pretrained; the model code is inftyformer's, not this file's."""

from inftyformer.hf import config as _config
from inftyformer.hf import model as _model


class InftyformerConfig(_config.InftyformerConfig):
    pass


class InftyformerForCausalLM(_model.InftyformerForCausalLM):
    config_class = InftyformerConfig
'''


def mark_config(config) -> None:
    """Name the loader's classes in `config.auto_map` (saved with it)."""
    config.auto_map = dict(AUTO_MAP)


def write_loader(directory: str | Path) -> Path:
    """Write the loader module into a saved model's folder; returns its path."""
    path = Path(directory) / f"{LOADER}.py"
    write_atomic(path, SOURCE)
    return path


__all__ = ["AUTO_MAP", "LOADER", "mark_config", "write_loader"]
