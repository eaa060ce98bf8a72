"""A document read once, asked twice: what a session costs (`inftyformer ask --session`,
docs/ask.md) on a real chat model.

For each length, a passage of a test book of about that many tokens with a pass key at 40% of
it ("The pass key is NNNNN. Remember it. NNNNN is the pass key.") is read into a session
(`DocumentReader.read`), the question "What is the pass key?" asked; then the session is loaded
as a later `ask` would and the question asked again. Recorded: the seconds to read, to load and
to answer, the session's bytes by file (blocks, choosing keys, state) and per token read,
whether the two answers are the same tokens, whether they hold the key, the peak RSS.

    python experiments/ask_session.py --base-model models/smollm2-135m --lengths 2048,8192
    python experiments/ask_session.py --render-only

OUT/ask.json holds the rows; the table between the markers of docs/ask.md is rendered from it.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs"
BOOK = "pg19-mini/test/84.txt"  # in the data directory (`inftyformer.data.paths`)
QUESTION = "What is the pass key?"
BEGIN, END = "<!-- ask.json: rendered by experiments/ask_session.py -->", "<!-- /ask.json -->"


def passage(tokenizer, book: str, length: int, key: int) -> str:
    """About `length` tokens of `book` with the pass key at 40% (cut at a paragraph)."""
    ids = tokenizer(book, add_special_tokens=False, verbose=False)["input_ids"][:length]
    text = tokenizer.decode(ids)
    at = text.find("\n\n", int(len(text) * 0.4))
    at = at if at >= 0 else int(len(text) * 0.4)
    fact = f"\n\nThe pass key is {key}. Remember it. {key} is the pass key.\n\n"
    return text[:at] + fact + text[at:]


def folder_bytes(folder: Path) -> dict[str, int]:
    parts = {"blocks": 0, "keys": 0, "state": 0, "info": 0}
    for path in folder.rglob("*"):
        if path.is_file():
            kind = ("blocks" if path.parent.name == "blocks" else "keys"
                    if path.name.startswith("keys-") else "state"
                    if path.name.startswith("state-") else "info")  # fmt: skip
            parts[kind] += path.stat().st_size
    return parts


def book_path(data_dir: str | Path | None = None) -> Path:
    """The test book in `data_dir` (default: the shared data, `inftyformer.data.paths`)."""
    from inftyformer.data.paths import resolve_data_dir

    return resolve_data_dir(data_dir) / BOOK


def measure(
    base_model: str, book: Path, length: int, preset: str | None, seed: int, **settings
) -> dict:
    import torch

    from inftyformer._measure import peak_rss_mb
    from inftyformer.retrieval.ask import DocumentReader

    torch.set_num_threads(1)
    reader = DocumentReader.from_base(base_model, preset, **settings)
    key = random.Random(seed + length).randrange(10_000, 100_000)
    text = passage(reader.tokenizer, book.read_text(encoding="utf-8"), length, key)
    folder = Path(tempfile.mkdtemp(prefix="ask-session-"))
    try:
        start = time.perf_counter()
        reader.read(text, session=folder)
        read_s = time.perf_counter() - start
        start = time.perf_counter()
        first = reader.answer_tokens(QUESTION, max_new_tokens=24)
        answer_s = time.perf_counter() - start
        again = DocumentReader(reader.model, reader.tokenizer, reader.key)
        start = time.perf_counter()
        again.load(folder)
        load_s = time.perf_counter() - start
        start = time.perf_counter()
        second = again.answer_tokens(QUESTION, max_new_tokens=24)
        answer2_s = time.perf_counter() - start
        sizes = folder_bytes(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    tokens = reader.info.tokens
    stored = int(reader.state.blocks[0]) * reader.model.config.block_size
    answer = reader.tokenizer.decode(first, skip_special_tokens=True)
    return {
        "length": length, "preset": preset, "tokens": tokens, "stored_tokens": stored,
        "read_s": read_s, "answer_s": answer_s, "load_s": load_s, "answer_again_s": answer2_s,
        "bytes": sizes, "block_bytes_per_stored_token": sizes["blocks"] / max(stored, 1),
        "same_answer": first == second, "answer": answer, "has_key": str(key) in answer,
        "peak_rss_mb": peak_rss_mb(),
    }  # fmt: skip


def render(data: dict) -> str:
    from inftyformer._measure import markdown_table

    rows = [
        (f"{r['tokens']:,}", r["preset"], f"{r['read_s']:.0f}", f"{r['answer_s']:.1f}",
         f"{r['load_s']:.1f}", f"{r['answer_again_s']:.1f}",
         f"{sum(r['bytes'].values()) / 2**20:.0f}", f"{r['bytes']['state'] / 2**20:.0f}",
         f"{r['block_bytes_per_stored_token']:,.0f}", "yes" if r["same_answer"] else "no",
         "yes" if r["has_key"] else "no")
        for r in data["rows"]
    ]  # fmt: skip
    headers = ("tokens read", "preset", "read (s)", "answer (s)", "load (s)", "answer again (s)",
               "session (MiB)", "of it state (MiB)", "block bytes / stored token",
               "same answer", "key in answer")  # fmt: skip
    machine = data["machine"]
    return (
        f"{BEGIN}\nMeasured on `{Path(data['base_model']).name}`, one CPU thread "
        f"({machine.get('cpu', '?')}, a machine shared with other jobs: the seconds vary with "
        f"its load), by `{data['command']}`:\n\n"
        + markdown_table(headers, rows) + f"\n{END}"
    )  # fmt: skip


def write_page(data: dict, page: Path) -> None:
    from inftyformer._measure import write_text

    text = page.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise ValueError(f"{page} has no markers {BEGIN} … {END}")
    head, rest = text.split(BEGIN, 1)
    write_text(page, head + render(data) + rest.split(END, 1)[1])


def main() -> None:
    from inftyformer._measure import command_line, machine_info, write_json

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-model", default="models/smollm2-135m")
    parser.add_argument("--lengths", default="2048,8192")
    parser.add_argument("--preset", default="retrieval")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default=None, help="holds pg19-mini/ (default: shared)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--render-only", action="store_true")
    args = parser.parse_args()
    path = args.out / "ask.json"
    if not args.render_only:
        import json

        book = book_path(args.data_dir)
        rows = [measure(args.base_model, book, int(n), args.preset, args.seed)
                for n in args.lengths.split(",")]  # fmt: skip
        data = {"base_model": args.base_model, "command": command_line(),
                "machine": machine_info(), "rows": rows}  # fmt: skip
        write_json(path, data)
        print(json.dumps(rows, indent=1))
    import json

    write_page(json.loads(path.read_text(encoding="utf-8")), args.out / "ask.md")


if __name__ == "__main__":
    main()
