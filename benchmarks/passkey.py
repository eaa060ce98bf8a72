"""The passkey probe on the pretrained path: how far back the memory brings a number.

A five-digit key is hidden in filler text at a chosen distance from the end of a prompt of about
`--tokens` tokens, streamed in segments of L tokens: the base model attends only within the last
(partial) segment, so a key further back than that can only come back through the memory. Greedy
answers, exact match, `--samples` keys per distance. Models: the base alone, and the models
trained by `benchmarks/compare_pretrained.py` with memory (their run directories, found in its
results). Writes OUT/passkey.json and renders OUT/passkey.md (notes kept in passkey.notes.md).

    python benchmarks/passkey.py                    # after compare_pretrained.py
    python benchmarks/passkey.py --rows memory-density   # one more row, the others kept
    python benchmarks/passkey.py --quick            # tiny random model, seconds
    python benchmarks/passkey.py --render-only
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import experiment as ex

NAME = "passkey"
ROWS = {  # compare_pretrained row → label
    "base": "base model, no memory",
    "memory-frozen": "memory trained, base frozen (row c of docs/pretrained.md)",
    "memory-all": "memory trained with the base (row d)",
    "memory-sticky": "sticky memory trained, base frozen (row e)",
    "memory-density": "memory trained, base frozen, density heads at their own rate (row f)",
}


def evaluate(rows: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from inftyformer.data import load_tokenizer
    from inftyformer.models import PretrainedMemoryConfig, build_model
    from inftyformer.tasks.passkey import passkey_accuracy
    from inftyformer.training import load_run

    torch.set_num_threads(1)
    out = {}
    for name, source in rows.items():
        start, cpu = time.perf_counter(), time.process_time()
        if source["run"] is None:
            config = PretrainedMemoryConfig(base_model=source["base_model"], memory=False,
                                            segment_len=args.segment_len)  # fmt: skip
            model = build_model(config)
        else:
            model = load_run(source["run"]).model
        tokenizer = load_tokenizer(source["base_model"])
        results = passkey_accuracy(
            model, tokenizer, args.distances, args.samples, args.tokens, max_new_tokens=8
        )
        out[name] = {
            "segment_len": model.config.segment_len,
            "results": {str(k): v for k, v in results.items()},
            "seconds": time.perf_counter() - start,
            "cpu_seconds": time.process_time() - cpu,
        }
        print(f"{name}: " + ", ".join(f"{k}: {v['accuracy']:.2f}" for k, v in results.items()))
    return out


def render(data: dict[str, Any], out_dir: Path) -> None:
    setup, rows = data["setup"], data["rows"]
    lines = [
        "# Passkey retrieval on the pretrained path",
        "",
        f"A five-digit key hidden in filler text at a distance d (tokens from the end of the key "
        f"sentence to the end of the prompt) in a prompt of about {setup['tokens']:,} tokens, "
        "streamed in segments of L tokens: everything but the last, partial segment goes "
        "through the memory first; the model then answers greedily from that last segment. "
        f"Exact match over {setup['samples']} keys per distance (`inftyformer.tasks.passkey`).",
        "",
    ]
    distances = [str(d) for d in setup["distances"]]
    header = ["model", "L", *(f"d = {d}" for d in distances), "CPU min"]
    table = []
    for name, row in sorted(rows.items(), key=lambda kv: list(ROWS).index(kv[0])):
        r = row["results"]
        table.append([ROWS.get(name, name), row["segment_len"],
                      *(f"{r[d]['accuracy']:.2f}" for d in distances),
                      f"{row['cpu_seconds'] / 60:.1f}"])  # fmt: skip
    lines += [ex.table(header, table), ""]
    any_row = next(iter(rows.values()))
    actual = [
        f"{d}: {min(any_row['results'][d]['distance_tokens'])}–"
        f"{max(any_row['results'][d]['distance_tokens'])}"
        for d in distances
    ]
    lines += [f"Actual distances in tokens (filler comes in whole sentences): {', '.join(actual)}."]
    lines += ["", ex.hand_notes(out_dir / f"{NAME}.md"), ""]
    (out_dir / f"{NAME}.md").write_text("\n".join(lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--out", type=Path, help="reports (default docs/; --quick: tmp)")
    p.add_argument("--base-model", default=ex.default_base_model())
    p.add_argument("--runs", type=Path, default=Path("runs/compare_pretrained"),
                   help="compare_pretrained's runs directory (holds results.jsonl)")  # fmt: skip
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--distances", type=str, default="16,200,400,800")
    p.add_argument("--samples", type=int, default=10)
    p.add_argument("--segment-len", type=int, default=256)
    p.add_argument("--rows", type=str,
                   help="evaluate only these rows (comma-separated) and keep the others of "
                        "OUT/passkey.json (same settings)")  # fmt: skip
    args = p.parse_args(argv)
    args.distances = [int(d) for d in args.distances.split(",")]
    out_dir = args.out or (Path(tempfile.mkdtemp()) if args.quick else ex.ROOT / "docs")
    if args.render_only:
        render(ex.load_report(out_dir / f"{NAME}.json"), out_dir)
        return
    rows: dict[str, Any] = {"base": {"base_model": args.base_model, "run": None}}
    if args.quick:
        from compare_pretrained import tiny_base

        base = tiny_base(Path(tempfile.mkdtemp()) / "base")
        rows = {"base": {"base_model": base, "run": None}}
        args.tokens, args.samples, args.distances, args.segment_len = 96, 2, [8, 64], 32
    else:
        results = args.runs / "results.jsonl"
        for line in results.read_text().splitlines() if results.exists() else []:
            entry = json.loads(line)
            row = entry["key"][0]
            if row in ROWS and row != "base":
                recorded = entry["result"].get("run_dir")
                run_dir = Path(recorded) if recorded and Path(recorded).is_dir() else None
                if run_dir is None:
                    run_dir = next(args.runs.glob(f"pretrained-{row}-*"), None)
                if run_dir is not None:
                    rows[row] = {"base_model": args.base_model, "run": str(run_dir)}
    setup = {k: getattr(args, k) for k in ("tokens", "distances", "samples", "segment_len")}
    kept: dict[str, Any] = {}
    if args.rows:
        chosen = {r.strip() for r in args.rows.split(",") if r.strip()}
        unknown = sorted(chosen - set(rows))
        if unknown:
            raise SystemExit(f"no run for rows {unknown}; found {', '.join(rows)}")
        previous = ex.load_report(out_dir / f"{NAME}.json")
        if previous["setup"] != setup:
            raise SystemExit("--rows: the settings differ from OUT/passkey.json; run all rows")
        kept = {k: v for k, v in previous["rows"].items() if k not in chosen}
        rows = {k: v for k, v in rows.items() if k in chosen}
    start = time.perf_counter()
    evaluated = kept | evaluate(rows, args)
    data = ex.report(NAME, setup, {}, {}, [], 1, time.perf_counter() - start) | {"rows": evaluated}
    ex.write_report(out_dir / f"{NAME}.json", data)
    render(data, out_dir)
    print(f"wrote {out_dir / NAME}.md")


if __name__ == "__main__":
    main()
