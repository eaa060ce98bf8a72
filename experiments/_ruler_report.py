"""Pieces of docs/ruler.md that need none of experiments/ruler.py's tables: what the page says
of the answers' length, and each cell's peak resident memory."""

from __future__ import annotations


def cut_sentence(setup: dict) -> str:
    """What the page says of the answers' length (`--max-gen-toks`)."""
    cuts = setup.get("max_gen_toks") or [0]
    if cuts == [0]:
        return ""
    said = " or ".join("the task's own" if n == 0 else f"{n:,}" for n in cuts)
    return (
        f" Answers cut at {said} new tokens (lm_eval's RULER tasks allow 128; a needle's value "
        "is 7 digits or one UUID, and a model that answers goes on writing the haystack: the cut "
        "saves the CPU that text, for every row alike)."
    )


def memory_lines(cells: dict, tasks: tuple[str, ...]) -> list[str]:
    """A table of each cell's peak resident memory (MiB) by row and length, per task, for the
    cells that recorded it (`tasks` in this order); the change from a row's shortest length to
    its longest."""
    measured = [c for c in cells.values() if c.get("peak_rss_mb")]
    if not measured:
        return []
    lines = ["", "## Peak resident memory", "",
             "MiB, the peak of each cell's lm_eval run (the process's peak set back to its "
             "resident memory before the cell: model, prompts and generation); first → last: "
             "the change from a row's shortest length to its longest.", ""]  # fmt: skip
    for task in tasks:
        here = [c for c in measured if c["task"] == task]
        if not here:
            continue
        lengths = sorted({c["length"] for c in here})
        lines += [f"{task}:", "",
                  "| row | " + " | ".join(f"{n:,} tokens" for n in lengths) + " | first → last |",
                  "|---|" + "---:|" * (len(lengths) + 1)]  # fmt: skip
        for row in dict.fromkeys(c["row"] for c in here):
            by = {c["length"]: c["peak_rss_mb"] for c in here if c["row"] == row}
            got = [by[n] for n in lengths if n in by]
            change = f"{got[-1] / got[0] - 1:+.1%}" if len(got) > 1 else "–"
            shown = [f"{by[n]:,.0f}" if n in by else "–" for n in lengths]
            lines.append(f"| {row} | " + " | ".join(shown) + f" | {change} |")
        lines.append("")
    return lines[:-1]
