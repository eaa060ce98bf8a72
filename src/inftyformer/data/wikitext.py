"""WikiText's layout: articles under top-level headings `` = Title = `` (sub-headings look like
`` = = Sub = = ``), in its files and in its Hugging Face dataset's rows alike."""

from __future__ import annotations

import re

_WIKITEXT_TITLE = re.compile(r"^ = ([^=].*) = $")


def split_wikitext(text: str) -> list[tuple[str, str]]:
    """(title, article text) pairs, split at top-level headings `` = Title = ``.

    Text before the first heading (if any, and not blank) becomes a document titled "".
    """
    docs: list[tuple[str, list[str]]] = []
    for line in text.splitlines(keepends=True):
        match = _WIKITEXT_TITLE.match(line.rstrip("\r\n"))
        if match is not None:
            docs.append((match.group(1).strip(), [line]))
        elif docs:
            docs[-1][1].append(line)
        elif line.strip():
            docs.append(("", [line]))
    return [(title, "".join(lines)) for title, lines in docs]
