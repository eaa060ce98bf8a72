"""Every relative link of the README and the documents resolves, and every repository path they
name in backticks exists.

    python scripts/check_links.py        # prints each broken link or path; exit 1 if any

Checked: README.md, docs/**/*.md and experiments/notes/*.md. A Markdown link `[text](target)` to
no URL is resolved against its file's folder (a `#fragment` must name a heading of the target);
a path in backticks that starts with one of the repository's folders (`docs/`, `experiments/`,
`benchmarks/`, `scripts/`, `src/`, `tests/`) is resolved against the repository's root, unless it
holds a placeholder (NAME, X, …) or a wildcard, or a line of the document says it is in git
history ("git history at commit …": a dropped study's script). Paths outside those folders (a
run's own `runs/…`) are not checked.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
CODE_PATH = re.compile(r"`((?:docs|experiments|benchmarks|scripts|src|tests)/[^`\s]+)`")
HISTORY = "git history at commit"  # a line saying where a dropped file can still be read
FENCE = re.compile(r"```.*?```", re.DOTALL)
PLACEHOLDER = re.compile(r"[*{}<>]|\b(NAME|X|Y|ROW|TASK|LENGTH|OUT|DIR|RUN|N)\b|\.\.\.|…")


def documents(root: Path = ROOT) -> list[Path]:
    return [
        root / "README.md",
        *sorted((root / "docs").rglob("*.md")),
        *sorted((root / "experiments" / "notes").glob("*.md")),
    ]


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {anchor(m) for m in re.findall(r"^#+\s+(.*)$", text, re.MULTILINE)}


def broken(path: Path, root: Path = ROOT) -> list[str]:
    """What in `path` does not resolve, one line each."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    out = []
    for m in LINK.finditer(text):
        target = m.group(1) or m.group(2)
        if re.match(r"[a-z]+:", target):  # a URL
            continue
        file, _, fragment = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists():
            out.append(f"{path.relative_to(root)}: link to {target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            out.append(f"{path.relative_to(root)}: link to {target}: no such heading")
    dropped = {  # files a line says were dropped, kept in git history
        m.group(1)
        for line in text.splitlines()
        if HISTORY in line
        for m in CODE_PATH.finditer(line)
    }
    for m in CODE_PATH.finditer(text):
        named = m.group(1).split("::")[0].rstrip(".,:;)")
        if PLACEHOLDER.search(named) or m.group(1) in dropped:
            continue
        if not (root / named).exists():
            out.append(f"{path.relative_to(root)}: names `{named}`, which does not exist")
    return out


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    problems = [line for path in documents() for line in broken(path)]
    print("\n".join(problems) if problems else f"{len(documents())} documents: every link resolves")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
