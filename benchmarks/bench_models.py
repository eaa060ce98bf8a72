"""Speed and memory of the four models on one backbone (transformer, xl, compressive, infty).

    python benchmarks/bench_models.py            # full run (≈ 30 min on 2 shared cores)
    python benchmarks/bench_models.py --quick    # < 1 min: cpu-small only, short histories

Writes docs/benchmarks/models.{json,md,png}:

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

Every measurement runs in a fresh subprocess (`_common.run_worker`): its own peak RSS, no
allocator state carried between measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import _common as common

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "docs" / "benchmarks"
MODEL_TYPES = ("transformer", "xl", "compressive", "infty")
VARIANTS = ("eager", "compiled", "bf16")  # as it is; torch.compile(model); bf16 autocast
STREAMED = ("xl", "compressive", "infty")
VOCAB = 256  # a small LM vocabulary; the sorting task uses 22

SIZES: dict[str, dict[str, Any]] = {
    "cpu-small": dict(preset="cpu-small", batch=8, overrides={}),
    "larger": dict(
        preset="cpu-small",
        batch=4,
        overrides=dict(
            d_model=256,
            n_layers=4,
            n_heads=8,
            d_ff=1024,
            segment_len=256,
            mem_len=256,
            compressed_len=256,
            num_basis=256,
            num_samples=256,
        ),
    ),
    # the paper's sorting configuration (L = m = 1024, N = M = 512), one stream: few repeats
    "paper-sorting": dict(preset="paper-sorting", batch=1, overrides={}, repeats=3),
}


def make_config(size: str, model_type: str, **extra):
    from inftyformer import ModelConfig

    spec = SIZES[size]
    overrides = dict(spec["overrides"], vocab_size=VOCAB, dropout=0.0, **extra)
    if model_type == "transformer":
        overrides.pop("mem_len", None)  # the preset sets 0
    return ModelConfig.preset(spec["preset"], model_type=model_type, **overrides)


def _setup(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)


# ----------------------------------------------------------------------------- workers
def worker_throughput(args: dict[str, Any]) -> dict[str, Any]:
    """All four models of one size in this process, each as it is (eager, float32), under
    torch.compile and under bf16 autocast; training and inference steps timed round-robin over
    all of them. Every variant streams its own segments (memories full after warm-up)."""
    import torch
    import torch._functorch.config as functorch_config

    from inftyformer import MemoryLM

    _setup(args["threads"])
    size, batch = args["size"], SIZES[args["size"]]["batch"]
    g = torch.Generator().manual_seed(0)
    models, optims = {}, {}
    for mt in MODEL_TYPES:
        torch.manual_seed(0)
        models[mt] = MemoryLM(make_config(size, mt))
        optims[mt] = torch.optim.Adam(models[mt].parameters(), lr=1e-4)
    L = models["xl"].config.segment_len
    tokens = torch.randint(0, VOCAB, (batch, L), generator=g)
    variants = [v for v in VARIANTS if v in ("eager", *args["variants"])]
    calls = {
        # static shapes: a stream's memory length takes only a few values (empty, filling, full),
        # and with dynamic ones inductor's kernels over a symbolic memory length run ~2× slower
        (mt, v): torch.compile(models[mt], dynamic=False) if v == "compiled" else models[mt]
        for mt in MODEL_TYPES
        for v in variants
    }
    states: dict[tuple[str, str], Any] = {key: None for key in calls}

    def run(mt: str, v: str, train: bool):
        def call():
            model = models[mt]
            model.train(train)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=v == "bf16"):
                if train:
                    optims[mt].zero_grad(set_to_none=True)
                    out = calls[mt, v](tokens, states[mt, v], targets=tokens)
                else:
                    with torch.no_grad():
                        out = calls[mt, v](tokens, states[mt, v])
            if train:
                out.loss.backward()
                optims[mt].step()
            states[mt, v] = out.state

        return call

    # torch 2.13 rebuilds aliased graph outputs wrongly from a warm AOTAutograd cache
    # (tests/models/test_compile.py); compiling from scratch is right
    with functorch_config.patch(enable_autograd_cache=False):
        timings = {
            mode: common.interleaved(
                {f"{mt}/{v}": run(mt, v, mode == "train") for mt in MODEL_TYPES for v in variants},
                args["repeats"],
                warmup=args["warmup"],  # ≥ 4: memories fill and overflow, graphs compile
            )
            for mode in ("train", "infer")
        }
    rows = {}
    for mt in MODEL_TYPES:
        row: dict[str, Any] = {"params": sum(p.numel() for p in models[mt].parameters())}
        for mode, t in timings.items():
            eager = t[f"{mt}/eager"]
            step = common.summarize(eager)
            row[f"{mode}_step"] = step
            row[f"{mode}_tokens_per_s"] = batch * L / (step["median_ms"] / 1000)
            # per-round ratios (same round) are more robust than a ratio of medians
            row[f"{mode}_ratio_to_xl"] = _paired(eager, t["xl/eager"])
            for v in variants[1:]:
                row[f"{mode}_{v}_step"] = common.summarize(t[f"{mt}/{v}"])
                row[f"{mode}_{v}_speedup"] = _paired(eager, t[f"{mt}/{v}"])
        rows[mt] = row
    return {
        "size": size,
        "batch": batch,
        "segment_len": L,
        "variants": variants,
        "models": rows,
        "flops": _flops(models, tokens),
    }


def _paired(a: list[float], b: list[float]) -> float:
    """Median over rounds of a / b."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def _flops(models: dict[str, Any], tokens) -> dict[str, dict[str, float]]:
    """Matrix-multiply and convolution FLOPs of one training step (forward + backward) and one
    inference step of each model, memories full (torch's FlopCounterMode)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    out = {}
    for mt, model in models.items():
        state = None
        for _ in range(3):  # fill the memories (and build the design matrices) first
            with torch.no_grad():
                state = model(tokens, state).state
        model.train()
        with FlopCounterMode(display=False) as train:
            model(tokens, state, targets=tokens).loss.backward()
        model.zero_grad(set_to_none=True)
        model.eval()
        with torch.no_grad(), FlopCounterMode(display=False) as infer:
            model(tokens, state)
        out[mt] = {"train_gflop": train.get_total_flops() / 1e9}
        out[mt]["infer_gflop"] = infer.get_total_flops() / 1e9
    return out


def worker_graph_breaks(args: dict[str, Any]) -> dict[str, Any]:
    """torch._dynamo.explain of one training and one inference call per model (cpu-small, the
    memories full): graphs, breaks, and each break's reason and source line."""
    import torch
    import torch._dynamo as dynamo

    from inftyformer import MemoryLM

    _setup(args["threads"])
    out = {}
    for mt in MODEL_TYPES:
        torch.manual_seed(0)
        model = MemoryLM(make_config("cpu-small", mt))
        tokens = torch.randint(0, VOCAB, (SIZES["cpu-small"]["batch"], model.config.segment_len))
        state = None
        with torch.no_grad():
            for _ in range(3):
                state = model(tokens, state).state
        out[mt] = {}
        for mode in ("train", "infer"):
            model.train(mode == "train")
            with torch.set_grad_enabled(mode == "train"):
                kwargs = {"targets": tokens} if mode == "train" else {}
                explained = dynamo.explain(model)(tokens, state, **kwargs)
            breaks: dict[str, dict[str, Any]] = {}
            for reason in explained.break_reasons:
                frame = reason.user_stack[-1] if reason.user_stack else None
                where = f"{Path(frame.filename).name}:{frame.lineno}" if frame is not None else "?"
                entry = breaks.setdefault(
                    where,
                    {
                        "reason": reason.reason.splitlines()[0],
                        "code": (frame.line or "").strip() if frame is not None else "",
                        "count": 0,
                    },
                )
                entry["count"] += 1
            out[mt][mode] = {
                "graphs": explained.graph_count,
                "breaks": explained.graph_break_count,
                "by_line": breaks,
            }
            dynamo.reset()
    return out


def worker_rss(args: dict[str, Any]) -> dict[str, Any]:
    """Peak RSS of a fresh process training one model for a few steps."""
    import torch

    from inftyformer import MemoryLM

    _setup(args["threads"])
    base = common.peak_rss_mb()
    model = MemoryLM(make_config(args["size"], args["model_type"]))
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    batch, L = SIZES[args["size"]]["batch"], model.config.segment_len
    tokens = torch.randint(0, VOCAB, (batch, L))
    state = None
    for _ in range(args["steps"]):
        opt.zero_grad(set_to_none=True)
        out = model(tokens, state, targets=tokens)
        out.loss.backward()
        opt.step()
        state = out.state
    return {"peak_rss_mb": common.peak_rss_mb(), "before_model_mb": base}


def worker_history(args: dict[str, Any]) -> dict[str, Any]:
    """Stream up to `max_history` tokens (batch 1, eval) through XL, compressive and ∞-former,
    one segment of each in turn; per-segment times around each milestone."""
    import torch

    from inftyformer import MemoryLM

    _setup(args["threads"])
    models = {mt: MemoryLM(make_config("cpu-small", mt)).eval() for mt in STREAMED}
    L = models["xl"].config.segment_len
    milestones = args["milestones"]
    window = args["window"]  # segments timed per milestone (the ones just before it)
    g = torch.Generator().manual_seed(0)
    states = {mt: None for mt in STREAMED}
    times = {mt: [] for mt in STREAMED}
    result = {mt: [] for mt in STREAMED}
    total_segments = milestones[-1] // L
    wall = time.perf_counter()
    with torch.no_grad():
        for s in range(total_segments):
            tokens = torch.randint(0, VOCAB, (1, L), generator=g)
            for mt in STREAMED:
                start = time.perf_counter()
                states[mt] = models[mt](tokens, states[mt]).state
                times[mt].append(time.perf_counter() - start)
            history = (s + 1) * L
            if history in milestones:
                print(f"  history {history:,} tokens", flush=True)
                for mt in STREAMED:
                    summary = common.summarize(times[mt][-window:])
                    result[mt].append({"history_tokens": history, **summary})
                    times[mt] = []  # keep memory flat for a 1M-token run
    return {
        "segment_len": L,
        "batch": 1,
        "models": result,
        "wall_s": time.perf_counter() - wall,
    }


def worker_full(args: dict[str, Any]) -> dict[str, Any]:
    """Attending to the whole history: (a) a vanilla-transformer forward over n tokens,
    (b) one segment of L tokens over a cache of n states (XL with mem_len = n)."""
    import torch

    from inftyformer import MemoryLM

    _setup(args["threads"])
    limit_s, reps = args["limit_s"], args["repeats"]
    L = make_config("cpu-small", "xl").segment_len
    out: dict[str, list] = {"full_forward": [], "cached_segment": []}
    with torch.no_grad():
        for n in args["full_lengths"]:
            torch.manual_seed(0)
            model = MemoryLM(make_config("cpu-small", "transformer", segment_len=n)).eval()
            tokens = torch.randint(0, VOCAB, (1, n))
            model(tokens)  # warm-up
            t = [common.timed(lambda m=model, x=tokens: m(x)) for _ in range(reps)]
            out["full_forward"].append({"context": n, **common.summarize(t)})
            if statistics.median(t) > limit_s:
                break
        for n in args["cached_lengths"]:
            torch.manual_seed(0)
            model = MemoryLM(make_config("cpu-small", "xl", mem_len=n)).eval()
            state = model.init_state(1)
            # a full cache of n states per layer, as after streaming n tokens
            for layer in state.layers:
                layer.short_term.memory = torch.randn(1, n, model.config.d_model)
                layer.short_term.length = torch.full((1,), n)
            tokens = torch.randint(0, VOCAB, (1, L))
            model(tokens, state)
            t = [common.timed(lambda m=model, x=tokens, s=state: m(x, s)) for _ in range(reps)]
            out["cached_segment"].append({"history_tokens": n, **common.summarize(t)})
            if statistics.median(t) > limit_s:
                break
    return out


WORKERS = {
    "throughput": worker_throughput,
    "graph_breaks": worker_graph_breaks,
    "rss": worker_rss,
    "history": worker_history,
    "full": worker_full,
}


# ----------------------------------------------------------------------------- analysis
def fit(xs: list[float], ys: list[float], powers: tuple[int, ...]) -> list[float]:
    """Least squares y ≈ Σ c_k x^p_k with c_k ≥ 0 (coefficients clipped, refitted)."""
    import numpy as np

    X = np.array([[x**p for p in powers] for x in xs], dtype=float)
    y = np.array(ys, dtype=float)
    active = list(range(len(powers)))
    coef = np.zeros(len(powers))
    while active:
        c, *_ = np.linalg.lstsq(X[:, active], y, rcond=None)
        if (c >= 0).all():
            coef[active] = c
            break
        active.pop(int(np.argmin(c)))
    return coef.tolist()


def extrapolate(points: list[dict], key: str, powers: tuple[int, ...], targets: list[int]):
    xs = [p[key] for p in points]
    ys = [p["median_ms"] for p in points]
    coef = fit(xs[-4:], ys[-4:], powers)  # the largest sizes: the asymptotic regime
    predicted = [
        {key: n, "median_ms": sum(c * n**p for c, p in zip(coef, powers, strict=True))}
        for n in targets
        if n > xs[-1]
    ]
    return {"powers": list(powers), "coefficients_ms": coef, "fitted_on": xs[-4:]}, predicted


# ----------------------------------------------------------------------------- report
def markdown(result: dict[str, Any], notes: str) -> str:
    fmt = common.fmt_ms
    parts = [
        "# Models: speed and memory",
        "",
        "Commands: "
        + "; ".join(
            f"`{cmd}` ({', '.join(s for s, c in result.get('commands', {}).items() if c == cmd)})"
            for cmd in dict.fromkeys(result.get("commands", {}).values())
        )
        if result.get("commands")
        else f"Command: `{result['command']}`",
        "",
        common.machine_markdown(result["machine"]),
        "",
        "Same backbone size for all four models; training = forward + backward + Adam step, "
        "inference = eval forward without gradients. Times are medians over interleaved repeats "
        "(the models take turns, so the machine's load falls on all of them alike); ratios are "
        "medians of per-round ratios. Peak RSS: a fresh process training that model alone for a "
        "few steps (it includes ~the Python + torch baseline shown in brackets).",
        "",
        "## Throughput",
    ]
    for tp in result["throughput"]:
        cfg = tp["config"]
        parts += [
            "",
            f"### {tp['size']}: batch {tp['batch']}, segment {tp['segment_len']}, "
            f"d_model {cfg['d_model']}, {cfg['n_layers']} layers, {cfg['n_heads']} heads, "
            f"m {cfg['mem_len']}, N {cfg['num_basis']}, M {cfg['num_samples']}, "
            f"n_cm {cfg['compressed_len']} (c {cfg['compression_rate']})",
            "",
        ]
        rows = []
        for mt in MODEL_TYPES:
            r, fl = tp["models"][mt], tp["flops"][mt]
            rss = r.get("rss", {})
            rows.append(
                [
                    mt,
                    f"{r['params'] / 1e6:.2f}M",
                    f"{r['train_tokens_per_s']:,.0f}",
                    fmt(r["train_step"]["median_ms"]),
                    f"{r['train_ratio_to_xl']:.2f}×",
                    f"{fl['train_gflop'] / tp['flops']['xl']['train_gflop']:.2f}×",
                    f"{r['infer_tokens_per_s']:,.0f}",
                    f"{r['infer_ratio_to_xl']:.2f}×",
                    f"{fl['infer_gflop'] / tp['flops']['xl']['infer_gflop']:.2f}×",
                    f"{rss['peak_rss_mb']:.0f} ({rss['before_model_mb']:.0f})"
                    if rss
                    else "not measured (--quick)",
                ]
            )
        parts.append(
            common.markdown_table(
                [
                    "model",
                    "params",
                    "train tok/s",
                    "train step ms",
                    "train step / XL",
                    "train FLOPs / XL",
                    "infer tok/s",
                    "infer / XL",
                    "infer FLOPs / XL",
                    "peak RSS MiB",
                ],
                rows,
            )
        )
        others = [v for v in tp["variants"] if v != "eager"]
        if others:
            rows = []
            for mt in MODEL_TYPES:
                r = tp["models"][mt]
                row = [mt]
                for v in others:
                    for mode in ("train", "infer"):
                        row.append(
                            f"{fmt(r[f'{mode}_{v}_step']['median_ms'])} ms "
                            f"({r[f'{mode}_{v}_speedup']:.2f}×)"
                        )
                rows.append(row)
            med = {
                (mt, v, mode): tp["models"][mt][f"{mode}_{v}_step"]["median_ms"]
                for mt in ("infty", "xl")
                for v in others
                for mode in ("train", "infer")
            }
            rows.append(
                ["*infty / xl*"]
                + [
                    f"{med['infty', v, mode] / med['xl', v, mode]:.2f}×"
                    for v in others
                    for mode in ("train", "infer")
                ]
            )
            heads = ["model"] + [f"{v} {mode}" for v in others for mode in ("train", "infer")]
            parts += [
                "",
                "Step time under torch.compile(model, dynamic=False) and under bf16 autocast, "
                "and the speed-up over the eager float32 step (median of per-round ratios); "
                "last row: the ∞-former's step over Transformer-XL's in that variant (ratio of "
                "medians):",
                "",
                common.markdown_table(heads, rows),
            ]
    hist = result["history"]
    parts += [
        "",
        "## Per-segment time as the history grows",
        "",
        f"cpu-small, batch 1, segment {hist['segment_len']}, inference. Each value is the median "
        f"over the {result['settings']['window']} segments just before the history reached that "
        f"many tokens; the three models stream side by side, one segment each in turn "
        f"(total {hist['wall_s']:.0f} s).",
        "",
    ]
    heads = ["history tokens"] + [f"{mt} ms" for mt in STREAMED]
    rows = []
    for i, point in enumerate(hist["models"]["xl"]):
        rows.append(
            [f"{point['history_tokens']:,}"]
            + [fmt(hist["models"][mt][i]["median_ms"]) for mt in STREAMED]
        )
    parts.append(common.markdown_table(heads, rows))
    full = result["full"]
    parts += [
        "",
        "## What attending to the full history would cost",
        "",
        "(a) one vanilla-transformer forward over the whole context (what recomputing over the "
        "full history costs per step); (b) one segment over a cache of the whole history (XL "
        "with mem_len = history: the cheapest exact full attention). Measured until one call "
        f"took more than {result['settings']['limit_s']} s, then extrapolated with a least-"
        "squares fit on the largest measured sizes ((a) a·n + b·n², (b) a + b·n); *italic* = "
        "extrapolated.",
        "",
    ]
    heads = result["throughput"][0]["config"]["n_heads"]
    seg = hist["segment_len"]

    def gib(n_bytes: float) -> str:
        return f"{n_bytes / 2**30:,.3g}"

    rows = []
    for key, label, xkey in (
        ("full_forward", "(a) full forward", "context"),
        ("cached_segment", "(b) cached segment", "history_tokens"),
    ):
        for extrapolated, points in ((False, full[key]), (True, full[key + "_extrapolated"])):
            for p in points:
                n = p[xkey]
                scores = 4 * heads * (n * n if key == "full_forward" else seg * (n + seg))
                t = fmt(p["median_ms"])
                rows.append([label, f"{n:,}", f"*{t}*" if extrapolated else t, gib(scores)])
    parts.append(
        common.markdown_table(
            ["variant", "context tokens", "ms per call", "score tensor GiB / layer"], rows
        )
    )
    if "graph_breaks" in result:
        parts += ["", *_graph_breaks_markdown(result["graph_breaks"])]
    parts += ["", "## Summary", ""] + [f"- {line}" for line in summary_lines(result)]
    parts += ["", "## Notes", "", notes]
    return "\n".join(parts)


def _graph_breaks_markdown(gb: dict[str, Any]) -> list[str]:
    """Graphs and breaks per model and mode, then every break site with its source line."""
    rows = [
        [mt, *(f"{gb[mt][m]['graphs']} / {gb[mt][m]['breaks']}" for m in ("train", "infer"))]
        for mt in MODEL_TYPES
    ]
    sites: dict[str, dict[str, Any]] = {}
    for mt in MODEL_TYPES:
        for mode in ("train", "infer"):
            for where, b in gb[mt][mode]["by_line"].items():
                site = sites.setdefault(where, {**b, "models": set(), "count": 0})
                site["models"].add(mt)
                site["count"] += b["count"]
    site_rows = [
        [f"`{where}`", f"`{s['code']}`", ", ".join(sorted(s["models"])), s["count"], s["reason"]]
        for where, s in sorted(sites.items(), key=lambda kv: -kv[1]["count"])
    ]
    return [
        "## torch.compile: graph breaks",
        "",
        "`torch._dynamo.explain` of one training and one inference call (cpu-small, memories "
        "full). A break is a Python decision on a tensor's value (`bool(t)`, `.item()`): dynamo "
        "ends the graph, runs the decision eagerly and resumes in a new graph. Here they are the "
        "argument checks (ids in range, finite inputs) and the data-dependent branches of the "
        "memories (does any row have states to flush, is the ragged memory full). Graphs / "
        "breaks per call:",
        "",
        common.markdown_table(["model", "train", "infer"], rows),
        "",
        "Break sites, over all models and both modes (count = breaks at that line):",
        "",
        common.markdown_table(["where", "code", "models", "count", "dynamo's reason"], site_rows),
    ]


def plot(result: dict[str, Any], path: Path) -> None:
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    hist = result["history"]["models"]
    for mt, style in zip(STREAMED, ("o-", "s-", "^-"), strict=True):
        xs = [p["history_tokens"] for p in hist[mt]]
        ax.plot(xs, [p["median_ms"] for p in hist[mt]], style, label=f"{mt} (per segment)")
    full = result["full"]
    for key, label, xkey, color in (
        ("full_forward", "vanilla, full forward over history", "context", "tab:red"),
        ("cached_segment", "segment over cached full history", "history_tokens", "tab:purple"),
    ):
        xs = [p[xkey] for p in full[key]]
        ax.plot(xs, [p["median_ms"] for p in full[key]], "x-", color=color, label=label)
        ext = full[key + "_extrapolated"]
        if ext:
            ax.plot(
                [xs[-1]] + [p[xkey] for p in ext],
                [full[key][-1]["median_ms"]] + [p["median_ms"] for p in ext],
                "x--",
                color=color,
                alpha=0.6,
                label=label + " (extrapolated)",
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("history (tokens)")
    ax.set_ylabel(f"ms per call (batch 1, segment {result['history']['segment_len']})")
    ax.set_title("Cost of the next segment as the processed history grows (cpu-small)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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


def write_report(result: dict[str, Any], out: Path) -> None:
    common.write_text(out / "models.md", markdown(result, common.kept_notes(out / "models.md")))
    plot(result, out / "models.png")


def summary_lines(result: dict[str, Any]) -> list[str]:
    """The headline figures, from the measurements."""
    summary = []
    for tp in result["throughput"]:
        r = tp["models"]
        summary.append(
            f"{tp['size']}: ∞-former training step = {r['infty']['train_ratio_to_xl']:.2f}× "
            f"Transformer-XL's (inference {r['infty']['infer_ratio_to_xl']:.2f}×); compressive "
            f"{r['compressive']['train_ratio_to_xl']:.2f}×; vanilla "
            f"{r['transformer']['train_ratio_to_xl']:.2f}×."
        )
        fl = tp["flops"]
        summary.append(
            f"{tp['size']}: the ∞-former's training step has "
            f"{fl['infty']['train_gflop'] / fl['xl']['train_gflop']:.2f}× Transformer-XL's "
            f"matrix-multiply FLOPs (inference "
            f"{fl['infty']['infer_gflop'] / fl['xl']['infer_gflop']:.2f}×)."
        )
        for v in tp["variants"][1:]:
            summary.append(
                f"{tp['size']}, {v} vs eager float32, training / inference step speed-up: "
                + "; ".join(
                    f"{mt} {r[mt][f'train_{v}_speedup']:.2f}× / {r[mt][f'infer_{v}_speedup']:.2f}×"
                    for mt in MODEL_TYPES
                )
                + "."
            )
    history = result["history"]
    for mt in STREAMED:
        first, last = history["models"][mt][0], history["models"][mt][-1]
        summary.append(
            f"{mt}: {first['median_ms']:.1f} ms per segment at {first['history_tokens']:,} "
            f"tokens of history, {last['median_ms']:.1f} ms at {last['history_tokens']:,} "
            f"(ratio {last['median_ms'] / first['median_ms']:.2f})."
        )
    full = result["full"]
    last_full = (full["full_forward"] + full["full_forward_extrapolated"])[-1]
    last_cached = (full["cached_segment"] + full["cached_segment_extrapolated"])[-1]
    measured_full = full["full_forward"][-1]["context"]
    measured_cached = full["cached_segment"][-1]["history_tokens"]
    summary.append(
        f"full attention at {last_full['context']:,} tokens: a full forward "
        f"≈ {last_full['median_ms'] / 1000:,.1f} s, one cached segment ≈ "
        f"{last_cached['median_ms']:,.0f} ms "
        f"({'extrapolated' if full['full_forward_extrapolated'] else 'measured'}; measured up to "
        f"{measured_full:,} / {measured_cached:,} tokens)."
    )
    return summary


if __name__ == "__main__":
    main()
