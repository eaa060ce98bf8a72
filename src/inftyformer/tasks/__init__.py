"""Tasks: the contract the trainer calls (`base`), and one module per task, each holding its data
and its implementation of the contract, registered by name:

    sorting   the paper's sorting task (§4.1)                 `sorting.py`
    recall    associative recall across a chosen distance      `recall.py`
    lm        long-document language modelling (§4.2)          `lm.py` (+ `lm_eval.py`)
    dialogue  document-grounded dialogue on CMU-DoG (§4.3)     `dialogue.py`

Sorting and recall share `streamed.LastBlockTask` (a generated stream, scored on its last
block). A new task is one module here that subclasses `Task` (or `LastBlockTask`), decorates it
with `@register_task(name)`, and is imported below; the trainer and the command line find it in
`TASKS`.
"""

from . import dialogue, lm, recall, sorting  # noqa: F401 - registers the built-in tasks
from .base import (
    TASKS,
    Evaluation,
    Metric,
    RunContext,
    Shard,
    StepOutput,
    Task,
    TaskConfig,
    get_task,
    register_task,
)
from .dialogue import DialogueConfig, DialogueTask
from .facts import FactsConfig, FactsTask
from .lm import LanguageModelTask, LMConfig
from .recall import RecallConfig, RecallTask
from .sorting import SortingConfig, SortingTask

__all__ = [
    "TASKS",
    "DialogueConfig",
    "DialogueTask",
    "Evaluation",
    "FactsConfig",
    "FactsTask",
    "LMConfig",
    "LanguageModelTask",
    "Metric",
    "RecallConfig",
    "RecallTask",
    "RunContext",
    "Shard",
    "SortingConfig",
    "SortingTask",
    "StepOutput",
    "Task",
    "TaskConfig",
    "get_task",
    "register_task",
]
