"""Speed of the ∞-former's core: one long-term memory update + continuous attention, forward and
backward, per segment and layer.

    python benchmarks/bench_core.py                      # full run (~15 min on a 2-core CPU)
    python benchmarks/bench_core.py --quick              # smoke run (< 2 min), to a temp dir
    python benchmarks/bench_core.py --sections paper     # one section; the others are kept
    python benchmarks/bench_core.py --before-src DIR     # also time the `src` tree of another
                                                         # commit, interleaved (before/after)

Writes docs/results/benchmarks/core.{json,md} and core_history.png. The Markdown is rendered
from the JSON (`--render-only` re-renders it); hand-written notes between the notes markers of
core.md are kept. Every section runs in a fresh process with one torch thread.

paper    `LongTermMemory.update` (CNN gate included) + `LongTermAttention`, forward + backward of
         context.sum() + kl, at the paper's sorting shapes (e 300, 6 heads, N = M = 512, L = 1024
         new vectors and 1024 queries), B = 1 and 8, with the densities as initialised (wide) and
         as narrow as the KL prior asks (σ = σ₀). Variants timed round-robin in one process:
         the library; the continuous read unfused (plain autograd of the closed form over the
         whole [B, H, Q, N], the previous implementation); both under torch.compile; the library
         under bf16 autocast; and a 1024³ sgemm, whose rate turns the step's matrix-multiply
         FLOPs (counted by torch's FlopCounterMode) into the floor the step is compared with.
profile  Where the library step's time goes at B = 8: torch.profiler, self time by operator.
history  Per-segment time and RSS while one stream grows from 1K to 1M tokens (B = 4, L = 512,
         N = 256, e = 300): every segment streamed, the state detached between segments as a
         model does. Each timed segment is paired with a reference segment (the same step on
         the state after the first segment) timed next to it, so that the ratio does not depend
         on the load of a shared machine.

The measurements are `_bench_core_measure.py`, the report `_bench_core_report.py`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _bench_core_measure import WORKERS
from _bench_core_report import write_report

from inftyformer import _measure as common

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve()


# =============================================================================== main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run (< 2 min), to a temp dir")
    ap.add_argument(
        "--sections", default="paper,profile,history", help="subset of paper,profile,history"
    )
    ap.add_argument("--out-dir", type=Path, default=None, help="default: docs/results/benchmarks")
    ap.add_argument("--before-src", default=None, help="a `src` directory of another commit")
    ap.add_argument("--before-label", default=None, help="its name in the report")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile variants")
    ap.add_argument("--render-only", action="store_true", help="re-render core.md from core.json")
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--worker-args", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    torch.set_num_threads(1)  # a shared 2-core machine: one thread is fastest and steadiest
    if a.worker:
        common.write_json(a.worker_out, WORKERS[a.worker](json.loads(a.worker_args)))
        return 0
    out_dir = a.out_dir or (
        Path(tempfile.gettempdir()) / "inftyformer_bench_core"
        if a.quick
        else ROOT / "docs/results/benchmarks"
    )
    previous = out_dir / "core.json"
    if a.render_only:
        write_report(json.loads(previous.read_text()), out_dir)
        return 0
    sections = [s for s in a.sections.split(",") if s]
    if unknown := set(sections) - set(WORKERS):
        ap.error(f"unknown sections {sorted(unknown)}")
    args = {
        "paper": dict(
            batches=[2] if a.quick else [1, 8],
            densities=[False] if a.quick else [False, True],
            repeats=2 if a.quick else 7,
            warmup=1,
            # which steps to compile (each takes a while): --quick only the library's
            compile=[] if a.no_compile else ["library"] if a.quick else ["library", "unfused"],
            before_src=a.before_src,
        ),
        "profile": dict(batch=2 if a.quick else 8, repeats=3, rows=16),
        "history": dict(milestones=[1000, 10000], window=4)
        if a.quick
        else dict(milestones=[1000, 10000, 100000, 1000000], window=14),
    }
    res: dict[str, Any] = {"machine": common.machine_info()}
    if previous.exists() and not a.quick:
        res.update({k: v for k, v in json.loads(previous.read_text()).items() if k in WORKERS})
    for name in sections:
        print(f"{name} …", file=sys.stderr, flush=True)
        t0, load0 = time.perf_counter(), os.getloadavg()[0]
        res[name] = common.run_worker(SCRIPT, name, args[name])
        res[name]["provenance"] = {
            "command": common.command_line(),
            "commit": common.git_revision(ROOT, ["src", "benchmarks"]),
            "measured": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "seconds": time.perf_counter() - t0,
            "load_average_1min": [load0, os.getloadavg()[0]],
        }
        res[name]["provenance"]["repeats"] = args[name].get("repeats")
        if name == "paper" and a.before_src:
            res[name]["before_label"] = a.before_label or a.before_src
    common.write_json(out_dir / "core.json", res)
    write_report(res, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
