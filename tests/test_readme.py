"""The Python snippets of the README and of the guides that run without a converted model are
executed as they are: they must stay true."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
GUIDES = [README.parent / "docs" / name for name in ("training.md", "retrieval_guide.md")]
SNIPPETS = [
    (f"{path.relative_to(README.parent)} snippet {i}", code)
    for path in (README, *GUIDES)
    for i, code in enumerate(re.findall(r"```python\n(.*?)```", path.read_text("utf-8"), re.DOTALL))
]


def test_readme_and_guides_have_snippets():
    where = [name.split(" ")[0] for name, _ in SNIPPETS]
    assert where.count("README.md") >= 3  # the three quick starts
    assert all(str(g.relative_to(README.parent)) in where for g in GUIDES)


@pytest.mark.parametrize("index", range(len(SNIPPETS)), ids=[name for name, _ in SNIPPETS])
def test_readme_snippet_runs_and_warns_nothing(index, capfd):
    """Runs as written, prints what it shows, and no warning appears that a reader did not
    cause: neither a Python warning nor a library's log line (transformers logs its warnings
    once per message, so that cache is cleared first)."""
    import logging
    import warnings

    import torch

    try:
        from transformers.utils import logging as hf_logging

        hf_logging.warning_once.cache_clear()
    except ImportError:
        pass
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    library = logging.getLogger("transformers")
    library.addHandler(handler)
    torch.manual_seed(0)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            name, code = SNIPPETS[index]
            exec(compile(code, name, "exec"), {})
    finally:
        library.removeHandler(handler)
    out, err = capfd.readouterr()
    assert out.strip()  # each snippet prints what it shows
    assert [str(w.message) for w in caught] == []
    assert [r.getMessage() for r in records] == []
    assert err == ""


def test_readme_commands_are_the_ones_ci_runs():
    text = README.read_text(encoding="utf-8")
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert "python -m pytest -q" in text and "python -m pytest -q" in ci
    assert "inftyformer train sorting" in text
    first = re.search(r"```bash\n(.*?)\s+#", text).group(1)  # the README's first command
    pin = re.search(r'"torch==([\d.]+)"', ci).group(1)  # what CI installs first
    assert first == f'pip install torch=={pin} -e ".[dev]"'
    assert 'pip install -q -e ".[dev]"' in ci


def test_readme_sets_up_cpu_and_gpu_machines_alike_pinned():
    """A CPU-only machine takes torch from PyTorch's CPU index, the index CI falls back to; the
    GPU line takes PyPI's build; both pin the torch CI tests."""
    text = README.read_text(encoding="utf-8")
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    pin = re.search(r'"torch==([\d.]+)"', ci).group(1)
    cpu_index = re.search(r"--index-url (https://download\.pytorch\.org/whl/cpu)\b", ci).group(1)
    lines = [line.strip() for line in text.splitlines()]
    cpu = f'pip install torch=={pin} --index-url {cpu_index} && pip install -e ".[dev]"'
    assert cpu in lines
    gpu = [line for line in lines if line.startswith(f'pip install torch=={pin} -e ".[dev]" && ')]
    assert gpu and "torch.cuda.is_available()" in gpu[0]
