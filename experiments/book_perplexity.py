"""Book perplexity by position: does reading chosen past blocks cost anything on ordinary text?

Each of K held-out books' first T tokens is streamed through the base in calls of 256 tokens,
and every token's negative log-likelihood (NLL, nats) given all that the row reads of its past
is recorded. Rows (the same tokens for every row; each a preset of the retrieval or baseline
kind, or a retired preset's settings on the default (`_retired_presets`), but `full`):

    full       the base alone with its HF KV cache (only the positions the base has)
    window     the base with a KV cache of its last 2,048 tokens
    streaming  the first 64 tokens and the last 1,984 (StreamingLLM's sink + recent window)
    retrieval  the first 64, the 16 past blocks of 64 the queries match best, the last 960
    retrieval-near  the first 64, the 24 past blocks of 64 the queries match best (the best
               last), the last 448 (a retired preset)
    retrieval-picked  the first 64, one past block and the block after it, the last 256 (a
               retired preset)
    hybrid     retrieval with the ∞-former's continuous memory of what left its window
               (`--memory-weights`, trained by experiments/train_hybrid_memory.py)
    hybrid-empty  the same weights with the memory empty (`_hybrid.py`: the low-rank adapters
               trained beside the memory alone, `retrieval` when there are none)
    hybrid-other  the same weights reading the memory of another book (its pair: 1 ↔ 2, 3 ↔ 4,
               …, streamed beside it: its memory at the same position), so that a fixed
               correction cannot pass as memory (an empty memory reads 0: that row is
               `retrieval`)

Perplexity is exp(mean NLL) over the tokens at positions [1K, 2K), [2K, 4K), [4K, 8K),
[8K, 16K) and ≥ 1K of every book, pooled; its interval is a bootstrap over books (books drawn
with replacement, the same draws for every row, so the ratio of two rows is paired).

    python experiments/book_perplexity.py --books 4 --tokens 16384 --threads 1   # resumable
    python experiments/book_perplexity.py --render-only
    python experiments/book_perplexity.py --quick --out /tmp/b                    # tiny model

Books: pg19-mini's test split, then its valid split (both held out from training here), in
the order of its books.tsv. Each (row, book) cell is written to
OUT/book_perplexity.cells/ROW-BOOK.json as it finishes: the NLL summed per block of 64
predicted positions (a cell already there with the same settings is skipped);
OUT/book_perplexity.json gathers the cells with the perplexities, intervals and ratios
computed from them, and OUT/book_perplexity.md and .png are rendered from that JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import inspect
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from _hybrid import digests, hybrid_model, reader_settings
from _retired_presets import RETIRED, preset_of
from _retired_presets import row_settings as retired_settings

from inftyformer._measure import (
    command_line,
    default_base_model,
    kept_notes,
    machine_info,
    write_json,
    write_text,
)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "results"
NAME = "book_perplexity"
ROWS = ("full", "window", "streaming", "retrieval", "retrieval-near", "retrieval-picked",
        "hybrid", "hybrid-empty", "hybrid-other")  # fmt: skip
HYBRID = ("hybrid", "hybrid-empty", "hybrid-other")
SPLITS = ("test", "valid")  # held out, in this order
BLOCK = 64  # predicted positions per stored NLL sum (the buckets' edges are multiples of it)
SEGMENT = 256  # tokens per call
BUCKETS = ((1024, 2048), (2048, 4096), (4096, 8192), (8192, 16384), (2048, None), (1024, None))
WHAT = {
    "full": "the base alone, its HF KV cache of every earlier token (calls of 256)",
    "window": "a KV cache of the last 2,048 tokens",
    "streaming": "the first 64 tokens and the last 1,984",
    "retrieval": "the first 64, the 16 past blocks of 64 its queries match best, the last 960",
    "retrieval-near": "the first 64, the 24 past blocks of 64 its queries match best (the best "
    "last), the last 448",
    "retrieval-picked": "the first 64, the past block a call's last 32 queries give the most "
    "attention weight with the block after it, the last 256 (448 places)",
    "hybrid": "the retrieval it was trained beside (`retrieval`, unless the run changed it) "
    "plus the continuous memory of what left its window (N = 256 basis coefficients in each of "
    "4 blocks; trained weights)",
    "hybrid-empty": "hybrid's weights with the memory empty (its adapters alone, if any)",
    "hybrid-other": "hybrid's weights reading another book's memory at the same position",
}


def bucket_name(bucket: tuple[int, int | None]) -> str:
    lo, hi = bucket
    k = lambda n: f"{n // 1024}K"  # noqa: E731
    return f"≥{k(lo)}" if hi is None else f"[{k(lo)}, {k(hi)})"


# --------------------------------------------------------------------------- books
def held_out_books(folder: Path) -> list[dict]:
    """The books of `folder`'s test split, then its valid split ({split}/{id}.txt): in the
    order of its books.tsv (with their titles) when it has one, else by name."""
    titles, order = {}, {}
    table = folder / "books.tsv"
    if table.exists():
        with open(table, encoding="utf-8", newline="") as f:
            for i, rec in enumerate(csv.DictReader(f, delimiter="\t")):
                titles[(rec["split"], rec["id"])] = rec["title"]
                order[(rec["split"], rec["id"])] = i
    books = []
    for split in SPLITS:
        files = sorted((folder / split).glob("*.txt"))
        files.sort(key=lambda p: order.get((split, p.stem), len(order)))
        for path in files:
            title = titles.get((split, path.stem), path.stem)
            books.append({"split": split, "id": path.stem, "title": title, "path": path})
    if not books:
        raise SystemExit(f"no books in {folder}/{{{','.join(SPLITS)}}}/*.txt")
    return books


def book_tokens(tokenizer, book: dict, count: int) -> torch.Tensor:
    """The first `count` tokens of `book` [1, count]; an error naming it when it is shorter."""
    ids = tokenizer.encode(book["path"].read_text(encoding="utf-8")).ids
    if len(ids) < count:
        raise SystemExit(f"book {book['id']} ({book['title']}) has {len(ids)} tokens < {count}")
    return torch.tensor([ids[:count]])


# --------------------------------------------------------------------------- measuring
def cache_keyword(base) -> str:
    """The name under which this transformers' forward takes a KV cache (renamed in 5.x)."""
    params = inspect.signature(base.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@torch.no_grad()
def token_nll(
    row: str, ids: torch.Tensor, base, progress: bool = False, weights=None, other=None
) -> torch.Tensor:
    """NLL [n − 1] of ids[0, 1:] [1, n], each token given what `row` reads of its past;
    the stream is fed in calls of SEGMENT tokens (its last token is never fed). `weights`:
    the hybrid rows' memory; `other` [1, n]: the book whose memory hybrid-other reads."""
    from inftyformer.retrieval.model import RetrievalLM

    with contextlib.ExitStack() as stack:
        model = None  # the full row: the base alone
        if row in HYBRID:  # the adapters, if any, on the base while the stream is read
            model = stack.enter_context(hybrid_model(base, weights, row != "hybrid-empty"))
        elif row != "full":
            preset, on_top = preset_of(row)
            model = RetrievalLM(base, preset=preset, **on_top).eval()
        return stream_nll(row, ids, base, model, progress, other)


def stream_nll(row: str, ids: torch.Tensor, base, model, progress: bool, other) -> torch.Tensor:
    """`token_nll` of the row's `model` (None: the base with its HF KV cache)."""
    from tqdm import tqdm
    from transformers import DynamicCache

    n, beside, state = ids.shape[1], None, None  # beside: the state of the book hybrid-other reads
    if model is None:
        cache, key = DynamicCache(), cache_keyword(base)
    nll = []
    for start in tqdm(range(0, n - 1, SEGMENT), desc=row, leave=False, disable=not progress):
        chunk = ids[:, start : min(start + SEGMENT, n - 1)]  # [1, t]
        target = ids[:, start + 1 : start + 1 + chunk.shape[1]]  # [1, t]
        if model is None:
            out = base(chunk, use_cache=True, **{key: cache})
            cache = getattr(out, key)
            logits = out.logits
        else:
            if beside is not None:  # hybrid-other: the other book's memory at this position
                state = dataclasses.replace(state, continuous=beside.continuous)
            out = model(chunk, state)
            logits, state = out.logits, out.state
            if row == "hybrid-other":
                beside = model(other[:, start : start + chunk.shape[1]], beside).state
        nll.append(F.cross_entropy(logits[0].float(), target[0], reduction="none"))
    for s in (state, beside):
        if s is not None:
            s.store.close()
    return torch.cat(nll)


def block_sums(nll: torch.Tensor) -> tuple[list[float], list[int]]:
    """The NLL of predicted positions 1 … n − 1 summed per block of BLOCK positions
    ([0, 64), [64, 128), …: the first block has 63) and the tokens of each block."""
    padded = torch.cat([nll.new_zeros(1), nll]).double()  # position 0 predicts nothing
    counts = torch.ones_like(padded)
    counts[0] = 0
    blocks = math.ceil(padded.numel() / BLOCK)
    pad = blocks * BLOCK - padded.numel()
    sums = F.pad(padded, (0, pad)).view(blocks, BLOCK).sum(1)
    count = F.pad(counts, (0, pad)).view(blocks, BLOCK).sum(1)
    return sums.tolist(), [int(c) for c in count.tolist()]


def cell_settings(
    row: str, tokens: int, base_dir: str, positions: int, weights=None, other=None
) -> dict:
    from inftyformer.presets import retrieval_settings

    fed = min(tokens, positions) if row == "full" else tokens
    if row == "full":
        preset = {}
    elif row in RETIRED:
        preset = retired_settings(row)
    elif row in HYBRID:  # the retrieval the memory was trained beside
        preset = {**retrieval_settings("retrieval"), **reader_settings(weights)}
    else:
        preset = retrieval_settings(row)
    out = {"base_model": Path(base_dir).name, "tokens": fed, "segment_len": SEGMENT,
           "preset": preset}  # fmt: skip
    if row in HYBRID:  # the weights by their digest, and the book whose memory is read
        out.update(digests(weights))
        out["other_book"] = other["id"] if row == "hybrid-other" else None
    return out


def run_cell(row: str, book: dict, settings: dict, base, tokenizer, progress: bool,
             weights=None, other=None) -> dict:  # fmt: skip
    ids = book_tokens(tokenizer, book, settings["tokens"])
    beside = None if other is None else book_tokens(tokenizer, other, settings["tokens"])
    wall, cpu = time.perf_counter(), time.process_time()
    nll = token_nll(row, ids, base, progress, weights, beside)
    seconds, cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
    sums, counts = block_sums(nll)
    return {
        "row": row, "book": book["id"], "split": book["split"], "title": book["title"],
        "settings": settings, "block": BLOCK, "nll_sum": sums, "count": counts,
        "seconds": seconds, "cpu_seconds": cpu_seconds, "torch_threads": torch.get_num_threads(),
    }  # fmt: skip


# --------------------------------------------------------------------------- statistics
def ratio_pairs(rows: list[str]) -> list[tuple[str, str]]:
    """The rows compared: each with the window (the goal's reference), retrieval with
    streaming (what the chosen blocks add to the sink and the recent window), retrieval-near
    and retrieval-picked with retrieval (what a shorter window and fewer blocks change)."""
    pairs = [(r, "window") for r in rows if r != "window"]
    near, picked = ("retrieval-near", "retrieval"), ("retrieval-picked", "retrieval")
    hybrid = [("hybrid", "retrieval"), ("hybrid-empty", "retrieval"), ("hybrid-other", "retrieval"),
              ("hybrid", "hybrid-empty"), ("hybrid", "hybrid-other")]  # fmt: skip
    for pair in (("retrieval", "streaming"), near, picked, *hybrid):
        if set(pair) <= set(rows):
            pairs.append(pair)
    return pairs


def bucket_nll(cell: dict, lo: int, hi: int | None) -> tuple[float, int] | None:
    """(NLL sum, tokens) of the predicted positions [lo, hi) of a cell; None when the cell
    does not reach hi (a bucket measured in part is not reported)."""
    b = cell["block"]
    reach = len(cell["count"]) * b
    if hi is None:
        hi = reach
    if lo % b or hi % b or hi > reach or lo >= hi:
        return None
    sums, counts = cell["nll_sum"][lo // b : hi // b], cell["count"][lo // b : hi // b]
    return float(sum(sums)), int(sum(counts))


def summarise(
    cells: dict, rows: list[str], books: list[str], tokens: int, resamples: int, seed: int
) -> dict:
    """Per row and bucket (the last one: positions ≥ 1K up to `tokens`, the books' length):
    perplexity pooled over the books, a 95% bootstrap interval over
    books, the per-book perplexities; per pair of `ratio_pairs` and bucket the ratio of
    their perplexities (paired: the same book draws), with how many books have it below 1."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(books), size=(resamples, len(books)))  # the same for every row
    rows_out, nlls = {}, {}
    for row in rows:
        rows_out[row] = {}
        for bucket in BUCKETS:
            lo, hi = bucket
            got = [bucket_nll(cells[f"{row}-{b}"], lo, hi or tokens) for b in books]
            if any(g is None for g in got):
                continue
            sums = np.array([g[0] for g in got])
            counts = np.array([g[1] for g in got])
            boot = sums[draws].sum(1) / counts[draws].sum(1)  # [resamples]
            nlls[row, bucket] = (sums, counts, boot)
            nll = sums.sum() / counts.sum()
            rows_out[row][bucket_name(bucket)] = {
                "ppl": math.exp(nll), "nll": nll, "tokens": int(counts.sum()),
                "interval": np.exp(np.percentile(boot, [2.5, 97.5])).tolist(),
                "per_book": np.exp(sums / counts).tolist(),
            }  # fmt: skip
    ratios = {}
    for row, ref in ratio_pairs(rows):
        ratios[f"{row}/{ref}"] = by = {}
        for bucket in BUCKETS:
            if (row, bucket) not in nlls or (ref, bucket) not in nlls:
                continue
            s, c, boot = nlls[row, bucket]
            rs, rc, rboot = nlls[ref, bucket]
            per_book = np.exp(s / c - rs / rc)
            by[bucket_name(bucket)] = {
                "ratio": math.exp(s.sum() / c.sum() - rs.sum() / rc.sum()),
                "interval": np.exp(np.percentile(boot - rboot, [2.5, 97.5])).tolist(),
                "per_book": per_book.tolist(), "books_below_1": int((per_book < 1).sum()),
            }  # fmt: skip
    return {"rows": rows_out, "ratios": ratios}


def curve(cells: dict, row: str, books: list[str], resamples: int, seed: int) -> list[dict]:
    """Mean NLL per power-of-two position bin [64, 128), [128, 256), … pooled over books, with
    the bootstrap interval over books (the plot's points)."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(books), size=(resamples, len(books)))
    out, lo = [], BLOCK
    while True:
        got = [bucket_nll(cells[f"{row}-{b}"], lo, 2 * lo) for b in books]
        if any(g is None for g in got):
            return out
        sums, counts = np.array([g[0] for g in got]), np.array([g[1] for g in got])
        boot = sums[draws].sum(1) / counts[draws].sum(1)
        out.append({"from": lo, "to": 2 * lo, "nll": float(sums.sum() / counts.sum()),
                    "interval": np.percentile(boot, [2.5, 97.5]).tolist()})  # fmt: skip
        lo *= 2


# --------------------------------------------------------------------------- report
def gather(cells_dir: Path, rows: list[str], books: list[dict], args, meta: dict) -> dict:
    ids = [b["id"] for b in books]
    cells = {}
    for row in rows:
        for b in ids:
            path = cells_dir / f"{row}-{b}.json"
            if not path.exists():
                raise SystemExit(f"no cell {path}: run without --render-only to measure it")
            cells[f"{row}-{b}"] = json.loads(path.read_text())
    tokens = max(c["settings"]["tokens"] for c in cells.values())
    results = summarise(cells, rows, ids, tokens, args.resamples, args.seed)
    results["curves"] = {r: curve(cells, r, ids, args.resamples, args.seed) for r in rows}
    setup = {
        "base_model": next(iter(cells.values()))["settings"]["base_model"],
        "tokens": tokens,
        "full_tokens": min(c["settings"]["tokens"] for c in cells.values()),
        "segment_len": SEGMENT, "block": BLOCK, "rows": rows,
        "books": [{k: b[k] for k in ("split", "id", "title")} for b in books],
        "buckets": [bucket_name(b) for b in BUCKETS], "resamples": args.resamples,
        "seed": args.seed, "quick": args.quick,
    }  # fmt: skip
    meta = {**meta, "cpu_seconds": sum(c["cpu_seconds"] for c in cells.values()),
            "seconds": sum(c["seconds"] for c in cells.values())}  # fmt: skip
    return {"setup": setup, "results": results, "meta": meta, "cells": cells}


# --------------------------------------------------------------------------- quick run
def quick_model(folder: Path) -> Path:
    """A tiny random Llama of 4,096 positions with a BPE of the embedded corpus's test book
    (the --quick run)."""
    import sys

    from inftyformer.data.paths import EMBEDDED_CORPUS

    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_pretrained import write_tiny_model

    text = next((EMBEDDED_CORPUS / "test").glob("*.txt")).read_text(encoding="utf-8")
    return write_tiny_model(folder, corpus=(text[:20000],), max_positions=4096)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--books", type=int, default=4, help="how many held-out books (K)")
    p.add_argument("--tokens", type=int, default=16384, help="tokens of each book (T)")
    p.add_argument("--rows", default=",".join(r for r in ROWS if r not in HYBRID))
    p.add_argument("--base-model", default=None)
    p.add_argument("--memory-weights", default=None,
                   help="the hybrid rows' memory (experiments/train_hybrid_memory.py)")  # fmt: skip
    p.add_argument("--data-dir", default=None, help="holds pg19-mini/ (default: the shared data)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--resamples", type=int, default=2000, help="bootstrap draws over books")
    p.add_argument("--seed", type=int, default=0, help="of the bootstrap")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--reverse", action="store_true",
                   help="the books last first (a second process on the same cells)")  # fmt: skip
    p.add_argument("--quick", action="store_true",
                   help="a tiny random model, the embedded corpus's 2 held-out books, 4,096 "
                   "tokens each")  # fmt: skip
    args = p.parse_args(argv)
    rows = args.rows.split(",")
    for row in rows:
        if row not in ROWS:
            p.error(f"unknown row {row!r}; known: {', '.join(ROWS)}")
    if "window" not in rows:
        p.error("the rows must include window (the others are compared with it)")
    if set(rows) & set(HYBRID) and not args.render_only and not args.memory_weights:
        p.error("the hybrid rows need --memory-weights")
    if args.tokens < 2 * BLOCK or args.tokens % BLOCK:
        p.error(f"--tokens must be a multiple of {BLOCK}, at least {2 * BLOCK}")
    if args.quick and Path(args.out).resolve() == OUT.resolve():
        p.error("--quick needs an --out of its own (its tiny model's cells are not docs/'s)")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    cells_dir = out / f"{NAME}.cells"
    if args.quick:
        from inftyformer.data.paths import EMBEDDED_CORPUS

        args.base_model = str(quick_model(out / "quick-model"))
        args.tokens, args.books, folder = 4096, 2, EMBEDDED_CORPUS
    else:
        from inftyformer.data import resolve_data_dir

        folder = resolve_data_dir(args.data_dir) / "pg19-mini"
    books = held_out_books(folder)
    if args.books > len(books):
        p.error(f"--books {args.books}: {folder} holds {len(books)} held-out books")
    books = books[: args.books]
    base_dir = args.base_model or default_base_model()
    last = out / f"{NAME}.json"
    previous = json.loads(last.read_text())["meta"] if last.exists() else None
    ran = False
    if not args.render_only:
        from tokenizers import Tokenizer
        from transformers import AutoModelForCausalLM

        tokenizer = Tokenizer.from_file(str(Path(base_dir) / "tokenizer.json"))
        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
        positions = int(getattr(base.config, "max_position_embeddings", None) or 1 << 30)
        cells_dir.mkdir(parents=True, exist_ok=True)
        order = list(enumerate(books))
        for i, book in reversed(order) if args.reverse else order:
            # whose memory hybrid-other reads: books in pairs (1 ↔ 2, 3 ↔ 4, …; an odd last
            # one with the one before), so that more books leave the cells measured as they are
            other = books[i ^ 1] if i ^ 1 < len(books) else books[i - 1]
            for row in rows:
                path = cells_dir / f"{row}-{book['id']}.json"
                settings = cell_settings(row, args.tokens, base_dir, positions,
                                         args.memory_weights, other)  # fmt: skip
                if path.exists() and json.loads(path.read_text())["settings"] == settings:
                    continue
                other_book = other if row == "hybrid-other" else None
                cell = run_cell(row, book, settings, base, tokenizer, not args.quick,
                                args.memory_weights, other_book)  # fmt: skip
                write_json(path, cell)
                ran = True
                ppl = math.exp(sum(cell["nll_sum"]) / sum(cell["count"]))
                print(f"{row} {book['id']}: ppl {ppl:.3f} over {settings['tokens']} tokens, "
                      f"{cell['cpu_seconds']:.0f} CPU-s", flush=True)  # fmt: skip
    # the command and machine of the run that measured the cells, not of one that renders
    meta = (
        {"command": command_line().replace(str(ROOT) + "/", ""), "machine": machine_info(),
         "threads": args.threads}
        if ran or previous is None else
        {k: previous[k] for k in ("command", "machine", "threads")}
    )  # fmt: skip
    data = gather(cells_dir, rows, books, args, meta)
    write_json(last, data)
    notes = kept_notes(out / f"{NAME}.md")
    from _book_perplexity_report import plot, render

    plot(data, out / f"{NAME}.png")
    write_text(out / f"{NAME}.md", render(data, notes))


if __name__ == "__main__":
    main()
