"""The README's Python snippets are executed as they are: they must stay true."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)


def test_readme_has_snippets():
    assert len(SNIPPETS) >= 2


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs(index, capsys):
    import torch

    torch.manual_seed(0)
    exec(compile(SNIPPETS[index], f"README.md snippet {index}", "exec"), {})
    assert capsys.readouterr().out.strip()  # each snippet prints what it shows


def test_readme_commands_are_the_ones_ci_runs():
    text = README.read_text(encoding="utf-8")
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert "python -m pytest -q" in text and "python -m pytest -q" in ci
    assert "inftyformer train sorting" in text
