"""scripts/check_links.py: every relative link of the README and the documents resolves, and
every repository path they name exists (or a line says it is in git history)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("links", ROOT / "scripts" / "check_links.py")
links = importlib.util.module_from_spec(spec)
spec.loader.exec_module(links)


def test_every_link_and_named_path_of_the_documents_resolves():
    documents = links.documents()
    assert ROOT / "README.md" in documents and ROOT / "docs" / "index.md" in documents
    assert [line for path in documents for line in links.broken(path)] == []


def test_the_checker_finds_a_broken_link_a_missing_heading_and_a_missing_path(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "here.py").write_text("")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "# Title\n\n## Two words\n\n[ok](page.md#two-words) [gone](missing.md) "
        "[anchor](page.md#nowhere) [web](https://example.org/x)\n"
        "`src/here.py` `src/gone.py` `src/NAME.py`\n"
        "`src/old.py` is in git history at commit 5cd6d91\n"
        "```\n[in a fence](fenced.md)\n```\n"
    )
    assert links.broken(page, tmp_path) == [
        "docs/page.md: link to missing.md: no such file",
        "docs/page.md: link to page.md#nowhere: no such heading",
        "docs/page.md: names `src/gone.py`, which does not exist",
    ]
