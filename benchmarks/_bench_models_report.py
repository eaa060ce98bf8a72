"""`bench_models.py`'s report: fits and extrapolations of the full-history costs, the Markdown
(docs/results/benchmarks/models.md, with the hand-kept notes), the plot and the headline lines, all
rendered from models.json alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _bench_models_measure import MODEL_TYPES, STREAMED

from inftyformer import _measure as common


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
