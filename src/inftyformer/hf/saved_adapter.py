"""A memory model saved as an adapter: its config and the memory's weights, plus a reference to
the pretrained base it loads on top of (`docs/hf.md`), in the spirit of PEFT's adapter folders
(no dependency on peft):

    config.json                 the InftyformerConfig (memory settings, the base's config nested)
    adapter_model.safetensors   the memory's tensors only (`long_term.*`)
    adapter_config.json         {"format": "inftyformer-adapter",
                                 "base_model_name_or_path": the base's folder (absolute),
                                 "base_model_sha256": its `weights_hash`,
                                 "base_weights_prefix": "base."}

`model.save_pretrained(dir, adapter_only=True)` writes it (refusing a model whose base weights
are not the base folder's: a fine-tuned base is saved whole); `InftyformerForCausalLM.
from_pretrained(dir)` (or `AutoModelForCausalLM.from_pretrained(dir)`) loads the base from the
reference, or from `base_model=` when it moved, refuses one whose hash differs, and adds the
saved memory: the logits are the saved model's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from .._files import atomic_path, write_atomic
from ..base_weights import BaseReference, weight_files
from .config import InftyformerConfig

FORMAT = "inftyformer-adapter"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base."  # where the base's tensors sit in InftyformerForCausalLM's state dict


def is_adapter(directory: Any) -> bool:
    """Whether `directory` is an adapter folder (not a whole saved model)."""
    try:
        return (Path(directory) / ADAPTER_CONFIG).is_file()
    except TypeError:
        return False


def _base_folder(model: Any, base_model: str | Path | None) -> Path:
    given = base_model or getattr(model.base.config, "_name_or_path", "")
    if not given or not (Path(given).expanduser() / "config.json").is_file():
        raise ValueError(
            f"adapter_only needs the base model's folder (got {str(given) or 'none'}): pass "
            "base_model=DIR, the folder the base was loaded from"
        )
    return Path(given).expanduser().resolve()


def _check_same_base(model: Any, folder: Path) -> None:
    """The base in `model` holds the folder's weights (the adapter would load on them)."""
    state = model.base.state_dict()
    compared = 0
    for path in weight_files(folder):
        if path.suffix != ".safetensors":
            raise ValueError(f"{folder}: adapter_only needs a base saved as safetensors")
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
                if name not in state:
                    continue
                mine = state[name]
                theirs = f.get_tensor(name).to(mine.dtype)
                if not torch.equal(theirs, mine.detach().cpu()):
                    raise ValueError(
                        f"the model's base weights differ from {folder}'s (e.g. {name}: was the "
                        "base trained?): save the whole model (save_pretrained without "
                        "adapter_only)"
                    )
                compared += 1
    if not compared:
        raise ValueError(f"{folder}: none of its tensors are the model's base weights")


def save_adapter(model: Any, directory: str | Path, base_model: str | Path | None = None) -> Path:
    """Write `model`'s adapter folder (module docstring) to `directory`; returns it.
    `base_model`: the base's folder (default: where the base was loaded from)."""
    folder = _base_folder(model, base_model)
    _check_same_base(model, folder)
    reference = BaseReference.of(folder, PREFIX)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {
        k: v.detach().cpu().contiguous().clone()
        for k, v in model.state_dict().items()
        if not k.startswith(PREFIX)
    }
    model.config.save_pretrained(directory)
    with atomic_path(directory / ADAPTER_WEIGHTS) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    info = {
        "format": FORMAT,
        "base_model_name_or_path": reference.path,
        "base_model_sha256": reference.sha256,
        "base_weights_prefix": PREFIX,
    }
    write_atomic(directory / ADAPTER_CONFIG, json.dumps(info, indent=1))
    return directory


def load_adapter(
    directory: str | Path,
    build: Callable[..., Any],
    base_model: str | Path | None = None,
    **base_options: Any,
) -> Any:
    """The model saved by `save_adapter` in `directory`, on the base in `base_model` (default:
    the recorded folder), checked by its weights hash; `build(base, **memory settings)` adds
    the memory (`add_long_term_memory`). `base_options` go to the base's
    `AutoModelForCausalLM.from_pretrained` (dtype, device_map, ...)."""
    directory = Path(directory)
    path = directory / ADAPTER_CONFIG
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        if info.get("format") != FORMAT:
            raise ValueError(f"format {info.get('format')!r}, not {FORMAT!r}")
        reference = BaseReference(
            str(info["base_model_name_or_path"]),
            str(info["base_model_sha256"]),
            str(info["base_weights_prefix"]),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{path} is not a readable adapter config: {err}") from None
    folder = Path(base_model).expanduser() if base_model is not None else Path(reference.path)
    if not (folder / "config.json").is_file():
        raise ValueError(
            f"the adapter's base model {folder} is not there (no config.json): pass "
            "base_model=DIR, its new folder"
        )
    reference.check(folder, option="base_model=")
    config = InftyformerConfig.from_pretrained(directory)
    settings = {"adapter": config.adapter}
    base_options.pop("config", None)  # AutoModelForCausalLM passes the adapter's own
    base = AutoModelForCausalLM.from_pretrained(str(folder), **base_options)
    model = build(base, **settings)
    result = model.load_state_dict(load_file(directory / ADAPTER_WEIGHTS), strict=False)
    missing = [k for k in result.missing_keys if not k.startswith(reference.prefix)]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"{directory / ADAPTER_WEIGHTS} does not fit the model its config describes: missing "
            f"{missing[:3]}, unexpected {list(result.unexpected_keys)[:3]}"
        )
    return model.eval()


__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "is_adapter", "load_adapter", "save_adapter"]
