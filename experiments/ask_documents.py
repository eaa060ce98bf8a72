"""What `inftyformer ask` does with a document, on a chat model (docs/ask.md says how it is
measured): how often it answers right on documents of three kinds, and what a first and a later
question cost in seconds and memory against the document's length.

    python experiments/ask_documents.py --base-model models/smollm2-135m --documents 9
    python experiments/ask_documents.py --quick --out /tmp/ask   # a tiny random model
    python experiments/ask_documents.py --render-only

Each answer is appended to OUT/ask_documents.jsonl as it is made (a rerun skips those there);
OUT/ask_documents.json is computed from it, its tables rendered into docs/ask.md's markers.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import random
import sysconfig
import tempfile
import time
from pathlib import Path

import torch
from _arguments import positive_int, positive_ints
from experiment import tiny_model_writer
from retrieval import wilson

from inftyformer import _measure
from inftyformer.data.cmu_dog import load_cmu_dog
from inftyformer.data.paths import resolve_data_dir
from inftyformer.retrieval.ask import DocumentReader

ROOT = Path(__file__).resolve().parent.parent
DOCS, NAME = ROOT / "docs", "ask_documents"
BEGIN, END = f"<!-- {NAME}.json: rendered by experiments/{NAME}.py -->", f"<!-- /{NAME}.json -->"
KINDS, CONDITIONS = ("code", "dialogue", "prose"), ("one", "alike")
GROUPS = [*itertools.product(KINDS, CONDITIONS), ("all", "all")]
PACKAGES = "json email http urllib logging xml concurrent importlib unittest asyncio html".split()
THINGS = ("garage", "boathouse", "north gate", "server room", "wine cellar", "archive", "attic")
FACT = {"code": "# The {}.\n", "dialogue": "Ben: Before I forget, the {}.\n", "prose": "The {}. "}
AFTER = {"code": "\n", "dialogue": "\n", "prose": ". "}  # a fact goes in right after one
SPEAKERS = {"user1": "Ann", "user2": "Ben"}
PACKED = "packed"  # a row, not a preset: `preset_of`
KEY = ("part", "row", "kind", "condition", "doc", "length")  # what a record answers
QUICK = dict(block_size=8, blocks=2, sink_blocks=1, window=32, segment_len=16)
COST_QUESTION = "Who is this story about?"
COST = (  # the cost table's columns, then its cells
    "row|tokens read|first answer (s)|later question (s)|session (MiB)|same answer|RSS, model "
    "loaded (MiB)|peak RSS (MiB)\n{row}|{tokens:,}|{first_s:.0f}|{later_s:.1f}|{session_mib:,.0f}|"
    "{same_answer}|{loaded_rss_mib:,.0f}|{peak_rss_mib:,.0f}"
).split("\n")


def source(kind: str, doc: int, length: int, data_dir: Path) -> str:
    """The text document `doc` of `kind` is cut from (documents of one kind never overlap)."""
    if kind == "code":
        top = Path(sysconfig.get_paths()["stdlib"]) / PACKAGES[doc % len(PACKAGES)]
        files = sorted(top.rglob("*.py"))
        return "".join(f"# file: {p.relative_to(top.parent)}\n{p.read_text()}\n" for p in files)
    if kind == "dialogue":
        per = length // 300 + 2  # a test conversation is ~600 tokens
        talks = load_cmu_dog(data_dir, "test")[doc * per : (doc + 1) * per]
        turns = [t for talk in talks for t in (*talk.turns, None)]  # None: a blank line
        return "".join(
            f"{SPEAKERS[t.speaker]}: {' '.join(t.text.split())}\n" if t else "\n" for t in turns
        )
    books = sorted((data_dir / "pg19-mini" / "test").glob("*.txt"))
    text = books[doc % len(books)].read_text(encoding="utf-8")
    start = 5000 + (doc // len(books)) * length * 8  # passages of one book never overlap
    return text[text.find("\n\n", start) + 2 :]


def cut(tokenizer, text: str, length: int, what: str) -> str:
    """The first `length` tokens of `text`."""
    ids = tokenizer(text[: length * 12], add_special_tokens=False)["input_ids"]
    if len(ids) < length:
        raise ValueError(f"{what} has {len(ids)} tokens, fewer than the {length} asked")
    return tokenizer.decode(ids[:length])


@functools.lru_cache(maxsize=1)
def document(tokenizer, kind: str, doc: int, condition: str, length: int, seed: int, data_dir):
    """(text of about `length` tokens with its facts, question, the asked code, its depth): the
    facts drawn from (`seed`, kind, doc) alone, so `one` and `alike` share the asked fact."""
    rng = random.Random(f"{seed}:{kind}:{doc}")
    things, codes = rng.sample(THINGS, 4), rng.sample(range(10_000, 100_000), 4)
    depths = [rng.uniform(0.05, 0.95) for _ in things]
    n = 1 if condition == "one" else 4
    facts = [FACT[kind].format(f"access code for the {things[i]} is {codes[i]}") for i in range(n)]
    spent = sum(len(tokenizer(f, add_special_tokens=False)["input_ids"]) for f in facts)
    text = cut(tokenizer, source(kind, doc, length, data_dir), length - spent, f"{kind} {doc}")
    for depth, fact in sorted(zip(depths, facts, strict=False), reverse=True):  # deepest first
        at = text.find(AFTER[kind], int(depth * len(text)))  # after the next boundary
        at = len(text) if at < 0 else at + len(AFTER[kind])
        text = text[:at] + fact + text[at:]
    return text, f"What is the access code for the {things[0]}?", codes[0], depths[0]


def preset_of(row: str, settings: dict) -> tuple[str, dict]:
    """The preset and settings of `row`: a retrieval preset, or `packed` (the default preset
    with choice max, as it was until it chose questions)."""
    return ("retrieval", {**settings, "choice": "max"}) if row == PACKED else (row, settings)


def answer(reader, row: str, text: str, question: str, new_tokens: int) -> dict:
    """One answer of `row`: the reader's (read, then answer) or the base's on the whole prompt
    (`full`; skipped beyond its positions)."""
    start = time.perf_counter()
    if row == "full":
        read = len(reader.document_tokens(text))  # what is read of the document
        ids = reader.document_tokens(text) + reader.question_tokens(question)
        if len(ids) + new_tokens > (most := reader.model.base.config.max_position_embeddings):
            return {"skipped": f"{len(ids)} + {new_tokens} tokens > {most} positions"}
        stop, x = sorted(reader.stop), torch.tensor([ids])  # HF's generate is under no_grad
        greedy = dict(do_sample=False, eos_token_id=stop, pad_token_id=stop[0])
        out = reader.model.base.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, **greedy
        )
        tokens = out[0, len(ids) :].tolist()
    else:
        if reader.state is not None:
            reader.state.store.close()
        reader.read(text)
        tokens, read = reader.answer_tokens(question, max_new_tokens=new_tokens), reader.info.tokens
    words = reader.tokenizer.decode(tokens, skip_special_tokens=True)
    return {"answer": words, "tokens": read, "seconds": time.perf_counter() - start}


def cost_worker(job: dict) -> dict:
    """In a fresh process (its own peak RSS): `length` tokens of the test books one after
    another read into a session and asked (the first answer), the session loaded by a fresh
    reader and asked again (a later question); seconds, session size, peak RSS."""
    reader = DocumentReader.from_base(job["base_model"], job["preset"], **job["settings"])
    books = sorted((Path(job["data_dir"]) / "pg19-mini" / "test").glob("*.txt"))
    text = "\n\n".join(b.read_text(encoding="utf-8") for b in books)
    loaded, text = _measure.rss_mb(), cut(reader.tokenizer, text, job["length"], "the test books")
    with tempfile.TemporaryDirectory(prefix="ask-session-") as folder:
        start = time.perf_counter()
        reader.read(text, session=folder)
        first = reader.answer_tokens(COST_QUESTION, max_new_tokens=16)
        first_s, start = time.perf_counter() - start, time.perf_counter()
        later = DocumentReader(reader.model, reader.tokenizer, reader.key)
        later.load(folder)
        same = later.answer_tokens(COST_QUESTION, max_new_tokens=16) == first
        later_s = time.perf_counter() - start
        mib = sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file()) / 2**20
        later.state.store.close()
    got = dict(tokens=reader.info.tokens, first_s=first_s, later_s=later_s, session_mib=mib)
    return got | dict(same_answer=same, loaded_rss_mib=loaded, peak_rss_mib=_measure.peak_rss_mb())


def mcnemar(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value of b and c discordant pairs (a binomial test, p = ½)."""
    n = b + c
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n) if n else 1.0


def summarise(records: list[dict], rows: list[str]) -> dict:
    """Right / n and its interval per row and (kind, condition); McNemar of each preset against
    `full` on the answers both made (b: the preset's right alone, c: full's)."""
    answers = [r for r in records if r["part"] == "answer" and "skipped" not in r]
    cells, tests = {}, {}
    for kind, condition in GROUPS:
        right = {r: {} for r in rows}  # row: {(kind, condition, doc): right}
        for a in answers:
            if kind in ("all", a["kind"]) and condition in ("all", a["condition"]):
                right[a["row"]][a["kind"], a["condition"], a["doc"]] = a["right"]
        for row in rows:
            k, n, name = sum(right[row].values()), len(right[row]), f"{row}/{kind}/{condition}"
            cells[name] = {"right": k, "n": n, "interval": wilson(k, n)}
            if row != "full" and "full" in rows:
                mine, full = right[row], right["full"]
                both = mine.keys() & full.keys()
                b, c = sum(mine[x] > full[x] for x in both), sum(full[x] > mine[x] for x in both)
                tests[name] = {"b": b, "c": c, "p": mcnemar(b, c)}
    return {"cells": cells, "mcnemar": tests}


def render(data: dict) -> str:
    """The tables (the prose around them is docs/ask.md's)."""
    from _experiment_report import table

    s, tests = data["setup"], data["mcnemar"]

    def cell(c: dict) -> str:
        lo, hi = c["interval"]
        return f"{c['right']}/{c['n']} [{lo:.2f}, {hi:.2f}]" if c["n"] else "not run"

    rows = [[r, *(cell(data["cells"][f"{r}/{k}/{c}"]) for k, c in GROUPS)] for r in s["rows"]]
    for r in [r for r in s["rows"] if f"{r}/all/all" in tests]:
        ps = [f"{tests[f'{r}/{k}/{c}']['p']:.2g}" for k, c in GROUPS]
        rows.append([f"{r} vs full: McNemar p", *ps])
    costs = [COST[1].format(**r).split("|") for r in data["cost"]]
    heads = ["row", *(f"{k}, {c}" for k, c in GROUPS[:-1]), "all"]
    made = f"`{Path(s['base_model']).name}` ({data['machine'].get('cpu', '?')})"
    tables = [table(heads, rows), table(COST[0].split("|"), costs)]
    text = [f"{BEGIN}\nMeasured on {made} by `{data['command']}`:", *tables]
    return "\n\n".join(text) + f"\n{END}"


def write_page(data: dict, page: Path) -> None:
    """The tables between the markers of `page` (a page of their own where it has none)."""
    text = page.read_text(encoding="utf-8") if page.exists() else f"{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        raise ValueError(f"{page} has no markers {BEGIN} … {END}")
    head, rest = text.split(BEGIN, 1)
    _measure.write_text(page, head + render(data) + rest.split(END, 1)[1])


def run(args, rows: list[str], settings: dict, log: Path, records: list[dict]) -> None:
    """Every answer and cost not in `records` yet, appended to them and to `log` as it is made."""
    torch.set_num_threads(1)
    data_dir = resolve_data_dir(args.data_dir)
    done = {tuple(r[k] for k in KEY) for r in records}
    readers = {}
    for row in rows[:-1]:
        preset, on_top = preset_of(row, settings)
        readers[row] = DocumentReader.from_base(args.base_model, preset, **on_top)
    readers["full"] = readers[rows[0]]  # `full` is the base of the first preset's reader

    def todo(where: dict) -> list[str]:
        return [row for row in rows if tuple((where | {"row": row})[k] for k in KEY) not in done]

    def append(record: dict) -> None:
        with log.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
        records.append(record)
        print(json.dumps({k: v for k, v in record.items() if k != "answer"}), flush=True)

    for kind, doc, condition in itertools.product(KINDS, range(args.documents), CONDITIONS):
        where = dict(part="answer", kind=kind, condition=condition, doc=doc, length=args.length)
        for row in todo(where):
            made = (readers[row].tokenizer, kind, doc, condition, args.length, args.seed, data_dir)
            text, question, code, depth = document(*made)  # once for all rows (cached)
            got = answer(readers[row], row, text, question, args.new_tokens)
            right = {"right": str(code) in got["answer"]} if "answer" in got else {}
            append(where | dict(row=row, depth=depth, code=code) | got | right)
    for length in args.rss_lengths:
        where = dict(part="cost", kind="prose", condition="-", doc=0, length=length)
        for preset in [row for row in todo(where) if row != "full"]:
            chosen, on_top = preset_of(preset, settings)
            job = dict(base_model=args.base_model, preset=chosen, settings=on_top, length=length)
            job["data_dir"], one_thread = str(data_dir), {"OMP_NUM_THREADS": "1"}  # as here
            got = _measure.run_worker(Path(__file__), "cost", job, env_extra=one_thread)
            append(where | {"row": preset} | got)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-model", default=None, help="a chat model (default: smollm2-135m)")
    p.add_argument("--presets", default="retrieval",
                   help="retrieval presets (or `packed`), comma-separated")  # fmt: skip
    p.add_argument("--documents", type=positive_int, default=9, help="of each kind")
    p.add_argument("--length", type=positive_int, default=4096, help="tokens of a document")
    p.add_argument("--rss-lengths", type=positive_ints, default=[4096, 16384, 65536])
    p.add_argument("--new-tokens", type=positive_int, default=32, help="of an answer, at most")
    p.add_argument("--seed", type=int, default=0, help="of the facts and their depths")
    p.add_argument("--data-dir", default=None, help="holds pg19-mini/, cmu-dog/ (default: shared)")
    p.add_argument("--out", type=Path, default=DOCS)
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--quick", action="store_true", help="a tiny random model, 2 short documents")
    for hidden in ("--worker", "--worker-args", "--worker-out"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:  # a fresh process of `run`'s (`inftyformer._measure.run_worker`)
        return _measure.write_json(args.worker_out, cost_worker(json.loads(args.worker_args)))
    path, log, in_docs = (
        args.out / f"{NAME}.json",
        args.out / f"{NAME}.jsonl",
        args.out.resolve() == DOCS,
    )
    page = DOCS / "ask.md" if in_docs else args.out / f"{NAME}.md"
    if args.render_only:
        return write_page(json.loads(path.read_text(encoding="utf-8")), page)
    if args.documents > len(PACKAGES):
        p.error(f"--documents: at most {len(PACKAGES)}, the standard-library packages read as code")
    if args.quick and in_docs:
        p.error("--quick needs an --out of its own (its tiny model's answers are not docs/'s)")
    settings, rows = {}, [*args.presets.split(","), "full"]
    args.base_model = args.base_model or _measure.default_base_model()
    if args.quick:
        args.base_model = str(args.out / "quick-model")  # tests/tiny_pretrained.py's
        if not Path(args.base_model, "config.json").exists():
            text = "the access code for the garage is 48213. def read(self): return None"
            tiny_model_writer()(args.base_model, chat=True, corpus=[text] * 20, max_positions=1024)
        args.documents, args.length, args.rss_lengths, settings = 2, 320, [1024], QUICK
    records = [json.loads(line) for line in log.open(encoding="utf-8")] if log.exists() else []
    args.out.mkdir(parents=True, exist_ok=True)
    run(args, rows, settings, log, records)
    mine = [r for r in records if r["row"] in rows and r["doc"] < args.documents]
    answers = [r for r in mine if r["part"] == "answer" and r["length"] == args.length]
    setup = {k: getattr(args, k) for k in ("base_model", "seed", "documents", "length")}
    data = dict(setup=setup | dict(rows=rows, settings=settings), command=_measure.command_line())
    data |= dict(machine=_measure.machine_info(), **summarise(answers, rows), answers=answers)
    data["cost"] = [r for r in mine if r["part"] == "cost" and r["length"] in args.rss_lengths]
    _measure.write_json(path, data)
    write_page(data, page)


if __name__ == "__main__":
    main()
