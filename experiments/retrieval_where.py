"""Where the asked fact was when the retrieval preset answered: in a block it chose, in its
window or sink, or not read at all, and how often the answer was right in each case.

The multi-key needles of `experiments/retrieval.py` (the same passages, questions and greedy
answers as its `retrieval` row): for each question, the question's call chooses its blocks
(`reselect`, as `RetrievalLM.generate` does) and we look up where the needle's number lies in
the stream: in the sink, in the window, in stored blocks the question chose (`chosen`: every
token of the number; `partly`: some), or in stored blocks it did not choose (`missed`). Which
of selection and reading fails, per preset and length:

    python experiments/retrieval_where.py --lengths 4096 --presets retrieval,retrieval-near
    python experiments/retrieval_where.py --tasks single --lengths 12288 --passages 25
    python experiments/retrieval_where.py --quick --out /tmp/w       # tiny random model

The tasks are `experiments/retrieval.py`'s `multikey` and `single` (one needle, no distractor).
Cells OUT/retrieval_where.cells/PRESET-LENGTH.json (multikey) and TASK-PRESET-LENGTH.json (a
cell already there is skipped);
OUT/retrieval_where.json gathers them; OUT/retrieval_where.md is rendered from it.
"""

from __future__ import annotations

import argparse
import json
import time
from itertools import product
from pathlib import Path

import torch
from retrieval import (
    load_run,
    passage_arguments,
    passages,
    question_groups,
    run_setup,
    wilson,
)

from inftyformer._measure import (
    kept_notes,
    machine_info,
    write_json,
    write_text,
)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs"
PLACES = ("sink", "window", "chosen", "partly", "missed", "unknown")
TASKS = ("multikey", "single")  # of experiments/retrieval.py's: those with a word's number


def place_of(span: range, state, row: int, chosen: list[int], model) -> str:
    """Where the tokens `span` of row `row`'s stream are read from after its prefill."""
    c = model.config
    B, S = c.block_size, int(state.sink_len[row])
    length = int(state.tokens[row])
    if span.start >= length - int(state.window_len[row]):
        return "window"
    if span.stop <= S:
        return "sink"
    stored = state.block_ids[row, : int(state.blocks[row])].tolist()
    blocks = {(t - S) // B for t in span if t >= S and t < length - int(state.window_len[row])}
    read = [stored[b] in chosen for b in blocks if b < len(stored)]
    if read and all(read):
        return "chosen"
    return "partly" if any(read) else "missed"


def find(passage: list[int], answer: list[int]) -> range | None:
    """The tokens of the number `answer` in the passage (its first occurrence)."""
    n = len(answer)
    for t in range(len(passage) - n + 1):
        if passage[t : t + n] == answer:
            return range(t, t + n)
    return None


@torch.no_grad()
def run_cell(
    preset: str, length: int, args, base, tokenizer, filler: list[int], task: str = "multikey"
) -> dict:
    from inftyformer.retrieval.model import RetrievalLM

    data = passages(tokenizer, filler, length, args.passages, args.needles, args.seed, task)
    start = time.perf_counter()
    ids = torch.stack([passage for passage, _ in data])
    model = RetrievalLM(base, preset=preset).eval()
    state = model(ids, logits_to_keep=1).state
    samples = []
    for j, members, question, rows in question_groups(data):
        part = state.select_rows(members)
        choice = model(question, part, reselect=True, logits_to_keep=1).state.selected
        count = max(len(rows[i][1]) for i in members)
        written, _ = model.generate(question, count, 0, state=part)
        for k, (i, new) in enumerate(zip(members, written.tolist(), strict=True)):
            answer = rows[i][1]
            span = find(data[i][0].tolist(), answer)
            where = "unknown" if span is None else place_of(
                span, state, i, choice[k].tolist(), model
            )  # fmt: skip
            samples.append({"passage": i, "question": j, "where": where,
                            "at": None if span is None else span.start,
                            "exact": new[: len(answer)] == answer})  # fmt: skip
    state.store.close()
    return {"task": task, "preset": preset, "length": length, "passages": len(data),
            "needles": len(data[0][1]), "samples": len(samples), "answers": samples,
            "seconds": time.perf_counter() - start}  # fmt: skip


def render(data: dict, notes: str = "") -> str:
    setup = data["setup"]
    lines = [
        "# Where the asked fact was: chosen, in the window, or missed",
        "",
        f"Base model `{setup['base_model']}`; the `retrieval` presets on the needles of "
        "`experiments/retrieval.py` (`multikey`: several needles per passage, one question per "
        f"needle; `single`: one needle, no distractor; seed {setup['seed']}; passages and "
        "needles per passage in the table). For each question: where the "
        "needle's number lies when the question's call has chosen its blocks, and whether the "
        "greedy answer was exact. Cells: right / questions [95% Wilson interval of the share]. "
        "Rendered from `retrieval_where.json` by `experiments/retrieval_where.py`.",
        "",
        "| task | passages × needles | preset | length | " + " | ".join(PLACES) + " | all |",
        "|---|---|---|---:|" + "---:|" * (len(PLACES) + 1),
    ]
    cells_ = data["cells"]
    for cell in cells_.values():  # cells of before the task column: multikey, the setup's counts
        cell.setdefault("task", "multikey")
        cell.setdefault("passages", setup["passages"])
        cell.setdefault("needles", setup["needles"])
    order = lambda k: (cells_[k]["task"], cells_[k]["preset"], cells_[k]["length"])  # noqa: E731
    for key in sorted(data["cells"], key=order):
        answers = data["cells"][key]["answers"]
        cells = []
        for place in (*PLACES, None):
            got = [a for a in answers if place is None or a["where"] == place]
            if not got:
                cells.append("–")
                continue
            right = sum(a["exact"] for a in got)
            low, high = wilson(right, len(got))
            cells.append(f"{right}/{len(got)} [{low:.2f}, {high:.2f}]")
        cell = cells_[key]
        head = f"| {cell['task']} | {cell['passages']} × {cell['needles']} | {cell['preset']} | "
        lines.append(head + f"{cell['length']:,} | " + " | ".join(cells) + " |")
    lines += ["", "```"]
    for task in sorted({c["task"] for c in cells_.values()}):
        group = [c for c in cells_.values() if c["task"] == task]
        lengths = ",".join(str(n) for n in sorted({c["length"] for c in group}))
        lines.append(f"python experiments/retrieval_where.py --tasks {task} --lengths {lengths} "
                     f"--presets {','.join(sorted({c['preset'] for c in group}))} "
                     f"--passages {max(c['passages'] for c in group)}")  # fmt: skip
    lines += ["```", "", f"Machine: {data['machine'].get('cpu', '?')}", ""]
    if notes:
        lines += [notes, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="4096")
    p.add_argument("--presets", default="retrieval", help="of the retrieval kind, with blocks")
    p.add_argument("--tasks", default="multikey", help=", ".join(TASKS))
    passage_arguments(p, threads=1)
    args = p.parse_args(argv)
    presets = args.presets.split(",")
    for task in args.tasks.split(","):
        if task not in TASKS:
            p.error(f"unknown task {task!r}; known: {', '.join(TASKS)}")
    if args.quick and Path(args.out).resolve() == OUT.resolve():
        p.error("--quick needs an --out of its own (its tiny model's cells are not docs/'s)")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    cells_dir = out / "retrieval_where.cells"
    base_dir = run_setup(args)
    ran = False
    if not args.render_only:
        tokenizer, filler, base = load_run(args, base_dir)
        cells_dir.mkdir(parents=True, exist_ok=True)
        tasks = args.tasks.split(",")
        for task, length, preset in product(tasks, map(int, args.lengths.split(",")), presets):
            name = f"{preset}-{length}" if task == "multikey" else f"{task}-{preset}-{length}"
            path = cells_dir / f"{name}.json"
            if path.exists():
                continue
            cell = run_cell(preset, length, args, base, tokenizer, filler, task)
            write_json(path, cell)
            ran = True
            print(f"{length}: {[(a['where'], a['exact']) for a in cell['answers']]}", flush=True)
    cells = {p.stem: json.loads(p.read_text()) for p in sorted(cells_dir.glob("*.json"))}
    last = out / "retrieval_where.json"
    machine = (
        machine_info() if ran or not last.exists() else json.loads(last.read_text())["machine"]
    )
    setup = {"base_model": Path(base_dir).name, "needles": args.needles,
             "passages": args.passages, "seed": args.seed}  # fmt: skip
    data = {"setup": setup, "cells": cells, "machine": machine}
    write_json(last, data)
    write_text(out / "retrieval_where.md", render(data, kept_notes(out / "retrieval_where.md")))


if __name__ == "__main__":
    main()
