"""The comparison reports: the JSON every Markdown report and plot is rendered from (`report`,
`load_report`, `write_report`), the hand-kept notes beside it, the cost line, and the pieces of
the tables (mean ± standard deviation, Markdown tables)."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from inftyformer._files import write_atomic
from inftyformer._measure import command_line, machine_info

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"  # the results pages a user reads
NOTES = ROOT / "experiments" / "notes"  # the notes kept by hand on each study
FORMAT = 2  # layout of the report JSON (format 1: the scripts before this module)


def report(
    name: str, setup: dict, variants: dict, data: dict, runs: list, workers: int, elapsed: float
) -> dict[str, Any]:
    """The report JSON: everything the Markdown and the plots are rendered from."""
    command = command_line().replace(str(ROOT) + "/", "")
    meta = dict(command=command, machine=machine_info(), workers=workers, elapsed_seconds=elapsed)
    head = dict(format=FORMAT, experiment=name, setup=setup, variants=variants, data=data)
    return head | {"meta": meta, "runs": runs}


def load_report(path: Path) -> dict[str, Any]:
    if not Path(path).exists():
        raise SystemExit(f"no report to render: {path} does not exist")
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if data.get("format") != FORMAT:
        raise SystemExit(f"{path} is not in report format {FORMAT}: run the experiment again")
    return data


def write_report(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=1, ensure_ascii=False) + "\n")  # whole or nothing


def hand_notes(report_md: Path) -> str:
    """A results page's pointer to the notes kept by hand on its study (what the numbers mean,
    what was tried and dropped): docs/results/X.md (or docs/results/X/NAME.md) points to
    experiments/notes/X.notes.md, which stays out of the pages a user reads. A page written
    outside docs/results (a --quick or --out run) takes its notes verbatim from beside it."""
    try:
        where = report_md.parent.resolve().relative_to(RESULTS.resolve()).parts
    except ValueError:
        beside = report_md.with_suffix(".notes.md")
        return beside.read_text(encoding="utf-8").strip() if beside.exists() else ""
    name = f"{where[-1] if where else report_md.stem}.notes.md"
    if not (NOTES / name).exists():
        return f"(no notes yet: write them by hand in `experiments/notes/{name}`)"
    link = "../" * (len(where) + 2) + f"experiments/notes/{name}"
    return (
        "Notes kept by hand on this study (what the numbers mean, what was tried and dropped): "
        f"[experiments/notes/{name}]({link})."
    )


def cost_line(data: dict[str, Any]) -> str:
    """What the runs cost and how they were made, from the report alone."""
    meta, runs = data["meta"], data["runs"]
    cpu = [r.get("cpu_seconds") for r in runs]
    text = f"- Cost: {len(runs)} runs, {meta['workers']} in parallel (one thread each)"
    if runs and None not in cpu:
        text = (
            f"- Cost: the {len(runs)} runs took {sum(cpu) / 60:.1f} CPU-minutes (one thread each),"
            f" i.e. {sum(cpu) / 60 / meta['workers']:.1f} min of wall time with {meta['workers']}"
            " in parallel"
        )
    machine = meta.get("machine", {})
    text += f" on {machine.get('cpu', 'a machine')}"
    if machine.get("logical_cpus"):
        text += f" ({machine['logical_cpus']} logical CPUs)"
    if meta.get("elapsed_seconds") is None:  # not recorded (a report converted from format 1)
        text += ", on a shared machine."
    else:
        text += (
            "; elapsed across the invocations that produced them (finished runs are reused when "
            f"the script is restarted): {meta['elapsed_seconds'] / 60:.1f} min, on a shared "
            "machine."
        )
    return text + (f" Made by `{meta['command']}`." if meta.get("command") else "")


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value) of the finite values; NaN if none."""
    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return math.nan, math.nan
    return statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0


def fmt_mean_std(values: Iterable[float], digits: int = 3) -> str:
    """'0.236 ± 0.003', or '–' when there is no value."""
    mean, std = mean_std(values)
    return "–" if math.isnan(mean) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], numeric_from: int = 1) -> str:
    """A Markdown table whose columns from `numeric_from` on are right-aligned."""
    align = ["---" if i < numeric_from else "---:" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])
