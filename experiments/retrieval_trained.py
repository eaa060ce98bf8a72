"""The read trained on the facts task: a map of the choosing block's queries
(`retrieval/query_map.py`)
trained so that a question's call scores the block holding its fact above every other stored
block, the fact's alike facts (distractors) included; then how often the asked fact's block is
ranked first, untrained and trained, on held-out facts passages and on RULER's prompts.

Training passages (the facts task, `tasks/facts.py`): a window of a train book (pg19-mini's
train split) with 4 facts of one train wording at random depths, alike but for the name or the
place ("Mara's locker number is 4821." … "Tobias's locker number is 903117."), then one of
their questions ("What is Tobias's locker number? It is"). Validation passages: the same from
the valid books. RULER's prompts (`experiments/ruler.py --dump-prompts`): its own wording and
haystack, never trained on: whether what was learned carries over.

Each passage is read by the `retrieval-picked` preset as `RetrievalLM.generate` reads a prompt
(streamed in calls of 256, the last call choosing first), on the base's blocks up to the
choosing one only (what the choice depends on; the rest is never needed here); recorded: the
last call's queries at the choosing block and the stored keys there. Training minimises
−log Σ_{s ∈ asked} softmax(score)_s over the stored blocks, score the preset's ("attention":
a block's best log softmax weight from any query and head over all stored tokens), on the
mapped queries; the map kept is the one whose validation passages rank the asked block first
most often (ties: the lower validation loss).

    python experiments/retrieval_trained.py --prompts runs/ruler-prompts-books.jsonl
    python experiments/retrieval_trained.py --quick --work /tmp/t --out /tmp/t   # tiny model

Features go to WORK/features-SPLIT.pt (written as they grow: a run cut short goes on), the map
to WORK/query-map.safetensors; OUT/retrieval_trained.json and .md the ranks.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from retrieval import quick_model, wilson
from retrieval_rank import LastQuery, ranks

from inftyformer._measure import (
    default_base_model,
    kept_notes,
    machine_info,
    write_json,
    write_text,
)
from inftyformer.retrieval.query_map import QueryMap
from inftyformer.tasks.facts import NAMES, PLACES, TRAIN_DIGITS, TRAIN_FACTS

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs"
NAME = "retrieval_trained"
PRESET = "retrieval-picked"
FACTS = 4  # facts per passage: one asked, three alike distractors
NEEDLE = re.compile(r"One of the special magic numbers for (\S+) is: (\d+)\.")


# ---------------------------------------------------------------------- passages
def book_texts(data_dir: Path, split: str) -> list[str]:
    """The books of a pg19-mini split (the embedded novels where it is missing)."""
    folder = data_dir / "pg19-mini" / split
    files = sorted(folder.glob("*.txt")) if folder.is_dir() else []
    if not files:
        from inftyformer.data.paths import EMBEDDED_CORPUS

        files = sorted((EMBEDDED_CORPUS / split).rglob("*.txt"))
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def facts_passage(rng: np.random.Generator, encode, books: list[str], length: int):
    """One passage of about `length` tokens: (ids, each fact's key token indices, each fact's
    question ids); the facts of one train wording, their names (or places) all different."""
    statement, question = TRAIN_FACTS[int(rng.integers(len(TRAIN_FACTS)))]
    field = "name" if "{name}" in statement else "place"
    pool = NAMES if field == "name" else PLACES
    facts = []
    for w in rng.choice(len(pool), FACTS, replace=False):
        d = int(rng.choice(TRAIN_DIGITS))
        key = str(int(rng.integers(10 ** (d - 1), 10**d)))
        names = {"name": NAMES[0], "place": PLACES[0], "key": key, field: pool[int(w)]}
        said = encode("\n" + statement.format(**names) + "\n")
        facts.append((said, encode("\n" + question.format(**names)), encode(" " + key)))
    book = books[int(rng.integers(len(books)))]
    start = int(rng.integers(max(1, len(book) - 6 * length)))
    room = length - sum(len(s) for s, _, _ in facts)
    text = encode(book[start : start + 6 * length])[:room]
    depths = sorted(rng.choice(np.arange(16, len(text) - 64), FACTS, replace=False).tolist())
    ids, keys, at = [], [], 0
    for (said, _, answer), depth in zip(facts, depths, strict=True):
        ids += text[at:depth]
        at = depth
        k = next(i for i in range(len(said)) if said[i : i + len(answer)] == answer)
        keys.append(list(range(len(ids) + k, len(ids) + k + len(answer))))
        ids += said
    ids += text[at:]
    return ids, keys, [q for _, q, _ in facts]


def ruler_needles(prompt: str, ids: list[int], tokenizer) -> list[tuple[str, list[int]]]:
    """RULER's needles in a prompt: (number, its token indices), by the prompt's offsets."""
    enc = tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
    if enc.input_ids != ids:
        raise ValueError("the dumped prompt's tokens are not the tokenizer's")
    out = []
    for m in NEEDLE.finditer(prompt):
        a, b = m.span(2)
        out.append(
            (m.group(2), [i for i, (s, e) in enumerate(enc.offset_mapping) if s < b and e > a])
        )
    return out


# ---------------------------------------------------------------------- features
class Reader:
    """`retrieval-picked` on the base's blocks up to the choosing one; records each choice's
    queries."""

    def __init__(self, base) -> None:
        from inftyformer.retrieval.model import RetrievalLM

        select = len(base.model.layers) // 2
        base.model.layers = base.model.layers[: select + 1]  # above it: never needed here
        base.config.num_hidden_layers = select + 1
        # every query of the call chooses (the ranks by the last k are this run's --select-queries)
        self.model = RetrievalLM(base, preset=PRESET, select_layer=select, select_queries=0).eval()
        self.last = LastQuery(self.model)  # each choice's queries

    @torch.no_grad()
    def read(self, prompts: list[tuple[list[int], list[list[int]], int]]) -> list[dict]:
        """For prompts (ids, needles' token indices, the asked needle) sharing what precedes
        their last call: the last call's queries, the stored keys and the needles' blocks."""
        from inftyformer.retrieval.model import held

        m, L, B = self.model, self.model.config.segment_len, self.model.config.block_size
        out, prefixes = [], {}
        for ids, needles, asked in prompts:
            cut = (len(ids) - 1) // L * L  # the last call's first token, as generate streams
            if cut not in prefixes:
                prefixes[cut] = m(torch.tensor([ids[:cut]]), logits_to_keep=1).state
            state = prefixes[cut]
            n = int(held(state, torch.device("cpu"))[0].sum())
            S = int(state.sink_len[0])
            end = int(state.tokens[0]) - int(state.window_len[0])
            slots = [sorted({(t - S) // B for t in ks}) if ks and ks[0] >= S and ks[-1] < end
                     else None for ks in needles]  # fmt: skip
            if slots[asked] is None:
                continue  # the asked fact in the sink or the window: nothing to choose
            m(torch.tensor([ids[cut:]]), state, reselect=True, logits_to_keep=1)
            keys = torch.cat([k[0] for k in state.keys], 0)[: n * B]
            out.append({"query": self.last.query[0].half(), "keys": keys, "slots": slots,
                        "asked": asked, "length": len(ids)})  # fmt: skip
        for state in prefixes.values():
            state.store.close()
        return out


def collect(path: Path, make, count: int, reader: Reader, label: str) -> list[dict]:
    """Features of `count` passages `make(i)` (a list of prompts sharing a prefix each), kept
    in `path` as they grow (a run cut short goes on from the passages there)."""
    have = torch.load(path) if path.is_file() else {"done": 0, "samples": []}
    start = time.perf_counter()
    for i in range(have["done"], count):
        have["samples"] += reader.read(make(i))
        have["done"] = i + 1
        if have["done"] % 5 == 0 or have["done"] == count:
            tmp = path.with_suffix(".tmp")
            torch.save(have, tmp)
            tmp.replace(path)
        took = time.perf_counter() - start
        print(f"{label}: {have['done']}/{count} passages, {len(have['samples'])} questions, "
              f"{took:.0f}s", flush=True)  # fmt: skip
    return have["samples"]


# ---------------------------------------------------------------------- scores and training
def block_logits(query: torch.Tensor, keys: torch.Tensor, kv_heads: int, block: int):
    """The "attention" score of every stored block [n] (`retrieval.scorers.attention_score`,
    differentiable): query [H, T, d], keys [n·B, Hkv, d]."""
    H, T, d = query.shape
    q = query.float().view(kv_heads, H // kv_heads, T, d) / math.sqrt(d)
    k = keys.float().permute(1, 0, 2)  # [Hkv, n·B, d]
    s = torch.einsum("kgtd,knd->kgtn", q, k)  # [Hkv, G, T, n·B]
    weight = s - torch.logsumexp(s, -1, keepdim=True)
    return weight.unflatten(-1, (-1, block)).amax(-1).amax((0, 1, 2))  # [n]


def loss_and_rank(qmap: QueryMap | None, sample: dict, kv_heads: int, block: int):
    """−log of the asked blocks' share of the softmax over blocks, and the asked fact's rank
    (0: first) and whether it is above every distractor."""
    query = sample["query"].float()[None]
    query = (qmap(query) if qmap is not None else query)[0]
    score = block_logits(query, sample["keys"], kv_heads, block)
    asked = sample["slots"][sample["asked"]]
    loss = torch.logsumexp(score, 0) - torch.logsumexp(score[asked], 0)
    got = ranks(score.detach(), sample["slots"], sample["asked"])
    return loss, got["rank"], got["above_distractors"]


def evaluate(qmap, samples: list[dict], kv_heads: int, block: int, last: int = 0) -> dict:
    """Ranks and loss over `samples`, the blocks chosen by the last `last` queries (0: all)."""
    with torch.no_grad():
        got = [loss_and_rank(qmap, {**s, "query": s["query"][:, -last:]}, kv_heads, block)
               for s in samples]  # fmt: skip
    n = len(got)
    first = sum(r == 0 for _, r, _ in got)
    above = sum(a for _, _, a in got)
    return {"questions": n, "first": first, "first_interval": wilson(first, n),
            "above": above, "above_interval": wilson(above, n),
            "median_rank": statistics.median(r for _, r, _ in got) if n else None,
            "loss": sum(float(x) for x, _, _ in got) / max(n, 1)}  # fmt: skip


def train(train_set, valid_set, heads, head_dim, select, args, kv_heads, block):
    qmap = QueryMap(heads, head_dim, select)
    opt = torch.optim.Adam(qmap.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(args.seed)
    best, best_state, history = None, None, []
    for epoch in range(args.epochs + 1):
        if epoch:  # epoch 0: the untrained map (the identity)
            for i in torch.randperm(len(train_set), generator=gen).tolist():
                loss = loss_and_rank(qmap, train_set[i], kv_heads, block)[0]
                eye = torch.eye(head_dim)
                loss = loss + args.decay * (qmap.weight - eye).pow(2).sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
        got = evaluate(qmap, valid_set, kv_heads, block)
        history.append({"epoch": epoch, **got})
        print(f"epoch {epoch}: valid first {got['first']}/{got['questions']}, "
              f"loss {got['loss']:.3f}", flush=True)  # fmt: skip
        key = (got["first"], -got["loss"])
        if best is None or key > best:
            best, best_state = key, qmap.weight.detach().clone()
    with torch.no_grad():
        qmap.weight.copy_(best_state)
    return qmap, history


# ---------------------------------------------------------------------- the run
def facts_maker(args, encode, split: str):
    books = book_texts(Path(args.data_dir), split)
    low, high = (int(x) for x in args.passage_lengths.split(","))
    entropy = {"train": 1, "valid": 2}[split]

    def make(i: int):
        rng = np.random.default_rng([args.seed, entropy, i])
        ids, keys, questions = facts_passage(rng, encode, books, int(rng.integers(low, high)))
        return [(ids + q, keys, j) for j, q in enumerate(questions)]

    return make


def ruler_maker(rows: list[dict], tokenizer):
    def make(i: int):
        r = rows[i]
        needles = ruler_needles(r["prompt"], r["input_ids"], tokenizer)
        asked = [j for j, (number, _) in enumerate(needles) if number in r["expected"]]
        if len(asked) != 1:
            return []  # the asked number not found once among the needles
        return [(r["input_ids"], [t for _, t in needles], asked[0])]

    return make


def render(data: dict, notes: str) -> str:
    s = data["setup"]
    lines = [
        "# The read trained on the facts task: does the asked fact's block rank first?",
        "",
        f"Base model `{s['base_model']}`; preset `{PRESET}` with every query choosing "
        f"(`select_queries=0`; its choosing block {s['select_layer']}). A map W_h of each "
        "query head's choosing queries "
        "(`inftyformer.retrieval.query_map`, W_h = I untrained) "
        f"trained for {s['epochs']} epochs on "
        f"{s['train_questions']} questions of {s['train_passages']} facts passages (train "
        f"books, the facts task's train wordings, {FACTS} alike facts a passage, "
        f"{s['passage_lengths']} tokens); the map kept: best on {s['valid_questions']} "
        f"questions of valid-book passages. For each question whose fact lies in a stored "
        "block: ranked first among all stored blocks, ranked above every distractor's block "
        "(share [95% Wilson interval]), median rank (0 = first); map: untrained or trained, "
        "the blocks chosen by every query of the question's call, or by its last k only "
        "(`select_queries`). Rendered from "
        "`retrieval_trained.json` by `experiments/retrieval_trained.py`.",
        "",
        "| passages | map | questions | first | above every distractor | median rank |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, cell in data["cells"].items():
        for which, c in cell.items():
            n = c["questions"]
            lines.append(
                f"| {name} | {which} | {n} | {c['first']}/{n} "
                f"[{c['first_interval'][0]:.2f}, {c['first_interval'][1]:.2f}] | "
                f"{c['above']}/{n} [{c['above_interval'][0]:.2f}, {c['above_interval'][1]:.2f}]"
                f" | {c['median_rank']} |"
            )
    lines += ["", "Validation by epoch (first / questions, loss): " + ", ".join(
        f"{h['epoch']}: {h['first']}/{h['questions']}, {h['loss']:.2f}" for h in data["history"]
    ) + ".", "", "```", data["command"], "```", "", f"Machine: {data['machine']['cpu']}", "",
        notes]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-model", default=None)
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--passages", type=int, default=60, help="training passages (4 questions)")
    p.add_argument("--valid-passages", type=int, default=10)
    p.add_argument("--passage-lengths", default="3000,8200", help="low,high tokens")
    p.add_argument("--prompts", default=None, help="RULER prompts (ruler.py --dump-prompts)")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--decay", type=float, default=1e-3, help="× ‖W − I‖² in the loss")
    p.add_argument(
        "--select-queries",
        type=int,
        default=32,
        help="the ranks also with the blocks chosen by the last k queries (`select_queries`)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work", default="runs/retrieval-trained")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--quick", action="store_true", help="a tiny random model, 2 passages")
    args = p.parse_args(argv)
    if args.quick and Path(args.out).resolve() == OUT.resolve():
        p.error("--quick needs an --out of its own (its tiny model's ranks are not docs/'s)")
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    work, out = Path(args.work), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    if args.quick:
        args.base_model = str(quick_model(work / "quick-model"))
        args.passages, args.valid_passages, args.epochs = 2, 1, 1
        args.passage_lengths = "1400,1600"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_dir = args.base_model or default_base_model()
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    reader = Reader(base)
    model = reader.model
    kv, block = model.kv_heads, model.config.block_size
    heads, select = int(base.config.num_attention_heads), model.select_layer

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False).input_ids

    sets = {}
    for split, count in (("train", args.passages), ("valid", args.valid_passages)):
        make = facts_maker(args, encode, split)
        sets[split] = collect(work / f"features-{split}.pt", make, count, reader, split)
    if args.prompts:
        import json

        rows = [json.loads(x) for x in Path(args.prompts).read_text().splitlines() if x]
        for length in sorted({r["length"] for r in rows}):
            mine = [r for r in rows if r["length"] == length]
            name = f"{mine[0]['task']} {length}"
            path = work / f"features-{mine[0]['task']}-{length}.pt"
            sets[name] = collect(path, ruler_maker(mine, tokenizer), len(mine), reader, name)
    qmap, history = train(sets["train"], sets["valid"], heads, model.head_dim, select, args,
                          kv, block)  # fmt: skip
    saved = qmap.save(work / "query-map.safetensors")
    print(f"query map written to {saved}", flush=True)
    k = args.select_queries
    cells = {
        name: {"untrained": evaluate(None, samples, kv, block),
               "trained": evaluate(qmap, samples, kv, block),
               f"untrained, last {k}": evaluate(None, samples, kv, block, k),
               f"trained, last {k}": evaluate(qmap, samples, kv, block, k)}
        for name, samples in sets.items() if name != "train"
    }  # fmt: skip
    command = "python experiments/retrieval_trained.py " + " ".join(
        a for a in (argv if argv is not None else __import__("sys").argv[1:])
    )
    data = {
        "setup": {"base_model": Path(base_dir).name, "select_layer": select,
                  "epochs": args.epochs, "lr": args.lr, "decay": args.decay,
                  "train_passages": args.passages, "train_questions": len(sets["train"]),
                  "valid_questions": len(sets["valid"]), "seed": args.seed,
                  "select_queries": args.select_queries,
                  "passage_lengths": args.passage_lengths.replace(",", "–")},
        "cells": cells, "history": history, "command": command, "machine": machine_info(),
    }  # fmt: skip
    write_json(out / f"{NAME}.json", data)
    md = out / f"{NAME}.md"
    write_text(md, render(data, kept_notes(md)))
    print(f"wrote {out / NAME}.json and .md", flush=True)


if __name__ == "__main__":
    main()
