"""RULER through lm-evaluation-harness: the base with its full context beside the retrieval-kind
presets, on lm_eval's own `ruler` tasks that run offline.

Rows (the same prompts for every row: lm_eval makes them from its seeds and the base's tokenizer):
    full       the base alone, lm_eval's `hf` model (only where the length fits its positions)
    window     the base with a KV cache of its last 2,048 tokens  (lm_eval model
    streaming  the first 64 tokens and the last 1,984               "inftyformer-retrieval",
    retrieval  the default: the context read as `packed`; its      `integrations.ruler_lm`)
               question reads the first 64, its 2 past blocks of most attention weight, each
               with the next, and the last 256 (`choice=question`)
    packed     the first 64, the 16 past blocks of 64 its queries match best and the last 960,
               the question too (`choice=max`: the default until it chose questions)
    retrieval-near  a retired preset (`_retired_presets`): the first 64, the 24 past blocks of
               64 its queries match best (the best last, right before the window), the last 448
    retrieval-picked  a retired preset: one fact read: the first 64, the block the last 32
               queries of the prompt's last call (the question's) give the most attention
               weight with the block after it, the last 256; the answer reads the
               question's blocks
    picked-all, picked-max, retrieval-question, question-first  variants of those rows
               (`VARIANTS`: preset and settings; what each reads: `ROW_WHAT`)
    paper      the paper's memory in every block of the base (`paper-gpt2`, untrained), saved as
               a memory model, run by lm_eval's `hf` model with trust_remote_code (--models-dir)

Tasks: lm_eval's RULER tasks whose data is made here without a download (`OFFLINE`); those left
out and why: `LEFT_OUT`. Lengths: lm_eval's `max_seq_lengths` metadata (prompt and answer, in
the base's tokens); one length per lm_eval run, so that `--limit` takes that many prompts of it.

    python experiments/ruler.py --lengths 4096,8192 --limit 25 --cache-dir runs/ruler-cache
    python experiments/ruler.py --render-only
    python experiments/ruler.py --quick --out /tmp/r                     # tiny random model
    python experiments/ruler.py --dump-prompts runs/ruler-prompts.jsonl --lengths 4096

Peer rows `kvpress_*` (NVIDIA's kvpress presses, each keeping 2,048 entries of the context): run
on the dumped prompts by `experiments/ruler_kvpress.py` in their own virtualenv
(`scripts/kvpress_env.sh`), rendered here beside the others.

Each (row, task, length) cell is written to OUT/ruler.cells/ROW-TASK-LENGTH.json as it finishes
(a cell already there is skipped, unless it holds fewer prompts than --limit); OUT/ruler.json
gathers them and OUT/ruler.md is rendered from it: RULER's score (the share of the expected
strings in the answer, averaged over prompts), its 95% Wilson interval and the prompt count.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import _ruler_report as parts
import torch
from _arguments import positive_int, positive_ints
from _retired_presets import NEAR, PICKED, PRESET, RETIRED, model_args
from _ruler_report import BOOK_TASKS, BOOKS, LEFT_OUT, ROW_WHAT, WHAT, cut_sentence, memory_lines
from retrieval import PRESET_ROWS as ROWS
from retrieval import plot_scores, score_table, wilson
from ruler_kvpress import PRESSES, peer_lines

from inftyformer._measure import (
    default_base_model,
    kept_notes,
    machine_info,
    peak_rss_mb,
    reset_peak_rss,
    rss_mb,
    write_json,
    write_text,
)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "results"
TASKS = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "ruler_vt")
OFFLINE = (*TASKS, "ruler_cwe", "ruler_fwe", *BOOK_TASKS)
QUICK_CORPUS = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
    "A special magic number is hidden within the following text. Make sure to memorize it. I "
    "will quiz you about the number afterwards. One of the special magic numbers for is: What "
    "is mentioned in the provided text? 0123456789 Memorize and track the chain(s) of variable "
    "assignment hidden in the following text. VAR ABCDEFGHIJKLMNOPQRSTUVWXYZ = Question: Find "
    "all variables that are assigned the value in the text above. Answer: According to the "
    "chain(s) of variable assignment in the text above, variables are assgined the value, they "
    "are: abcdefghijklmnopqrstuvwxyz-"
)


def stale(path: Path, args) -> bool:
    """A cell at `path` measured on fewer prompts than --limit asks for, or with answers of
    another length than --max-gen-toks (run again; a skipped cell stays skipped)."""
    cell = json.loads(path.read_text())
    if "samples" not in cell:
        return False
    return cell["samples"] < args.limit or cell.get("max_gen_toks") != args.max_gen_toks


# rows of settings on a preset (row: preset, settings): the retired presets (`_retired_presets`)
# and variants of the default and of them
VARIANTS = {NEAR: (PRESET, model_args(RETIRED[NEAR])),
            PICKED: (PRESET, model_args(RETIRED[PICKED])),
            "packed": ("retrieval", "choice=max"),
            "picked-all": (PRESET, model_args({**RETIRED[PICKED], "select_queries": 0})),
            "picked-max": (PRESET, model_args({**RETIRED[PICKED], "choice": "max"})),
            "retrieval-question": ("retrieval", "choice=question,question_select_layer={mid}"),
            "question-first": ("retrieval", "choice=question,question_blocks=2,question_window="
                               "None,question_layout=stream,question_shortlist=8,"
                               "question_select_layer={mid}")}  # fmt: skip
RULER_ROWS = (*ROWS, *VARIANTS, "paper")
PAPER_PRESET = "paper-gpt2"
WHOLE = 1 << 24  # lm_eval's max_length for a memory model: any prompt reaches it whole


def paper_model(base_dir: str | Path, folder: Path) -> Path:
    """The base with the paper's memory in every block (`PAPER_PRESET`, as wrapped: untrained)
    saved with its tokenizer to `folder`, as lm_eval's hf model loads a memory model (made once;
    a folder already holding one is used as it is)."""
    if (folder / "config.json").is_file():
        return folder
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from inftyformer.hf import add_long_term_memory

    base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    model = add_long_term_memory(base, preset=PAPER_PRESET)
    model.save_pretrained(str(folder))
    AutoTokenizer.from_pretrained(str(base_dir)).save_pretrained(str(folder))
    return folder


def model_of(row: str, base_dir: str, models_dir: str | Path | None = None) -> tuple[str, str]:
    """lm_eval's model name and model_args for `row` (`paper`: its saved model, made in
    `models_dir` if it is not there)."""
    if row not in RULER_ROWS:
        raise ValueError(f"no row {row!r}: the rows are {', '.join(RULER_ROWS)}")
    from inftyformer.integrations.harness import check_model_dir

    folder = check_model_dir(base_dir)
    if row == "full":  # lm_eval's hf model, every position of the base
        return "hf", f"pretrained={folder},dtype=float32,max_length={parts.base_positions(folder)}"
    if row == "paper":  # a memory model as a user runs one: the prompt streams through it
        if models_dir is None:
            raise ValueError("the paper row needs a folder for its saved model (--models-dir)")
        saved = check_model_dir(paper_model(base_dir, Path(models_dir) / PAPER_PRESET))
        return "hf", f"pretrained={saved},trust_remote_code=True,dtype=float32,max_length={WHOLE}"
    import inftyformer.integrations.ruler_lm as ruler_lm  # registers the model with lm_eval

    if row in VARIANTS:
        preset, settings = VARIANTS[row]
        if "{mid}" in settings:  # as measured (`middle_block`)
            settings = settings.format(mid=parts.middle_block(folder))
        return ruler_lm.NAME, f"pretrained={folder},preset={preset},{settings}"
    return ruler_lm.NAME, f"pretrained={folder},preset={row}"


def ruler_task(task: str, length: int, base_dir: str, seed: int):
    """lm_eval's `task` with its prompts of `length` made (500, as lm_eval makes them) from the
    seed and the base's tokenizer: made once, evaluated by every row."""
    import random

    import numpy as np

    random.seed(seed)  # the seeds lm_eval sets before it makes a task's data
    np.random.seed(seed)  # noqa: NPY002  (lm_eval's ruler_vt draws from numpy's global state)
    torch.manual_seed(seed)
    metadata = {"pretrained": str(base_dir), "max_seq_lengths": [length]}
    return ruler_tasks(metadata).load([task])["tasks"][task]


def ruler_tasks(metadata: dict | None = None):
    """lm_eval's task manager over its ruler folder and the books tasks' folder alone (indexing
    all of lm_eval's tasks takes seconds, each time)."""
    import lm_eval.tasks
    from lm_eval.tasks import TaskManager

    from inftyformer.integrations.ruler_haystack import TASKS_DIR

    folders = [str(Path(lm_eval.tasks.__file__).parent / "ruler"), str(TASKS_DIR)]
    return TaskManager(include_path=folders, include_defaults=False, metadata=metadata)


def question_start(prompt: str) -> int:
    """Where the question of a RULER prompt starts: after its last newline. Every template of
    lm_eval's RULER tasks ends with the question on a line of its own, the answer's opening
    (lm_eval's gen_prefix) after it: niah "What is the special magic number for KEY mentioned in
    the provided text? The special magic number for KEY mentioned in the provided text is",
    ruler_vt "Question: Find all variables that are assigned the value N in the text above.
    Answer: ... they are:" (cwe and fwe: "Question: ..." too); all before it is the context."""
    cut = prompt.rfind("\n")
    if cut < 0:
        raise ValueError("no newline in the prompt: RULER's question stands on a line of its own")
    return cut + 1


def prompt_records(task, length: int, limit: int, tokenizer) -> list[dict]:
    """The first `limit` prompts of `task` (`ruler_task`) as lm_eval hands them to a model: the
    request's text (its doc_to_text and gen_prefix joined by lm_eval itself), lm_eval's
    prompt_hash of it, its tokens as lm_eval's hf model encodes them (no special token added),
    how many of them are the context (the tokens that start before `question_start`), the
    expected strings and the generation settings."""
    import lm_eval
    from lm_eval.utils import hash_string

    task.build_all_requests(limit=limit, rank=0, world_size=1)
    records = []
    for instance in sorted(task.instances, key=lambda i: i.doc_id):
        prompt, settings = instance.args
        start = question_start(prompt)
        encoded = tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
        context = next((i for i, (a, _) in enumerate(offsets) if a >= start), len(ids))
        records.append({
            "task": task.config.task, "length": length, "doc_id": instance.doc_id,
            "prompt": prompt, "prompt_hash": hash_string(prompt), "question_start": start,
            "input_ids": ids, "context_tokens": context, "expected": instance.doc["outputs"],
            "ruler_length": instance.doc["length"], "generation": settings,
            "lm_eval": lm_eval.__version__,
        })  # fmt: skip
    return records


def dump_prompts(path: Path, tasks: list[str], lengths: list[int], args, base_dir: str) -> int:
    """`prompt_records` of every (task, length) written to `path` as JSON lines, for a model run
    outside lm_eval (`experiments/ruler_kvpress.py`); the count written."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(base_dir))
    lines = []
    for length in lengths:
        for name in tasks:
            made = ruler_task(name, length, base_dir, args.seed)
            lines += [json.dumps(r) for r in prompt_records(made, length, args.limit, tokenizer)]
    write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)


def without_paths(model_args: str, base_dir: str, models_dir: str | None) -> str:
    """`model_args` with no path of this machine: MODEL_DIR, PAPER_DIR."""
    if models_dir is not None:
        model_args = model_args.replace(str(Path(models_dir) / PAPER_PRESET), "PAPER_DIR")
    return model_args.replace(str(base_dir), "MODEL_DIR")


def run_cell(row: str, task, length: int, args, base_dir: str) -> dict:
    """One lm_eval run of `row` on `task` (`ruler_task`), the first `args.limit` prompts,
    scored per prompt."""
    import lm_eval

    limit = parts.base_positions(base_dir)
    if row == "full" and length > limit:
        return {"skipped": f"the prompts do not fit the base's {limit} positions"}
    model, model_args = model_of(row, base_dir, getattr(args, "models_dir", None))
    name = task.config.task
    from_start = not reset_peak_rss()  # the cell's own peak where the kernel allows it
    before = rss_mb()  # lm_eval's task data (its prompts of this length) made, no model yet
    start = time.perf_counter()
    cut = None if args.max_gen_toks is None else {"max_gen_toks": args.max_gen_toks}
    answered = None  # lm_eval's cache of answers: a cell cut short resumes from its last prompt
    if args.cache_dir:
        answered = str(Path(args.cache_dir) / f"{row}-{name}-{length}")
    result = lm_eval.simple_evaluate(
        model=model, model_args=model_args, tasks=[task], limit=args.limit, gen_kwargs=cut,
        use_cache=answered,
        batch_size=args.batch_size, device="cpu", log_samples=True, bootstrap_iters=0,
        task_manager=ruler_tasks(),
        random_seed=args.seed, numpy_random_seed=args.seed, torch_random_seed=args.seed,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    peak = {"peak_rss_mb": round(peak_rss_mb(), 1), "peak_rss_from_process_start": from_start,
            "rss_start_mb": round(before, 1)}  # fmt: skip
    answers = [
        {
            "expected": s["doc"]["outputs"],
            "written": s["filtered_resps"][0],
            "score": float(s[str(length)]),
            "ruler_length": s["doc"]["length"],
            "prompt_hash": s["prompt_hash"],
        }  # fmt: skip
        for s in result["samples"][name]
    ]
    n = len(answers)
    total = sum(a["score"] for a in answers)
    return {
        "row": row, "task": name, "length": length, "model": model,
        "model_args": without_paths(model_args, base_dir, getattr(args, "models_dir", None)),
        "score": total / n, "samples": n, "interval": wilson(total, n),
        "lm_eval_score": result["results"][name][f"{length},none"], "seconds": seconds,
        "max_gen_toks": args.max_gen_toks, **peak,
        "lm_eval": lm_eval.__version__, "answers": answers,
    }  # fmt: skip


PEERS = tuple(PRESSES)  # kvpress's rows, run by experiments/ruler_kvpress.py in a venv of its own


def rows_run(cells: dict) -> tuple[str, ...]:
    """The rows of RULER_ROWS and PEERS that have a cell: a row never run is left out of the
    tables, the plot and the page's list of rows."""
    have = {
        key.rsplit("-", 1)[0].removesuffix("-" + task)  # ROW-TASK-LENGTH
        for key in cells
        for task in OFFLINE
        if key.rsplit("-", 1)[0].endswith("-" + task)
    }
    return tuple(r for r in (*RULER_ROWS, *PEERS) if r in have)


def render(data: dict, notes: str = "") -> str:
    setup = data["setup"]
    ran = rows_run(data["cells"])
    peers = tuple(r for r in PEERS if r in ran)
    lines = [
        "# RULER through lm-evaluation-harness: the base, a KV cache and retrieval side by side",
        "",
        f"Base model `{setup['base_model']}`; lm_eval {setup['lm_eval']}'s RULER tasks (seed "
        f"{setup['seed']}), the first prompts of each length (the same prompts for every row; "
        "how many: each cell's last number). Each cell: RULER's score (the share of the "
        "expected strings found in the greedy answer, averaged over prompts) [95% Wilson "
        "interval of that share over the prompts] (prompts). Lengths in the base's tokens, "
        "prompt and answer (lm_eval's `max_seq_lengths`). Every row reads at most 2,048 places "
        "but `full`"
        + (" (the `kvpress_*` rows: 2,048 of the context, then the question)" if peers else "")
        + ". Rendered from `ruler.json` by `experiments/ruler.py`."
        + cut_sentence(setup),
        "",
        "Rows: "
        + "; ".join(f"`{r}` {ROW_WHAT[r]}" for r in ran if r in ROW_WHAT)
        + "."
        + (
            " Rows `kvpress_*`: NVIDIA's kvpress presses, each keeping 2,048 entries of the "
            "context (below)."
            if peers
            else ""
        ),
    ]
    for task in OFFLINE:
        keys = [k for k in data["cells"] if k.rsplit("-", 1)[0].endswith("-" + task)]
        if not keys:
            continue
        lengths = sorted({int(k.rsplit("-", 1)[1]) for k in keys})
        lines += ["", f"## {task}", "", WHAT[task] + ".", ""]
        lines += score_table(data["cells"], "{row}-" + task + "-{n}", lengths, "score", ran)
    lines += memory_lines(data["cells"], OFFLINE, ran)
    lines += peer_lines(data["cells"])
    lines += ["", "## What runs offline", "",
              "Run here (data made by lm_eval from its seeds and the base's tokenizer, nothing "
              "downloaded): " + ", ".join(f"`{t}`" for t in OFFLINE) + ".", "",
              "Left out:"]  # fmt: skip
    for why in dict.fromkeys(LEFT_OUT.values()):  # one line per reason
        names = ", ".join(f"`{t}`" for t, w in LEFT_OUT.items() if w == why)
        lines.append(f"- {names}: {why}")
    lines += ["", BOOKS]
    lines += ["", "Commands:", "", "```",
              f"python experiments/ruler.py --lengths {setup['lengths']} --limit {setup['limit']}"
              + "".join(f" --max-gen-toks {n}" for n in setup.get("max_gen_toks", []) if n)
              + (" --quick" if setup.get("quick") else ""),
              "python -m inftyformer.integrations.ruler_lm run --model inftyformer-retrieval \\",
              "    --model_args pretrained=MODEL_DIR,preset=retrieval --tasks niah_single_1 \\",
              "    --metadata '{\"max_seq_lengths\": [4096]}' --limit 5",
              "```", "", f"Machine: {data['machine'].get('cpu', '?')}", ""]  # fmt: skip
    if notes:
        lines += [notes, ""]
    return "\n".join(lines)


def quick_model(folder: Path) -> Path:
    """A tiny random Llama of 4,096 positions and its tokenizer (with an end-of-sequence token,
    as lm_eval's hf model needs), written to `folder` (the --quick run)."""
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_pretrained import write_tiny_model

    path = write_tiny_model(
        folder, corpus=(QUICK_CORPUS,) * 20, vocab_size=1000, max_positions=4096
    )
    settings = {"eos_token": "<|endoftext|>"}
    (path / "tokenizer_config.json").write_text(json.dumps(settings), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default=",".join(RULER_ROWS))
    p.add_argument("--tasks", help=f"of {', '.join(OFFLINE)} (default {', '.join(TASKS)})")
    p.add_argument("--lengths", type=positive_ints, default=[4096, 8192])
    p.add_argument("--limit", type=positive_int, default=25, help="prompts per task and length")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--max-gen-toks",
        type=positive_int,
        default=None,
        help="answers cut at this many new tokens (default: the task's, 128 for the needles)",
    )
    p.add_argument(
        "--cache-dir",
        default=None,
        help="lm_eval's cache of each cell's answers (one sqlite file per cell): a run cut "
        "short goes on from the prompts it answered",
    )
    p.add_argument("--batch-size", type=positive_int, default=1)
    p.add_argument("--base-model", default=None)
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--render-only", action="store_true")
    p.add_argument(
        "--models-dir",
        default="runs/ruler-models",
        help="where the paper row's saved memory model is made (once, ~0.6 GB for SmolLM2-135M)",
    )
    p.add_argument(
        "--dump-prompts",
        metavar="FILE",
        help="write the first --limit prompts of each task and length as lm_eval gives them to "
        "a model (JSON lines: text, tokens, context/question split, expected) and stop; the "
        "input of experiments/ruler_kvpress.py",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a tiny random model, 2 prompts of 3,072 tokens, "
        "niah_single_1 unless --tasks (its tokenizer is weak: lm_eval spins on ruler_vt's)",
    )
    args = p.parse_args(argv)
    quick_tasks = "niah_single_1" if args.quick else ",".join(TASKS)
    rows, tasks = args.rows.split(","), (args.tasks or quick_tasks).split(",")
    for name, given, known in (("row", rows, RULER_ROWS), ("task", tasks, OFFLINE)):
        for x in given:
            if x not in known:
                why = f" ({LEFT_OUT[x]})" if x in LEFT_OUT else ""
                if x in PEERS:
                    why = " (a kvpress row: experiments/ruler_kvpress.py)"
                p.error(f"unknown {name} {x!r}{why}; known: {', '.join(known)}")
    if args.quick and Path(args.out).resolve() == OUT.resolve():
        p.error("--quick needs an --out of its own (its tiny model's cells are not docs/'s)")
    torch.set_num_threads(args.threads)
    out, cells_dir = Path(args.out), Path(args.out) / "ruler.cells"
    if args.quick:
        args.base_model = str(quick_model(out / "quick-model"))
        args.models_dir = str(out / "quick-models")
        args.lengths, args.limit = [3072], 2
    base_dir = args.base_model or default_base_model()
    if args.dump_prompts:
        count = dump_prompts(Path(args.dump_prompts), tasks, args.lengths, args, base_dir)
        print(f"{count} prompts written to {args.dump_prompts}", flush=True)
        return
    ran = False  # a cell run by this call: the machine is this one, else the last run's
    if not args.render_only:
        cells_dir.mkdir(parents=True, exist_ok=True)
        for length in args.lengths:
            for task in tasks:
                made = None
                for row in rows:
                    path = cells_dir / f"{row}-{task}-{length}.json"
                    if path.exists() and not stale(path, args):
                        continue
                    made = made or ruler_task(task, length, base_dir, args.seed)
                    cell = run_cell(row, made, length, args, base_dir)
                    ran = True
                    write_json(path, cell)
                    summary = {k: v for k, v in cell.items() if k not in ("answers", "model_args")}
                    print(f"{row} {task} {length}: {summary}", flush=True)
    cells = {p.stem: json.loads(p.read_text()) for p in sorted(cells_dir.glob("*.json"))}
    import lm_eval

    # what lm_eval's cells hold, not this call (the kvpress rows: their own commands)
    run = [c for c in cells.values() if "samples" in c and c.get("row") not in PEERS]
    lengths = sorted({c["length"] for c in run}) or args.lengths
    setup = {"base_model": Path(base_dir).name, "seed": args.seed,
             "limit": max((c["samples"] for c in run), default=args.limit),
             "lengths": ",".join(map(str, lengths)), "lm_eval": lm_eval.__version__,
             "quick": args.quick,
             "max_gen_toks": sorted({c.get("max_gen_toks") or 0 for c in run})}  # fmt: skip
    last = out / "ruler.json"
    machine = (
        machine_info() if ran or not last.exists() else json.loads(last.read_text())["machine"]
    )
    data = {"setup": setup, "cells": cells, "machine": machine}
    write_json(out / "ruler.json", data)
    panels = [(t, "{row}-" + t + "-{n}") for t in OFFLINE]
    drawn = plot_scores(cells, panels, rows_run(cells), out / "ruler.png", "score", "prompt tokens")
    picture = "![RULER's score against length](ruler.png)\n\n" if drawn else ""
    write_text(out / "ruler.md", render(data, picture + kept_notes(out / "ruler.md")))


if __name__ == "__main__":
    main()
