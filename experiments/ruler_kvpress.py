"""NVIDIA's kvpress presses as peer rows of the RULER table (docs/results/ruler.md), on the very
prompts lm_eval gave the other rows.

kvpress pins transformers below 5.3 and inftyformer needs a newer one, so this script runs with
the python of a virtualenv of its own (`scripts/kvpress_env.sh`), never inftyformer's; it reads
the prompts that `experiments/ruler.py --dump-prompts` wrote with lm_eval in inftyformer's
environment (the request's text, its tokens as lm_eval's hf model encodes them, where its
question starts):

    bash scripts/kvpress_env.sh                                    # .venv-kvpress, some minutes
    python experiments/ruler.py --dump-prompts runs/ruler-prompts.jsonl \\
        --tasks niah_single_1 --lengths 4096 --limit 25 --base-model MODEL_DIR
    .venv-kvpress/bin/python experiments/ruler_kvpress.py --prompts runs/ruler-prompts.jsonl \\
        --base-model MODEL_DIR --limit 25                           # cells, resumable
    python experiments/ruler.py --render-only

Each prompt, as kvpress's own pipeline does it but on lm_eval's tokens (its pipeline would add
a BOS token and the base's chat template, and tokenize the context and the question apart):
the context (the tokens before the question, `ruler.question_start`) is read whole in one
forward call of the base with the press on, which leaves KEPT = 2,048 entries of it in every
layer's cache (compression_ratio = 1 - 2,048 / context tokens, per prompt); then the question
(at its own positions, uncompressed) and a greedy answer, until the tokenizer's end-of-sequence
token or the task's max_gen_toks, cut at the task's stop strings. RULER's score of the answer
(`ruler_score`) as lm_eval scores it.

Each (press, task, length) cell is written to OUT/ruler.cells/ROW-TASK-LENGTH.json in the form
of experiments/ruler.py's (a cell already there with at least --limit prompts is skipped). Each
prompt's answer is appended to OUT/ruler.cells/ROW-TASK-LENGTH.partial.jsonl as soon as it is
written, so a run stopped or killed between prompts resumes at the next one (the file goes when
its cell is written).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import re
import sys
import time
from importlib import metadata
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
try:  # the package's stdlib helpers; the venv does not install inftyformer
    import inftyformer._measure  # noqa: F401
except ImportError:
    sys.path.insert(0, str(ROOT / "src"))
from _arguments import positive_int, positive_ints  # noqa: E402
from retrieval import wilson  # noqa: E402

from inftyformer._measure import rss_mb, write_json  # noqa: E402

OUT = ROOT / "docs" / "results"
KEPT = 2048  # the places every compressed row of the table reads
PRESSES = {  # row -> kvpress's press
    "kvpress_snapkv": "SnapKVPress",  # the last 64 context tokens' attention picks the rest
    "kvpress_expected": "ExpectedAttentionPress",  # attention expected of future queries
    "kvpress_knorm": "KnormPress",  # keys of small norm kept, no query used
    "kvpress_streaming": "StreamingLLMPress",  # 4 sink tokens and the most recent
    "kvpress_snapkv_q": "SnapKVPress",  # the question in what is pressed: its window asks
    "kvpress_expected_q": "ExpectedAttentionPress",
}
QUESTION_SEEN = ("kvpress_snapkv_q", "kvpress_expected_q")  # pressed: the prompt but its last
DEFAULT_PRESSES = ("kvpress_snapkv", "kvpress_expected", "kvpress_knorm")
CONTROL = re.compile(r"[\x00-\x1f]")


def peer_lines(cells: dict) -> list[str]:
    """What the kvpress rows are and the commands that made them (none: no kvpress cell)."""
    run = [c for c in cells.values() if c.get("row") in PRESSES and "samples" in c]
    if not run:
        return []
    tasks = ",".join(sorted({c["task"] for c in run}))
    lengths = ",".join(str(n) for n in sorted({c["length"] for c in run}))
    limit = max(c["samples"] for c in run)
    versions = ", ".join(sorted({c["kvpress"] for c in run}))
    presses = ",".join(r for r in PRESSES if any(c["row"] == r for c in run))
    shown = ", ".join(f"`{r}` {PRESSES[r]}" for r in PRESSES if any(c["row"] == r for c in run))
    return [
        "",
        "## The kvpress rows",
        "",
        f"Rows `kvpress_*`: presses of NVIDIA's kvpress {versions} ({shown}), on the same "
        "prompts as the rows above (the same lm_eval requests: the same prompt_hash and tokens), "
        "run by `experiments/ruler_kvpress.py` with the python of a virtualenv of their own "
        "(kvpress pins transformers below 5.3; inftyformer does not depend on it). SnapKVPress "
        "keeps what the attention of the context's last 64 tokens picks; ExpectedAttentionPress "
        "what the queries of the next 512 positions are expected to attend, from the statistics "
        "of the context's queries; KnormPress the keys of smallest norm, no query used; "
        "StreamingLLMPress 4 sink tokens and the most recent. Rows ending in `_q`: the press "
        "reads all of the prompt but its last token, the question included (SnapKV's window is "
        "then the question's, as its authors use it), and the last token is read after it from "
        "the pressed cache.",
        "",
        f"Budget: each press keeps {KEPT:,} entries of the context in every layer "
        f"(compression_ratio = 1 − {KEPT:,} / context tokens, per prompt). The context is the "
        "prompt up to its last line; that line, the question and the answer's opening (lm_eval's "
        "gen_prefix), is read after it uncompressed, at its own positions, then the answer "
        "greedily (the task's max_gen_toks, the tokenizer's end of sequence), scored by RULER's "
        "rule. So these rows read the question's few dozen places on top of their 2,048, where "
        "the rows above count it within theirs; and, as in kvpress's own pipeline, the context "
        "is read in one forward pass (every layer attending to all of it), the press choosing "
        "what stays for the question and the answer without seeing the question, where the "
        "`retrieval` row chooses its blocks with the question's own queries.",
        "",
        "```",
        "bash scripts/kvpress_env.sh        # the virtualenv .venv-kvpress: kvpress, its "
        "transformers, CPU torch",
        f"python experiments/ruler.py --dump-prompts runs/ruler-prompts.jsonl --tasks {tasks} \\",
        f"    --lengths {lengths} --limit {limit} --base-model MODEL_DIR",
        ".venv-kvpress/bin/python experiments/ruler_kvpress.py --prompts runs/ruler-prompts.jsonl "
        "\\",
        f"    --base-model MODEL_DIR --limit {limit} --threads 1 --presses {presses}",
        "```",
    ]


def ruler_score(written: str, expected: list[str]) -> float:
    """RULER's score of one answer, as lm_eval 0.4's ruler tasks compute it: the answer stripped,
    each control character made a newline and stripped again; the share of the expected strings
    found in it, case ignored."""
    answer = CONTROL.sub("\n", written.strip()).strip().lower()
    return sum(e.lower() in answer for e in expected) / len(expected)


def compression_ratio(context: int, kept: int = KEPT) -> float:
    """The compression_ratio with which kvpress keeps `kept` of `context` entries (it keeps
    int(context * (1 - ratio))): 1 - kept / context, half an entry less so that rounding cannot
    drop one; 0 (nothing dropped) where the context is no longer than `kept`."""
    if context <= kept:
        return 0.0
    return 1.0 - (kept + 0.5) / context


def make_press(row: str, ratio: float):
    import kvpress

    return getattr(kvpress, PRESSES[row])(compression_ratio=ratio)


def cut_at_stops(text: str, stops: list[str]) -> str:
    for stop in stops:
        if stop:
            text = text.split(stop, 1)[0]
    return text


def pressed_tokens(row: str, record: dict) -> int:
    """How many of the prompt's first tokens the press reads: the context (the question read
    after, uncompressed), or for a row of QUESTION_SEEN all of the prompt but its last token (so
    that SnapKV's window is the question's, as its authors meant; the last token is read after,
    from the pressed cache, so no answer token is computed with the whole prompt in view)."""
    return len(record["input_ids"]) - 1 if row in QUESTION_SEEN else record["context_tokens"]


@torch.no_grad()  # without it the context's forward keeps every activation: 12 GB at 8K
def answer(
    model, tokenizer, press, record: dict, n: int, cut: int | None = None
) -> tuple[str, int]:
    """The greedy answer to `record`'s prompt with `press` on its first `n` tokens, at most
    `cut` new tokens (None: the task's max_gen_toks); (text, the entries each layer's cache
    kept of them)."""
    from transformers import DynamicCache

    ids = torch.tensor([record["input_ids"]])  # [1, T]
    settings = record["generation"]
    until = settings.get("until") or []
    stops = [until] if isinstance(until, str) else list(until)
    count = cut or int(settings.get("max_gen_toks") or 256)
    cache = DynamicCache()
    with press(model):  # the context read whole; each layer's cache pressed as it is filled
        model.model(input_ids=ids[:, :n], past_key_values=cache)
    kept = cache.get_seq_length()
    positions = torch.arange(n, ids.shape[1]).unsqueeze(0)  # the question at its own places
    out = model(input_ids=ids[:, n:], past_key_values=cache, position_ids=positions,
                logits_to_keep=1)  # fmt: skip
    written: list[int] = []
    at = ids.shape[1]
    for _ in range(count):
        token = int(out.logits[0, -1].argmax())
        if token == tokenizer.eos_token_id:
            break
        written.append(token)
        if any(s in tokenizer.decode(written) for s in stops if s) or len(written) == count:
            break
        out = model(input_ids=torch.tensor([[token]]), past_key_values=cache,
                    position_ids=torch.tensor([[at]]))  # fmt: skip
        at += 1
    return cut_at_stops(tokenizer.decode(written), stops), kept


def release_memory() -> None:
    """Hand the freed heap back to the system between prompts (glibc keeps what one prompt's
    forward pass freed), so that each prompt's resident memory is measured from the same floor."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def done_answers(partial: Path | None, records: list[dict], cut: int | None, budget: int) -> list:
    """The answers a stopped run of this cell already wrote to `partial`, in prompt order, as
    long as they are of the same prompts and settings (else none: the cell starts over)."""
    if partial is None or not partial.exists():
        return []
    answers = []
    for line in partial.read_text(encoding="utf-8").splitlines():
        try:
            answer_ = json.loads(line)
        except json.JSONDecodeError:  # a line cut by the kill: the prompt runs again
            break
        i = len(answers)
        same = (
            i < len(records)
            and answer_.get("prompt_hash") == records[i]["prompt_hash"]
            and answer_.get("max_gen_toks") == cut
            and answer_.get("budget") == budget
        )
        if not same:
            return []
        answers.append(answer_)
    return answers


def run_cell(
    row: str,
    records: list[dict],
    model,
    tokenizer,
    positions: int,
    cut: int | None = None,
    budget: int = KEPT,
    partial: Path | None = None,
) -> dict:
    """One press on the prompts `records` (one task and length), scored per prompt; each answer
    appended to `partial` as it is written, and the answers already there reused."""
    task, length = records[0]["task"], records[0]["length"]
    name = PRESSES[row]
    if max(len(r["input_ids"]) + r["generation"].get("max_gen_toks", 0) for r in records) > (
        positions
    ):
        return {"skipped": f"the prompts do not fit the base's {positions} positions"}
    answers = done_answers(partial, records, cut, budget)
    if partial is not None:
        partial.parent.mkdir(parents=True, exist_ok=True)
        with open(partial, "w", encoding="utf-8") as f:  # the usable lines only
            f.writelines(json.dumps(a) + "\n" for a in answers)
        if answers:
            print(f"  {row} {task} {length}: {len(answers)} prompts done before", flush=True)
    start = time.perf_counter() - sum(a["seconds"] for a in answers)
    for i, record in enumerate(records):
        if i < len(answers):
            continue
        n = pressed_tokens(row, record)
        ratio = compression_ratio(n, budget)
        began = time.perf_counter()
        text, kept = answer(model, tokenizer, make_press(row, ratio), record, n, cut)
        score = ruler_score(text, record["expected"])
        answers.append({
            "expected": record["expected"], "written": text, "score": score,
            "ruler_length": record["ruler_length"], "prompt_hash": record["prompt_hash"],
            "context_tokens": record["context_tokens"], "pressed_tokens": n, "kept": kept,
            "compression_ratio": ratio, "seconds": time.perf_counter() - began,
            "max_gen_toks": cut, "budget": budget,
        })  # fmt: skip
        release_memory()
        answers[-1]["rss_mb"] = round(rss_mb())  # after the prompt's temporaries are freed
        if partial is not None:
            with open(partial, "a", encoding="utf-8") as f:
                f.write(json.dumps(answers[-1]) + "\n")
        print(f"  {row} {task} {length} prompt {i + 1}/{len(records)}: score {score} "
              f"kept {kept}/{record['context_tokens']} "
              f"{answers[-1]['seconds']:.1f} s {text!r} rss {answers[-1]['rss_mb']} MB",
              flush=True)  # fmt: skip
    seconds = time.perf_counter() - start
    n = len(answers)
    total = sum(a["score"] for a in answers)
    version = metadata.version("kvpress")
    return {
        "row": row, "task": task, "length": length, "model": f"kvpress {version} {name}",
        "model_args": f"pretrained=MODEL_DIR,dtype=float32,press={name},kept={budget},"
        f"compression_ratio=1-{budget}/pressed_tokens,"
        + ("question=pressed" if row in QUESTION_SEEN else "question=uncompressed"),
        "score": total / n, "samples": n, "interval": wilson(total, n), "seconds": seconds,
        "max_gen_toks": cut,
        "lm_eval": records[0].get("lm_eval"), "kvpress": version,
        "transformers": metadata.version("transformers"), "torch": torch.__version__,
        "answers": answers,
    }  # fmt: skip


def read_prompts(path: Path) -> dict[tuple[str, int], list[dict]]:
    """The dumped prompts by (task, length), in lm_eval's order."""
    groups: dict[tuple[str, int], list[dict]] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            missing = {"task", "length", "input_ids", "context_tokens", "expected"} - set(record)
            if missing:
                raise ValueError(f"{path}:{number}: not a dumped prompt (no {sorted(missing)})")
            groups.setdefault((record["task"], record["length"]), []).append(record)
    for records in groups.values():
        records.sort(key=lambda r: r["doc_id"])
    return groups


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", required=True, help="experiments/ruler.py --dump-prompts' file")
    p.add_argument("--base-model", required=True, help="the base's folder (weights, tokenizer)")
    p.add_argument("--presses", default=",".join(DEFAULT_PRESSES), help=", ".join(PRESSES))
    p.add_argument("--tasks", help="of the dumped ones (default: all)")
    p.add_argument("--lengths", type=positive_ints, help="of the dumped ones (default: all)")
    p.add_argument("--limit", type=positive_int, default=25, help="prompts per task and length")
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--max-gen-toks", type=positive_int, help="as experiments/ruler.py's")
    p.add_argument(
        "--kept",
        type=int,
        default=KEPT,
        help="entries of the pressed tokens kept in every layer (the table's budget: "
        f"{KEPT}; more, with an --out of its own, checks a press that fails at the budget)",
    )
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    if args.kept != KEPT and Path(args.out).resolve() == OUT.resolve():
        p.error(f"--kept {args.kept} needs an --out of its own (docs/'s cells keep {KEPT})")
    rows = args.presses.split(",")
    for row in rows:
        if row not in PRESSES:
            p.error(f"unknown press {row!r}; known: {', '.join(PRESSES)}")
    groups = read_prompts(Path(args.prompts))
    if args.tasks:
        groups = {k: v for k, v in groups.items() if k[0] in args.tasks.split(",")}
    if args.lengths:
        groups = {k: v for k, v in groups.items() if k[1] in args.lengths}
    if not groups:
        p.error(f"no dumped prompt of those tasks and lengths in {args.prompts}")
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()  # a bar per weight read, no news
    folder = Path(args.base_model)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    positions = int(json.loads((folder / "config.json").read_text())["max_position_embeddings"])
    cells = Path(args.out) / "ruler.cells"
    for (task, length), records in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        records = records[: args.limit]
        for record in records:  # the same tokens as lm_eval's rows, or no run at all
            ids = tokenizer(record["prompt"], add_special_tokens=False)["input_ids"]
            if ids != record["input_ids"]:
                raise SystemExit(
                    f"{task} {length} doc {record['doc_id']}: this environment's tokenizer "
                    "encodes the prompt to other tokens than lm_eval's run did"
                )
        for row in rows:
            path = cells / f"{row}-{task}-{length}.json"
            if path.exists():
                old = json.loads(path.read_text())
                done = old.get("samples", 0) >= len(records)
                if "skipped" in old or (done and old.get("max_gen_toks") == args.max_gen_toks):
                    continue
            partial = cells / f"{row}-{task}-{length}.partial.jsonl"
            cell = run_cell(
                row, records, model, tokenizer, positions, args.max_gen_toks, args.kept, partial
            )
            write_json(path, cell)
            partial.unlink(missing_ok=True)
            summary = {k: v for k, v in cell.items() if k not in ("answers", "model_args")}
            print(f"{row} {task} {length}: {summary}", flush=True)


if __name__ == "__main__":
    main()
