"""Pieces of docs/results/ruler.md that need none of experiments/ruler.py's tables: what each task
is, what is left out and why, what the page says of the answers' length, and each cell's peak
resident memory."""

from __future__ import annotations

import json
from pathlib import Path


def base_config(base_dir: str | Path) -> dict:
    """The config.json of the base at `base_dir`."""
    return json.loads((Path(base_dir) / "config.json").read_text())


def base_positions(base_dir: str | Path) -> int:
    """The positions of the base at `base_dir` (its config's; unbounded when it names none)."""
    return int(base_config(base_dir).get("max_position_embeddings") or 1 << 30)


def middle_block(base_dir: str | Path) -> int:
    """The middle block of the base at `base_dir` (its config's layer count // 2): where the
    rows measured before `question_select_layer` existed chose a question's blocks, pinned."""
    config = base_config(base_dir)
    layers = config.get("num_hidden_layers") or config.get("n_layer")
    if not layers:
        raise ValueError(f"{base_dir}/config.json names no layer count")
    return int(layers) // 2


# lm_eval's essay-haystack needle tasks with the package's novels as the haystack
# (inftyformer.integrations.ruler_haystack; their folder is lm_eval's --include_path)
BOOK_TASKS = ("niah_single_2_books", "niah_multikey_1_books")
ESSAYS = (
    "the haystack is Paul Graham's essays, a Hugging Face Hub data set "
    "(baber/paul_graham_essays) loaded at run time, split into sentences by nltk's punkt_tab, "
    "itself downloaded at run time: run here as the `*_books` tasks (below)"
)
LEFT_OUT = {
    "niah_single_2": ESSAYS,
    "niah_single_3": ESSAYS,
    "niah_multikey_1": ESSAYS,
    "niah_multiquery": ESSAYS,
    "niah_multivalue": ESSAYS,
    "ruler_qa_squad": "the documents and questions are SQuAD v2's, downloaded at run time",
    "ruler_qa_hotpot": "the documents and questions are HotpotQA's, downloaded at run time",
}
BOOKS = (
    "The `*_books` tasks (`inftyformer.integrations.ruler_haystack`, the folder "
    "`src/inftyformer/integrations/ruler_tasks` for lm_eval's `--include_path`; "
    "tag `ruler_books`) are "
    "lm_eval's essay-haystack tasks made by lm_eval's own generator "
    "(`prepare_niah.generate_samples`: its template, needles, depths and scoring) with the "
    "package's six Austen novels as the haystack, split into words as lm_eval splits the "
    "essays, and into sentences by a Punkt model nltk's unsupervised trainer learns from the "
    "same novels (made once, no download). All five are there (`niah_single_2_books`, "
    "`niah_single_3_books`, `niah_multikey_1_books`, `niah_multivalue_books`, "
    "`niah_multiquery_books`); the ones run here are listed above. As with the essays, every "
    "prompt's haystack is the text's opening (here Emma's), and the base has likely read these "
    "novels in training: the needles are what it has not seen."
)
MODEL = (
    "(this row and those below but `paper`: lm_eval model `inftyformer-retrieval`, "
    "`inftyformer.integrations.ruler_lm`, with the row's preset)"
)
ROW_WHAT = {  # what each row reads, as the page says it
    "full": "the base alone (lm_eval's `hf` model)",
    "window": f"a KV cache of the last 2,048 tokens {MODEL}",
    "streaming": "the first 64 and the last 1,984",
    "retrieval": "the default: the context read as `packed`, the question (the last call) "
    "reading the first 64, the 2 past blocks its last 32 queries attend to most at three "
    "fifths of the base's blocks, each with the next, and the last 256 (`choice=question`); "
    "its cells answered by `experiments/question_choices.py --default-cells` (row "
    "`question-late`) from one read of each prompt",
    "packed": "the first 64, the 16 past blocks of 64 its queries match best and the last 960, "
    "the question too (`choice=max`: the default until it chose questions)",
    "retrieval-near": "a retired preset (`experiments/_retired_presets.py`): the first 64, the "
    "24 past blocks of 64 its queries match best (the best last) and the last 448",
    "retrieval-picked": "a retired preset: one fact read: the first 64, the past block the last "
    "32 queries of the prompt's last call (the question's) give the most attention weight with "
    "the block after it, and the last 256 (448 places), the answer written with its question's "
    "blocks",
    "picked-all": "that row, its blocks chosen by every query of that call (`select_queries=0`)",
    "picked-max": "that row scoring each block by its best q · k (`choice=max`)",
    "retrieval-question": "the retrieval preset whose question (the last call) cuts its window "
    "to 256 tokens, then reads the 2 blocks its last 32 queries attend to most, each with the "
    "next, the best last, after the stream's 16 (`choice=question`)",
    "question-first": "that choice first measured: one lead of the 8 of best q · k, all the window",
    "paper": "the paper's memory in every block of the base (preset `paper-gpt2`, untrained: as "
    "wrapped, it adds nothing to the base's logits, so it reads what the base reads in its "
    "window of one segment before the segment), saved as a memory model and run by lm_eval's "
    "`hf` model with trust_remote_code, every prompt streamed through the memory",
}
WHAT = {
    "niah_single_1": "one needle (word → 7-digit number) in a repeated filler of 5 sentences",
    "niah_multikey_2": "one needle among lines that are all needles of other keys",
    "niah_multikey_3": "as niah_multikey_2, keys and values UUIDs",
    "ruler_vt": "variable tracking: the 5 variables of a chain of assignments in a filler",
    "ruler_cwe": "common words: the 10 most frequent words of a numbered list",
    "ruler_fwe": "frequent words: the 3 most frequent coded words of a text",
    "niah_single_2_books": "one needle (word → 7-digit number) in the novels' prose "
    "(lm_eval's niah_single_2, the books for the essays)",
    "niah_multikey_1_books": "one needle and three distractors (other words → other numbers) in "
    "the novels' prose (lm_eval's niah_multikey_1, the books for the essays)",
}


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


def memory_lines(cells: dict, tasks: tuple[str, ...], rows: tuple[str, ...]) -> list[str]:
    """Tables of each cell's peak resident memory (MiB) by row (of `rows`) and length, per task,
    for the cells that recorded it (`tasks` in this order), and of what the cell's run added
    above its resident memory at the start (lm_eval's task data made, no model yet) where the
    cells recorded that; the change from a row's shortest length to its longest."""
    measured = [c for c in cells.values() if c.get("peak_rss_mb") and c.get("row") in rows]
    if not measured:
        return []
    added = [c for c in measured if c.get("rss_start_mb")]
    lines = ["", "## Peak resident memory", "",
             "MiB, the peak of each cell's lm_eval run (the process's peak set back to its "
             "resident memory before the cell: model, prompts and generation); first → last: "
             "the change from a row's shortest length to its longest."
             + (" Added: the peak less the resident memory at the cell's start (lm_eval's "
                "task, its prompts of the length, already made; no model yet): what loading "
                "the model and answering added." if added else ""), ""]  # fmt: skip
    for task in tasks:
        lines += _memory_table(measured, task, "peak", lambda c: c["peak_rss_mb"])
        lines += _memory_table(added, task, "added", lambda c: c["peak_rss_mb"] - c["rss_start_mb"])
    return lines[:-1]


def _memory_table(cells: list[dict], task: str, what: str, value) -> list[str]:
    """One task's table of `value(cell)` (MiB) by row and length, titled `task` (`what`)."""
    here = [c for c in cells if c["task"] == task]
    if not here:
        return []
    lengths = sorted({c["length"] for c in here})
    lines = [f"{task}, {what}:", "",
             "| row | " + " | ".join(f"{n:,} tokens" for n in lengths) + " | first → last |",
             "|---|" + "---:|" * (len(lengths) + 1)]  # fmt: skip
    for row in dict.fromkeys(c["row"] for c in here):
        by = {c["length"]: value(c) for c in here if c["row"] == row}
        got = [by[n] for n in lengths if n in by]
        change = f"{got[-1] / got[0] - 1:+.1%}" if len(got) > 1 else "–"
        shown = [f"{by[n]:,.0f}" if n in by else "–" for n in lengths]
        lines.append(f"| {row} | " + " | ".join(shown) + f" | {change} |")
    return lines + [""]
