"""Speed and memory of the four models on one backbone (transformer, xl, compressive, infty).

    python benchmarks/bench_models.py            # full run (≈ 30 min on 2 shared cores)
    python benchmarks/bench_models.py --quick    # < 1 min: cpu-small only, short histories

Writes docs/results/benchmarks/models.{json,md,png}:

1. Throughput at three sizes (cpu-small, a larger one, the paper's sorting configuration at
   batch 1), all four models with the same backbone size: training tokens/s (forward + backward
   + Adam step), inference tokens/s (eval forward, no grad), peak RSS of a fresh process running
   a few training steps, the ∞-former's step time over Transformer-XL's, next to the ratio of
   their matrix-multiply FLOPs (torch's FlopCounterMode), and each model's speed-up under
   torch.compile(model) and under bf16 autocast. All models and variants are timed round-robin
   in one process (ratios within one run), medians of repeats. Also the graph breaks of
   torch.compile per model (torch._dynamo.explain), with the source line of each.
2. Per-segment inference time as the processed history grows (1K tokens → up to 1M): XL, the
   compressive model and the ∞-former stream side by side, one segment each in turn.
3. What attending to the full history would cost instead: one vanilla-transformer forward over
   the whole context, and one segment with the whole history as cached keys/values (XL with
   mem_len = history), timed at growing lengths until too slow, then extrapolated with a fit of
   a·n + b·n² (resp. a + b·n) — extrapolated points are marked as such.

Every measurement runs in a fresh subprocess (`_measure.run_worker`): its own peak RSS, no
allocator state carried between measurements.

The measurements are `_bench_models_measure.py`, the report `_bench_models_report.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from _bench_models_measure import MODEL_TYPES, SIZES, VARIANTS, WORKERS, make_config
from _bench_models_report import extrapolate, summary_lines, write_report

from inftyformer import _measure as common

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "docs" / "results" / "benchmarks"


def _log(t0: float, message: str) -> None:
    print(f"[bench_models {time.perf_counter() - t0:5.0f} s] {message}", flush=True)


SECTIONS = ("throughput", "graph_breaks", "history", "full")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="< 2 min: a smoke-sized run")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--max-history", type=int, default=None, help="tokens (default 1M)")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 9)")
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), help="throughput sizes")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated subset of {','.join(SECTIONS)}; the others are kept from the "
        "previous models.json",
    )
    parser.add_argument(
        "--variants",
        default=None,
        help="besides eager float32, comma-separated subset of compiled,bf16 "
        "(default: both; --quick: bf16, since compiling four models takes minutes)",
    )
    parser.add_argument(
        "--render-only", action="store_true", help="re-render models.md from models.json"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-args", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        res = WORKERS[args.worker](json.loads(args.worker_args))
        Path(args.worker_out).write_text(json.dumps(res))
        return
    out = args.out
    if args.render_only:
        write_report(json.loads((out / "models.json").read_text()), out)
        return
    quick = args.quick
    sections = [x for x in args.sections.split(",") if x]
    if unknown := set(sections) - set(SECTIONS):
        parser.error(f"unknown sections {sorted(unknown)}")
    sizes = args.sizes or (["cpu-small"] if quick else list(SIZES))
    chosen = args.variants if args.variants is not None else "bf16" if quick else "compiled,bf16"
    variants = [v for v in chosen.split(",") if v]
    if unknown := set(variants) - set(VARIANTS[1:]):
        parser.error(f"unknown variants {sorted(unknown)}")
    max_history = args.max_history or (4096 if quick else 1 << 20)
    settings = {
        "quick": quick,
        "threads": args.threads,
        "repeats": args.repeats or (3 if quick else 9),
        "warmup": 4,  # the 3rd and 4th calls build the long-term design matrices
        "rss_steps": 1 if quick else 3,
        "window": 4 if quick else 16,
        "limit_s": 0.5 if quick else 8.0,
        "max_history": max_history,
    }
    script = Path(__file__).resolve()
    t0 = time.perf_counter()
    previous = out / "models.json"
    result: dict[str, Any] = {}
    if previous.exists() and not quick and set(sections) != set(SECTIONS):
        result = json.loads(previous.read_text())
        print(f"[bench_models] keeping the other sections of {previous}", flush=True)
    machine = common.machine_info()
    machine["torch_threads"] = args.threads
    result.update(command=common.command_line(), machine=machine)
    for section in sections:  # which invocation measured which section
        result.setdefault("commands", {})[section] = common.command_line()
    result.setdefault("settings", {}).update(settings)

    if "throughput" in sections:
        throughput = []
        for size in sizes:
            _log(t0, f"throughput {size}")
            tp = common.run_worker(
                script,
                "throughput",
                dict(
                    size=size,
                    threads=args.threads,
                    repeats=SIZES[size].get("repeats", settings["repeats"]),
                    warmup=settings["warmup"],
                    variants=variants,
                ),
            )
            tp["config"] = make_config(size, "infty").to_dict()
            tp["load_average"] = list(os.getloadavg())
            for mt in ("xl", "infty") if quick else MODEL_TYPES:  # quick: the pair that matters
                _log(t0, f"peak RSS {size} {mt}")
                tp["models"][mt]["rss"] = common.run_worker(
                    script,
                    "rss",
                    dict(
                        size=size, model_type=mt, threads=args.threads, steps=settings["rss_steps"]
                    ),
                )
            throughput.append(tp)
        result["throughput"] = throughput
    if "graph_breaks" in sections:
        _log(t0, "graph breaks")
        result["graph_breaks"] = common.run_worker(
            script, "graph_breaks", dict(threads=args.threads)
        )
    if "history" in sections:
        milestones = [n for n in (2**k for k in range(10, 21)) if n <= max_history]
        _log(t0, f"history up to {milestones[-1]:,} tokens")
        result["history"] = common.run_worker(
            script,
            "history",
            dict(threads=args.threads, milestones=milestones, window=settings["window"]),
        )
    if "full" in sections:
        # (a) materialises [heads, n, n] score tensors: 8K tokens already take ~1 GiB per tensor
        full_lengths = [2**k for k in range(7, 12 if quick else 14)]
        cached_lengths = [2**k for k in range(7, 12 if quick else 17)]
        _log(t0, "full-history attention")
        full = common.run_worker(
            script,
            "full",
            dict(
                threads=args.threads,
                full_lengths=full_lengths,
                cached_lengths=cached_lengths,
                limit_s=settings["limit_s"],
                repeats=3,
            ),
        )
        targets = [8192, 65536, 1 << 20]
        full["full_forward_fit"], full["full_forward_extrapolated"] = extrapolate(
            full["full_forward"], "context", (1, 2), targets
        )
        full["cached_segment_fit"], full["cached_segment_extrapolated"] = extrapolate(
            full["cached_segment"], "history_tokens", (0, 1), targets
        )
        result["full"] = full
    result.pop("summary", None)  # written by older versions; now rendered from the data
    result["wall_s"] = time.perf_counter() - t0
    common.write_json(out / "models.json", result)
    write_report(result, out)
    print("\n".join(summary_lines(result)))
    print(f"[bench_models] wrote {out}/models.{{json,md,png}} in {result['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
