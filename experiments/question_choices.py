"""How a question chooses, side by side on the same reads: each RULER prompt's context is read
once (the calls of a stream, the `retrieval` preset's, which every row here makes alike: the
rows differ only in the prompt's last call, the question's) and saved as a session; the
question is then answered by each row from that session. The answers are lm_eval's for the
same row, prompt by prompt (`experiments/ruler.py`, whose rows of these names these are: the
page counts where both have an answer and where they agree), at the cost of one read for all
the rows: a choice is tried on 25 prompts of 8K in minutes, not an hour.

    python experiments/question_choices.py --tasks niah_single_2_books,niah_multikey_1_books \\
        --lengths 8192 --limit 25 --base-model models/smollm2-135m
    python experiments/question_choices.py --render-only
    python experiments/question_choices.py --quick --out /tmp/q          # a tiny random model

Sessions go to --sessions (one folder per prompt, ~25 MiB per 1K tokens of SmolLM2-135M; kept,
so that a row added later reads nothing again). Each answer is a line of OUT/answers.jsonl as it
is made (a run cut short goes on from there); OUT/question_choices.json gathers the cells (RULER's
score, its 95% Wilson interval, the prompts) with each row's exact McNemar test against the
first row on the same prompts, and OUT/question_choices.md is rendered from it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from _arguments import positive_int, positive_ints
from ask_documents import mcnemar
from retrieval import wilson

from inftyformer._measure import (
    default_base_model,
    kept_notes,
    machine_info,
    write_json,
    write_text,
)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "results" / "question_choices"
READER = "retrieval"  # the preset every row is: its stream's calls are every row's
MIDDLE = "middle"  # the base's middle block, where a question chose before question_select_layer
SHORTLISTED = {"choice": "question", "question_shortlist": 8,  # as measured before 0 (WHAT)
               "question_select_layer": MIDDLE}  # fmt: skip
ROWS = {  # row: its settings on top of READER (the names of experiments/ruler.py's rows)
    "packed": {"choice": "max"},
    "question-first": {**SHORTLISTED, "question_window": None, "question_blocks": 2,
                       "question_layout": "stream"},
    "question-cut": {**SHORTLISTED, "question_blocks": 2, "question_layout": "stream"},
    "question-2-leads": {**SHORTLISTED, "question_layout": "stream"},
    "question-nearest": SHORTLISTED,
    "retrieval-question": {"choice": "question", "question_select_layer": MIDDLE},
    "question-1-lead": {**SHORTLISTED, "question_blocks": 2},
    "question-late": {"choice": "question"},
}  # fmt: skip
WHAT = {
    "packed": "the packed choice (`choice=max`, the default preset's until it chose questions): "
    "its question reads the 16 blocks its queries match best and the last 960 tokens, as its "
    "stream does",
    "question-first": "choice `question` as first measured: the question reads the block its "
    "last 32 queries give the most attention weight among the 8 of best q · k "
    "(`question_shortlist=8`), with the block after it, and the whole window",
    "question-cut": "that, its window cut to the last 256 tokens first, the older whole blocks "
    "stored among those it chooses from (`question_window=256`)",
    "question-2-leads": "that, reading the 2 best blocks, each with the block after it, in "
    "stream order (`question_blocks=4`)",
    "question-nearest": "that, the best block read last, next to the window "
    "(`question_layout=nearest`)",
    "retrieval-question": "that, choosing among all stored blocks (no shortlist by q · k: "
    "`question_shortlist=0`, as `retrieval-picked` chooses): `choice=question` as it was "
    "before question-late",
    "question-1-lead": "question-nearest reading its best block with the block after it only "
    "(`question_blocks=2`)",
    "question-late": "retrieval-question choosing at a later block of the base than its stream "
    "does: its queries of block 18 of 30 (three fifths of the base's blocks, "
    "`question_select_layer`'s default) against the stored keys of that block, read from the "
    "store; the rows above choose at the middle block, 15, where the stream chooses: the "
    "default preset, `retrieval`",
}


AT = "question-at-"  # a row question-at-L: `question-late` choosing at block L of the base


def row_settings(row: str) -> dict | None:
    """The settings of `row` on top of READER (ROWS, or question-at-L); None: no such row."""
    if row.startswith(AT) and row[len(AT) :].isdigit():
        return {"choice": "question", "question_select_layer": int(row[len(AT) :])}
    return ROWS.get(row)


def what(row: str) -> str:
    """What `row` reads, for the page."""
    if row.startswith(AT):
        return f"question-late choosing at block {row[len(AT) :]} (`question_select_layer`)"
    return WHAT.get(row, row)


def last_call(tokens: int, segment_len: int) -> int:
    """Where the prompt's last call starts as `RetrievalLM(ids, reselect=True)` streams it."""
    return ((tokens - 1) // segment_len) * segment_len


def saved_read(reader, ids: list[int], folder: Path, kind: str = "document") -> Path:
    """`ids` read by `reader` (the READER preset's stream) and saved to `folder` as a session of
    `kind` (once: a folder holding a session is used as it is)."""
    from inftyformer.retrieval.ask import read
    from inftyformer.retrieval.session import ModelKey, SessionInfo, is_session, save_session

    if not is_session(folder):
        info = SessionInfo(kind, ModelKey.of(None, READER, {}, reader.config))
        save_session(folder, read(reader, ids), info).store.close()
    return folder


def session_of(record: dict, reader, folder: Path) -> Path:
    """The prompt's context (all but its last call) read by `reader`, saved to `folder`."""
    ids = record["input_ids"]
    return saved_read(reader, ids[: last_call(len(ids), reader.config.segment_len)], folder)


def answer_of(model, tokenizer, record: dict, folder: Path, max_gen_toks: int) -> dict:
    """The row's answer to the prompt's question from the saved context, cut and scored as
    lm_eval's RULER task cuts and scores it."""
    from lm_eval.tasks.ruler.common_utils import postprocess_pred, string_match_all

    from inftyformer.integrations.ruler_lm import cut_at_stops, generation_settings
    from inftyformer.retrieval.ask import answer
    from inftyformer.retrieval.session import load_session

    stops, count = generation_settings(record["generation"])
    state, _ = load_session(folder, model, read_only=True)
    ids = record["input_ids"]
    start = time.perf_counter()
    eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    new, state = answer(model, ids[last_call(len(ids), model.config.segment_len) :], state,
                        stop=eos, max_new_tokens=min(count, max_gen_toks))  # fmt: skip
    state.store.close()
    written = cut_at_stops(tokenizer.decode(new), stops)
    score = string_match_all(postprocess_pred([written]), [record["expected"]])
    return {"written": written, "score": score, "seconds": time.perf_counter() - start}


def summarise(answers: list[dict], rows: list[str]) -> dict:
    """Per (row, task, length): the mean score, its interval and prompts; against the first
    row on the prompts both answered, b (this row right alone), c (the first row's) and the
    exact McNemar p."""
    cells = {}
    first = rows[0]
    by = {(a["row"], a["task"], a["length"], a["prompt_hash"]): a["score"] for a in answers}
    for row, task, length in sorted({(a["row"], a["task"], a["length"]) for a in answers}):
        scores = {h: s for (r, t, n, h), s in by.items() if (r, t, n) == (row, task, length)}
        k = sum(scores.values())
        cell = {"row": row, "task": task, "length": length, "score": k / len(scores),
                "samples": len(scores), "interval": wilson(k, len(scores))}  # fmt: skip
        if row != first:
            pairs = [(s, by[(first, task, length, h)]) for h, s in scores.items()
                     if (first, task, length, h) in by]  # fmt: skip
            b = sum(1 for s, f in pairs if s >= 1 > f)
            c = sum(1 for s, f in pairs if f >= 1 > s)
            cell["paired"] = {"against": first, "prompts": len(pairs), "b": b, "c": c,
                              "p": mcnemar(b, c)}  # fmt: skip
        cells[f"{row}-{task}-{length}"] = cell
    return cells


def agreement(answers: list[dict], ruler_cells: Path) -> dict:
    """Per (row, task, length) with an lm_eval cell of that row in `ruler_cells`: the prompts
    both answered and those whose written answers are the same."""
    out = {}
    for path in sorted(ruler_cells.glob("*.json")) if ruler_cells.is_dir() else []:
        cell = json.loads(path.read_text())
        theirs = {a["prompt_hash"]: a["written"] for a in cell.get("answers", [])}
        ours = [a for a in answers if (a["row"], a["task"], a["length"]) ==
                (cell.get("row"), cell.get("task"), cell.get("length"))]  # fmt: skip
        both = [a for a in ours if a["prompt_hash"] in theirs]
        if both:
            same = sum(a["written"] == theirs[a["prompt_hash"]] for a in both)
            out[path.stem] = {"prompts": len(both), "same": same}
    return out


DEFAULT_ROW = "question-late"  # the settings of the default preset, `retrieval`


def default_cells(answers: list[dict], limit: int, max_gen_toks: int) -> dict[str, dict]:
    """RULER cells of the row `retrieval` (the default preset) from DEFAULT_ROW's answers of each
    (task, length) with at least `limit` prompts, in `experiments/ruler.py`'s cell format (its
    first `limit` prompts, as lm_eval takes them), named as that script names them."""
    cells = {}
    for task, length in sorted({(a["task"], a["length"]) for a in answers}):
        mine = [a for a in answers if (a["row"], a["task"], a["length"]) ==
                (DEFAULT_ROW, task, length)][:limit]  # fmt: skip
        if len(mine) < limit:
            continue
        k = sum(a["score"] for a in mine)
        cells[f"{READER}-{task}-{length}"] = {
            "row": READER, "task": task, "length": length, "model": "inftyformer-retrieval",
            "model_args": f"pretrained=MODEL_DIR,preset={READER}", "score": k / len(mine),
            "samples": len(mine), "interval": wilson(k, len(mine)), "max_gen_toks": max_gen_toks,
            "harness": f"experiments/question_choices.py, row {DEFAULT_ROW}: each prompt's "
            "context read once, its question answered from that read (lm_eval's answers, "
            "prompt by prompt, where both ran)",
            "answers": [{k: a[k] for k in ("prompt_hash", "written", "score")} for a in mine],
        }  # fmt: skip
    return cells


def shown(cell: dict, score: str, after: str = "") -> str:
    """A cell as the pages write it: `score` [its 95% interval]`after`, then its paired count
    against the first row and the exact McNemar p when it has one."""
    lo, hi = cell["interval"]
    text = f"{score} [{lo:.2f}, {hi:.2f}]{after}"
    if "paired" in cell:
        q = cell["paired"]
        text += f"; {q['b']} : {q['c']}, p = {q['p']:.2f}"
    return text


def render(data: dict, notes: str = "") -> str:
    cells, setup = data["cells"], data["setup"]
    rows = [r for r in setup["rows"] if any(c["row"] == r for c in cells.values())]
    keys = sorted({(c["task"], c["length"]) for c in cells.values()})
    lines = [
        "# How a question chooses: the rows side by side on the same reads",
        "",
        f"Base model `{setup['base_model']}`; lm_eval {setup['lm_eval']}'s RULER prompts (seed "
        f"{setup['seed']}), the first of each task and length. Each prompt's context was read "
        f"once by the `{READER}` preset's stream, which every row shares, and each row answered "
        "its question (the prompt's last call) from that read. Each cell: RULER's score [95% "
        "Wilson interval] (prompts); then, against the first row on the same prompts, the "
        "prompts only this row got right : only the first row got right, and the exact McNemar "
        f"p. Answers cut at {setup['max_gen_toks']} new tokens. Rendered from "
        "`question_choices.json` by `experiments/question_choices.py`.",
        "",
        "Rows: " + "; ".join(f"`{r}` {what(r)}" for r in rows) + ".",
        "",
        "| row | " + " | ".join(f"{t} {n:,}" for t, n in keys) + " |",
        "|---|" + "---:|" * len(keys),
    ]
    for row in rows:
        got = [cells.get(f"{row}-{task}-{length}") for task, length in keys]
        texts = [c and shown(c, f"{c['score']:.2f}", f" ({c['samples']})") for c in got]
        lines.append(f"| {row} | " + " | ".join(t or "–" for t in texts) + " |")
    agree = data.get("agreement", {})
    if agree:
        lines += ["", "Against lm_eval's answers (`experiments/ruler.py`'s cells of the same row):",
                  ""]  # fmt: skip
        lines += [f"- `{k}`: {v['same']} of {v['prompts']} answers the same" for k, v in
                  agree.items()]  # fmt: skip
    lines += ["", f"Machine: {data['machine'].get('cpu', '?')}", ""]
    if notes:
        lines += [notes, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--tasks", default="niah_single_2_books,niah_multikey_1_books")
    p.add_argument("--lengths", type=positive_ints, default=[8192])
    p.add_argument("--limit", type=positive_int, default=25)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-gen-toks", type=positive_int, default=32)
    p.add_argument("--base-model", default=None)
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--sessions", default="runs/question_sessions")
    p.add_argument("--ruler-cells", default=str(ROOT / "docs" / "results" / "ruler.cells"))
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--default-cells", action="store_true",
                   help=f"write the cells of row `{READER}` (the default) from {DEFAULT_ROW}'s "
                   "answers into --ruler-cells")  # fmt: skip
    quick = "a tiny random model, 2 prompts of 3,072 tokens of niah_single_1"
    p.add_argument("--quick", action="store_true", help=quick)
    args = p.parse_args(argv)
    rows = args.rows.split(",")
    for row in rows:
        if row_settings(row) is None:
            p.error(f"unknown row {row!r}; known: {', '.join(ROWS)}, {AT}L (block L)")
    out = Path(args.out)
    if args.quick:
        if out.resolve() == OUT.resolve():
            p.error("--quick needs an --out of its own (its tiny model's cells are not docs/'s)")
        from ruler import quick_model

        args.base_model = str(quick_model(out / "quick-model"))
        args.tasks, args.lengths, args.limit = "niah_single_1", [3072], 2
        args.sessions = str(out / "sessions")
    import lm_eval

    torch.set_num_threads(args.threads)
    base_dir = args.base_model or default_base_model()
    log = out / "answers.jsonl"
    answers = [json.loads(x) for x in log.read_text().splitlines() if x] if log.exists() else []
    if not args.render_only:
        answers = run(args, rows, base_dir, log, answers)
    setup = {"base_model": Path(base_dir).name, "seed": args.seed, "rows": rows,
             "lm_eval": lm_eval.__version__, "max_gen_toks": args.max_gen_toks,
             "quick": args.quick}  # fmt: skip
    last = out / "question_choices.json"
    machine = machine_info() if not args.render_only or not last.exists() else (
        json.loads(last.read_text())["machine"])  # fmt: skip
    data = {"setup": setup, "cells": summarise(answers, rows), "machine": machine,
            "agreement": agreement(answers, Path(args.ruler_cells))}  # fmt: skip
    write_json(last, data)
    write_text(out / "question_choices.md", render(data, kept_notes(out / "question_choices.md")))
    if args.default_cells:
        for name, cell in default_cells(answers, args.limit, args.max_gen_toks).items():
            write_json(Path(args.ruler_cells) / f"{name}.json", cell)


def run(args, rows: list[str], base_dir: str, log: Path, answers: list[dict]) -> list[dict]:
    """Every (task, length, prompt, row) not yet in `log` answered and appended to it."""
    from _ruler_report import middle_block
    from ruler import prompt_records, ruler_task
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from inftyformer.retrieval.model import RetrievalLM

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    mid = middle_block(base_dir)
    pinned = {r: {k: mid if v == MIDDLE else v for k, v in row_settings(r).items()} for r in rows}
    models = {row: RetrievalLM(base, preset=READER, **pinned[row]).eval() for row in rows}
    reader = RetrievalLM(base, preset=READER).eval()
    done = {(a["row"], a["task"], a["length"], a["prompt_hash"]) for a in answers}
    log.parent.mkdir(parents=True, exist_ok=True)
    for length in args.lengths:
        for task in args.tasks.split(","):
            made = ruler_task(task, length, base_dir, args.seed)
            for record in prompt_records(made, length, args.limit, tokenizer):
                key = (task, length, record["prompt_hash"])
                todo = [r for r in rows if (r, *key) not in done]
                if not todo:
                    continue
                folder = session_of(record, reader, Path(args.sessions) / key[2][:16])
                for row in todo:
                    got = answer_of(models[row], tokenizer, record, folder, args.max_gen_toks)
                    line = {"row": row, "task": task, "length": length,
                            "prompt_hash": key[2], **got}  # fmt: skip
                    answers.append(line)
                    with log.open("a", encoding="utf-8") as f:
                        f.write(json.dumps(line) + "\n")
                print(task, length, key[2][:8],
                      {a["row"]: a["score"] for a in answers[-len(todo):]}, flush=True)  # fmt: skip
    return answers


if __name__ == "__main__":
    main()
