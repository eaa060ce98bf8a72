"""What `bench_models.py` measures and how: the four models, the backbone sizes and the workers,
each run in a fresh subprocess by `_measure.run_worker` (throughput and FLOPs, the graph breaks of
torch.compile, peak RSS, per-segment time as the history grows, full-history attention)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from inftyformer import _measure as common

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
