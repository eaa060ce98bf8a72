"""Does a block score pick the asked fact among alike ones? The rank of the asked needle's block
among all stored blocks when the question's call scores them, under each of RetrievalLM's block
scores ("max", "mean", "attention"), on the multi-key needles of `experiments/retrieval.py`.

For each question: the passage is read by a retrieval preset (the window and the store as it
leaves them), then the question's call runs as `RetrievalLM.generate` runs it (`reselect`); its
queries at the choosing block are scored against every stored block by each score
(`RetrievalLM.block_scores`). The asked needle's number lies in one or two stored blocks (its
rank: the best of them, 0 = first); a question whose number is in the window or the sink is
counted apart. Reported per score: the share of questions whose needle's block ranks first, and
the share where it ranks above every other needle's block (the distractors), with 95% Wilson
intervals, and the median rank. Answers are not written here: `docs/retrieval.md` has them.

    python experiments/retrieval_rank.py --lengths 4096,16384 --passages 10 --seed 1
    python experiments/retrieval_rank.py --quick --out /tmp/k              # tiny random model

Cells OUT/retrieval_rank.cells/PRESET-LENGTH-sSEED.json (a cell already there is skipped);
OUT/retrieval_rank.json gathers them; OUT/retrieval_rank.md is rendered from it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from retrieval import load_run, passage_arguments, passages, question_groups, run_setup, wilson
from retrieval_where import find

from inftyformer._measure import kept_notes, machine_info, write_json, write_text
from inftyformer.retrieval.config import SCORES

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs"
NAME = "retrieval_rank"


class LastQuery:
    """The queries [b, H, T, d] of the last choice `model` made (its `select` wrapped on this
    instance only)."""

    def __init__(self, model) -> None:
        self.query, self._select = None, model.select

        def select(state, query):
            self.query = query
            return self._select(state, query)

        model.select = select


def needle_slots(passage: list[int], answers: list[list[int]], state, row: int, block: int):
    """For each needle of a passage: the stored slots [b] holding its number, or None when the
    number lies in the sink or the window (or is not found)."""
    S, length = int(state.sink_len[row]), int(state.tokens[row])
    end = length - int(state.window_len[row])  # the window starts here
    out = []
    for answer in answers:
        span = find(passage, answer)
        if span is None or span.start < S or span.stop > end:
            out.append(None)
        else:
            out.append(sorted({(t - S) // block for t in span}))
    return out


def ranks(score: torch.Tensor, slots: list, asked: int) -> dict:
    """Rank of the asked needle's best slot among all (0: first) under `score` [n], and whether
    it ranks above every other needle's stored slots."""
    order = score.argsort(descending=True).tolist()
    place = {slot: i for i, slot in enumerate(order)}
    rank = min(place[s] for s in slots[asked])
    others = [min(place[s] for s in sl) for j, sl in enumerate(slots) if j != asked and sl]
    return {"rank": rank, "above_distractors": all(rank < o for o in others)}


@torch.no_grad()
def run_cell(preset: str, length: int, args, base, tokenizer, filler: list[int]) -> dict:
    from inftyformer.retrieval.model import RetrievalLM

    data = passages(tokenizer, filler, length, args.passages, args.needles, args.seed)
    start = time.perf_counter()
    model = RetrievalLM(base, preset=preset).eval()
    last = LastQuery(model)
    state = model(torch.stack([p for p, _ in data]), logits_to_keep=1).state
    B = model.config.block_size
    slots = [
        needle_slots(p.tolist(), [a for _, a in qs], state, i, B)
        for i, (p, qs) in enumerate(data)
    ]  # fmt: skip
    samples = []
    for j, members, question, _ in question_groups(data):
        part = state.select_rows(members)
        model(question, part, reselect=True, logits_to_keep=1)
        scores = {s: model.block_scores(part, last.query, s) for s in SCORES}  # [b, n] each
        for k, i in enumerate(members):
            if slots[i][j] is None:
                samples.append({"passage": i, "question": j, "stored": False})
                continue
            n = int(state.blocks[i])
            by = {s: ranks(scores[s][k, :n], slots[i], j) for s in SCORES}
            samples.append({"passage": i, "question": j, "stored": True, "scores": by})
    state.store.close()
    return {"preset": preset, "length": length, "seed": args.seed, "passages": len(data),
            "needles": args.needles, "samples": samples,
            "seconds": time.perf_counter() - start}  # fmt: skip


def summary(cell: dict) -> dict:
    """Per score: first and above-every-distractor counts over the stored questions, their
    Wilson intervals and the median rank."""
    stored = [s for s in cell["samples"] if s["stored"]]
    n, out = len(stored), {}
    for score in SCORES:
        first = sum(s["scores"][score]["rank"] == 0 for s in stored)
        above = sum(s["scores"][score]["above_distractors"] for s in stored)
        median = statistics.median(s["scores"][score]["rank"] for s in stored) if n else None
        out[score] = {"first": first, "first_interval": wilson(first, n), "above": above,
                      "above_interval": wilson(above, n), "median_rank": median}  # fmt: skip
    return {"stored": n, "questions": len(cell["samples"]), "scores": out}


def share(k: int, n: int, interval: list[float]) -> str:
    return f"{k}/{n} [{interval[0]:.2f}, {interval[1]:.2f}]"


def render(data: dict, notes: str = "") -> str:
    lines = [
        "# Does the block score pick the asked fact? Ranks of the asked needle's block",
        "",
        f"Base model `{data['setup']['base_model']}`; the multi-key needles of "
        "`experiments/retrieval.py` (5 needles a passage, one question each, the others its "
        "distractors). For each question whose number lies in a stored block: the rank of "
        "that block among all stored blocks when the question's call scores them "
        "(`RetrievalLM.block_scores`), per score: ranked first, ranked above every "
        "distractor's block (share [95% Wilson interval]), median rank (0 = first). Scores: "
        "`max` a block's best query·key over the call's queries, heads and its tokens; `mean` "
        "the mean over queries of that best; `attention` a block's best softmax weight from any "
        "query and head over the whole store. Rendered from `retrieval_rank.json` by "
        "`experiments/retrieval_rank.py`.",
        "",
        "| preset | length | seed | stored / questions | score | first | above every distractor "
        "| median rank |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for key in sorted(data["cells"], key=lambda k: (data["cells"][k]["length"], k)):
        cell = data["cells"][key]
        s = summary(cell)
        for score in SCORES:
            r, n = s["scores"][score], s["stored"]
            first = share(r["first"], n, r["first_interval"])
            above = share(r["above"], n, r["above_interval"])
            lines.append(
                f"| {cell['preset']} | {cell['length']:,} | {cell['seed']} | "
                f"{n}/{s['questions']} | {score} | {first} | {above} | {r['median_rank']} |"
            )
    lines += ["", f"Machine: {data['machine'].get('cpu', '?')}", ""]
    if notes:
        lines += [notes, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="4096")
    p.add_argument("--presets", default="retrieval-near")
    passage_arguments(p, threads=1)
    args = p.parse_args(argv)
    if args.quick and Path(args.out).resolve() == OUT.resolve():
        p.error("--quick needs an --out of its own (its tiny model's cells are not docs/'s)")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    cells_dir = out / f"{NAME}.cells"
    base_dir = run_setup(args)
    ran = False
    if not args.render_only:
        tokenizer, filler, base = load_run(args, base_dir)
        cells_dir.mkdir(parents=True, exist_ok=True)
        for length in (int(x) for x in args.lengths.split(",")):
            for preset in args.presets.split(","):
                path = cells_dir / f"{preset}-{length}-s{args.seed}.json"
                if path.exists():
                    continue
                cell = run_cell(preset, length, args, base, tokenizer, filler)
                write_json(path, cell)
                ran = True
                s = summary(cell)
                print(f"{preset} {length}: {s['stored']}/{s['questions']} stored, "
                      + ", ".join(f"{k} first {v['first']}" for k, v in s["scores"].items()),
                      flush=True)  # fmt: skip
    cells = {p.stem: json.loads(p.read_text()) for p in sorted(cells_dir.glob("*.json"))}
    last = out / f"{NAME}.json"
    machine = (
        machine_info() if ran or not last.exists() else json.loads(last.read_text())["machine"]
    )
    data = {"setup": {"base_model": Path(base_dir).name}, "cells": cells, "machine": machine}
    write_json(last, data)
    write_text(out / f"{NAME}.md", render(data, kept_notes(out / f"{NAME}.md")))


if __name__ == "__main__":
    main()
