"""What a checkpoint holds of the model: every weight, or, when the model's pretrained base is
frozen, the weights that train plus a reference to the base (`inftyformer.base_weights`,
`docs/hf.md`), recorded in the metadata under "base":

    {"path": the base's folder (absolute), "sha256": its weights_hash,
     "prefix": where the base's tensors sit in the model's state dict, e.g. "lm.base."}

Loading such a checkpoint builds the model from its settings (which load the base from its
folder), refuses a base whose hash differs, then loads the checkpoint's tensors: all of the
model's except the base's. A checkpoint without "base" (every run that trains its base, and
frozen-base runs saved before references existed) holds every weight and loads strictly.

Every checkpoint of a pretrained model also records the base's `behaviour_config` under
"base_config" (what its config.json makes the weights compute: rope_theta, hidden_act, ...),
and `check_base` refuses a base folder whose config.json differs, whether the checkpoint refers
to the base's weights or holds them.

A base that moved: `relocate` points the saved settings at its new folder (the model's
`base_model` and any task setting that named the old folder, i.e. the tokenizer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..base_weights import BaseReference, behaviour_config, check_config
from ..model_kinds import frozen_base, model_kind
from .checkpoint import Checkpoint, CheckpointError

META_KEY = "base"
CONFIG_KEY = "base_config"


def base_folder(model_config: Any) -> str | None:
    """The folder a pretrained model's base loads from (None: a native model)."""
    if model_kind(model_config) != "pretrained":
        return None
    folder = model_config.to_dict().get("base_model")
    return folder if isinstance(folder, str) else None


def base_config(model_config: Any) -> dict[str, Any] | None:
    """The behaviour config of `model_config`'s pretrained base, recorded in its checkpoints
    (None: a native model)."""
    folder = base_folder(model_config)
    return None if folder is None else behaviour_config(folder)


def base_reference(model_config: Any) -> BaseReference | None:
    """The reference a checkpoint of `model_config`'s model records instead of the base's
    weights (None: the base trains, or there is none: the checkpoint holds every weight)."""
    frozen = frozen_base(model_config)
    return None if frozen is None else BaseReference.of(*frozen)


def model_tensors(model: nn.Module, reference: BaseReference | None) -> dict[str, torch.Tensor]:
    """The model's tensors a checkpoint holds: all of them, or all but the referenced base's."""
    state = model.state_dict()
    if reference is None:
        return state
    return {k: v for k, v in state.items() if not k.startswith(reference.prefix)}


def saved_reference(ckpt: Checkpoint) -> BaseReference | None:
    """The base reference recorded in a checkpoint (None: it holds every weight)."""
    data = ckpt.meta.get(META_KEY)
    if data is None:
        return None
    try:
        return BaseReference.from_dict(data, str(ckpt.path))
    except ValueError as err:
        raise CheckpointError(str(err)) from None


def check_base(ckpt: Checkpoint, model_config: Any) -> BaseReference | None:
    """The checkpoint's base reference, checked against the base `model_config` loads: a
    BaseMismatchError (one line, both bases named) when its weights differ, or when its
    config.json computes otherwise than the recorded one (checkpoints that hold every weight
    too)."""
    saved_config, folder = ckpt.meta.get(CONFIG_KEY), base_folder(model_config)
    if isinstance(saved_config, dict) and folder is not None:
        check_config(saved_config, folder, "--base-model", f"the checkpoint {ckpt.path}")
    reference = saved_reference(ckpt)
    if reference is None:
        return None
    frozen = frozen_base(model_config)
    if frozen is None:
        raise CheckpointError(
            f"{ckpt.path}: the checkpoint holds no base weights (it refers to {reference.path}), "
            "but its settings train the base"
        )
    reference.check(frozen[0])
    return reference


def load_model_tensors(model: nn.Module, ckpt: Checkpoint) -> None:
    """Load the checkpoint's weights into `model`: every tensor must fit, and every weight of
    the model must be in the checkpoint, except the referenced base's (loaded from its folder;
    `check_base` checks it). RuntimeError otherwise."""
    reference = saved_reference(ckpt)
    tensors = ckpt.section("model")
    if reference is None:
        model.load_state_dict(tensors, strict=True)
        return
    result = model.load_state_dict(tensors, strict=False)
    missing = [k for k in result.missing_keys if not k.startswith(reference.prefix)]
    unexpected = list(result.unexpected_keys)
    if missing or unexpected:
        raise RuntimeError(
            f"missing tensors {missing[:5]}, unexpected tensors {unexpected[:5]} "
            f"(the base's, under {reference.prefix!r}, come from {reference.path})"
        )


def relocate(meta: dict[str, Any], base_model: str | None, where: object) -> str | None:
    """Point the checkpoint's settings (`meta`, changed in place) at the base model's folder
    `base_model` when it is another than the saved one: the model's `base_model` and the task
    settings that named the saved folder (the tokenizer). Without `base_model`, a saved folder
    that is gone is looked for at the reference's absolute path (a run evaluated from another
    working directory), else refused with what to do. Returns the saved folder if it changed."""
    model_config = meta.get("model_config")
    if not isinstance(model_config, dict) or not isinstance(model_config.get("base_model"), str):
        if base_model is not None:
            raise CheckpointError(
                f"{where}: this model has no pretrained base for --base-model to point at"
            )
        return None
    old = model_config["base_model"]
    new = base_model
    if new is None:
        if (Path(old).expanduser() / "config.json").is_file():
            return None
        reference = meta.get(META_KEY)
        path = reference.get("path") if isinstance(reference, dict) else None
        if not (isinstance(path, str) and (Path(path) / "config.json").is_file()):
            raise CheckpointError(
                f"{where}: the run's base model {old} is not there any more (no config.json): "
                "give its new folder with --base-model DIR"
            )
        new = path
    if str(new) == old:
        return None
    model_config["base_model"] = str(new)
    task_config = meta.get("task_config")
    if isinstance(task_config, dict):
        for key, value in task_config.items():
            if value == old:
                task_config[key] = str(new)
    return old


__all__ = [
    "CONFIG_KEY",
    "META_KEY",
    "base_config",
    "base_folder",
    "base_reference",
    "check_base",
    "load_model_tensors",
    "model_tensors",
    "relocate",
    "saved_reference",
]
