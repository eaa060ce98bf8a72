"""Speed and memory of the ∞-former's core: long-term memory update + continuous attention.

    python benchmarks/bench_core.py            # full run (~10 min on a 2-core CPU)
    python benchmarks/bench_core.py --quick    # smoke run (< 1 min, 1 thread), to a temp dir

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
import os
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
from inftyformer._checks import check_finite
from inftyformer.continuous_softmax import variance_kl

ROOT = Path(__file__).resolve().parent.parent
CORE_PATHS = [
    f"src/inftyformer/{m}.py"
    for m in ("basis", "ridge", "continuous_softmax", "long_term_memory", "long_term_attention")
]
SCRIPT = Path(__file__).resolve()

# The authors' figures for one update segment of one layer (forward+backward, sorting shapes) on a
# similar 2-core CPU, in ms: (low, high).
AUTHORS_MS = {1: (250.0, 340.0), 8: (1700.0, 2500.0)}

HISTORY_CONFIG = dict(batch=4, length=512, num_basis=256, dim=300, heads=6, num_samples=512)
BLOCK_DEFAULT = LongTermAttention.query_block_elements
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


# =============================================================================== initial version
def initial_continuous_softmax(mu: torch.Tensor, sigma_sq: torch.Tensor, basis) -> torch.Tensor:
    """`continuous_softmax` as first committed (63e5d4a), for the before/after comparison."""
    c = basis.center_grid.to(device=mu.device, dtype=mu.dtype)
    w_sq = basis.width_grid.to(device=mu.device, dtype=mu.dtype) ** 2
    var = sigma_sq.unsqueeze(-1) + w_sq
    coef = (-0.5 / var).unsqueeze(-1)
    log_norm = (-0.5 * torch.log(2.0 * math.pi * var)).unsqueeze(-1)
    dist_sq = ((mu.unsqueeze(-1) - c) ** 2).unsqueeze(-2)
    return torch.exp(torch.addcmul(log_norm, coef, dist_sq)).flatten(-2)


def initial_attention(att: LongTermAttention, query: torch.Tensor, state: LongTermState):
    """`LongTermAttention.forward` as first committed (63e5d4a): K = B W^K built, then folded with
    w_μ, w_σ; the continuous softmax over the whole [B, H, Q, N] at once. Returns (context, kl)."""
    c = att.config
    check_finite("query", query)
    batch, num_q, _ = query.shape
    H, d = c.num_heads, c.head_dim
    B = state.coefficients.to(query.dtype)
    q = att.query(query) if att.query is not None else query
    q = q.view(batch, num_q, H, d).transpose(1, 2)
    k = att.key(B).view(batch, -1, H, d).transpose(1, 2)
    v = att.value(B).view(batch, -1, H, d).transpose(1, 2)
    w = torch.cat([att.mu_head.weight, att.sigma_head.weight])
    k_heads = torch.einsum("bhnd,mn->bhdm", k, w) / math.sqrt(d)
    logits = torch.matmul(q, k_heads)
    mu = torch.sigmoid(logits[..., 0] + att.mu_head.bias)
    sigma_sq = F.softplus(logits[..., 1] + att.sigma_head.bias).clamp(min=c.min_sigma_sq)
    r = initial_continuous_softmax(mu, sigma_sq, att.basis)
    z = torch.matmul(r, v).transpose(1, 2).reshape(batch, num_q, H * d)
    filled = (~state.empty).to(device=query.device, dtype=query.dtype)
    context = att.out(z) * filled[:, None, None]
    kl_rows = variance_kl(sigma_sq, c.sigma_0).mean(dim=(1, 2))
    kl = (kl_rows * filled).sum() / filled.sum().clamp(min=1.0)
    return context, kl


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
    """Stream one batch of streams through `total` segments and time every segment.

    Around each milestone, every stream segment is paired with a *reference* segment: the same
    step applied to the state saved after the first segment (512 tokens of history), timed right
    before or after it. The load of a shared machine changes over a long stream; the ratio
    stream / reference at each milestone does not depend on it."""
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
    in_window = {k for w in windows for k in w}
    window_ends = {w[-1] for w in windows}
    total = max(window_ends) + 1

    # warm-up on a throw-away stream (threads, allocator, caches of G)
    state = mem.init_state(B)
    for k in range(args["warmup"]):
        state = library_step(mem, att, state, xs[k % pool], qs[k % pool]).detach()
        clear_grads(mem, att, *qs)
    rss_before = common.rss_mb()

    def reference(x, q):
        library_step(mem, att, ref_state, x, q)

    state = mem.init_state(B)
    ref_state = None
    times, ref_times, rss = [], {}, []
    start = time.perf_counter()
    for k in range(total):
        x, q = xs[k % pool], qs[k % pool]
        if k in in_window and k % 2:
            ref_times[k] = common.timed(lambda x=x, q=q: reference(x, q))
            clear_grads(mem, att, q)
        t0 = time.perf_counter()
        new_state = library_step(mem, att, state, x, q)
        times.append(time.perf_counter() - t0)
        state = new_state.detach()  # as a model keeps it across segments
        clear_grads(mem, att, q)
        if k == 0:
            ref_state = state  # 512 tokens of history
        if k in in_window and not k % 2:
            ref_times[k] = common.timed(lambda x=x, q=q: reference(x, q))
            clear_grads(mem, att, q)
        rss.append(common.rss_mb())
        if k in window_ends:
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
        r = common.summarize([ref_times[i] for i in w])
        ratios = sorted(times[i] / ref_times[i] for i in w)
        results.append(
            dict(
                tokens=m,
                center_segment=k,
                center_history_tokens=(k + 1) * L,
                segments=[w[0], w[-1]],
                history_tokens_range=[(w[0] + 1) * L, (w[-1] + 1) * L],
                rss_mb=rss[k],
                **s,
                reference_median_ms=r["median_ms"],
                median_ratio_to_reference=ratios[len(ratios) // 2]
                if len(ratios) % 2
                else 0.5 * (ratios[len(ratios) // 2 - 1] + ratios[len(ratios) // 2]),
            )
        )
    first, last = results[0], results[-1]
    return dict(
        config=cfg,
        segments=total,
        tokens=total * L,
        window=window,
        stream_seconds=time.perf_counter() - start,
        milestones=results,
        ratio_last_over_first=last["median_ms"] / first["median_ms"],
        ratio_last_over_first_paired=last["median_ratio_to_reference"],
        rss_mb_after_warmup=rss_before,
        peak_rss_mb=common.peak_rss_mb(),
        per_segment_ms=[1000 * t for t in times],
        reference_ms={str(k): 1000 * t for k, t in ref_times.items()},
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
    block_default = BLOCK_DEFAULT
    out: dict[str, Any] = {"config": cfg, "batches": {}}
    for B in args["batches"]:
        gen = torch.Generator().manual_seed(B)
        state = mem.update(mem.init_state(B), torch.randn(B, L, e, generator=gen)).detach()
        x = torch.randn(B, L, e, generator=gen)
        q = torch.randn(B, L, e, generator=gen).requires_grad_()

        def run_library(block=block_default, state=state, x=x, q=q):
            att.query_block_elements = block
            library_step(mem, att, state, x, q)

        def run_initial(state=state, x=x, q=q):
            context, kl = initial_attention(att, q, mem.update(state, x))
            (context.sum() + kl).backward()

        def run_update(state=state, x=x):
            mem.update(state, x).coefficients.sum().backward()

        def run_attention(state=state, q=q):
            att.query_block_elements = block_default
            o = att(q, state)
            (o.context.sum() + o.kl).backward()

        variants = {
            "library": run_library,
            "library_one_block": lambda: run_library(None),
            "initial": run_initial,
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
    """The library vs the same with one block, vs the initial version, in float32 and float64,
    and float32 vs float64 (the size of float32 rounding); then naive vs library."""
    cfg = PAPER_CONFIG
    B, L = args["batch"], cfg["length"]
    res: dict[str, Any] = {"batch": B, "shapes": cfg}
    outs: dict[str, dict[str, dict[str, torch.Tensor]]] = {}
    for dtype in (torch.float32, torch.float64):
        torch.manual_seed(0)  # same parameters and inputs in both dtypes
        mem, att = build(cfg["dim"], cfg["heads"], cfg["num_basis"], cfg["num_samples"], dtype)
        gen = torch.Generator().manual_seed(3)
        state = mem.update(
            mem.init_state(B, dtype=dtype), torch.randn(B, L, cfg["dim"], generator=gen).to(dtype)
        ).detach()
        x = torch.randn(B, L, cfg["dim"], generator=gen).to(dtype)
        q = torch.randn(B, L, cfg["dim"], generator=gen).to(dtype).requires_grad_()
        dname = str(dtype).split(".")[-1]
        # at least 3 blocks, whatever the batch size, so that the blocking is exercised
        blocked = min(BLOCK_DEFAULT, -(-B * cfg["heads"] * L * cfg["num_basis"] // 3))
        res["library_query_block_elements"] = blocked
        for name in ("library", "one_block", "initial"):
            clear_grads(mem, att, q)
            att.query_block_elements = {"one_block": None, "initial": BLOCK_DEFAULT}.get(
                name, blocked
            )
            if name == "initial":
                context, kl = initial_attention(att, q, mem.update(state, x))
            else:
                o = att(q, mem.update(state, x))
                context, kl = o.context, o.kl
            (context.sum() + kl).backward()
            got = {"context": context.detach(), "kl": kl.detach(), "query.grad": q.grad}
            for mod, prefix in ((mem, "mem."), (att, "att.")):
                for pname, p in mod.named_parameters():
                    got[prefix + pname + ".grad"] = p.grad
            outs[f"{name}_{dname}"] = got
        att.query_block_elements = BLOCK_DEFAULT
    for a, b in (
        ("library_float64", "one_block_float64"),
        ("library_float64", "initial_float64"),
        ("library_float32", "one_block_float32"),
        ("library_float32", "initial_float32"),
        ("initial_float32", "initial_float64"),
        ("library_float32", "library_float64"),
    ):
        diffs = {k: rel_diff(outs[a][k], outs[b][k]) for k in outs[b]}
        res[f"{a}_vs_{b}"] = {"max": max(diffs.values()), "per_tensor": diffs}
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
    ref = {int(k): v for k, v in hist.get("reference_ms", {}).items()}
    if ref:
        ax1.scatter(
            [tokens[k] for k in ref],
            list(ref.values()),
            s=10,
            marker="^",
            color="tab:orange",
            alpha=0.7,
            label="reference (same step on the 512-token state), timed alongside",
        )
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
        f" = {hist['ratio_last_over_first']:.2f} from medians, "
        f"{hist['milestones'][-1]['median_ratio_to_reference']:.2f} paired; "
        "medians with quartiles (red)",
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
        f"Written by `python benchmarks/bench_core.py{' --quick' if res['quick'] else ''}`"
        f"{' (quick smoke run)' if res['quick'] else ''}; raw numbers in `core.json`. "
        f"Last invocation: `{res['command']}` on {res['started']}. Sections (and the "
        "allocator/thread runs of the paper-shape section) can be re-run separately with "
        "`--sections` / `--paper-runs`; each one states below when, at which commit and under "
        "which load it was measured.",
        "",
        common.machine_markdown(res["machine"]),
        "",
        "The machine is shared with other jobs, so single timings are noisy. Every figure is a "
        "median over repeated steps; in the paper-shape table the variants are interleaved "
        "round-robin in the same process so that load falls on all of them alike. Compare the "
        "ratios rather than the absolute times.",
        "",
    ]
    lines += _summary_markdown(res)
    if "history" in res:
        h = res["history"]
        c = h["config"]
        first, last = h["milestones"][0], h["milestones"][-1]
        lines += [
            "## Time per segment as the history grows",
            "",
            *_provenance(h),
            f"One batch of B={c['batch']} streams, segments of L={c['length']} tokens, "
            f"N={c['num_basis']}, e={c['dim']}, {c['heads']} heads, M={c['num_samples']}. All "
            f"{h['segments']} segments ({h['tokens']:,} tokens) are streamed in one process, the "
            "state carried and detached after each segment as a model does; every segment is "
            "timed (update + attention forward + backward of context.sum() + kl). Per milestone: "
            f"the median of the {h['window']} segments around it. Each of those is paired with a "
            "*reference* segment timed next to it — the same step applied to the state saved "
            "after the first segment (512 tokens) — so that the ratio stream / reference does "
            "not depend on how loaded the shared machine was at that moment. Stream wall time "
            f"{h['stream_seconds']:.0f} s.",
            "",
            common.markdown_table(
                [
                    "history",
                    "segments",
                    "median ms",
                    "quartiles ms",
                    "reference ms",
                    "stream / reference",
                    "RSS MiB",
                ],
                [
                    [
                        _tok(m["tokens"]),
                        f"{m['segments'][0]}–{m['segments'][1]}",
                        fm(m["median_ms"]),
                        f"{fm(m['q1_ms'])}–{fm(m['q3_ms'])}",
                        fm(m["reference_median_ms"]),
                        f"{m['median_ratio_to_reference']:.3f}",
                        f"{m['rss_mb']:.0f}",
                    ]
                    for m in h["milestones"]
                ],
            ),
            "",
            f"**t({_tok(last['tokens'])}) / t({_tok(first['tokens'])}) = "
            f"{h['ratio_last_over_first']:.2f}** from the medians of the two windows, "
            f"**{last['median_ratio_to_reference']:.2f}** paired (the reference *is* the step "
            "at 1K tokens of history, timed next to each segment at 1M, so the load cancels). "
            "How much of that is noise: at 1K, where stream and reference are the same "
            f"computation, the paired median is {first['median_ratio_to_reference']:.2f}"
            f"{_pair_spread(h)}. The memory costs N×e whatever the history, so the "
            "time per segment does not grow. Peak RSS of the whole process (VmHWM, torch "
            f"included): **{h['peak_rss_mb']:.0f} MiB**; RSS after warm-up "
            f"{h['rss_mb_after_warmup']:.0f} MiB, at the end {h['rss_mb_per_segment'][-1]:.0f} "
            "MiB (flat: no state or graph is kept across segments).",
            "",
            "![time per segment vs history](core_history.png)",
            "",
            "Plateaus and spikes in the plot come and go with other jobs on the shared CPU (the "
            "reference segments, which always carry 512 tokens of history, rise and fall with "
            "them); they do not follow the history.",
            "",
        ]
    if "paper" in res:
        lines += _paper_markdown(res["paper"])
    if "verify" in res:
        lines += _verify_markdown(res["verify"])
    lines += [
        "## Changes to the core made for speed",
        "",
        "- `LongTermAttention` computes the continuous softmax and E_p[V] in blocks of queries "
        "(`query_block_elements`: at most 3·2^21 elements = 24 MiB per [B, H, block, N] "
        "tensor, even blocks) instead of one [B, H, Q, N] tensor: same math, plain autograd. "
        "Blocks that size stay under glibc's 32 MiB ceiling for mmap'ed allocations, so most "
        "are recycled from the heap instead of being mapped, page-faulted and unmapped every "
        "step (compare *library* with *one block* above). Smaller blocks (8 MiB, tried first) "
        "fault even less but multiply kernel launches and thread wake-ups: on this loaded "
        "2-core machine, B=8 took 5.9 s with 13 blocks, 4.3 s with 7, 3.1–3.5 s with 4 and "
        "3.5 s with one block (2 threads); single-threaded 1.34 s, 1.39 s (4 blocks) and 1.81 s "
        "(one block).",
        "- `continuous_softmax` applies `exp` in place on the addcmul result (one full-size "
        "allocation less, identical values and graph).",
        "- (Commit 3f8effe, from the model work:) the w_μ, w_σ heads are folded into B before "
        "W^K, so K = B W^K [B, N, e] is never built: identical math, one [N, e]×[e, e] product "
        "and its backward less.",
        "- Measured and not kept: a mul/add_/square form of the exponent (no gain beyond noise, "
        "not bit-identical). Not attempted: a custom backward (excluded by design, SPEC §3).",
        "- Where the time goes now (torch.profiler, B=8): the CNN gate's convolution and its "
        "weight gradient, the ridge fit G_infᵀ[x̃; X] and its backward, the r·V products and "
        "their backward (d = 50 makes these GEMMs thin), and the elementwise exp/addcmul "
        "backward of the continuous softmax — each a sizeable share, none dominant.",
        "",
    ]
    return "\n".join(lines)


def _summary_markdown(res: dict[str, Any]) -> list[str]:
    fm = common.fmt_ms
    out = ["## Summary", ""]
    p = res.get("paper", {})
    for run, label in PAPER_RUN_LABELS:
        if run not in p:
            continue
        for B, b in p[run]["batches"].items():
            v = b["variants"]
            t = v["library"]["median_ms"]
            text = f"- B={B}, {label}: **{fm(t)} ms** per segment per layer"
            if int(B) in AUTHORS_MS:
                lo, hi = AUTHORS_MS[int(B)]
                text += f"; authors' {fm(lo)}–{fm(hi)} ms ÷ this = **{lo / t:.1f}–{hi / t:.1f}**"
            text += f"; naive {v['naive']['median_ms'] / t:.1f}× slower"
            if "initial" in v:
                text += f", initial version {v['initial']['median_ms'] / t:.2f}× slower"
            out.append(text + ".")
    if any(run in p for run in ("default", "tuned")) and any("1thread" in run for run in p):
        loads = [
            x
            for run in ("default", "tuned")
            for x in p.get(run, {}).get("provenance", {}).get("load_average_1min", [])
        ]
        at = f" at a load average of {min(loads):.0f}–{max(loads):.0f}" if loads else ""
        out.append(
            '- The rows without "1 thread" use torch\'s 2 threads on a CPU that other jobs kept '
            f"busy{at}: two threads then mostly wait for each other (see the note under the "
            "table). Compare with the authors through the 1-thread rows."
        )
    if "history" in res:
        h = res["history"]
        first, last = h["milestones"][0], h["milestones"][-1]
        out.append(
            f"- History {_tok(first['tokens'])} → {_tok(last['tokens'])} tokens: "
            f"t({_tok(last['tokens'])}) / t({_tok(first['tokens'])}) = "
            f"**{h['ratio_last_over_first']:.2f}** (medians), "
            f"**{last['median_ratio_to_reference']:.2f}** (paired with the 1K step timed "
            "alongside; for the noise level, the same paired figure at 1K, where both are the "
            f"same computation, is {first['median_ratio_to_reference']:.2f}); peak RSS "
            f"**{h['peak_rss_mb']:.0f} MiB**, RSS flat at "
            f"{min(h['rss_mb_per_segment']):.0f}–{max(h['rss_mb_per_segment']):.0f} MiB."
        )
    return out + [""] if len(out) > 2 else []


PAPER_RUN_LABELS = (
    ("default_1thread", "glibc default, 1 thread"),
    ("tuned_1thread", "tuned malloc, 1 thread"),
    ("default", "glibc default"),
    ("tuned", "tuned malloc"),
)
PAPER_VARIANTS = (
    ("library", "**library**"),
    ("library_one_block", "one block"),
    ("initial", "initial (63e5d4a)"),
    ("naive", "naive"),
    ("library_update_only", "*update only*"),
    ("library_attention_only", "*attention only*"),
)


def _paper_markdown(p: dict[str, Any]) -> list[str]:
    fm = common.fmt_ms
    c = PAPER_CONFIG
    lines = [
        "## Paper shapes: one update segment of one layer",
        "",
        *_provenance(p),
        f"e={c['dim']} ({c['heads']} heads × {c['dim'] // c['heads']}), N={c['num_basis']}, "
        f"M={c['num_samples']}, {c['length']} new vectors and {c['length']} queries: "
        "`LongTermMemory.update` (with the CNN gate) + `LongTermAttention` forward + backward "
        "of context.sum() + kl, the memory already holding a signal. Variants, interleaved in "
        "one process per allocator setting:",
        "",
        "- **library**: `inftyformer` as it is now (continuous softmax in blocks of queries);",
        "- *one block*: the same with `query_block_elements = None` (the whole [B, H, Q, N] at "
        "once);",
        "- *initial (63e5d4a)*: the attention as first committed, copied into the benchmark "
        "(K = B W^K built, one block, out-of-place exp);",
        "- *naive*: written in the benchmark — scores [B, H, Q, N] materialised then "
        "Linear(N, 1), a full-size Gaussian density per basis function, G from an explicit "
        "float32 inverse, ψ(u) rebuilt each step;",
        "- *update only* / *attention only*: the library's two halves alone.",
        "",
        "Authors' figures, same shapes on a similar 2-core CPU: "
        f"{AUTHORS_MS[1][0]:.0f}–{AUTHORS_MS[1][1]:.0f} ms at B=1, "
        f"{AUTHORS_MS[8][0] / 1000:.1f}–{AUTHORS_MS[8][1] / 1000:.1f} s at B=8.",
        "",
    ]
    rows = []
    for alloc, label in PAPER_RUN_LABELS:
        for B, bres in p.get(alloc, {}).get("batches", {}).items():
            v = bres["variants"]
            for name, pretty in PAPER_VARIANTS:
                if name not in v:
                    continue
                t = v[name]["median_ms"]
                whole = not name.endswith("_only")
                authors = ""
                if int(B) in AUTHORS_MS and whole:
                    a = AUTHORS_MS[int(B)]
                    authors = f"{a[0] / t:.1f}–{a[1] / t:.1f}×"
                rows.append(
                    [
                        B,
                        label,
                        pretty,
                        f"**{fm(t)}**" if name == "library" else fm(t),
                        f"{fm(v[name]['q1_ms'])}–{fm(v[name]['q3_ms'])}",
                        f"{v['naive']['median_ms'] / t:.2f}×" if whole else "",
                        f"{v['initial']['median_ms'] / t:.2f}×" if whole and "initial" in v else "",
                        authors,
                    ]
                )
    threads = p["default"]["machine"]["torch_threads"]
    lines += [
        f"torch threads: {threads} (torch's default here) unless the row says 1 thread. Other "
        "jobs were running on the same 2 CPUs (see the load averages); with more runnable "
        "threads than CPUs, two torch threads wait for each other at every parallel kernel, so "
        "the 2-thread wall times mostly measure that wait"
        + (
            " (library at B=1: "
            f"{fm(p['default']['batches']['1']['variants']['library']['median_ms'])} ms with "
            f"{threads} threads, "
            f"{fm(p['default_1thread']['batches']['1']['variants']['library']['median_ms'])} ms "
            "with 1)"
            if "default_1thread" in p and "1" in p["default"]["batches"]
            else ""
        )
        + ". The 1-thread rows are the meaningful ones on this machine; on an idle 2-core "
        "CPU two threads would be faster still.",
        "",
    ]
    headers = ["B", "allocator", "variant", "median ms", "quartiles ms"]
    headers += ["naive / this", "initial / this", "authors / this"]
    lines += [common.markdown_table(headers, rows), ""]
    reps = ", ".join(f"B={B}: {b['repeats']}" for B, b in p["default"]["batches"].items())
    faults = "; ".join(
        f"{a}: "
        + ", ".join(f"B={B} {b['minor_faults_per_step']:,.0f}" for B, b in p[a]["batches"].items())
        for a, _ in PAPER_RUN_LABELS
        if a in p
    )
    lines += [
        f"Repeats per variant: {reps}. Tuned malloc: `{_env_str()}`. Minor page faults per "
        f"timed call, averaged over all variants: {faults}.",
        "",
    ]
    pair = next(
        ((x, y) for x, y in (("default_1thread", "tuned_1thread"), ("default", "tuned")) if y in p),
        None,
    )
    if pair is not None:
        big = max(p[pair[0]]["batches"], key=int)
        d = p[pair[0]]["batches"][big]["variants"]
        t = p[pair[1]]["batches"][big]["variants"]
        one_d, one_t = d["library_one_block"]["median_ms"], t["library_one_block"]["median_ms"]
        lib_d, lib_t = d["library"]["median_ms"], t["library"]["median_ms"]
        threads_note = ", 1 thread" if "1thread" in pair[0] else ""
        lines += [
            "### Allocator tip",
            "",
            f"At B={big} the [B, H, Q, N] tensors of a one-block continuous softmax are "
            f"~{int(big) * c['heads'] * c['length'] * c['num_basis'] * 4 / 2**20:.0f} MiB each. "
            "glibc serves allocations that large with a fresh `mmap` and returns them with "
            "`munmap` when freed, so every step page-faults them in again. Measured here at "
            f"B={big}{threads_note}: one block takes {fm(one_d)} ms with glibc's defaults and "
            f"{fm(one_t)} ms with raised thresholds ({one_d / one_t:.2f}×); the blocked library "
            f"{fm(lib_d)} ms and {fm(lib_t)} ms ({lib_d / lib_t:.2f}×). Blocking gets (part "
            "of) the allocator's gain without any setting; other large CPU tensors (the "
            "activations of big batches, the rest of a model) still pay for it, so on Linux "
            "CPU machines run training and benchmarks with",
            "",
            "```sh",
            f"export {_env_str()}",
            "```",
            "",
            "which keeps freed memory in the heap for reuse (peak RSS rises by about what was "
            "being unmapped and mapped again).",
            "",
        ]
    return lines


def _verify_markdown(v: dict[str, Any]) -> list[str]:
    def line(key: str, what: str) -> str:
        r = v[key]
        nonzero = [k for k, x in r["per_tensor"].items() if x > 0]
        where = (
            "bit-identical"
            if not nonzero
            else "differs in "
            + ", ".join(f"`{k}`" for k in nonzero[:6])
            + (" …" if len(nonzero) > 6 else "")
        )
        return f"- {what}: **{r['max']:.1e}** ({where})"

    nv = v["naive_vs_library"]
    return [
        "## Checks",
        "",
        *_provenance(v),
        f"Same parameters and inputs, B={v['batch']}, paper shapes, the library in blocks of "
        f"≤ {v.get('library_query_block_elements', BLOCK_DEFAULT):,} elements (≥ 3 blocks); "
        "max |a − b| / max |b| over "
        "the context, the KL, the query gradient and every parameter gradient (CNN gate "
        "included), the largest over all of them:",
        "",
        line("library_float64_vs_one_block_float64", "library vs one block, float64"),
        line("library_float64_vs_initial_float64", "library vs initial version, float64"),
        line("library_float32_vs_one_block_float32", "library vs one block, float32"),
        line("library_float32_vs_initial_float32", "library vs initial version, float32"),
        line(
            "initial_float32_vs_initial_float64",
            "for scale, float32 rounding: initial version float32 vs float64",
        ),
        f"- naive vs library, attention context (float32): {nv['attention_context_rel_diff']:.1e}",
        f"- naive vs library, updated coefficients (float32): "
        f"{nv['update_coefficients_rel_diff']:.1e}: the naive G_inf from an explicit float32 "
        f"inverse is {nv['G_inf_float32_inverse_rel_error']:.1e} off (Frobenius) the float64 "
        "solve the library uses (SPEC §2).",
        "",
        "The float64 rows show the math is the same; in float32 the changes only reorder "
        "sums (the W^V gradient is accumulated over query blocks; the K fold multiplies in "
        "another order), within float32 rounding.",
        "",
    ]


def _pair_spread(h: dict[str, Any]) -> str:
    """', and single pairs range from a to b' over all milestone windows."""
    ref = {int(k): v for k, v in h.get("reference_ms", {}).items()}
    t = h["per_segment_ms"]
    ratios = [t[k] / r for k, r in ref.items()]
    if not ratios:
        return ""
    return f", and single pairs range from {min(ratios):.2f} to {max(ratios):.2f}"


def _prov_text(pv: dict[str, Any]) -> str:
    load = pv["load_average_1min"]
    text = f"measured {pv['measured']} at commit `{pv['commit']}`"
    if "query_block_elements" in pv:
        text += f" (`query_block_elements` = {pv['query_block_elements']})"
    if "command" in pv:
        text += f" by `{pv['command']}`"
    return (
        text + f", {pv['seconds']:.0f} s; 1-minute load average {load[0]:.1f} → {load[1]:.1f} "
        "on 2 CPUs"
    )


def _provenance(section: dict[str, Any]) -> list[str]:
    """Where a section's numbers come from (sections and paper runs can be re-run separately)."""
    pv = section.get("provenance")
    if pv and "load_average_1min" in pv:
        return [f"*{_prov_text(pv)[0].upper()}{_prov_text(pv)[1:]}.*", ""]
    runs = [
        (label, section[run]["provenance"])
        for run, label in PAPER_RUN_LABELS
        if "provenance" in section.get(run, {})
    ]
    if not runs:
        return []
    block = (pv or {}).get("query_block_elements")
    head = "*Runs" + (f" (`query_block_elements` = {block})" if block else "") + ":*"
    return [head, "", *[f"- *{label}: {_prov_text(r)}.*" for label, r in runs], ""]


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
        "--paper-runs",
        default=None,
        help="comma-separated subset of default,tuned,default_1thread,tuned_1thread (allocator "
        "settings and thread counts of the paper section; default: all, --quick: default,tuned)",
    )
    ap.add_argument(
        "--render-only",
        action="store_true",
        help="only rewrite core.md and core_history.png from the core.json in --out-dir",
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

    if a.render_only:
        res = json.loads((out_dir / "core.json").read_text())
        _write_report(res, out_dir)
        return 0

    if a.quick and a.threads is None:
        a.threads = 1  # a smoke run: one thread is fastest and steadiest on a shared CPU
    wargs = [] if a.threads is None else ["--threads", str(a.threads)]
    paper_runs = (a.paper_runs or ("default,tuned" if a.quick else "")).split(",")
    paper_runs = [r for r in paper_runs if r] or [
        "default",
        "tuned",
        "default_1thread",
        "tuned_1thread",
    ]
    started = time.time()
    res: dict[str, Any] = {
        "benchmark": "core",
        "command": common.command_line(),
        "quick": a.quick,
        "started": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": common.machine_info(),
        "authors_ms": {str(k): v for k, v in AUTHORS_MS.items()},
    }

    def section(name: str, run) -> None:
        print(f"{name} …", file=sys.stderr, flush=True)
        t0, load0 = time.time(), os.getloadavg()[0]
        res[name] = run()
        res[name]["provenance"] = {
            "commit": common.git_revision(ROOT, CORE_PATHS),
            "measured": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": res["command"],
            "seconds": time.time() - t0,
            "load_average_1min": [load0, os.getloadavg()[0]],
            "query_block_elements": BLOCK_DEFAULT,
        }

    if "verify" in sections:
        section(
            "verify", lambda: common.run_worker(SCRIPT, "verify", verify_args, extra_argv=wargs)
        )
    if "history" in sections:
        section(
            "history", lambda: common.run_worker(SCRIPT, "history", history_args, extra_argv=wargs)
        )
    if "paper" in sections:

        def paper() -> dict[str, Any]:
            out: dict[str, Any] = {}
            one = ["--threads", "1"]
            runs = {
                "default": ({}, wargs),
                "tuned": (common.TUNED_MALLOC_ENV, wargs),
                "default_1thread": ({}, one),
                "tuned_1thread": (common.TUNED_MALLOC_ENV, one),
            }
            for name in paper_runs:
                env, argv = runs[name]
                print(f"  {name} …", file=sys.stderr, flush=True)
                t0, load0 = time.time(), os.getloadavg()[0]
                out[name] = common.run_worker(SCRIPT, "paper", paper_args, env, extra_argv=argv)
                out[name]["malloc_env"] = env
                out[name]["provenance"] = {
                    "command": res["command"],
                    "commit": common.git_revision(ROOT, CORE_PATHS),
                    "measured": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                    "seconds": time.time() - t0,
                    "load_average_1min": [load0, os.getloadavg()[0]],
                }
            previous = out_dir / "core.json"
            if previous.exists() and not a.quick:
                old = json.loads(previous.read_text()).get("paper", {})
                for name in runs:
                    if name not in out and "batches" in old.get(name, {}):
                        out[name] = old[name]  # kept, with its own provenance
                        print(f"kept paper run {name!r} from {previous}", file=sys.stderr)
            return out

        section("paper", paper)
    res["duration_s"] = time.time() - started

    out_dir.mkdir(parents=True, exist_ok=True)
    previous = out_dir / "core.json"
    if previous.exists() and not a.quick and set(sections) != set(WORKERS):
        old = json.loads(previous.read_text())
        for name in WORKERS:
            if name not in res and name in old and not old.get("quick"):
                res[name] = old[name]  # kept, with its own provenance
                print(f"kept section {name!r} from {previous}", file=sys.stderr)
    common.write_json(out_dir / "core.json", res)
    _write_report(res, out_dir)
    return 0


def _write_report(res: dict[str, Any], out_dir: Path) -> None:
    if "history" in res:
        plot_history(res["history"], out_dir / "core_history.png")
    common.write_text(out_dir / "core.md", render_markdown(res))
    print(f"wrote {out_dir / 'core.md'}", file=sys.stderr)
    _print_summary(res)


def _print_summary(res: dict[str, Any]) -> None:
    if "history" in res:
        h = res["history"]
        print(
            "history: "
            + ", ".join(f"{_tok(m['tokens'])} {m['median_ms']:.0f} ms" for m in h["milestones"])
            + f"; ratio {h['ratio_last_over_first']:.2f} (paired "
            + f"{h['milestones'][-1]['median_ratio_to_reference']:.2f}); "
            + f"peak RSS {h['peak_rss_mb']:.0f} MiB"
        )
    for alloc, p in res.get("paper", {}).items():
        if "batches" not in p:
            continue
        for B, b in p["batches"].items():
            print(
                f"paper {alloc} B={B}: "
                + ", ".join(f"{n} {v['median_ms']:.0f} ms" for n, v in b["variants"].items())
            )


if __name__ == "__main__":
    sys.exit(main())
