"""Speed of the ∞-former's core: one long-term memory update + continuous attention, forward and
backward, per segment and layer.

    python benchmarks/bench_core.py                      # full run (~15 min on a 2-core CPU)
    python benchmarks/bench_core.py --quick              # smoke run (< 2 min), to a temp dir
    python benchmarks/bench_core.py --sections paper     # one section; the others are kept
    python benchmarks/bench_core.py --before-src DIR     # also time the `src` tree of another
                                                         # commit, interleaved (before/after)

Writes docs/benchmarks/core.{json,md} and core_history.png. The Markdown is rendered from the
JSON (`--render-only` re-renders it); hand-written notes between the notes markers of core.md
are kept. Every section runs in a fresh process with one torch thread.

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
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common as common
import torch
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve()
PAPER = dict(dim=300, heads=6, num_basis=512, num_samples=512, length=1024)
HISTORY = dict(batch=4, length=512, dim=300, heads=6, num_basis=256, num_samples=512)
SGEMM_N, SGEMM_REPEATS = 1024, 4  # the floor's yardstick: 4 products of 1024×1024 matrices
VARIANTS = {  # name: (label, what it is)
    "library": ("**library**", "fused continuous read (as shipped)"),
    "unfused": ("unfused read", "plain autograd of the closed form over the whole [B, H, Q, N]"),
    "compiled": ("library, torch.compile", "the step's forward compiled, backward by AOT autograd"),
    "compiled_unfused": ("unfused, torch.compile", "inductor's own kernels for the closed form"),
    "bf16": ("library, bf16 autocast", "projections in bf16, memory and read in float32"),
    "before": ("before", "the library at an earlier commit (--before-src)"),
}


# =============================================================================== workers
def _load_package(src: str | None):
    """inftyformer from this tree, or (before/after runs) the one under `src`, loaded as a
    separate package so that both can be timed in one process."""
    if src is None:
        import inftyformer

        return inftyformer
    init = Path(src) / "inftyformer" / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        "inftyformer_before", init, submodule_search_locations=[str(init.parent)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _problem(pkg, batch: int, narrow: bool, seed: int = 0):
    """Modules, a memory holding a signal, new vectors x and queries q at the paper shapes."""
    c = PAPER
    torch.manual_seed(seed)
    cfg = pkg.LongTermConfig(
        dim=c["dim"], num_heads=c["heads"], num_basis=c["num_basis"], num_samples=c["num_samples"]
    )
    mem, att = pkg.LongTermMemory(cfg), pkg.LongTermAttention(cfg)
    if narrow:  # σ² = softplus(bias) = σ₀², where the KL term pulls the densities
        with torch.no_grad():
            att.sigma_head.bias.fill_(torch.log(torch.expm1(torch.tensor(cfg.sigma_0**2))).item())
    g = torch.Generator().manual_seed(batch)
    L, e = c["length"], c["dim"]
    state = mem.update(mem.init_state(batch), torch.randn(batch, L, e, generator=g)).detach()
    x = torch.randn(batch, L, e, generator=g)
    q = torch.randn(batch, L, e, generator=g).requires_grad_()
    return mem, att, state, x, q


def _unfused(att):
    """`att` with the continuous read as plain autograd of the closed form, one block."""

    def read(mu, sigma_sq, v):
        from inftyformer.continuous_softmax import continuous_softmax

        return torch.matmul(continuous_softmax(mu, sigma_sq, att.basis), v)  # [B, H, Q, d]

    att._expected_values = read
    return att


def worker_paper(args: dict[str, Any]) -> dict[str, Any]:
    pkg = _load_package(None)
    before = _load_package(args["before_src"]) if args.get("before_src") else None
    out: dict[str, Any] = {"config": PAPER, "runs": []}
    a = torch.randn(SGEMM_N, SGEMM_N)
    b = torch.randn(SGEMM_N, SGEMM_N)
    sgemm_flops = 2 * SGEMM_N**3 * SGEMM_REPEATS

    def sgemm():
        for _ in range(SGEMM_REPEATS):
            torch.mm(a, b)

    for batch in args["batches"]:
        for narrow in args["densities"]:
            problems = {"library": _problem(pkg, batch, narrow)}
            problems["unfused"] = _problem(pkg, batch, narrow)
            _unfused(problems["unfused"][1])
            if before is not None:
                problems["before"] = _problem(before, batch, narrow)

            def step(p, autocast=False):
                mem, att, state, x, q = p
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    new = mem.update(state, x)
                    o = att(q, new)
                    loss = o.context.float().sum() + o.kl
                loss.backward()

            def compiled_step(p):
                mem, att, state, x, q = p

                def loss_fn(state, x, q):
                    o = att(q, mem.update(state, x))
                    return o.context.sum() + o.kl

                fn = torch.compile(loss_fn)
                return lambda: fn(state, x, q).backward()

            variants = {name: (lambda p=p: step(p)) for name, p in problems.items()}
            variants["bf16"] = lambda p=problems["library"]: step(p, autocast=True)
            if "library" in args["compile"]:
                variants["compiled"] = compiled_step(problems["library"])
            if "unfused" in args["compile"]:
                variants["compiled_unfused"] = compiled_step(problems["unfused"])
            variants["sgemm"] = sgemm

            def clear(problems=problems):
                for mem, att, _, _, q in problems.values():
                    mem.zero_grad(set_to_none=True)
                    att.zero_grad(set_to_none=True)
                    q.grad = None

            step(problems["library"])  # builds and caches G_inf, whose Gram product is not a step's
            with FlopCounterMode(display=False) as counter:
                step(problems["library"])
            step_flops = counter.get_total_flops()
            t0 = time.perf_counter()
            times = common.interleaved(variants, args["repeats"], args["warmup"], between=clear)
            rate = [sgemm_flops / s for s in times["sgemm"]]  # FLOP/s, one per round
            floor = [step_flops / r for r in rate]  # seconds, one per round
            run = {
                "batch": batch,
                "densities": "narrow" if narrow else "wide",
                "step_gflop": step_flops / 1e9,
                "sgemm_gflops": statistics.median(rate) / 1e9,
                "floor_ms": 1000 * statistics.median(floor),
                "seconds": time.perf_counter() - t0,
                "variants": {},
            }
            for name, t in times.items():
                if name == "sgemm":
                    continue
                run["variants"][name] = {
                    **common.summarize(t),
                    "over_library": statistics.median(
                        x / y for x, y in zip(t, times["library"], strict=True)
                    ),
                    "over_floor": statistics.median(x / f for x, f in zip(t, floor, strict=True)),
                }
            out["runs"].append(run)
            print(
                f"  paper B={batch} {run['densities']}: "
                + ", ".join(f"{n} {v['median_ms']:.0f} ms" for n, v in run["variants"].items())
                + f"; floor {run['floor_ms']:.0f} ms",
                file=sys.stderr,
                flush=True,
            )
    out["machine"] = common.machine_info()
    return out


def worker_profile(args: dict[str, Any]) -> dict[str, Any]:
    """Self CPU time of the library step by operator and input shapes (torch.profiler, the
    median step of a few), largest first."""
    from torch.profiler import profile

    pkg = _load_package(None)
    mem, att, state, x, q = _problem(pkg, args["batch"], narrow=False)

    def step():
        o = att(q, mem.update(state, x))
        (o.context.sum() + o.kl).backward()
        for module in (mem, att):
            module.zero_grad(set_to_none=True)
        q.grad = None

    step()
    runs = []
    for _ in range(args["repeats"]):
        with profile(record_shapes=True) as prof:
            step()
        events = prof.key_averages(group_by_input_shape=True)
        runs.append((sum(e.self_cpu_time_total for e in events), events))
    total, events = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[: args["rows"]]
    return {
        "batch": args["batch"],
        "total_ms": total / 1000,
        "ops": [
            {
                "op": e.key,
                "shapes": [list(s) for s in e.input_shapes if s],
                "calls": e.count,
                "self_ms": e.self_cpu_time_total / 1000,
            }
            for e in top
        ],
        "machine": common.machine_info(),
    }


def worker_history(args: dict[str, Any]) -> dict[str, Any]:
    import inftyformer as pkg

    c = HISTORY
    torch.manual_seed(0)
    cfg = pkg.LongTermConfig(
        dim=c["dim"], num_heads=c["heads"], num_basis=c["num_basis"], num_samples=c["num_samples"]
    )
    mem, att = pkg.LongTermMemory(cfg), pkg.LongTermAttention(cfg)
    B, L, e = c["batch"], c["length"], c["dim"]
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(B, L, e, generator=g) for _ in range(4)]  # a few inputs, made up front
    qs = [torch.randn(B, L, e, generator=g).requires_grad_() for _ in range(4)]

    def step(state, k):
        new = mem.update(state, xs[k % 4])
        o = att(qs[k % 4], new)
        (o.context.sum() + o.kl).backward()
        mem.zero_grad(set_to_none=True)
        att.zero_grad(set_to_none=True)
        qs[k % 4].grad = None
        return new.detach()  # as a model keeps it across segments

    windows = []  # segment k holds (k + 1)·L tokens; segment 0 is the first fit, not timed
    for m in args["milestones"]:
        start = max(1, round(m / L) - 1 - args["window"] // 2)
        windows.append(range(start, start + args["window"]))
    timed = {k for w in windows for k in w}
    state, reference = mem.init_state(B), None
    times, ref_times, rss = {}, {}, []
    t0 = time.perf_counter()
    for k in range(max(timed) + 1):
        if k in timed and k % 2:  # the reference before or after the stream segment, alternately
            ref_times[k] = common.timed(lambda k=k, r=reference: step(r, k))
        start = time.perf_counter()
        state = step(state, k)
        times[k] = time.perf_counter() - start
        if k == 0:
            reference = state  # 512 tokens of history
        if k in timed and not k % 2:
            ref_times[k] = common.timed(lambda k=k, r=reference: step(r, k))
        rss.append(common.rss_mb())
    milestones = []
    for m, w in zip(args["milestones"], windows, strict=True):
        milestones.append(
            {
                "tokens": m,
                "segments": [w.start, w.stop - 1],
                **common.summarize([times[k] for k in w]),
                "reference_ms": 1000 * statistics.median(ref_times[k] for k in w),
                "over_reference": statistics.median(times[k] / ref_times[k] for k in w),
                "rss_mb": rss[w.stop - 1],
            }
        )
    return {
        "config": c,
        "segments": len(times),
        "stream_seconds": time.perf_counter() - t0,
        "milestones": milestones,
        "per_segment_ms": [1000 * times[k] for k in sorted(times)],
        "rss_mb_per_segment": rss,
        "peak_rss_mb": common.peak_rss_mb(),
        "machine": common.machine_info(),
    }


WORKERS = {"paper": worker_paper, "profile": worker_profile, "history": worker_history}


# =============================================================================== report
def render(res: dict[str, Any], notes: str) -> str:
    fm = common.fmt_ms
    lines = [
        "# Core benchmark: long-term memory update + continuous attention",
        "",
        "Written by `python benchmarks/bench_core.py` from `core.json` (re-render with "
        "`--render-only`); the notes at the end are hand-written and kept on re-runs.",
        "",
        common.machine_markdown(res["machine"]),
        "",
    ]
    if "paper" in res:
        p = res["paper"]
        lines += [
            "## Paper shapes: one update segment of one layer",
            "",
            _provenance(p),
            "",
            f"e = {PAPER['dim']} ({PAPER['heads']} heads), N = M = {PAPER['num_basis']}, "
            f"L = {PAPER['length']} new vectors and queries: update (CNN gate included) + "
            "attention, forward + backward of context.sum() + kl. Densities *wide*: the heads as "
            "initialised (σ² ≈ 0.7); *narrow*: σ = σ₀ = 0.05, where the KL term pulls them. "
            "Variants are timed round-robin in one process; *÷ library* and *÷ floor* are "
            "medians of per-round ratios. The floor is the step's matrix-multiply FLOPs "
            "(FlopCounterMode) at the sgemm rate measured in the same rounds "
            f"({SGEMM_REPEATS} products of {SGEMM_N}² matrices).",
            "",
            "| variant | what it is |",
            "| --- | --- |",
            *[f"| {label} | {what} |" for label, what in VARIANTS.values()],
            "",
        ]
        rows = []
        for run in p["runs"]:
            for name, v in run["variants"].items():
                label = VARIANTS[name][0]
                if name == "before":
                    label += f" ({p.get('before_label', '')})"
                rows.append(
                    [
                        run["batch"],
                        run["densities"],
                        label,
                        fm(v["median_ms"]),
                        f"{fm(v['q1_ms'])}–{fm(v['q3_ms'])}",
                        f"{v['over_library']:.2f}",
                        f"{v['over_floor']:.2f}",
                    ]
                )
            rows.append(
                [
                    run["batch"],
                    run["densities"],
                    f"*floor: {run['step_gflop']:.1f} GFLOP at {run['sgemm_gflops']:.0f} GFLOP/s*",
                    fm(run["floor_ms"]),
                    "",
                    "",
                    "1.00",
                ]
            )
        heads = ["B", "densities", "variant", "median ms", "quartiles ms", "÷ library", "÷ floor"]
        lines += [common.markdown_table(heads, rows), ""]
    if "profile" in res:
        pr = res["profile"]
        lines += [
            f"### Where the time goes: library step, B = {pr['batch']}, wide densities",
            "",
            _provenance(pr),
            "",
            "torch.profiler, self CPU time by operator and input shapes (the median of "
            f"{res['profile']['provenance'].get('repeats', 3)} profiled steps: "
            f"{fm(pr['total_ms'])} ms with the profiler's overhead):",
            "",
            common.markdown_table(
                ["operator", "input shapes", "calls", "self ms", "share"],
                [
                    [
                        f"`{o['op']}`",
                        " × ".join(str(s).replace(" ", "") for s in o["shapes"]),
                        o["calls"],
                        fm(o["self_ms"]),
                        f"{100 * o['self_ms'] / pr['total_ms']:.0f}%",
                    ]
                    for o in pr["ops"]
                ],
            ),
            "",
        ]
    if "history" in res:
        h = res["history"]
        c = h["config"]
        first, last = h["milestones"][0], h["milestones"][-1]
        lines += [
            "## Time per segment as the history grows",
            "",
            _provenance(h),
            "",
            f"B = {c['batch']} streams, segments of L = {c['length']}, N = {c['num_basis']}, "
            f"e = {c['dim']}, {c['heads']} heads, M = {c['num_samples']}; {h['segments']} segments "
            f"streamed in {h['stream_seconds']:.0f} s. Per milestone, the segments around it; "
            "*÷ reference*: median of each segment over the same step on the 512-token state, "
            "timed next to it.",
            "",
            common.markdown_table(
                [
                    "history",
                    "segments",
                    "median ms",
                    "quartiles ms",
                    "reference ms",
                    "÷ reference",
                    "RSS MiB",
                ],
                [
                    [
                        _tokens(m["tokens"]),
                        f"{m['segments'][0]}–{m['segments'][1]}",
                        fm(m["median_ms"]),
                        f"{fm(m['q1_ms'])}–{fm(m['q3_ms'])}",
                        fm(m["reference_ms"]),
                        f"{m['over_reference']:.2f}",
                        f"{m['rss_mb']:.0f}",
                    ]
                    for m in h["milestones"]
                ],
            ),
            "",
            f"t({_tokens(last['tokens'])}) / t({_tokens(first['tokens'])}) = "
            f"{last['median_ms'] / first['median_ms']:.2f} from the medians, "
            f"{last['over_reference']:.2f} paired (at {_tokens(first['tokens'])}, where both are "
            f"the same computation: {first['over_reference']:.2f}). Peak RSS "
            f"{h['peak_rss_mb']:.0f} MiB; RSS {min(h['rss_mb_per_segment']):.0f}–"
            f"{max(h['rss_mb_per_segment']):.0f} MiB over the stream.",
            "",
            "![time per segment vs history](core_history.png)",
            "",
        ]
    return "\n".join(lines + ["## Notes", "", notes, ""])


def _tokens(n: int) -> str:
    return f"{n // 10**6}M" if n >= 10**6 and n % 10**6 == 0 else f"{n // 1000}K"


def _provenance(section: dict[str, Any]) -> str:
    pv = section["provenance"]
    load = pv["load_average_1min"]
    return (
        f"*Measured {pv['measured']} at commit `{pv['commit']}` by `{pv['command']}` "
        f"({pv['seconds']:.0f} s; 1-minute load average {load[0]:.1f} → {load[1]:.1f} on "
        f"{section['machine']['logical_cpus']} CPUs).*"
    )


def plot_history(h: dict[str, Any], path: Path) -> None:
    plt = common.pyplot()
    L = h["config"]["length"]
    tokens = [(k + 1) * L for k in range(h["segments"])]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=[3, 1.4])
    ax1.scatter(tokens[1:], h["per_segment_ms"][1:], s=4, alpha=0.4, label="each segment")
    for m in h["milestones"]:
        ax1.errorbar(
            m["tokens"],
            m["median_ms"],
            yerr=[[m["median_ms"] - m["q1_ms"]], [m["q3_ms"] - m["median_ms"]]],
            fmt="o",
            color="tab:red",
            capsize=4,
        )
    ax1.set_xscale("log")
    top = sorted(h["per_segment_ms"])[int(0.97 * (len(h["per_segment_ms"]) - 1))]
    ax1.set_ylim(0, 1.3 * top)
    ax1.set_ylabel("update + attention fwd+bwd [ms]")
    ax1.set_title("∞-former core vs processed history (medians with quartiles in red)")
    ax1.legend(loc="lower right", fontsize=8)
    ax2.plot(tokens, h["rss_mb_per_segment"], color="tab:green")
    ax2.set_ylim(0, 1.15 * h["peak_rss_mb"])
    ax2.set_ylabel("RSS [MiB]")
    ax2.set_xlabel("tokens processed (history)")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(res: dict[str, Any], out_dir: Path) -> None:
    if "history" in res:
        plot_history(res["history"], out_dir / "core_history.png")
    md = out_dir / "core.md"
    common.write_text(md, render(res, common.kept_notes(md)))
    print(f"wrote {md}", file=sys.stderr)


# =============================================================================== main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run (< 2 min), to a temp dir")
    ap.add_argument(
        "--sections", default="paper,profile,history", help="subset of paper,profile,history"
    )
    ap.add_argument("--out-dir", type=Path, default=None, help="default: docs/benchmarks")
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
        else ROOT / "docs/benchmarks"
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
