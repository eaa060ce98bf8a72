"""One heads-read setting on a few pass-key distances and test-book windows, untrained: the quick
probe behind the exploratory figures of docs/passkey.notes.md (the side-by-side is passkey.py).

    python experiments/passkey_variant.py --distances 1500 \
        --set '{"num_basis": 2048, "num_samples": 2048, "widths": [0.00125, 0.0025], "tau": 0.75}'
    python experiments/passkey_variant.py --distances 700 --docs 2 --doc-len 2048 \
        --rows window,full,variant

The variant starts from row (xii)'s settings (memory_read = heads, density = mixture, β = 1,
sink edge 0.01, σ² floor 1e-6) and applies --set (a JSON object of adapter settings). The keys
of a distance depend on its place in --distances (as in passkey.py), so compare runs with the
same --distances. Prints one JSON line per row, and appends it to --jsonl FILE when given.
"""

from __future__ import annotations

import argparse
import json
import time

from passkey import (
    Row,
    add_prompt_arguments,
    book_windows,
    evaluate_books,
    evaluate_passkeys,
    passkey_prompts,
    prompt_setup,
)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_prompt_arguments(p, distances="700", keys=5)
    p.add_argument("--set", default="{}", help="adapter settings over row (xii)'s, JSON")
    p.add_argument("--docs", type=int, default=0, help="test-book windows (0: none)")
    p.add_argument("--doc-len", type=int, default=2048)
    p.add_argument(
        "--rows",
        default="variant",
        help="variant, window, full, exact, exact-positions",
    )
    p.add_argument("--jsonl", default=None, help="append each row's line to this file")
    args = p.parse_args(argv)
    # what passkey.Row reads besides the prompts: the ceiling rows' settings are row (xii)'s
    args.memory_layers, args.heads_sink_edge, args.heads_sharpness = None, 0.01, 100.0
    quick = dict(distances="40", keys=2, segment_len=16, window=16, docs=1, doc_len=48)
    _, setup = prompt_setup(args, quick, extra=("docs", "doc_len"))
    prompts = passkey_prompts(args)
    docs = book_windows(args) if args.docs else None
    for name in args.rows.split(","):
        start = time.perf_counter()
        if name == "variant":  # row (xii) with --set over its settings
            row = Row("mixture", args, overrides=json.loads(args.set))
        else:
            row = Row(name, args)
        keys = {
            d: {k: v[k] for k in ("exact", "nll", "right", "answer_tokens")}
            for d, v in evaluate_passkeys(row, prompts).items()
        }
        books = None
        if docs is not None:
            b = evaluate_books(row, docs)
            books = {"buckets": b["buckets"], "from_1k": b["from_1k"]}
        line = {"row": name, "set": json.loads(args.set) if name.startswith("variant") else {},
                "setup": setup, "passkey": keys, "books": books,
                "seconds": time.perf_counter() - start}  # fmt: skip
        print(json.dumps(line), flush=True)
        if args.jsonl:
            with open(args.jsonl, "a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
