"""The short-term window of a pretrained model with long-term memory: exactness and cost of
recomputing the previous segment, against the alternative of caching its keys and values.

    inftyformer convert-gguf smollm2 models/smollm2-135m   # once (~540 MB)
    python benchmarks/bench_window.py                     # SmolLM2-135M (--model DIR for another)
    python benchmarks/bench_window.py --tiny              # a random tiny Llama, runs in seconds

Writes docs/benchmarks/window_cost.{json,md} (--tiny: window_cost_tiny.*).

Parity: with the memory just added (its read starts at zero), the logits of segment k must be the
base's for segment k with segment k − 1 before it: max |Δlogit| over four consecutive segments,
for the given model (Llama family, rotary positions) and a random GPT-2 (learned positions).

Cost of one call of L tokens per row, batch B, one torch thread, the variants taking turns
(medians of per-round times; ratios against the base on the segment alone, in the same rounds):
- base, segment alone: what each call cost before the window;
- base, window recomputed: the base on [previous segment; segment] (W + L tokens), the segment's
  logits kept: what the window costs the model;
- base, window from cached keys/values: the base on the segment with the previous segment's keys
  and values in its cache (made untimed before each call): the alternative's cost, for comparison
  (not exact: see `src/inftyformer/hf/model.py`);
- memory model with window=0 and with window=L, steady state (a filled long-term memory and a
  segment waiting to be fitted).
Forward without gradients, and forward + backward (every parameter trainable, loss on the
segment's tokens).
"""

from __future__ import annotations

import statistics
import sys
from typing import Any

import _pretrained_setup as setup
import torch

from inftyformer import _measure as common

ROOT = setup.ROOT


@torch.no_grad()
def parity(base, ids: torch.Tensor, segment_len: int) -> list[float]:
    """max |Δlogit| per segment: the model just wrapped (window one segment) against the base
    on the segment with the previous one before it."""
    from inftyformer.hf import add_long_term_memory

    L = segment_len
    model = add_long_term_memory(base, segment_len=L, window=L).eval()
    memory, deltas = None, []
    for i in range(0, ids.shape[1], L):
        want = base(ids[:, max(i - L, 0) : i + L]).logits[:, -L:]
        out = model(ids[:, i : i + L], state=memory)
        deltas.append(float((out.logits - want).abs().max()))
        memory = out.state
    model.unwrap()
    return deltas


def cost(base, ids: torch.Tensor, segment_len: int, repeats: int) -> dict[str, Any]:
    """Round-robin timings of the variants on one segment (ids [B, 2L]: previous, current)."""
    from inftyformer.hf import add_long_term_memory

    L = segment_len
    prev, seg = ids[:, :L], ids[:, L : 2 * L]
    both = ids[:, : 2 * L]
    plain = add_long_term_memory(base, segment_len=L, window=0).eval()
    windowed = add_long_term_memory(base, segment_len=L, window=L).eval()
    with torch.no_grad():  # steady state: something in the long-term memory, a segment waiting
        memories = {}
        for name, model in (("plain", plain), ("windowed", windowed)):
            memory = None
            for _ in range(3):
                memory = model(seg, state=memory).state
            memories[name] = memory
    state: dict[str, Any] = {}

    def fresh_cache():
        with torch.no_grad():
            state["cache"] = base(prev, use_cache=True).cache

    def seg_loss(logits):
        return torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), seg[:, 1:].reshape(-1)
        )

    def run(kind: str, grad: bool):
        def call():
            with torch.set_grad_enabled(grad):
                if kind == "alone":
                    logits = base(seg).logits
                elif kind == "recomputed":
                    logits = base(both).logits[:, L:]
                elif kind == "cached":
                    logits = base(seg, cache=state["cache"]).logits
                else:
                    model = plain if kind == "memory, window 0" else windowed
                    key = "plain" if kind == "memory, window 0" else "windowed"
                    out = model(seg, state=memories[key])
                    logits = out.logits
                if grad:
                    seg_loss(logits).backward()

        return call

    kinds = {
        "alone": "base, segment alone (no window)",
        "recomputed": "base, window recomputed (W + L tokens)",
        "cached": "base, window from cached keys/values",
        "memory, window 0": "memory model, window=0",
        "memory, window L": "memory model, window=L (default)",
    }

    def between():
        base.zero_grad(set_to_none=True)
        plain.zero_grad(set_to_none=True)
        windowed.zero_grad(set_to_none=True)
        fresh_cache()

    rows: dict[str, Any] = {}
    tokens = seg.numel()
    for grad, pass_name in ((False, "forward"), (True, "forward+backward")):
        times = common.interleaved(
            {k: run(k, grad) for k in kinds}, repeats=repeats, warmup=1, between=between
        )
        reference = times["alone"]
        rows[pass_name] = [
            {
                "variant": label,
                "time": common.summarize(times[k]),
                "ms_per_token": 1000 * statistics.median(times[k]) / tokens,
                "ratio_median": statistics.median(
                    t / r for t, r in zip(times[k], reference, strict=True)
                ),
                "ratio_min": min(t / r for t, r in zip(times[k], reference, strict=True)),
                "ratio_max": max(t / r for t, r in zip(times[k], reference, strict=True)),
            }
            for k, label in kinds.items()
        ]
        print(pass_name, {r["variant"]: round(r["ratio_median"], 2) for r in rows[pass_name]})
    between()
    plain.unwrap()
    windowed.unwrap()
    return rows


def markdown(result: dict[str, Any]) -> str:
    s = result["setup"]
    lines = [
        "# The short-term window on a pretrained model: exactness and cost",
        "",
        f"Command: `{result['command']}`",
        "",
        common.machine_markdown(result["machine"]),
        f"- transformers {result['transformers']}; base: {s['base']} ({s['architecture']}, "
        f"{s['layers']} layers, d {s['hidden']}); text: {s['text']}",
        "",
        "## Parity at initialisation",
        "",
        "The memory's read starts at zero, so segment k must give the base's logits for segment "
        f"k with segment k − 1 before it (window W = L = {s['segment_len']}, batch {s['batch']}).",
        "",
        common.markdown_table(
            ["model", *(f"segment {i + 1}" for i in range(len(result["parity"][0]["deltas"])))],
            [[row["model"], *(f"{d:.3g}" for d in row["deltas"])] for row in result["parity"]],
        ),
        "",
        "(max |Δlogit| per segment, float32)",
        "",
        "## Cost of one call",
        "",
        f"Batch {s['batch']} × L = {s['segment_len']} tokens scored per call, window "
        f"W = {s['segment_len']}, {result['repeats']} rounds, the variants taking turns, one "
        "torch thread. Ratio: against the base on the segment alone, in the same round. "
        "Memory models in steady state (a filled long-term memory, a segment waiting to be "
        "fitted). Forward + backward: every parameter trainable, loss on the segment's tokens.",
        "",
    ]
    for pass_name, rows in result["cost"].items():
        lines += [
            f"### {pass_name}",
            "",
            common.markdown_table(
                ["variant", "ms (median)", "ms/scored token", "× base alone (median [min, max])"],
                [
                    [
                        r["variant"],
                        f"{r['time']['median_ms']:.0f}",
                        f"{r['ms_per_token']:.3f}",
                        f"{r['ratio_median']:.2f}× [{r['ratio_min']:.2f}, {r['ratio_max']:.2f}]",
                    ]
                    for r in rows
                ],
            ),
            "",
        ]
    lines.append(common.kept_notes(ROOT / result["markdown"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = setup.parser(__doc__, repeats=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    import transformers

    machine = common.machine_info()
    base, tokenizer, name = setup.load_base(args, parser)
    B, L = args.batch, args.segment_len
    ids, text = setup.book_ids(tokenizer, base.config.vocab_size, B, 4 * L)
    print(f"base {name}: {type(base).__name__}, text: {text}", flush=True)

    gpt2 = setup.random_gpt2(args.tiny)
    g_len = min(L, gpt2.config.n_positions // 2)  # W + L within GPT-2's positions
    g_ids = torch.randint(0, 50257, (2, 4 * g_len), generator=torch.Generator().manual_seed(1))
    shape = "tiny" if args.tiny else "GPT-2 small shape"
    parity_rows = [
        {"model": f"{name} ({type(base).__name__})", "deltas": parity(base, ids, L)},
        {
            "model": f"random GPT-2, {shape} (GPT2LMHeadModel)",
            "deltas": parity(gpt2, g_ids[:, : 4 * g_len], g_len),
        },
    ]
    del gpt2
    print("parity", parity_rows, flush=True)
    cost_rows = cost(base, ids, L, args.repeats)

    stem = "window_cost_tiny" if args.tiny else "window_cost"
    result = {
        "command": common.command_line(),
        "machine": machine,
        "transformers": transformers.__version__,
        "repeats": args.repeats,
        "setup": {
            "base": name,
            "architecture": type(base).__name__,
            "layers": base.config.num_hidden_layers,
            "hidden": base.config.hidden_size,
            "batch": B,
            "segment_len": L,
            "text": text,
        },
        "parity": parity_rows,
        "cost": cost_rows,
        "markdown": str((args.out_dir / f"{stem}.md").resolve().relative_to(ROOT)),
    }
    common.write_json(args.out_dir / f"{stem}.json", result)
    common.write_text(args.out_dir / f"{stem}.md", markdown(result))
    print(f"wrote {args.out_dir / stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
