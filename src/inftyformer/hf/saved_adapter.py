"""A memory model saved as an adapter: its config and the memory's weights, plus a reference to
the pretrained base it loads on top of (`docs/hf.md`), in the spirit of PEFT's adapter folders
(no dependency on peft):

    config.json                 the InftyformerConfig (memory settings, the base's config nested)
    adapter_model.safetensors   the memory's tensors only (`long_term.*`)
    adapter_config.json         {"format": "inftyformer-adapter",
                                 "base_model_name_or_path": the base's folder (absolute),
                                 "base_model_sha256": its `weights_hash`,
                                 "base_weights_prefix": "base.",
                                 "base_model_config": its `behaviour_config`,
                                 "files": {"config.json": sha256, ...}}  (written last)

`model.save_pretrained(dir, adapter_only=True)` writes it (refusing a model whose base weights
are not the base folder's: a fine-tuned base is saved whole); `InftyformerForCausalLM.
from_pretrained(dir)` (or `AutoModelForCausalLM.from_pretrained(dir)`) loads the base from the
reference, or from `base_model=` when it moved, refuses one whose hash differs or whose
config.json computes otherwise (`base_weights.check_config`: rope_theta, hidden_act, ...), and
adds the saved memory: the logits are the saved model's.

A folder holds one save (`save`): a save into a folder of another model (a base's own folder,
whose config.json it would overwrite) is refused; a save removes the files of an earlier save
of the other kind before it writes (the marker, adapter_config.json, first), so that neither a
whole model's weights nor a stale adapter are loaded in place of what was saved; and the
adapter config lists the sha256 of the files it was saved with, so that a folder whose files
come from two adapter saves (one cut short) is refused on loading.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from .._files import atomic_path, write_atomic
from ..base_weights import BaseReference, behaviour_config, check_config, weight_files
from .config import InftyformerConfig

FORMAT = "inftyformer-adapter"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base."  # where the base's tensors sit in InftyformerForCausalLM's state dict
# the files of a whole model's save (Hugging Face's names, shards and indexes included)
MEMORY_BLOCKS = "memory_blocks.json"  # a whole save's record of where its memories sit
WHOLE_WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "model-*-of-*.safetensors",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "pytorch_model-*-of-*.bin",
    MEMORY_BLOCKS,
)
ADAPTER_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)  # the marker first


def save(
    model: Any,
    directory: str | Path,
    whole: Callable[..., Any],
    adapter_only: bool,
    base_model: str | Path | None,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """`model.save_pretrained(directory, ...)`: the whole model through `whole` (Hugging Face's
    `save_pretrained`), or its adapter folder (`save_adapter`); either with the loader module
    (`remote_code.py`), into a folder that then holds this save only (`clear_for_save`)."""
    from .remote_code import mark_config, write_loader

    if adapter_only and (args or kwargs):
        raise ValueError(f"adapter_only takes no other options, got {sorted(kwargs)}")
    # everything that can refuse the save runs before the folder is touched
    reference = _checked_base(model, base_model) if adapter_only else None
    clear_for_save(directory, adapter_only)
    mark_config(model.config)
    result = None
    if reference is not None:
        _write_adapter(model, directory, reference)
    else:
        result = whole(directory, *args, **kwargs)
        # the memories' weights are saved by their place in memory_layers: what blocks those
        # were is recorded beside them, so a config.json that moves them is refused on loading
        blocks = {"memory_blocks": list(model.memory_blocks)}
        write_atomic(Path(directory) / MEMORY_BLOCKS, json.dumps(blocks))
    write_loader(directory)
    return result


def check_memory_blocks(directory: Any, model: Any) -> None:
    """Refuse a whole saved model whose config.json places its memories in other blocks than
    the weights were saved for (a folder saved before this record was kept: not checked)."""
    path = Path(str(directory)) / MEMORY_BLOCKS
    if not path.is_file():
        return
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))["memory_blocks"]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a record of the memories' blocks ({err})") from None
    if list(saved) != list(model.memory_blocks):
        raise ValueError(
            f"{directory}: config.json places the memories in blocks {list(model.memory_blocks)}, "
            f"but their weights were saved for blocks {list(saved)} ({MEMORY_BLOCKS}): each "
            "memory would read another block's states; restore memory_layers in config.json"
        )


def clear_for_save(directory: str | Path, adapter_only: bool) -> None:
    """Make `directory` ready for a save of one kind: refuse a folder that holds another model
    (a config.json of another model type, e.g. the base's own folder, which the save would
    overwrite), then remove an earlier save's files of the other kind (a whole model's
    weights before an adapter save; the adapter's marker and weights before a whole save)."""
    directory = Path(directory)
    config = directory / "config.json"
    if config.is_file():
        try:
            found = json.loads(config.read_text(encoding="utf-8")).get("model_type")
        except (OSError, ValueError, AttributeError) as err:
            raise ValueError(
                f"{directory} holds a config.json that cannot be read ({err}): a save there "
                "would mix with what is there; save into another folder"
            ) from None
        if found != InftyformerConfig.model_type:
            raise ValueError(
                f"{directory} holds another model (config.json of model_type {found!r}, e.g. "
                "the base's own folder): a save there would overwrite its config; save into "
                "another folder"
            )
    if not directory.is_dir():
        return
    if adapter_only:
        stale = [p for pattern in WHOLE_WEIGHTS for p in sorted(directory.glob(pattern))]
    else:
        stale = [directory / name for name in ADAPTER_FILES]
    for path in stale:
        path.unlink(missing_ok=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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


def _checked_base(model: Any, base_model: str | Path | None) -> BaseReference:
    """The reference to the base folder `model`'s adapter loads on, once its weights are
    checked to be the model's base."""
    folder = _base_folder(model, base_model)
    _check_same_base(model, folder)
    return BaseReference.of(folder, PREFIX)


def save_adapter(model: Any, directory: str | Path, base_model: str | Path | None = None) -> Path:
    """Write `model`'s adapter folder (module docstring) to `directory`; returns it.
    `base_model`: the base's folder (default: where the base was loaded from)."""
    return _write_adapter(model, directory, _checked_base(model, base_model))


def _write_adapter(model: Any, directory: str | Path, reference: BaseReference) -> Path:
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
        "base_model_config": behaviour_config(reference.path),  # rope_theta, hidden_act, ...
        # what this save wrote: a folder mixing two saves is refused on loading
        "files": {name: _sha256(directory / name) for name in ("config.json", ADAPTER_WEIGHTS)},
    }
    write_atomic(directory / ADAPTER_CONFIG, json.dumps(info, indent=1))
    return directory


def _check_files(directory: Path, info: dict[str, Any]) -> None:
    """The files the adapter config lists are those it was saved with (configs saved before
    the list existed are not checked)."""
    files = info.get("files")
    if files is None:
        return
    if not isinstance(files, dict):
        raise ValueError(f"{directory / ADAPTER_CONFIG}: 'files' must map names to sha256")
    for name, digest in sorted(files.items()):
        path = directory / str(name)
        found = _sha256(path) if path.is_file() else "missing"
        if found != digest:
            raise ValueError(
                f"{directory} mixes two saves: its {name} is not the one saved with "
                f"{ADAPTER_CONFIG} ({'missing' if found == 'missing' else 'other contents'}; "
                "was a save cut short, or a file copied over?): save the model again"
            )


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
    _check_files(directory, info)
    folder = Path(base_model).expanduser() if base_model is not None else Path(reference.path)
    if not (folder / "config.json").is_file():
        raise ValueError(
            f"the adapter's base model {folder} is not there (no config.json): pass "
            "base_model=DIR, its new folder"
        )
    reference.check(folder, option="base_model=")
    if "base_model_config" in info:  # adapters saved before it was recorded: weights only
        check_config(info["base_model_config"], folder, "base_model=", "this adapter")
    config = InftyformerConfig.from_pretrained(directory)
    settings = {"adapter": config.adapter}
    base_options.pop("config", None)  # AutoModelForCausalLM passes the adapter's own
    # and its internal flags (`_from_auto`, ...), which the call below sets again itself
    base_options = {k: v for k, v in base_options.items() if not k.startswith("_")}
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


__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "clear_for_save",
    "is_adapter",
    "load_adapter",
    "save",
    "save_adapter",
]
