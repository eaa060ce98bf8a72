"""What the command line shows before it does any work (`inftyformer --help`, a command's
`--help`, an unknown task's error), as plain constants, so that none of it imports torch: the
registered tasks and their one-line summaries, the model kinds, the default preset and the train
settings' defaults. `tests/cli/test_cli_start.py` checks every one against the task registry
and the configs themselves, so they cannot drift apart."""

from __future__ import annotations

# the task registry's names and summaries (`inftyformer.tasks.TASKS`, `Task.summary`)
TASK_SUMMARIES = {
    "dialogue": "document-grounded dialogue on CMU-DoG, the document in long-term memory (§4.3)",
    "facts": "facts written into books and asked for later (retrieval on real text)",
    "lm": "long-document language modelling on a folder of books (§4.2)",
    "recall": "associative recall across a gap of G filler tokens (how far the memory reaches)",
    "sorting": "the paper's sorting task (§4.1): sort 20 symbols by their count in a long sequence",
}
MODEL_TYPES = (
    "transformer",
    "xl",
    "compressive",
    "infty",
)  # `inftyformer.native.model_config.MODEL_TYPES`
DEFAULT_PRESET = "cpu-small"  # `inftyformer.configure.DEFAULT_PRESET`
# with --base-model: `inftyformer.configure.DEFAULT_PRETRAINED_PRESET`
DEFAULT_PRETRAINED_PRESET = "adapter"
# `TrainConfig()`'s values of the settings the command line names in its help
TRAIN_DEFAULTS = {
    "steps": 600,
    "batch_size": 8,
    "grad_accum": 1,
    "lr": 1e-3,
    "seed": 0,
    "eval_every": 100,
    "patience": 0,
    "threads": 1,
}


def check_task(name: str) -> str:
    """`name` if a task of that name is registered, else the registry's own error (the same
    words as `inftyformer.tasks.get_task`), found without importing any task: the built-in ones
    are listed here, and one that other code registered is in the registry already imported."""
    import sys

    registry = sys.modules.get("inftyformer.tasks.base")
    known = set(TASK_SUMMARIES) | set(registry.TASKS if registry is not None else ())
    if name not in known:
        raise ValueError(f"unknown task {name!r}; available tasks: {', '.join(sorted(known))}")
    return name
