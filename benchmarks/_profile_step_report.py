"""`profile_step.py`'s report (docs/results/benchmarks/step_profile.md), rendered from
step_profile.json alone, with the hand-kept notes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inftyformer import _measure as common


def extra_by_part(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per part: its time in each model's profiled step, the ∞-former's extra time, its extra
    FLOPs and the time they would take at the FLOP rate of XL's whole profiled step; largest
    extra first."""
    from profile_step import PARTS

    parts, flops = result["parts"], result["flops"]
    xl_rate = flops["xl"]["total"] / result["profiled_step_ms"]["xl"]  # FLOP per ms
    rows = []
    for label in sorted(set(parts["xl"]) | set(parts["infty"])):
        a, b = parts["xl"].get(label, {}), parts["infty"].get(label, {})
        extra_flop = flops["infty"]["parts"].get(label, 0.0) - flops["xl"]["parts"].get(label, 0.0)
        what, counted = PARTS.get(label, ("(not attributed)", False))
        rows.append(
            {
                "part": label,
                "what": what,
                "xl_ms": a.get("total_ms", 0.0),
                "infty_ms": b.get("total_ms", 0.0),
                "extra_ms": b.get("total_ms", 0.0) - a.get("total_ms", 0.0),
                "infty_ops_ms": b.get("ops_ms", 0.0),
                "infty_backward_ms": b.get("backward_ms", 0.0),
                "infty_ops": b.get("ops", 0.0),
                "extra_gflop": extra_flop / 1e9,
                "at_xl_rate_ms": extra_flop / xl_rate,
                "counted": counted,
            }
        )
    return sorted(rows, key=lambda r: -r["extra_ms"])


def markdown(result: dict[str, Any], notes: str) -> str:
    s, step, ratio, fl = result["settings"], result["step"], result["ratio"], result["flops"]
    flop_ratio = fl["infty"]["total"] / fl["xl"]["total"]
    profiled = result["profiled_step_ms"]
    rows = extra_by_part(result)
    total_extra = profiled["infty"] - profiled["xl"]
    total_extra_parts = sum(r["extra_ms"] for r in rows)
    counted = sum(r["extra_ms"] for r in rows if r["counted"] and r["extra_gflop"] > 0)
    expected = sum(r["at_xl_rate_ms"] for r in rows)
    cfg = s["config"]
    fmt = common.fmt_ms
    table = common.markdown_table(
        [
            "part",
            "what",
            "XL ms",
            "∞ ms",
            "extra ms",
            "% of extra",
            "∞: in ops / rest ms",
            "∞: of it backward ms",
            "∞ ops",
            "extra GFLOP",
            "extra at XL's rate ms",
        ],
        [
            [
                f"`{r['part']}`",
                r["what"],
                f"{r['xl_ms']:.1f}",
                f"{r['infty_ms']:.1f}",
                f"{r['extra_ms']:+.1f}",
                f"{100 * r['extra_ms'] / total_extra_parts:+.0f}%",
                f"{r['infty_ops_ms']:.1f} / {r['infty_ms'] - r['infty_ops_ms']:.1f}",
                f"{r['infty_backward_ms']:.1f}",
                f"{r['infty_ops']:.0f}",
                f"{r['extra_gflop']:.3f}" if r["extra_gflop"] else "–",
                f"{r['at_xl_rate_ms']:.1f}" if r["extra_gflop"] else "–",
            ]
            for r in rows
        ],
    )
    ops = result["operators"]
    names = set(ops["xl"]) | set(ops["infty"])

    def self_ms(mt: str, name: str) -> float:
        return ops[mt].get(name, {}).get("self_ms", 0.0)

    def calls(mt: str, name: str) -> float:
        return ops[mt].get(name, {}).get("calls", 0.0)

    top = sorted(names, key=lambda k: self_ms("xl", k) - self_ms("infty", k))[:15]
    op_table = common.markdown_table(
        ["operator", "XL self ms", "∞ self ms", "extra ms", "XL calls", "∞ calls"],
        [
            [
                f"`{k}`",
                f"{self_ms('xl', k):.1f}",
                f"{self_ms('infty', k):.1f}",
                f"{self_ms('infty', k) - self_ms('xl', k):+.1f}",
                f"{calls('xl', k):.0f}",
                f"{calls('infty', k):.0f}",
            ]
            for k in top
        ],
    )
    load = result["load_average_before"], result["load_average_after"]
    return "\n".join(
        [
            "# The ∞-former's training step against Transformer-XL's: where the time goes",
            "",
            f"Command: `{result['command']}` (revision {result['revision']}, nice {s['nice']})",
            "",
            common.machine_markdown(result["machine"]),
            f"- Load average after the profile: {', '.join(f'{x:.2f}' for x in load[1])} "
            "(another job ran on one of the two CPUs)",
            "",
            f"{s['size']}: batch {s['batch']}, segment {cfg['segment_len']}, d_model "
            f"{cfg['d_model']}, {cfg['n_layers']} layers, {cfg['n_heads']} heads, m "
            f"{cfg['mem_len']}, N {cfg['num_basis']}, M {cfg['num_samples']}, density "
            f"{cfg['density']}; a training step = zero_grad, forward with targets, "
            "backward, Adam step, with the memories full.",
            "",
            "## The ratio",
            "",
            f"- Step time ({s['repeats']} rounds, the two models taking turns, after "
            f"{s['warmup']} warm-up rounds): Transformer-XL {fmt(step['xl']['median_ms'])} ms, "
            f"∞-former {fmt(step['infty']['median_ms'])} ms (medians); the ∞-former's step is "
            f"**{ratio['median']:.2f}×** XL's (median of the per-round ratios; quartiles "
            f"{ratio['q1']:.2f}–{ratio['q3']:.2f}).",
            *_cpu_lines(result),
            f"- Matrix-product and convolution FLOPs of a step (forward + backward, "
            f"FlopCounterMode's formulas): XL {fl['xl']['total'] / 1e9:.2f} GFLOP, ∞-former "
            f"{fl['infty']['total'] / 1e9:.2f} GFLOP: **{flop_ratio:.2f}×**.",
            f"- Profiled ({s['profile_steps']} steps of each, taking turns; medians per part): "
            f"XL {fmt(profiled['xl'])} ms, ∞-former {fmt(profiled['infty'])} ms per step "
            f"({profiled['infty'] / profiled['xl']:.2f}×), {total_extra:.0f} ms extra. At the "
            f"FLOP rate of XL's whole step the ∞-former's extra FLOPs would take "
            f"{expected:.0f} ms; the parts whose FLOPs the count holds take "
            f"{counted:.0f} ms of the extra.",
            "",
            "## Where the extra time goes",
            "",
            "Each part's time in the profiled step (forward, and the backward nodes its forward "
            "made), the ∞-former's minus XL's; *in ops*: inside aten operations, *rest*: Python "
            "and glue between them; *∞ ops*: top-level operations and backward nodes per step. "
            "Parts XL shares (the backbone) should cancel; what they do not is noise of the "
            "shared machine, whose size the shared rows show. The per-part medians need not sum "
            "to the median step.",
            "",
            table,
            "",
            "## By operator",
            "",
            "Self time per aten operator over the whole step (means over the profiled steps), "
            "largest extra first:",
            "",
            op_table,
            "",
            "## Notes",
            "",
            notes,
        ]
    )


def _cpu_lines(result: dict[str, Any]) -> list[str]:
    """The same rounds in the measuring thread's CPU time (runs before it was recorded: none)."""
    if "cpu_step" not in result:
        return []
    cpu, ratio, faults = result["cpu_step"], result["cpu_ratio"], result["page_faults"]
    fmt = common.fmt_ms
    warm = result["settings"].get("warm_allocator_mib", 0)
    warmed = (
        [
            f"- The allocator was warmed first (`--warm-allocator {warm}`): one {warm} MiB block "
            "allocated and freed before the models were built, so that glibc's dynamic mmap and "
            "trim thresholds rise and the heap's top is kept between steps."
        ]
        if warm
        else []
    )
    return warmed + [
        f"- The same rounds in CPU time of the measuring thread (not counting the time it waited "
        f"for a CPU another job held): Transformer-XL {fmt(cpu['xl']['median_ms'])} ms, "
        f"∞-former {fmt(cpu['infty']['median_ms'])} ms (medians); **{ratio['median']:.2f}×** "
        f"(quartiles {ratio['q1']:.2f}–{ratio['q3']:.2f}). Minor page faults per step "
        f"(medians): XL {faults['xl']:.0f}, ∞-former {faults['infty']:.0f}."
    ]


def write_report(result: dict[str, Any], out: Path) -> None:
    path = out / "step_profile.md"
    common.write_text(path, markdown(result, common.kept_notes(path)))
