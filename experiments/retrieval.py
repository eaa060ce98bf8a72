"""Needles in a book: does a memory find the right fact among several like it, and a lone one?

Three tasks in our own wording and filler (the test books), answers written by greedy generation
(exact: the written tokens are the answer's):

    multikey   RULER's niah_multikey: K needles "One of the special magic numbers for WORD is:
               NNNNNNN." at random depths, then for each the question "What is the special magic
               number for WORD mentioned in the provided text? The special magic number for WORD
               mentioned in the provided text is:" (K − 1 distractors each; K questions per
               passage, all asked from the same memory of the passage)
    single     one needle in the multikey wording, no distractor (RULER's niah_single in a book):
               the lone pass key in the wording this base answers
    passkey    the pass-key test (Mohtashami & Jaggi 2023): the passage opens with "There is an
               important info hidden inside a lot of irrelevant text. Find it and memorize it.
               I will quiz you about the important information there.", then one "The pass key
               is NNNNN. Remember it. NNNNN is the pass key." at a random depth,
               then "What is the pass key? The pass key is"

Rows (the same passages for every row; each a preset of the retrieval or baseline kind but `full`):
    full       the base alone on the whole passage (only where it fits its positions)
    window     the base with a KV cache of its last 2,048 tokens
    streaming  the first 64 tokens and the last 1,984 (StreamingLLM's sink + recent window)
    retrieval  the default preset: the passage read as `packed`, the question reads the first
               64, its 2 past blocks of most attention weight (at three fifths of the base's
               blocks), each with the block after it, and its last 256 (`choice="question"`)
    packed     the first 64, the 16 past blocks of 64 the queries match best, the last 960, the
               question too (`choice="max"`: the default preset until it chose questions)
    retrieval-scored  `packed` with its chosen blocks by rising score, the best right before
               the window (`layout="nearest"`)
    retrieval-near  a retired preset (`_retired_presets`): as `retrieval-scored` with a
               shorter window and more blocks at the same budget (the first 64, 24 blocks, the
               last 448): the best block nearer the question
    near-attention  `retrieval-near` with score="attention": a block ranked by the best
               softmax weight any query and head gives it over the whole store (a word every
               needle shares counts less than the asked key)
    near-attention-4, -n1, -8n1  that with 4 blocks; with each best block's next block
               (neighbours=1); both with 8 blocks

    python experiments/retrieval.py --lengths 4096,8192 --passages 5        # cells, resumable
    python experiments/retrieval.py --render-only
    python experiments/retrieval.py --quick --out /tmp/r                    # tiny random model

Each (task, row, length) cell is written to OUT/retrieval.cells/TASK-ROW-LENGTH.json as it
finishes (a cell already there is skipped: a run spread over several sittings fills one table);
OUT/retrieval.json gathers them and OUT/retrieval.md is rendered from it.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
from _retired_presets import NEAR, PRESET, RETIRED

from inftyformer._measure import (
    default_base_model,
    kept_notes,
    machine_info,
    write_json,
    write_text,
)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "results"
WORDS = (
    "apple river candle garden silver window ladder forest pencil rabbit castle island winter "
    "mirror violin button desert harbor jacket lemon marble needle orange pepper rocket saddle "
    "tiger velvet walnut anchor basket copper dragon engine falcon ginger hammer iron jungle "
    "kettle lantern meadow nickel oyster parrot quartz ribbon spider thunder tunnel umbrella"
).split()
NEEDLE = " One of the special magic numbers for {word} is: {number}."
QUESTION = (
    " What is the special magic number for {word} mentioned in the provided text? The special "
    "magic number for {word} mentioned in the provided text is:"
)
PASSKEY = " The pass key is {number}. Remember it. {number} is the pass key."
PASSKEY_TASK = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
    "it. I will quiz you about the important information there.\n\n"
)
PASSKEY_QUESTION = " What is the pass key? The pass key is"
PRESET_ROWS = ("full", "window", "streaming", "retrieval")  # RULER's rows too
_NEAR_ATTENTION = {**RETIRED[NEAR], "choice": "attention"}
VARIANTS = {  # row: (preset, settings on top)
    NEAR: (PRESET, RETIRED[NEAR]),
    "packed": ("retrieval", {"choice": "max"}),
    "retrieval-scored": ("retrieval", {"choice": "max", "layout": "nearest"}),
    "near-attention": (PRESET, _NEAR_ATTENTION),
    "near-attention-4": (PRESET, {**_NEAR_ATTENTION, "blocks": 4}),
    "near-attention-n1": (PRESET, {**_NEAR_ATTENTION, "neighbours": 1}),
    "near-attention-8n1": (PRESET, {**_NEAR_ATTENTION, "neighbours": 1, "blocks": 8}),
}
ROWS = (*PRESET_ROWS, *VARIANTS)
TASKS = ("multikey", "single", "passkey")


def filler_text(data_dir: Path | None) -> str:
    """The test books of pg19-mini (or the embedded corpus's test book)."""
    folder = None if data_dir is None else data_dir / "pg19-mini" / "test"
    if folder is not None and folder.is_dir():
        return "\n\n".join(p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.txt")))
    from inftyformer.data.paths import EMBEDDED_CORPUS  # the embedded books

    files = sorted(EMBEDDED_CORPUS.rglob("*.txt"))
    return "\n\n".join(p.read_text(encoding="utf-8") for p in files)


def single_token_words(tokenizer) -> list[str]:
    return [w for w in WORDS if len(tokenizer.encode(" " + w).ids) == 1]


def passages(
    tokenizer, filler_ids: list[int], length: int, count: int, needles: int, seed: int,
    task: str = "multikey",
):  # fmt: skip
    """`count` passages of exactly `length` tokens cut from the `filler_ids`, each with
    `needles` needles at random depths (passkey, single: one) and their questions and answers:
    [(ids [length], [(question, answer ids)])]."""
    rng = random.Random(seed * 1_000_003 + length + {"passkey": 7, "single": 13}.get(task, 0))
    needles = 1 if task == "single" else needles
    words = single_token_words(tokenizer)
    words = words if len(words) >= needles else list(WORDS)  # a small tokenizer: whole words
    out = []
    for _ in range(count):
        if task == "passkey":
            chosen, numbers = [None], [str(rng.randrange(10**4, 10**5))]
            inserts = [tokenizer.encode(PASSKEY.format(number=numbers[0])).ids]
        else:
            chosen = rng.sample(words, needles)
            numbers = [str(rng.randrange(10**6, 10**7)) for _ in chosen]
            inserts = [tokenizer.encode(NEEDLE.format(word=w, number=n)).ids
                       for w, n in zip(chosen, numbers, strict=True)]  # fmt: skip
        head = tokenizer.encode(PASSKEY_TASK).ids if task == "passkey" else []
        room = length - sum(len(x) for x in inserts) - len(head)
        start = rng.randrange(0, len(filler_ids) - room)
        filler = filler_ids[start : start + room]
        depths = sorted(rng.uniform(0.05, 0.95) for _ in inserts)
        passage, at = list(head), 0
        for depth, needle in zip(depths, inserts, strict=True):
            cut = int(depth * room)
            passage += filler[at:cut] + needle
            at = cut
        passage += filler[at:]
        ask = lambda w: PASSKEY_QUESTION if w is None else QUESTION.format(word=w)  # noqa: E731
        questions = [
            (tokenizer.encode(ask(w)).ids, tokenizer.encode(" " + n).ids)
            for w, n in zip(chosen, numbers, strict=True)
        ]
        out.append((torch.tensor(passage), questions))
    return out


@torch.no_grad()
def greedy_full(base, cache, question: torch.Tensor, count: int) -> torch.Tensor:
    """The base's greedy continuation [b, count] of `question` [b, T] after its KV cache."""
    import copy

    cache, x, new = copy.deepcopy(cache), question, []
    for _ in range(count):
        out = base(x, cache=cache, use_cache=True)
        cache, x = out.cache, out.logits[:, -1:].argmax(-1)
        new.append(x)
    return torch.cat(new, 1)


def question_groups(data: list):
    """Question j of every passage of `data` (`passages`), asked together: (j, the passages
    whose question j has one length, those questions [len(members), T], every passage's
    (question, answer) j), j in order."""
    for j in range(len(data[0][1])):
        rows = [questions[j] for _, questions in data]
        groups: dict[int, list[int]] = {}
        for i, (question, _) in enumerate(rows):
            groups.setdefault(len(question), []).append(i)
        for members in groups.values():
            yield j, members, torch.tensor([rows[i][0] for i in members]), rows


@torch.no_grad()
def run_cell(task: str, row: str, length: int, args, base, tokenizer, filler: list[int]) -> dict:
    """All passages of a cell as one batch; question j of every passage asked together (the
    questions of a task have one length: the words are one token each)."""
    from inftyformer.retrieval.model import RetrievalLM

    data = passages(tokenizer, filler, length, args.passages, args.needles, args.seed, task)
    limit = int(getattr(base.config, "max_position_embeddings", 1 << 30))
    if row == "full" and length + 64 > limit:
        return {"skipped": f"the passage does not fit the base's {limit} positions"}
    start = time.perf_counter()
    ids = torch.stack([passage for passage, _ in data])  # [passages, length]
    if row == "full":  # the last token's logits only: all of them are length × vocabulary
        cache = base(ids, use_cache=True, logits_to_keep=1).cache
    else:
        preset, on_top = VARIANTS.get(row, (row, {}))
        model = RetrievalLM(base, preset=preset, **on_top).eval()
        state = model(ids, logits_to_keep=1).state
    samples = []
    for _, members, question, rows in question_groups(data):
        count = max(len(rows[i][1]) for i in members)
        if row == "full":
            written = greedy_full(base, select_cache(cache, members), question, count)
        else:
            written, _ = model.generate(question, count, 0, state=state.select_rows(members))
        for i, new in zip(members, written.tolist(), strict=True):
            answer = rows[i][1]
            samples.append({"answer": tokenizer.decode(answer),
                            "written": tokenizer.decode(new[: len(answer)]),
                            "exact": new[: len(answer)] == answer})  # fmt: skip
    if row != "full":
        state.store.close()
    n, k = len(samples), sum(s["exact"] for s in samples)
    return {
        "exact": k / n, "samples": n, "right": k, "interval": wilson(k, n),
        "seconds": time.perf_counter() - start, "answers": samples,
    }  # fmt: skip


def select_cache(cache, rows: list[int]):
    """The base's KV cache of the batch rows `rows` (all: itself)."""
    import copy

    if rows == list(range(cache.layers[0].keys.shape[0])):
        return cache
    out = copy.deepcopy(cache)
    for layer in out.layers:
        layer.keys, layer.values = layer.keys[rows], layer.values[rows]
    return out


def wilson(k: int, n: int, z: float = 1.96) -> list[float]:
    """The 95% Wilson interval of k successes in n."""
    if n == 0:
        return [0.0, 1.0]
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def score_table(
    cells: dict, key: str, lengths: list[int], score: str = "exact", rows: tuple = ROWS
) -> list[str]:
    """Markdown lines of a table: a row per `rows` entry run at one of the lengths at least, a
    column per length; the cell of row r at length n is `cells[key.format(row=r, n=n)]`
    (missing: not run, shown as –), its `score` shown with its interval and samples."""
    lines = ["| row | " + " | ".join(f"{n:,} tokens" for n in lengths) + " |",
             "|---|" + "---:|" * len(lengths)]  # fmt: skip
    for row in rows:
        if all(cells.get(key.format(row=row, n=n)) is None for n in lengths):
            continue  # never run: no row of dashes
        shown = []
        for n in lengths:
            cell = cells.get(key.format(row=row, n=n))
            if cell is None:
                shown.append("–")
            elif "skipped" in cell:
                shown.append("(beyond its positions)")
            else:
                lo, hi = cell["interval"]
                shown.append(f"{cell[score]:.2f} [{lo:.2f}, {hi:.2f}] ({cell['samples']})")
        lines.append(f"| {row} | " + " | ".join(shown) + " |")
    return lines


def render(data: dict) -> str:
    setup = data["setup"]
    lines = [
        "# Needles in a book: the right fact among several like it, and a lone one",
        "",
        f"Base model `{setup['base_model']}`; passages of the test books, answers written by "
        "greedy generation (exact: every written token the answer's), share of exact answers "
        "[95% Wilson interval] (samples). multikey: "
        f"{setup['needles']} needles per passage, one question per needle (the others its "
        "distractors); single: one such needle per passage, no distractor; passkey: one pass "
        "key per passage in the pass-key test's wording. Every row reads at most 2,048 places "
        "but `full`. Rendered from `retrieval.json` by `experiments/retrieval.py`.",
    ]
    for task in TASKS:
        keys = [k for k in data["cells"] if k.startswith(task + "-")]
        if not keys:
            continue
        lengths = sorted({int(k.rsplit("-", 1)[1]) for k in keys})
        lines += ["", f"## {task}", ""]
        lines += score_table(data["cells"], task + "-{row}-{n}", lengths)
    lines += ["", f"Machine: {data['machine'].get('cpu', '?')}", ""]
    return "\n".join(lines)


def plot(data: dict, path: Path) -> bool:
    """Exact against length per row, one panel per task, with the intervals; False: no cell."""
    panels = [(t, t + "-{row}-{n}") for t in TASKS]
    return plot_scores(data["cells"], panels, ROWS, path, "exact", "passage tokens")


def plot_scores(
    cells: dict, panels: list, rows: tuple, path: Path, score: str, xlabel: str
) -> bool:
    """`score` against length per row with its interval, a panel per (title, key) of `panels`
    measured at two lengths or more (`cells[key.format(row=r, n=n)]`, as `score_table` reads
    them); the panels measured at one length share one panel of points, a column each. Each row
    has its colour (`_plot_style`), one legend below. False: no panel had a cell."""
    from _plot_style import legend_below, row_style

    from inftyformer._measure import pyplot

    def points(key: str, row: str) -> list:
        head = key.format(row=row, n="")
        return sorted(
            (int(k[len(head) :]), c) for k, c in cells.items()
            if k.startswith(head) and k[len(head) :].isdigit() and score in c
        )  # fmt: skip

    def draw(ax, xs: list, got: list, row: str, **style) -> None:
        ys = [c[score] for _, c in got]
        low = [y - c["interval"][0] for y, (_, c) in zip(ys, got, strict=True)]
        high = [c["interval"][1] - y for y, (_, c) in zip(ys, got, strict=True)]
        colour, marker = row_style(row)
        handles[row] = ax.errorbar(xs, ys, yerr=[low, high], marker=marker, color=colour,
                                   capsize=3, label=row, **style)  # fmt: skip

    lengths = {k: {n for r in rows for n, _ in points(k, r)} for _, k in panels}
    curves = [(t, k) for t, k in panels if len(lengths[k]) > 1]
    single = [(t, k) for t, k in panels if len(lengths[k]) == 1]
    if sum(bool(points(k, r)) for _, k in single for r in rows) < 2:
        single = []  # a panel of one point says nothing a table does not
    if not curves and not single:
        return False
    plt = pyplot()
    count = len(curves) + bool(single)
    across = 2 if count == 4 else min(3, count)
    down = -(-count // across)
    fig, axes = plt.subplots(down, across, figsize=(5 * across, 3.6 * down + 0.6), squeeze=False)
    handles: dict = {}
    for ax, (title, key) in zip(axes.flat, curves, strict=False):
        drawn = [r for r in rows if points(key, r)]
        for i, row in enumerate(drawn):  # each row a little aside: equal scores stay visible
            shift = 1 + min(0.025, 0.25 / len(drawn)) * (i - (len(drawn) - 1) / 2)
            draw(ax, [n * shift for n, _ in points(key, row)], points(key, row), row)
        ax.set(xscale="log", xlabel=xlabel, ylabel=score, ylim=(-0.02, 1.02), title=title)
        ticks = sorted(lengths[key])
        ax.set_xticks(ticks, [f"{n // 1024}K" if n % 1024 == 0 else str(n) for n in ticks])
        ax.minorticks_off()
    if single:  # one length each: a column of points per panel, the rows side by side
        ax = axes.flat[len(curves)]
        for j, (_, key) in enumerate(single):
            here = [r for r in rows if points(key, r)]
            step = min(0.8 / len(here), 0.12)
            for i, row in enumerate(here):
                draw(ax, [j + (i - (len(here) - 1) / 2) * step], points(key, row), row, ls="none")
        names = [f"{t}\n{min(lengths[k]):,} {xlabel}" for t, k in single]
        ax.set_xticks(range(len(single)), names, fontsize=8)
        ax.set(ylabel=score, ylim=(-0.02, 1.02), xlim=(-0.6, len(single) - 0.4))
        ax.set_title("measured at one length")
    for ax in list(axes.flat)[count:]:
        ax.set_visible(False)
    shown = [r for r in rows if r in handles]
    legend_below(fig, [handles[r] for r in shown], shown, columns=7)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def quick_model(folder: Path):
    """A tiny random Llama and its tokenizer, written to `folder` (the --quick run)."""
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_pretrained import write_tiny_model

    words = " ".join(WORDS) + " One of the special magic numbers for is: What pass key 0123456789"
    return write_tiny_model(folder, corpus=(words,) * 20, max_positions=4096)


def passage_arguments(p: argparse.ArgumentParser, threads: int) -> None:
    """The passages' arguments."""
    p.add_argument("--passages", type=int, default=5)
    p.add_argument("--needles", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--base-model", default=None)
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--threads", type=int, default=threads)
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--quick", action="store_true", help="a tiny random model, 1 passage, 2,304")


def run_setup(args) -> str:
    """The base's folder (--quick: a tiny model written to OUT, with its short settings)."""
    if args.quick:
        args.base_model = str(quick_model(Path(args.out) / "quick-model"))
        args.lengths, args.passages, args.needles = "2304", 1, 2
    return args.base_model or default_base_model()


def load_run(args, base_dir: str):
    """The base's tokenizer, the filler's token ids (the books encoded once per run, not once
    per cell) and the base (float32, eval)."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tokenizer = Tokenizer.from_file(str(Path(base_dir) / "tokenizer.json"))
    data_dir = Path(args.data_dir)
    text = filler_text(data_dir if data_dir.is_dir() and not args.quick else None)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    return tokenizer, tokenizer.encode(text).ids, base


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--lengths", default="4096,8192")
    p.add_argument("--rows", default=",".join(ROWS))
    passage_arguments(p, threads=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    cells_dir = out / "retrieval.cells"
    base_dir = run_setup(args)
    ran = False  # a cell run by this call: the machine is this one, else the last run's
    if not args.render_only:
        tokenizer, filler, base = load_run(args, base_dir)
        cells_dir.mkdir(parents=True, exist_ok=True)
        for length in (int(x) for x in args.lengths.split(",")):
            for task in args.tasks.split(","):
                for row in args.rows.split(","):
                    path = cells_dir / f"{task}-{row}-{length}.json"
                    if path.exists():
                        continue
                    cell = run_cell(task, row, length, args, base, tokenizer, filler)
                    write_json(path, cell)
                    ran = True
                    summary = {k: v for k, v in cell.items() if k != "answers"}
                    print(f"{task} {row} {length}: {summary}", flush=True)
    cells = {p.stem: json.loads(p.read_text()) for p in sorted(cells_dir.glob("*.json"))}
    setup = {"base_model": Path(base_dir).name, "needles": args.needles,
             "passages": args.passages}  # fmt: skip
    last = out / "retrieval.json"
    if not ran and last.exists():  # nothing run: the setup the cells were made with
        setup = json.loads(last.read_text())["setup"]
    machine = (
        machine_info() if ran or not last.exists() else json.loads(last.read_text())["machine"]
    )
    data = {"setup": setup, "cells": cells, "machine": machine}
    write_json(last, data)
    notes = kept_notes(out / "retrieval.md")  # the discussion written between its markers
    picture = (
        "![exact against length](retrieval.png)\n\n" if plot(data, out / "retrieval.png") else ""
    )
    write_text(out / "retrieval.md", render(data) + "\n" + picture + notes + "\n")


if __name__ == "__main__":
    main()
