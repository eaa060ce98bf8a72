"""Speed and memory of the ∞-former's core: long-term memory update + continuous attention.

    python benchmarks/bench_core.py            # full run (~10 min on a 2-core CPU)
    python benchmarks/bench_core.py --quick    # smoke run (< 1 min), written to a temp dir

Writes docs/benchmarks/core.json (every measurement), core.md (tables, machine, command) and
core_history.png. Sections, each in a fresh subprocess (own allocator settings, own peak RSS):

history  Per-segment time of `LongTermMemory.update` + `LongTermAttention` forward+backward
         while one stream grows from 1K to 1M tokens (segment L=512, N=256, e=300, 6 heads, B=4,
         M=512). All segments are streamed, the state carried and detached after each segment as
         a model does; the time at a milestone is the median of the segments around it. Also the
         RSS after every segment and the peak RSS.
paper    Forward+backward per update segment per layer at the paper's sorting shapes (e=300,
         6 heads, N=512, M=512, L=1024 new vectors and 1024 queries), B=1 and B=8: update (with
         the CNN gate), attention, backward of context.sum() + kl. Interleaved, same run: the
         library, the library with the continuous softmax in one block (the implementation before
         the blocking), and a naive implementation written below. Run with glibc's default
         allocator settings and with raised mmap/trim thresholds.
verify   Blocked vs one-block outputs and gradients (float32 and float64); naive vs library.

Timings on a shared CPU are noisy: variants are interleaved round-robin in the same process and
medians are reported (with min and quartiles in the JSON); compare ratios, not absolute numbers.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

try:  # run as a script (python benchmarks/bench_core.py) or as a module
    from . import _common as common
except ImportError:
    import _common as common

from inftyformer import LongTermAttention, LongTermConfig, LongTermMemory, LongTermState

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve()

# The authors' figures for one update segment of one layer (forward+backward, sorting shapes) on a
# similar 2-core CPU, in ms: (low, high).
AUTHORS_MS = {1: (250.0, 340.0), 8: (1700.0, 2500.0)}

HISTORY_CONFIG = dict(batch=4, length=512, num_basis=256, dim=300, heads=6, num_samples=512)
PAPER_CONFIG = dict(dim=300, heads=6, num_basis=512, num_samples=512, length=1024)


# =============================================================================== naive baseline
class NaiveLongTerm:
    """The straightforward implementation, sharing the parameters of `mem` and `att`:

    - scores s = K q / √d materialised as [B, H, Q, N], then μ, σ² through the Linear(N, 1) heads;
    - the continuous softmax as a full-size Gaussian density per basis function,
      𝒩(μ; c_j, σ² + w_j²) with [B, H, Q, N] variances, differences, squares, …;
    - G_inf from an explicit float32 inverse (built once per length, as the authors do);
    - ψ(u) recomputed as a full [M, N] density matrix every update.
    Plain autograd everywhere (no custom backward), like the library.
    """

    def __init__(self, mem: LongTermMemory, att: LongTermAttention) -> None:
        self.mem, self.att = mem, att
        c = mem.config
        per_width = c.num_basis // len(c.widths)
        self.centers = torch.linspace(0.0, 1.0, per_width).repeat(len(c.widths))  # [N]
        self.widths = torch.tensor(c.widths).repeat_interleave(per_width)  # [N]
        self._G: dict[int, torch.Tensor] = {}

    def psi(self, t: torch.Tensor) -> torch.Tensor:
        w = self.widths
        d = t[:, None] - self.centers
        return torch.exp(-(d**2) / (2 * w**2)) / (w * math.sqrt(2 * math.pi))  # [T, N]

    def G_inf(self, length: int) -> torch.Tensor:
        if length not in self._G:
            c = self.mem.config
            m = c.num_samples
            old = c.tau * torch.arange(1, m + 1, dtype=torch.float32) / m
            new = c.tau + (1 - c.tau) * (torch.arange(length, dtype=torch.float32) + 0.5) / length
            t = torch.cat([old, new])
            pad = t.numel() // 2
            offsets = (torch.arange(pad, dtype=torch.float32) + 0.5) * (0.5 / pad)
            F_ = self.psi(torch.cat([-0.5 + offsets, t, 1.0 + offsets])).T  # [N, P_padded]
            eye = torch.eye(c.num_basis)
            G = F_.T @ torch.linalg.inv(F_ @ F_.T + c.ridge_lambda * eye)  # float32 inverse
            self._G[length] = G[pad : pad + t.numel()].contiguous()
        return self._G[length]

    def update(self, B_past: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        c = self.mem.config
        x = x * torch.sigmoid(self.mem.gate(x.transpose(1, 2))).transpose(1, 2)
        u = torch.arange(1, c.num_samples + 1, dtype=torch.float32) / c.num_samples
        x_old = self.psi(u) @ B_past.detach()  # [B, M, e]
        return self.G_inf(x.shape[1]).T @ torch.cat([x_old, x], dim=1)  # [B, N, e]

    def attend(self, q: torch.Tensor, coefficients: torch.Tensor):
        att, c = self.att, self.att.config
        b, num_q, e = q.shape
        H, d, N = c.num_heads, c.head_dim, c.num_basis
        k = att.key(coefficients).view(b, N, H, d).transpose(1, 2)  # [B, H, N, d]
        v = att.value(coefficients).view(b, N, H, d).transpose(1, 2)
        qh = q.view(b, num_q, H, d).transpose(1, 2)  # [B, H, Q, d]
        scores = qh @ k.transpose(-1, -2) / math.sqrt(d)  # [B, H, Q, N]
        mu = torch.sigmoid(att.mu_head(scores)).squeeze(-1)  # [B, H, Q]
        sigma_sq = F.softplus(att.sigma_head(scores)).squeeze(-1).clamp(min=c.min_sigma_sq)
        var = sigma_sq[..., None] + self.widths**2  # [B, H, Q, N]
        r = torch.exp(-((mu[..., None] - self.centers) ** 2) / (2 * var)) / torch.sqrt(
            2 * math.pi * var
        )
        z = (r @ v).transpose(1, 2).reshape(b, num_q, e)
        ratio = sigma_sq / c.sigma_0**2
        kl = (0.5 * (ratio - torch.log(ratio) - 1)).mean()
        return att.out(z), kl

    def step(self, state: LongTermState, x: torch.Tensor, q: torch.Tensor) -> None:
        context, kl = self.attend(q, self.update(state.coefficients, x))
        (context.sum() + kl).backward()


# =============================================================================== helpers
def build(dim: int, heads: int, num_basis: int, num_samples: int, dtype=torch.float32):
    cfg = LongTermConfig(dim=dim, num_heads=heads, num_basis=num_basis, num_samples=num_samples)
    return LongTermMemory(cfg).to(dtype), LongTermAttention(cfg).to(dtype)


def library_step(mem, att, state, x, q) -> LongTermState:
    new_state = mem.update(state, x)
    out = att(q, new_state)
    (out.context.sum() + out.kl).backward()
    return new_state


def clear_grads(*tensors_or_modules) -> None:
    for obj in tensors_or_modules:
        if isinstance(obj, torch.nn.Module):
            for p in obj.parameters():
                p.grad = None
        else:
            obj.grad = None


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| / max |b|"""
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-300)).item()


# =============================================================================== workers
def worker_history(args: dict[str, Any]) -> dict[str, Any]:
    """Stream one batch of streams through `total` segments; time every segment."""
    cfg = HISTORY_CONFIG
    torch.manual_seed(0)
    B, L, e = cfg["batch"], cfg["length"], cfg["dim"]
    mem, att = build(e, cfg["heads"], cfg["num_basis"], cfg["num_samples"])
    gen = torch.Generator().manual_seed(1)
    pool = 4  # a few different inputs, generated up front (randn is not what we time)
    xs = [torch.randn(B, L, e, generator=gen) for _ in range(pool)]
    qs = [torch.randn(B, L, e, generator=gen).requires_grad_() for _ in range(pool)]

    milestones = args["milestones"]  # tokens
    window = args["window"]
    centers = [max(1, round(m / L) - 1) for m in milestones]  # segment k holds (k + 1)·L tokens
    windows = []
    for k in centers:
        lo = max(1, k - window // 2)  # segment 0 is the first fit (another code path)
        windows.append(list(range(lo, lo + window)))
    total = max(w[-1] for w in windows) + 1

    # warm-up on a throw-away stream (threads, allocator, caches of G)
    state = mem.init_state(B)
    for k in range(args["warmup"]):
        state = library_step(mem, att, state, xs[k % pool], qs[k % pool]).detach()
        clear_grads(mem, att, *qs)
    rss_before = common.rss_mb()

    state = mem.init_state(B)
    times, rss = [], []
    start = time.perf_counter()
    for k in range(total):
        x, q = xs[k % pool], qs[k % pool]
        t0 = time.perf_counter()
        new_state = library_step(mem, att, state, x, q)
        times.append(time.perf_counter() - t0)
        state = new_state.detach()  # as a model keeps it across segments
        clear_grads(mem, att, q)
        rss.append(common.rss_mb())
        if k + 1 in {w[-1] + 1 for w in windows}:
            print(
                f"  history: {(k + 1) * L:>9,d} tokens, {time.perf_counter() - start:6.1f} s, "
                f"last {1000 * times[-1]:.0f} ms",
                file=sys.stderr,
                flush=True,
            )
    assert bool(torch.isfinite(state.coefficients).all())

    results = []
    for m, k, w in zip(milestones, centers, windows, strict=True):
        s = common.summarize([times[i] for i in w])
        results.append(
            dict(
                tokens=m,
                center_segment=k,
                center_history_tokens=(k + 1) * L,
                segments=[w[0], w[-1]],
                history_tokens_range=[(w[0] + 1) * L, (w[-1] + 1) * L],
                rss_mb=rss[k],
                **s,
            )
        )
    return dict(
        config=cfg,
        segments=total,
        tokens=total * L,
        window=window,
        stream_seconds=time.perf_counter() - start,
        milestones=results,
        ratio_last_over_first=results[-1]["median_ms"] / results[0]["median_ms"],
        rss_mb_after_warmup=rss_before,
        peak_rss_mb=common.peak_rss_mb(),
        per_segment_ms=[1000 * t for t in times],
        rss_mb_per_segment=rss,
        machine=common.machine_info(),
    )


def worker_paper(args: dict[str, Any]) -> dict[str, Any]:
    """Interleaved timings of the library, the one-block library and the naive baseline."""
    cfg = PAPER_CONFIG
    torch.manual_seed(0)
    mem, att = build(cfg["dim"], cfg["heads"], cfg["num_basis"], cfg["num_samples"])
    naive = NaiveLongTerm(mem, att)
    L, e = cfg["length"], cfg["dim"]
    block_default = LongTermAttention.query_block_elements
    out: dict[str, Any] = {"config": cfg, "batches": {}}
    for B in args["batches"]:
        gen = torch.Generator().manual_seed(B)
        state = mem.update(mem.init_state(B), torch.randn(B, L, e, generator=gen)).detach()
        x = torch.randn(B, L, e, generator=gen)
        q = torch.randn(B, L, e, generator=gen).requires_grad_()

        def run_library(block=block_default, state=state, x=x, q=q):
            att.query_block_elements = block
            library_step(mem, att, state, x, q)

        def run_update(state=state, x=x):
            mem.update(state, x).coefficients.sum().backward()

        def run_attention(state=state, q=q):
            att.query_block_elements = block_default
            o = att(q, state)
            (o.context.sum() + o.kl).backward()

        variants = {
            "library": run_library,
            "library_one_block": lambda: run_library(None),
            "naive": lambda state=state, x=x, q=q: naive.step(state, x, q),
        }
        if args["breakdown"]:
            variants["library_update_only"] = run_update
            variants["library_attention_only"] = run_attention
        reps = args["repeats"][str(B)]
        faults0 = common.minor_faults()
        times = common.interleaved(
            variants, reps, warmup=args["warmup"], between=lambda q=q: clear_grads(mem, att, q)
        )
        att.query_block_elements = block_default
        out["batches"][str(B)] = {
            "repeats": reps,
            "minor_faults_per_step": (common.minor_faults() - faults0)
            / ((reps + args["warmup"]) * len(variants)),
            "variants": {
                name: {**common.summarize(t), "all_ms": [1000 * s for s in t]}
                for name, t in times.items()
            },
        }
        print(
            f"  paper B={B}: "
            + ", ".join(
                f"{n} {v['median_ms']:.0f} ms"
                for n, v in out["batches"][str(B)]["variants"].items()
            ),
            file=sys.stderr,
            flush=True,
        )
    out["peak_rss_mb"] = common.peak_rss_mb()
    out["machine"] = common.machine_info()
    return out


def worker_verify(args: dict[str, Any]) -> dict[str, Any]:
    """Blocked vs one-block (the implementation before blocking) and naive vs library."""
    cfg = PAPER_CONFIG
    B, L = args["batch"], cfg["length"]
    res: dict[str, Any] = {"batch": B, "shapes": cfg}
    for dtype in (torch.float32, torch.float64):
        torch.manual_seed(0)
        mem, att = build(cfg["dim"], cfg["heads"], cfg["num_basis"], cfg["num_samples"], dtype)
        gen = torch.Generator().manual_seed(3)
        state = mem.update(
            mem.init_state(B, dtype=dtype), torch.randn(B, L, cfg["dim"], generator=gen).to(dtype)
        ).detach()
        x = torch.randn(B, L, cfg["dim"], generator=gen).to(dtype)
        q = torch.randn(B, L, cfg["dim"], generator=gen).to(dtype).requires_grad_()
        outs = {}
        for name, block in (("blocked", LongTermAttention.query_block_elements), ("one", None)):
            att.query_block_elements = block
            clear_grads(mem, att, q)
            o = att(q, mem.update(state, x))
            (o.context.sum() + o.kl).backward()
            outs[name] = {"context": o.context.detach(), "kl": o.kl.detach(), "q.grad": q.grad}
            for mod, prefix in ((mem, "mem."), (att, "att.")):
                for pname, p in mod.named_parameters():
                    outs[name][prefix + pname + ".grad"] = p.grad
        att.query_block_elements = LongTermAttention.query_block_elements
        diffs = {k: rel_diff(outs["blocked"][k], outs["one"][k]) for k in outs["one"]}
        res[f"blocked_vs_one_block_{str(dtype).split('.')[-1]}"] = {
            "max": max(diffs.values()),
            "per_tensor": diffs,
        }
    # naive vs library (float32, same parameters and state)
    torch.manual_seed(0)
    mem, att = build(cfg["dim"], cfg["heads"], cfg["num_basis"], cfg["num_samples"])
    naive = NaiveLongTerm(mem, att)
    gen = torch.Generator().manual_seed(4)
    state = mem.update(mem.init_state(B), torch.randn(B, L, cfg["dim"], generator=gen)).detach()
    x = torch.randn(B, L, cfg["dim"], generator=gen)
    q = torch.randn(B, L, cfg["dim"], generator=gen)
    with torch.no_grad():
        lib_state = mem.update(state, x)
        naive_coef = naive.update(state.coefficients, x)
        ctx_lib = att(q, state).context
        ctx_naive, _ = naive.attend(q, state.coefficients)
        G64 = mem.infinite_design(L, torch.device("cpu"), torch.float64)
        G32inv = naive.G_inf(L).double()
    res["naive_vs_library"] = {
        "attention_context_rel_diff": rel_diff(ctx_naive, ctx_lib),
        "update_coefficients_rel_diff": rel_diff(naive_coef, lib_state.coefficients),
        "G_inf_float32_inverse_rel_error": (
            (G32inv - G64).norm() / G64.norm()
        ).item(),  # Frobenius, vs float64 solve
    }
    return res


WORKERS = {"history": worker_history, "paper": worker_paper, "verify": worker_verify}


# =============================================================================== report
def plot_history(hist: dict[str, Any], path: Path) -> None:
    plt = common.pyplot()
    L = hist["config"]["length"]
    tokens = [(k + 1) * L for k in range(hist["segments"])]
    ms = hist["per_segment_ms"]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True, height_ratios=[3, 1.4])
    ax1.scatter(tokens[1:], ms[1:], s=4, alpha=0.35, color="tab:blue", label="each segment")
    ax1.scatter(tokens[:1], ms[:1], s=14, marker="x", color="gray", label="first fit (after reset)")
    run = _running_median(ms[1:], 31)
    ax1.plot(tokens[1:], run, color="tab:blue", lw=1.5, label="running median (31 segments)")
    for m in hist["milestones"]:
        ax1.errorbar(
            m["center_history_tokens"],
            m["median_ms"],
            yerr=[[m["median_ms"] - m["q1_ms"]], [m["q3_ms"] - m["median_ms"]]],
            fmt="o",
            color="tab:red",
            ms=7,
            capsize=4,
        )
        ax1.annotate(
            f"{m['median_ms']:.0f} ms",
            (m["center_history_tokens"], m["median_ms"]),
            textcoords="offset points",
            xytext=(6, 8),
            color="tab:red",
        )
    ax1.set_xscale("log")
    top = sorted(ms)[int(0.97 * (len(ms) - 1))]
    ax1.set_ylim(0, 1.3 * top)
    ax1.set_ylabel("update + attention fwd+bwd [ms / segment]")
    c = hist["config"]
    ax1.set_title(
        f"∞-former core vs processed history (B={c['batch']}, L={L}, N={c['num_basis']}, "
        f"e={c['dim']}, {c['heads']} heads, M={c['num_samples']})\n"
        f"t({_tok(hist['milestones'][-1]['tokens'])}) / t({_tok(hist['milestones'][0]['tokens'])})"
        f" = {hist['ratio_last_over_first']:.2f}; medians with quartiles (red)",
        fontsize=10,
    )
    ax1.legend(loc="lower right", fontsize=8)
    ax1.grid(alpha=0.3)
    ax2.plot(tokens, hist["rss_mb_per_segment"], color="tab:green")
    ax2.axhline(hist["peak_rss_mb"], color="tab:green", ls=":", lw=1)
    ax2.set_ylabel("RSS [MiB]")
    ax2.set_xlabel("tokens processed (history)")
    ax2.grid(alpha=0.3)
    ax2.set_ylim(0, 1.15 * hist["peak_rss_mb"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _running_median(values: list[float], width: int) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    half = width // 2
    padded = torch.cat([t[:1].expand(half), t, t[-1:].expand(half)])
    return padded.unfold(0, width, 1).median(dim=-1).values.tolist()


def _tok(n: int) -> str:
    return f"{n // 10**6}M" if n >= 10**6 and n % 10**6 == 0 else f"{n // 1000}K"


def render_markdown(res: dict[str, Any]) -> str:
    fm = common.fmt_ms
    lines = [
        "# Core benchmark: long-term memory update + continuous attention",
        "",
        f"Generated by `{res['command']}` on {res['started']} ({res['duration_s']:.0f} s"
        f"{', quick smoke run' if res['quick'] else ''}). Raw numbers: `core.json`.",
        "",
        common.machine_markdown(res["machine"]),
        "",
        "The machine is shared with other jobs, so single timings are noisy. Every figure is a "
        "median over repeated steps; in the paper-shape table the variants are interleaved "
        "round-robin in the same process so that load falls on all of them alike. Compare the "
        "ratios rather than the absolute times.",
        "",
    ]
    if "history" in res:
        h = res["history"]
        c = h["config"]
        first, last = h["milestones"][0], h["milestones"][-1]
        lines += [
            "## Time per segment as the history grows",
            "",
            f"One batch of B={c['batch']} streams, segments of L={c['length']} tokens, "
            f"N={c['num_basis']}, e={c['dim']}, {c['heads']} heads, M={c['num_samples']}. All "
            f"{h['segments']} segments ({h['tokens']:,} tokens) are streamed in one process, the "
            "state carried and detached after each segment; each segment is timed (update + "
            "attention forward + backward of context.sum() + kl). Per milestone: the median of "
            f"the {h['window']} segments around it. Stream wall time {h['stream_seconds']:.0f} s.",
            "",
            common.markdown_table(
                ["history", "segments timed", "median ms", "quartiles ms", "min ms", "RSS MiB"],
                [
                    [
                        _tok(m["tokens"]),
                        f"{m['segments'][0]}–{m['segments'][1]}",
                        fm(m["median_ms"]),
                        f"{fm(m['q1_ms'])}–{fm(m['q3_ms'])}",
                        fm(m["min_ms"]),
                        f"{m['rss_mb']:.0f}",
                    ]
                    for m in h["milestones"]
                ],
            ),
            "",
            f"**t({_tok(last['tokens'])}) / t({_tok(first['tokens'])}) = "
            f"{h['ratio_last_over_first']:.2f}** (the memory costs N×e whatever the history). "
            "Peak RSS of the whole process (VmHWM, includes torch): "
            f"**{h['peak_rss_mb']:.0f} MiB**; "
            f"RSS after warm-up {h['rss_mb_after_warmup']:.0f} MiB, at the end "
            f"{h['rss_mb_per_segment'][-1]:.0f} MiB.",
            "",
            "![time per segment vs history](core_history.png)",
            "",
        ]
    if "paper" in res:
        p = res["paper"]
        c = PAPER_CONFIG
        lines += [
            "## Paper shapes: one update segment of one layer",
            "",
            f"e={c['dim']} ({c['heads']} heads × {c['dim'] // c['heads']}), N={c['num_basis']}, "
            f"M={c['num_samples']}, {c['length']} new vectors and {c['length']} queries: "
            "`LongTermMemory.update` (with the CNN gate) + `LongTermAttention` forward + backward "
            "of context.sum() + kl, memory already holding a signal. Variants:",
            "",
            "- **library**: `inftyformer` as committed (continuous softmax in blocks of queries);",
            "- **one block**: the same with `query_block_elements = None` (the whole "
            "[B, H, Q, N] at once, as before the blocking);",
            "- **naive**: written in the benchmark — scores [B, H, Q, N] materialised then "
            "Linear(N, 1), a full-size Gaussian density per basis function, G from an explicit "
            "float32 inverse, ψ(u) rebuilt each step;",
            "- *update only* / *attention only*: the library's two halves alone.",
            "",
            "Authors' figures (similar 2-core CPU): "
            f"{AUTHORS_MS[1][0]:.0f}–{AUTHORS_MS[1][1]:.0f} ms "
            f"at B=1, {AUTHORS_MS[8][0] / 1000:.1f}–{AUTHORS_MS[8][1] / 1000:.1f} s at B=8.",
            "",
        ]
        rows = []
        for alloc, label in (("default", "glibc default"), ("tuned", "tuned malloc")):
            if alloc not in p:
                continue
            for B, bres in p[alloc]["batches"].items():
                v = bres["variants"]
                lib = v["library"]["median_ms"]
                for name, pretty in (
                    ("library", "library"),
                    ("library_one_block", "one block"),
                    ("naive", "naive"),
                    ("library_update_only", "*update only*"),
                    ("library_attention_only", "*attention only*"),
                ):
                    if name not in v:
                        continue
                    s = v[name]
                    vs_naive = v["naive"]["median_ms"] / s["median_ms"]
                    authors = ""
                    if int(B) in AUTHORS_MS and not name.endswith("_only"):
                        a = AUTHORS_MS[int(B)]
                        authors = f"{a[0] / s['median_ms']:.1f}–{a[1] / s['median_ms']:.1f}×"
                    rows.append(
                        [
                            B,
                            label,
                            pretty,
                            f"**{fm(s['median_ms'])}**"
                            if name == "library"
                            else fm(s["median_ms"]),
                            f"{fm(s['q1_ms'])}–{fm(s['q3_ms'])}",
                            f"{vs_naive:.2f}×" if not name.endswith("_only") else "",
                            f"{s['median_ms'] / lib:.2f}",
                            authors,
                        ]
                    )
        lines += [
            common.markdown_table(
                [
                    "B",
                    "allocator",
                    "variant",
                    "median ms",
                    "quartiles ms",
                    "speed-up vs naive",
                    "time / library",
                    "speed-up vs authors",
                ],
                rows,
            ),
            "",
            "Repeats per variant (interleaved): "
            + ", ".join(f"B={B}: {b['repeats']}" for B, b in p["default"]["batches"].items())
            + f". Tuned malloc: `{_env_str()}`. Minor page faults per step (all variants): "
            + ", ".join(
                f"B={B} {p[a]['batches'][B]['minor_faults_per_step']:,.0f} ({a})"
                for a in ("default", "tuned")
                if a in p
                for B in p[a]["batches"]
            )
            + ".",
            "",
            "### Allocator tip",
            "",
            "At B=8 the [B, H, Q, N] tensors of a one-block continuous softmax are ~100 MB each. "
            "glibc serves such allocations with a fresh `mmap` and gives them back with `munmap`, "
            "so every step page-faults them in again, which costs about half the step (compare "
            "*one block* with the default and the tuned allocator above). The library now computes "
            "the continuous softmax in blocks of queries (~8 MB intermediates, "
            "`LongTermAttention.query_block_elements`), which stay in glibc's heap. Other large "
            "CPU tensors (activations of big batches) still pay for it; on a Linux CPU machine, "
            "run training with",
            "",
            "```sh",
            f"export {_env_str()}",
            "```",
            "",
            "to keep freed memory in the heap (peak RSS grows by about what was being unmapped).",
            "",
        ]
    if "verify" in res:
        v = res["verify"]
        nv = v["naive_vs_library"]
        lines += [
            "## Checks",
            "",
            f"Same parameters and inputs, B={v['batch']}, paper shapes (max |a − b| / max |b| over "
            "the context, the KL, the query gradient and every parameter gradient, CNN gate "
            "included):",
            "",
            f"- blocked vs one block, float64: {v['blocked_vs_one_block_float64']['max']:.1e} "
            "(same math);",
            f"- blocked vs one block, float32: {v['blocked_vs_one_block_float32']['max']:.1e} "
            "(only the accumulation order of the W^V gradient over blocks differs);",
            f"- naive vs library attention context (float32): "
            f"{nv['attention_context_rel_diff']:.1e};",
            f"- naive vs library update (float32): {nv['update_coefficients_rel_diff']:.1e}, "
            f"because the explicit float32 inverse of the naive G_inf is "
            f"{nv['G_inf_float32_inverse_rel_error']:.1e} off (Frobenius) the float64 solve the "
            "library uses.",
            "",
        ]
    lines += [
        "## Changes to the core made for speed",
        "",
        "- `LongTermAttention` computes the continuous softmax and E_p[V] in blocks of queries "
        "(`query_block_elements`, 2^21 elements ≈ 8 MB per [B, H, block, N] tensor), instead of "
        "one [B, H, Q, N] tensor: same math, plain autograd; it avoids mmap/munmap and page "
        "faults of the big tensors and keeps them in cache.",
        "- `continuous_softmax` applies `exp` in place on the addcmul result (one full-size "
        "allocation less, identical values and graph).",
        "- Tried and not kept: a mul/add_/square formulation of the exponent (no measurable gain, "
        "not bit-identical).",
        "",
    ]
    return "\n".join(lines)


def _env_str() -> str:
    return " ".join(f"{k}={v}" for k, v in common.TUNED_MALLOC_ENV.items())


# =============================================================================== main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small smoke run (< 1 min)")
    ap.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="where to write core.{json,md} and core_history.png "
        "(default: docs/benchmarks; with --quick a temporary directory)",
    )
    ap.add_argument(
        "--sections",
        default="verify,history,paper",
        help="comma-separated subset of verify,history,paper",
    )
    ap.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's own)"
    )
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--worker-args", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a.threads is not None:
        torch.set_num_threads(a.threads)
    if a.worker:
        common.write_json(a.worker_out, WORKERS[a.worker](json.loads(a.worker_args)))
        return 0

    sections = [s.strip() for s in a.sections.split(",") if s.strip()]
    unknown = set(sections) - set(WORKERS)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}")
    out_dir = a.out_dir
    if out_dir is None:
        out_dir = (
            Path(tempfile.gettempdir()) / "inftyformer_bench_core_quick"
            if a.quick
            else ROOT / "docs" / "benchmarks"
        )
    if a.quick:
        history_args = dict(milestones=[1000, 10000], window=5, warmup=2)
        paper_args = dict(batches=[1, 2], repeats={"1": 3, "2": 2}, warmup=1, breakdown=False)
        verify_args = dict(batch=1)
    else:
        history_args = dict(milestones=[1000, 10000, 100000, 1000000], window=15, warmup=5)
        paper_args = dict(batches=[1, 8], repeats={"1": 15, "8": 7}, warmup=1, breakdown=True)
        verify_args = dict(batch=2)

    wargs = [] if a.threads is None else ["--threads", str(a.threads)]
    started = time.time()
    res: dict[str, Any] = {
        "benchmark": "core",
        "command": common.command_line(),
        "quick": a.quick,
        "started": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": common.machine_info(),
        "authors_ms": {str(k): v for k, v in AUTHORS_MS.items()},
    }
    if "verify" in sections:
        print("verify …", file=sys.stderr, flush=True)
        res["verify"] = common.run_worker(SCRIPT, "verify", verify_args, extra_argv=wargs)
    if "history" in sections:
        print("history …", file=sys.stderr, flush=True)
        res["history"] = common.run_worker(SCRIPT, "history", history_args, extra_argv=wargs)
    if "paper" in sections:
        res["paper"] = {}
        for alloc, env in (("default", {}), ("tuned", common.TUNED_MALLOC_ENV)):
            print(f"paper shapes, {alloc} allocator …", file=sys.stderr, flush=True)
            res["paper"][alloc] = common.run_worker(
                SCRIPT, "paper", paper_args, env, extra_argv=wargs
            )
            res["paper"][alloc]["malloc_env"] = env
    res["duration_s"] = time.time() - started

    out_dir.mkdir(parents=True, exist_ok=True)
    common.write_json(out_dir / "core.json", res)
    if "history" in res:
        plot_history(res["history"], out_dir / "core_history.png")
    common.write_text(out_dir / "core.md", render_markdown(res))
    print(f"wrote {out_dir / 'core.md'} ({res['duration_s']:.0f} s)", file=sys.stderr)
    _print_summary(res)
    return 0


def _print_summary(res: dict[str, Any]) -> None:
    if "history" in res:
        h = res["history"]
        print(
            "history: "
            + ", ".join(f"{_tok(m['tokens'])} {m['median_ms']:.0f} ms" for m in h["milestones"])
            + f"; ratio {h['ratio_last_over_first']:.2f}; peak RSS {h['peak_rss_mb']:.0f} MiB"
        )
    for alloc, p in res.get("paper", {}).items():
        for B, b in p["batches"].items():
            print(
                f"paper {alloc} B={B}: "
                + ", ".join(f"{n} {v['median_ms']:.0f} ms" for n, v in b["variants"].items())
            )


if __name__ == "__main__":
    sys.exit(main())
