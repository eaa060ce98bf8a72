"""What `bench_core.py` measures and how: the shapes (the paper's sorting configuration, the
growing history), the variants timed side by side, and the workers each section runs in a fresh
process (paper: the step and its floor; profile: where the time goes; history: time and RSS as
one stream grows)."""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from inftyformer import _measure as common

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
        from inftyformer.core.continuous_softmax import continuous_softmax

        return torch.matmul(continuous_softmax(mu, sigma_sq, att.basis), v)  # [B, H, Q, d]

    att.expected_values = read  # what the densities call
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
