"""The recommended-settings section of docs/results/benchmarks/pretrained_cost.md, rendered from the
JSON `_bench_pretrained_settings.measure` returns (also imported by docs tests)."""

from __future__ import annotations

from typing import Any

from inftyformer import _measure as common


def _mb(x: float) -> str:
    return f"{x / 1e6:.0f} MB"


def _layers(row: dict[str, Any]) -> str:
    blocks = row["memory_layers"]
    return "every block" if blocks is None else ",".join(map(str, blocks))


def _goal_rows(s: dict[str, Any]) -> list[list[str]]:
    return [[g["goal"], g["limit"], g["value"], "yes" if g["met"] else "**no**"] for g in goals(s)]


def goals(s: dict[str, Any]) -> list[dict[str, Any]]:
    """Each goal at the chosen setting: what, the threshold, the measured value, met or not."""
    g = s["goals"]
    row = s["candidates"][s["chosen"]]
    cli = s.get("command_line")
    out = [
        {
            "goal": "trained parameters / base",
            "limit": f"≤ {g['trained_fraction']:.0%}",
            "value": f"{row['trained_fraction']:.1%} ({row['trained_params'] / 1e6:.2f}M)",
            "met": row["trained_fraction"] <= g["trained_fraction"],
        }
    ]
    if cli is not None:
        ckpt = cli["train"]["checkpoint_bytes"]
        where = "the run's `last` checkpoint"
    else:
        ckpt, where = row["checkpoint_bytes"], "weights + AdamW moments"
    out.append(
        {
            "goal": "frozen-base checkpoint / base weights",
            "limit": f"≤ {g['checkpoint_fraction']:.0%}",
            "value": f"{ckpt / s['base_bytes']:.1%} ({_mb(ckpt)}, {where})",
            "met": ckpt / s["base_bytes"] <= g["checkpoint_fraction"],
        }
    )
    ratio = row["stream"]["ratio_to_base"]
    out.append(
        {
            "goal": "streaming forward per token / base over the same window",
            "limit": f"≤ {g['stream_ratio']}×",
            "value": f"{ratio:.2f}×",
            "met": ratio <= g["stream_ratio"],
        }
    )
    if cli is not None:
        rss = cli["train"]["peak_rss_bytes"]
        out.append(
            {
                "goal": f"peak RSS, frozen-base training run, batch {s['train_batch']} × "
                f"{s['segment_len']}",
                "limit": f"≤ {g['train_rss_gb']} GB",
                "value": f"{rss / 1e9:.2f} GB",
                "met": rss / 1e9 <= g["train_rss_gb"],
            }
        )
    gen = s["generation"]["rows"]["memory model"]["decode_ratio_to_base, same prompt"]
    out.append(
        {
            "goal": "generation tokens/s / the base's `generate` (same prompt, decoding)",
            "limit": f"≥ {g['generate_ratio']}×",
            "value": f"{gen:.2f}×",
            "met": gen >= g["generate_ratio"],
        }
    )
    if cli is not None:
        warm = cli["generate"][-1]
        out.append(
            {
                "goal": "`inftyformer generate RUN` (load + 20 tokens), wall",
                "limit": f"≤ {g['cli_seconds']:.0f} s",
                "value": f"{warm['wall_seconds']:.1f} s (CPU {warm['cpu_seconds']:.1f} s)",
                "met": warm["wall_seconds"] <= g["cli_seconds"],
            }
        )
    return out


def _carried(s: dict[str, Any]) -> bool:
    return all("run_checkpoint_bytes" in r for r in s["candidates"])


def _timings_note(s: dict[str, Any]) -> list[str]:
    """Where the timings come from, when an earlier run's were kept (`--keep-timings`)."""
    kept = s.get("timings_from")
    if kept is None:
        return []
    load = ", ".join(f"{x:.2f}" for x in kept["machine"]["load_average"])
    return [
        "",
        f"Streaming timings kept from `{kept['command']}` (load average {load} when it started; "
        "the generation speed's run is named in its section); the sizes, the choice and the "
        "command-line runs measured by the command above.",
    ]


def settings_markdown(s: dict[str, Any]) -> list[str]:
    row = s["candidates"][s["chosen"]]
    lines = [
        "## Recommended settings",
        "",
        f"Command: `{s['command']}`",
        "",
        common.machine_markdown(s["machine"]),
        "",
        f"Candidates, each measured (base: {s['base_params'] / 1e6:.1f}M parameters, "
        f"{_mb(s['base_bytes'])} of weights). Streaming: forward of one segment of batch "
        f"{s['batch']} × L = {s['segment_len']} after two streamed segments (a window of L "
        "tokens, a segment waiting to be fitted) against the base on the same window + segment, "
        f"{s['repeats']} interleaved rounds, one torch thread; medians of per-round ratios. "
        "Checkpoint: the memory's weights and AdamW's two moments in safetensors"
        + (
            f"; a run's checkpoint also holds the memory its {s['train_batch']} streams carry "
            "(per memory block N × d coefficients and the L × d inputs waiting to be fitted; "
            "the window's token ids), which the choice counts."
            if _carried(s)
            else "."
        ),
        *_timings_note(s),
        "",
        common.markdown_table(
            [
                "memory blocks",
                "N = M",
                "trained parameters (of base)",
                "adapter checkpoint (of base)",
                *([f"run checkpoint, batch {s['train_batch']} (of base)"] if _carried(s) else []),
                "forward ms/token",
                "× base, same window (median [min, max])",
                "bf16 autocast: × base bf16, speed-up over fp32",
            ],
            [
                [
                    _layers(r),
                    r["num_basis"],
                    f"{r['trained_params'] / 1e6:.2f}M ({r['trained_fraction']:.1%})",
                    f"{_mb(r['checkpoint_bytes'])} ({r['checkpoint_fraction']:.1%})",
                    *(
                        [f"{_mb(r['run_checkpoint_bytes'])} ({r['run_checkpoint_fraction']:.1%})"]
                        if _carried(s)
                        else []
                    ),
                    f"{r['stream']['ms_per_token']:.2f}",
                    f"{r['stream']['ratio_to_base']:.2f}× [{r['stream']['ratio_min']:.2f}, "
                    f"{r['stream']['ratio_max']:.2f}]",
                    "—"
                    if "stream_bf16" not in r
                    else f"{r['stream_bf16']['ratio_to_base']:.2f}×, "
                    f"{r['stream_bf16']['speed_vs_fp32']:.2f}×",
                ]
                for r in s["candidates"]
            ],
        ),
        "",
    ]
    base = s["base_stream"]
    lines.append(
        f"The base over the same window: {base['base|fp32']['ms_per_token']:.2f} ms/token "
        "float32"
        + (
            f", {base['base|bf16']['ms_per_token']:.2f} ms/token under bf16 autocast "
            f"({base['base|bf16']['speed_vs_fp32']:.2f}× the float32 speed; its logits move by "
            f"up to {base['base|bf16']['max_abs_logit_diff_vs_fp32']:.2g}, the segment's mean "
            f"NLL from {base['base|fp32']['nll']:.4f} to {base['base|bf16']['nll']:.4f} nats)"
            if "base|bf16" in base
            else ""
        )
        + "."
    )
    lines += [
        "",
        f"**Recommended: memory in blocks {_layers(row)}, N = M = {row['num_basis']}** "
        "(the candidate with the most memory that meets the parameter, checkpoint and "
        "streaming goals), e.g. `inftyformer train lm --base-model DIR --freeze-base "
        f"--batch-size {s['train_batch']} "
        + (f"--set memory_layers={_layers(row)} " if row["memory_layers"] is not None else "")
        + f"--set num_basis={row['num_basis']} --set num_samples={row['num_samples']}`.",
        "",
        "### Goals at the recommended setting",
        "",
        common.markdown_table(
            ["goal", "target", "measured", "met"],
            _goal_rows(s),
        ),
        "",
    ]
    gen = s["generation"]
    lines += [
        "### Generation speed",
        "",
        f"Greedy, batch 1, {gen['new_tokens']} new tokens after a {gen['prompt_tokens']}-token "
        f"prompt; the memory model has streamed two segments (so it has a window of "
        f"{gen['window']} tokens before the prompt and a filled memory, output projections "
        "N(0, 0.02²) so that the reads count). Each new token timestamped by a streamer: "
        "prefill = seconds to the first new token, decoding = tokens/s after it (the base's "
        "key/value cache in both). Interleaved rounds, medians."
        + (
            f" Measured by `{gen['command']}` (load average "
            f"{', '.join(f'{x:.2f}' for x in gen['load_average'])})."
            if "command" in gen
            else ""
        ),
        "",
        common.markdown_table(
            ["variant", "prefill s", "decoding tokens/s", "memory model / this (decoding)"],
            [
                [
                    name,
                    f"{r['prefill_seconds']:.2f}",
                    f"{r['decode_tokens_per_s']:.1f}",
                    "—"
                    if name == "memory model"
                    else f"{gen['rows']['memory model'][f'decode_ratio_to_{name}']:.2f}×",
                ]
                for name, r in gen["rows"].items()
            ],
        ),
        "",
    ]
    cli = s.get("command_line")
    if cli is not None:
        t = cli["train"]
        lines += [
            "### Through the command line",
            "",
            f"- `{t['command']}` (TMP: a corpus of a few book excerpts): "
            f"{t['wall_seconds']:.0f} s wall, {t['cpu_seconds']:.0f} s CPU, peak RSS "
            f"{t['peak_rss_bytes'] / 1e9:.2f} GB; its `last` checkpoint "
            f"{_mb(t['checkpoint_bytes'])} ("
            + ", ".join(f"{k} {_mb(v)}" for k, v in t["files"].items() if k.startswith("last."))
            + ")",
        ]
        for label, g in zip(("first", "second"), cli["generate"], strict=False):
            lines.append(
                f"- `{g['command']}`, {label} run: {g['wall_seconds']:.1f} s wall, "
                f"{g['cpu_seconds']:.1f} s CPU, peak RSS {g['peak_rss_bytes'] / 1e9:.2f} GB"
            )
        lines.append("")
    return lines


HF_BEGIN = "<!-- recommended settings: written by benchmarks/bench_pretrained.py -->"
HF_END = "<!-- /recommended settings -->"


def hf_section(s: dict[str, Any]) -> str:
    """docs/hf.md's recommended-settings block: the choice, the candidates and the goals."""
    row = s["candidates"][s["chosen"]]
    layers = f"--set memory_layers={_layers(row)} " if row["memory_layers"] is not None else ""
    lines = [
        HF_BEGIN,
        f"Measured on {s['machine']['cpu']} (one thread, load average "
        f"{', '.join(f'{x:.1f}' for x in s['machine']['load_average'])} at the start; "
        "`docs/results/benchmarks/pretrained_cost.md` has the method, generation speed and the "
        "command-line runs):",
        "",
        "```bash",
        # the batch the command-line run measured (its peak RSS below is this command's)
        f"inftyformer train lm --base-model DIR --freeze-base --batch-size {s['train_batch']} "
        f"{layers}--set num_basis={row['num_basis']} --set num_samples={row['num_samples']}",
        "```",
        "",
        common.markdown_table(
            [
                "memory blocks",
                "N = M",
                "trained (of base)",
                "checkpoint of a run (of base)" if _carried(s) else "checkpoint (of base)",
                "streaming × base",
            ],
            [
                [
                    _layers(r) + (" (recommended)" if i == s["chosen"] else ""),
                    r["num_basis"],
                    f"{r['trained_fraction']:.1%}",
                    f"{r.get('run_checkpoint_fraction', r['checkpoint_fraction']):.1%}",
                    f"{r['stream']['ratio_to_base']:.2f}×",
                ]
                for i, r in enumerate(s["candidates"])
            ],
        ),
        "",
        common.markdown_table(
            ["goal (recommended setting)", "target", "measured", "met"],
            _goal_rows(s),
        ),
        HF_END,
    ]
    return "\n".join(lines)


def update_hf_doc(path, s: dict[str, Any]) -> bool:
    """Replace the block between the markers in docs/hf.md (False when they are missing)."""
    text = path.read_text(encoding="utf-8")
    if HF_BEGIN not in text or HF_END not in text:
        return False
    head, rest = text.split(HF_BEGIN, 1)
    tail = rest.split(HF_END, 1)[1]
    path.write_text(head + hf_section(s) + tail, encoding="utf-8")
    return True
