"""How the command line's options become the run's settings: (TrainConfig, task settings, model
settings) from the defaults or the run being resumed, then the explicit options and `--set
KEY=VALUE` items (later wins). `inftyformer train` calls `build_configs`; nothing here trains."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from .native.model_config import MODEL_TYPES
from .presets import get_preset, preset_settings
from .pretrained_config import base_blocks
from .training.config import TrainConfig

DEFAULT_PRESET = "cpu-small"  # a native model's
DEFAULT_PRETRAINED_PRESET = "adapter"  # with --base-model: the recommended memory to train
DEFAULT_MODEL = "infty"
GROUPS = ("model", "train", "task")


def split_settings(
    items: list[str], task: str, model_cls: type | None = None
) -> dict[str, dict[str, str]]:
    """`--set key=value` items → {"model": {...}, "train": {...}, "task": {...}}.

    A key may be prefixed `model.`, `train.` or `task.`; a bare key goes to the one group that
    has it (an error if several or none do). `model_cls`: the model settings' class (default:
    the native `ModelConfig`)."""
    from .native.model_config import ModelConfig
    from .tasks import get_task
    from .training.config import field_types, split_assignment, unknown_setting

    keys = {
        "model": set(field_types(model_cls or ModelConfig)),
        "train": set(field_types(TrainConfig)) - {"task"},
        "task": set(field_types(get_task(task).Config)),
    }
    out: dict[str, dict[str, str]] = {group: {} for group in GROUPS}
    for item in items:
        if item.strip() in ("help", "list"):  # the whole list, on request
            from .settings_help import format_settings

            typer.echo(
                f"settings for --set KEY=VALUE (task {task!r}): name, type, default, meaning"
            )
            classes = {
                "model": model_cls or ModelConfig,
                "train": TrainConfig,
                "task": get_task(task).Config,
            }
            for group in GROUPS:
                typer.echo(f"  {group}:")
                skip = frozenset({"task"}) if group == "train" else frozenset()
                for line in format_settings(classes[group], skip=skip):
                    typer.echo(line)
            raise typer.Exit(0)
        key, value = split_assignment(item)
        group, _, name = key.partition(".")
        if name and group in GROUPS:
            out[group][name] = value
            continue
        owners = [g for g in GROUPS if key in keys[g]]
        if len(owners) > 1:
            raise ValueError(
                f"{key!r} is a setting of {' and '.join(owners)}: write "
                + " or ".join(f"{g}.{key}" for g in owners)
            )
        if not owners:
            raise ValueError(unknown_setting(key, set().union(*keys.values())))
        out[owners[0]][key] = value
    return out


def task_settings(
    task: str, options: dict[str, Any], text: dict[str, str], flags: dict[str, str] | None = None
) -> dict[str, Any]:
    """Typed task settings from command-line options (setting name → value, None: not given)
    and `--set` texts; an option the task has no setting for is an error naming the task's
    settings. `flags` names the option of a setting when it is not `--setting-name`."""
    from .tasks import get_task
    from .training.config import field_types, parse_overrides

    config_cls = get_task(task).Config
    names = set(field_types(config_cls))
    values: dict[str, Any] = {}
    for key, value in options.items():
        if value is None:
            continue
        if key not in names:
            flag = (flags or {}).get(key, "--" + key.replace("_", "-"))
            raise ValueError(
                f"{flag} is not a setting of task {task!r} (its settings: "
                f"{', '.join(sorted(names)) or 'none'})"
            )
        values[key] = value
    values.update(parse_overrides(config_cls, text, f"task {task!r}"))
    return values


def refuse_training_free(preset: str) -> None:
    """A preset of the retrieval (or one of its baselines) has nothing to train: say what to
    run instead."""
    from .presets import PRESETS, READ_KINDS

    if preset in PRESETS and PRESETS[preset].kind in READ_KINDS:
        raise ValueError(
            f"preset {preset!r} is training-free: the base reads its own past, nothing is "
            "trained. Read a document with `inftyformer ask --base-model DIR DOCUMENT "
            f"QUESTION`, or continue text with `inftyformer generate --base-model DIR --preset "
            f"{preset} --prompt-file FILE`"
        )


def build_configs(
    task: str,
    *,
    model: str | None,
    preset: str | None,
    settings: list[str],
    options: dict[str, Any],
    task_options: dict[str, Any],
    resume: bool,
    base_model: str | None = None,
    freeze_base: bool = False,
) -> tuple[TrainConfig, Any, Any]:
    """(TrainConfig, task settings, model settings) from the defaults, or from the run being
    resumed, then the explicit options and `--set` items (later wins). With `base_model` the
    model is that pretrained causal LM plus long-term memory (`PretrainedMemoryConfig`), and a
    task with a `tokenizer` setting takes the model's own tokenizer unless told otherwise. On
    resume, `base_model` is the run's base in its (new) folder; whether the base trains stays
    as it was."""
    import dataclasses

    from .model_kinds import PretrainedMemoryConfig
    from .native.model_config import ModelConfig
    from .tasks import get_task
    from .training import read_configs
    from .training.config import field_types, parse_overrides

    task_cls = get_task(task)
    if preset is not None and base_model is None:
        refuse_training_free(preset)
        get_preset(preset, "native")
    if base_model is not None:
        if model not in (None, "infty", "transformer"):
            raise ValueError(
                "--base-model brings its own model: --model is infty (with long-term memory, "
                "the default) or transformer (the base alone)"
            )
        if preset is not None:
            refuse_training_free(preset)
            get_preset(preset, "pretrained")  # named errors before anything else
    elif freeze_base:
        raise ValueError("--freeze-base needs --base-model")
    model_cls = PretrainedMemoryConfig if base_model is not None else ModelConfig
    if resume:
        name = Path(base_model).name if base_model else model or DEFAULT_MODEL
        check_resumable(options.get("out_dir") or default_out_dir(task, name))
    if resume and base_model is None:
        out_dir = options.get("out_dir") or default_out_dir(task, model or DEFAULT_MODEL)
        model_cls = type(read_configs(out_dir)[2])
    text = split_settings(settings, task, model_cls)
    train_values = {k: v for k, v in options.items() if v is not None}
    train_values.update(parse_overrides(TrainConfig, text["train"], "train"))
    model_values = parse_overrides(model_cls, text["model"], "model")
    task_values = task_settings(task, task_options, text["task"])
    if model is not None and model not in MODEL_TYPES:
        raise ValueError(f"unknown model {model!r}; choose one of {', '.join(MODEL_TYPES)}")
    if "model_type" in model_values:
        raise ValueError("choose the model with --model, not --set model_type")
    if base_model is not None:
        if "tokenizer" in field_types(task_cls.Config):
            task_values.setdefault("tokenizer", base_model)
        model_values.update(
            base_model=base_model, freeze_base=freeze_base, memory=model != "transformer"
        )

    if resume:
        name = Path(base_model).name if base_model else model or DEFAULT_MODEL
        out_dir = train_values.get("out_dir") or default_out_dir(task, name)
        saved_train, saved_task, saved_model = read_configs(out_dir, base_model)
        if base_model is not None:  # the run's base in its folder (moved?); what trains stays
            model_values["freeze_base"] = freeze_base or saved_model.to_dict().get("freeze_base")
            if model is None:
                del model_values["memory"]
        if saved_train.task != task:
            raise ValueError(f"{out_dir} holds a {saved_train.task!r} run, not {task!r}")
        if model is not None and model != saved_model.model_type:
            raise ValueError(
                f"{out_dir} holds a {saved_model.model_type!r} model, not {model!r}; "
                "drop --model or pick the right --out-dir"
            )
        train_values["out_dir"] = str(out_dir)
        train_values.setdefault("halt_after", 0)  # a halt is for one session, not the run
        train_cfg = dataclasses.replace(saved_train, **train_values)
        task_cfg = dataclasses.replace(saved_task, **task_values)
        if preset is not None and base_model is not None:  # its settings, as changes to check
            blocks = base_blocks(base_model)
            values = {**preset_settings(preset, "pretrained", blocks), **model_values}
            model_cfg = saved_model.replace(**values)
        elif preset is not None:
            base = ModelConfig.preset(preset, model_type=saved_model.model_type)
            model_cfg = base.replace(**task_cls.model_overrides(task_cfg), **model_values)
        else:
            model_cfg = saved_model.replace(**model_values)
        return train_cfg, task_cfg, model_cfg

    model = model or DEFAULT_MODEL
    train_values.setdefault(
        "out_dir", default_out_dir(task, Path(base_model).name if base_model else model)
    )
    train_cfg = TrainConfig(task=task, **train_values)
    task_cfg = task_cls.Config(**task_values)
    if base_model is not None:
        model_cfg = PretrainedMemoryConfig(
            preset=preset or DEFAULT_PRETRAINED_PRESET, **model_values
        )
        task_cls.check(task_cfg, model_cfg)
        return train_cfg, task_cfg, model_cfg
    model_cfg = ModelConfig.preset(
        preset or DEFAULT_PRESET,
        model_type=model,
        **{**task_cls.model_overrides(task_cfg), **model_values},
    )
    task_cls.check(task_cfg, model_cfg)
    return train_cfg, task_cfg, model_cfg


def default_out_dir(task: str, model: str) -> str:
    return str(Path("runs") / f"{task}-{model}")


def check_resumable(out_dir: str) -> None:
    """--resume needs a run to continue: say so when `out_dir` holds none."""
    from .training.checkpoint import checkpoint_exists

    fix = "start the run without --resume, or point --out-dir at the run to continue"
    if not Path(out_dir).is_dir():
        raise ValueError(f"nothing to resume: {out_dir} does not exist ({fix})")
    if not checkpoint_exists(out_dir, "last"):
        raise ValueError(f"nothing to resume: {out_dir} holds no checkpoint ({fix})")


__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_PRESET",
    "DEFAULT_PRETRAINED_PRESET",
    "GROUPS",
    "build_configs",
    "check_resumable",
    "default_out_dir",
    "split_settings",
    "task_settings",
]
