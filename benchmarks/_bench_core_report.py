"""`bench_core.py`'s report: docs/results/benchmarks/core.md (with its hand-kept notes) and
core_history.png, rendered from core.json alone."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from _bench_core_measure import PAPER, SGEMM_N, SGEMM_REPEATS, VARIANTS

from inftyformer import _measure as common


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
