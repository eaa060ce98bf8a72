"""`inftyformer._files`: every file the library writes appears whole or not at all."""

from __future__ import annotations

import pytest

from inftyformer._files import atomic_path, write_atomic


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "a.json"
    write_atomic(path, "old")
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]
    write_atomic(path, "new ∞".encode(), durable=True)
    assert path.read_text(encoding="utf-8") == "new ∞"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_a_directory_appears_whole_or_not_at_all(tmp_path):
    out = tmp_path / "model"
    with pytest.raises(KeyboardInterrupt), atomic_path(out) as tmp:
        tmp.mkdir()
        (tmp / "config.json").write_text("{}")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    with atomic_path(out) as tmp:
        tmp.mkdir()
        (tmp / "config.json").write_text("{}")
        assert not out.exists()  # nothing visible before the block ends
    assert [p.name for p in out.iterdir()] == ["config.json"]
