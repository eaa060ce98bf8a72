"""The command line starts without importing torch (`--help`, a command's help and argument
errors answer at once), from constants that are checked here against what they stand for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import inftyformer
from inftyformer.commands import catalog

SRC = Path(__file__).resolve().parents[2] / "src"


def test_the_catalog_is_the_registry_and_the_configs():
    from inftyformer.configure import DEFAULT_PRESET, DEFAULT_PRETRAINED_PRESET
    from inftyformer.native.model_config import MODEL_TYPES
    from inftyformer.tasks import TASKS, get_task
    from inftyformer.training.config import TrainConfig

    assert catalog.TASK_SUMMARIES == {name: cls.summary for name, cls in TASKS.items()}
    assert catalog.MODEL_TYPES == MODEL_TYPES and catalog.DEFAULT_PRESET == DEFAULT_PRESET
    assert catalog.DEFAULT_PRETRAINED_PRESET == DEFAULT_PRETRAINED_PRESET
    defaults = TrainConfig()
    assert catalog.TRAIN_DEFAULTS == {k: getattr(defaults, k) for k in catalog.TRAIN_DEFAULTS}
    with pytest.raises(ValueError) as expected:
        get_task("sortnig")
    with pytest.raises(ValueError) as found:
        catalog.check_task("sortnig")
    assert str(found.value) == str(expected.value)
    assert catalog.check_task("lm") == "lm"


SCRIPT = """
import sys
from typer.testing import CliRunner
from inftyformer.cli import app
for args in {args!r}:
    result = CliRunner().invoke(app, args)
    print(result.exit_code, result.output.splitlines()[-1] if result.output else "")
print("torch" in sys.modules)
"""


def test_help_and_argument_errors_do_not_import_torch():
    args = [["--help"], ["train", "--help"], ["train", "sortnig"], ["evaluate"], ["generate"]]
    args += [["bench", "--models", "gpt"], ["train", "lm", "--steps", "many"]]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(args=args)],
        capture_output=True, text=True, env=env, timeout=120, check=True,
    ).stdout.splitlines()  # fmt: skip
    codes = [int(line.split()[0]) for line in out[:-1]]
    assert codes == [0, 0, 2, 2, 2, 2, 2], out
    assert "unknown task 'sortnig'" in out[2] and "unknown model 'gpt'" in out[5]
    assert out[-1] == "False", out  # torch was never imported


def test_the_package_exports_its_names_on_first_use():
    for name in inftyformer.__all__:
        assert getattr(inftyformer, name) is not None
        assert name in dir(inftyformer)
    from inftyformer import MemoryLM
    from inftyformer.native.model import MemoryLM as defined

    assert MemoryLM is defined
    with pytest.raises(AttributeError, match="no attribute 'MemoryLm'"):
        inftyformer.MemoryLm  # noqa: B018


def test_a_submodule_of_a_public_name_leaves_the_name_to_the_function():
    import inftyformer.core.continuous_softmax  # noqa: F401 - the module of the same name

    assert callable(inftyformer.continuous_softmax)
    assert inftyformer.continuous_softmax.__module__ == "inftyformer.core.continuous_softmax"


def test_a_task_registered_by_other_code_is_found_too():
    from inftyformer.tasks import TASKS

    TASKS["echo"] = TASKS["sorting"]
    try:
        assert catalog.check_task("echo") == "echo"
    finally:
        TASKS.pop("echo")
    with pytest.raises(ValueError, match="available tasks: dialogue, facts, lm, recall, sorting$"):
        catalog.check_task("echo")
