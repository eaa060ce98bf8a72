"""The long-term memory on a pretrained causal LM: the checks that it is a faithful add-on, and
its per-token cost relative to the base model.

    inftyformer convert-gguf smollm2 models/smollm2-135m   # once (~540 MB)
    python benchmarks/bench_pretrained.py                 # SmolLM2-135M (--model DIR for another)
    python benchmarks/bench_pretrained.py --tiny          # a random tiny Llama, runs in seconds
    python benchmarks/bench_pretrained.py --quick --out-dir DIR  # tiny, one round, seconds
    python benchmarks/bench_pretrained.py --render-only   # the reports again from the JSON

Writes docs/results/benchmarks/pretrained_cost.{json,md} (--tiny, --quick: pretrained_cost_tiny.*).
The measurement that chose the recommended settings (the `adapter` preset) is recorded in
docs/results/benchmarks/pretrained_settings.md.

Checks (numbers, not pass/fail):
- parity at initialisation: max |Δlogit| between the base (given the previous segment, the
  model's default window) and the model with memory over three consecutive segments, for the
  given model (Llama family)
  and for a random GPT-2 (GPT-2 small's shape; tiny with --tiny);
- generation: the read's output projection set to N(0, 0.02²) so that the memory matters, then
  greedy `generate` from a memory vs recomputing `model(text so far, state=m)` at every step;
- save/load: `save_pretrained` → `AutoModelForCausalLM.from_pretrained`, and the memory state
  through `save_state` / `load_state`: max |Δlogit| of the next segment.

Cost: batch 4, L = 256, one torch thread, eval mode; the memory model in steady state (a filled
long-term memory and a waiting segment, so every timed call fits L vectors into the memory
(resample + refit) and reads it in every block), with its default window (the base runs on the
previous segment too; docs/results/benchmarks/window_cost.md separates the two costs). Forward (no
gradients) and forward + backward (all parameters trainable), the base and the memory model
taking turns; medians of the per-round ratios.
"""

from __future__ import annotations

import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _pretrained_setup as setup
import torch

from inftyformer import _measure as common

ROOT = setup.ROOT


# ----------------------------------------------------------------------------- checks
@torch.no_grad()
def parity(base, ids: torch.Tensor, segment_len: int) -> list[float]:
    """max |Δlogit| of each segment: the base (on the segment, with the model's window of
    earlier tokens before it) vs the model with memory (just wrapped)."""
    from inftyformer.hf import add_long_term_memory

    model = add_long_term_memory(base, segment_len=segment_len).eval()
    back = model.config.adapter.window
    reference = [
        base(ids[:, max(i - back, 0) : i + segment_len]).logits[:, -segment_len:]
        for i in range(0, ids.shape[1], segment_len)
    ]
    memory, deltas = None, []
    for i, want in zip(range(0, ids.shape[1], segment_len), reference, strict=True):
        out = model(ids[:, i : i + segment_len], state=memory)
        deltas.append(float((out.logits - want).abs().max()))
        memory = out.state
    model.unwrap()
    return deltas


@torch.no_grad()
def activate(model, std: float = 0.02, seed: int = 0) -> None:
    """Nonzero output projections of the reads (they start at zero), as after some training."""
    g = torch.Generator().manual_seed(seed)
    for layer in model.long_term:
        w = layer.attention.out.weight
        w.copy_(torch.randn(w.shape, generator=g) * std)


@torch.no_grad()
def generation_check(model, ids, segment_len, prompt_len, new_tokens, tokenizer) -> dict:
    memory = model(ids[:, :segment_len]).state
    memory = model(ids[:, segment_len : 2 * segment_len], state=memory).state
    prompt = ids[:, 2 * segment_len : 2 * segment_len + prompt_len]
    start = time.perf_counter()
    out = model.generate(
        prompt,
        state=memory,
        max_new_tokens=new_tokens,
        do_sample=False,
        return_dict_in_generate=True,
        output_logits=True,
        pad_token_id=0,
    )
    gen_s = time.perf_counter() - start
    seq, worst = prompt, 0.0
    for step in range(new_tokens):
        logits = model(seq, state=memory).logits[:, -1]
        worst = max(worst, float((logits - out.logits[step]).abs().max()))
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    alone = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    first = model(prompt).logits[:, -1]  # the first step without the memory
    result = {
        "rows": int(prompt.shape[0]),
        "prompt_tokens": prompt_len,
        "new_tokens": new_tokens,
        "tokens_equal_recomputation": bool(torch.equal(out.sequences, seq)),
        "max_abs_logit_diff_vs_recomputation": worst,
        "tokens_differ_from_no_memory": bool(not torch.equal(out.sequences, alone)),
        "first_step_max_abs_logit_diff_vs_no_memory": float((out.logits[0] - first).abs().max()),
        "generate_seconds": gen_s,
    }
    if tokenizer is not None:
        result["sample_with_memory"] = tokenizer.decode(out.sequences[0, prompt_len:])
        result["sample_without_memory"] = tokenizer.decode(alone[0, prompt_len:])
    return result


@torch.no_grad()
def save_load_check(model, ids, segment_len) -> dict:
    from transformers import AutoModelForCausalLM

    from inftyformer import load_state, save_state

    memory = model(ids[:, :segment_len]).state
    expected = model(ids[:, segment_len : 2 * segment_len], state=memory).logits
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        model.save_pretrained(Path(tmp) / "model")
        save_s = time.perf_counter() - start
        files = sorted(p.name for p in (Path(tmp) / "model").iterdir())
        size = sum(p.stat().st_size for p in (Path(tmp) / "model").iterdir())
        save_state(Path(tmp) / "memory.safetensors", memory)
        memory_bytes = (Path(tmp) / "memory.safetensors").stat().st_size
        start = time.perf_counter()
        loaded = AutoModelForCausalLM.from_pretrained(Path(tmp) / "model").eval()
        load_s = time.perf_counter() - start
        memory = load_state(Path(tmp) / "memory.safetensors")
    got = loaded(ids[:, segment_len : 2 * segment_len], state=memory).logits
    return {
        "loaded_class": type(loaded).__name__,
        "files": files,
        "model_dir_mib": size / 2**20,
        "memory_state_mib": memory_bytes / 2**20,
        "save_seconds": save_s,
        "load_seconds": load_s,
        "max_abs_logit_diff": float((got - expected).abs().max()),
    }


# ----------------------------------------------------------------------------- cost
def cost(base, model, ids: torch.Tensor, repeats: int) -> dict:
    """Interleaved timings of the base and the memory model on one segment ids [B, L]."""
    batch, length = ids.shape
    with torch.no_grad():  # steady state: a filled long-term memory and a waiting segment
        memory = model(ids).state
        memory = model(ids, state=memory).state

    def base_forward():
        with torch.no_grad():
            base(ids)

    def memory_forward():
        with torch.no_grad():
            model(ids, state=memory)

    def base_train():
        base(ids, labels=ids).loss.backward()

    def memory_train():
        model(ids, state=memory, labels=ids).loss.backward()

    def clear():
        base.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)

    times = common.interleaved(
        {
            "base forward": base_forward,
            "memory forward": memory_forward,
            "base forward+backward": base_train,
            "memory forward+backward": memory_train,
        },
        repeats=repeats,
        warmup=1,
        between=clear,
    )
    clear()
    tokens = batch * length
    rows = {}
    for kind in ("forward", "forward+backward"):
        b, m = times[f"base {kind}"], times[f"memory {kind}"]
        rows[kind] = {
            "base": common.summarize(b),
            "memory": common.summarize(m),
            "base_ms_per_token": 1000 * statistics.median(b) / tokens,
            "memory_ms_per_token": 1000 * statistics.median(m) / tokens,
            "ratio_median": statistics.median(y / x for x, y in zip(b, m, strict=True)),
            "ratio_min": min(y / x for x, y in zip(b, m, strict=True)),
            "ratio_max": max(y / x for x, y in zip(b, m, strict=True)),
        }
    return rows


# ----------------------------------------------------------------------------- report
def markdown(result: dict[str, Any]) -> str:
    lines = ["# Long-term memory on a pretrained causal LM: checks and cost", ""]
    lines += ["The measurement that chose the recommended settings (the `adapter` preset): "
              "[pretrained_settings.md](pretrained_settings.md).", ""]  # fmt: skip
    s = result["setup"]
    lines += [
        "## Checks and the cost of the default settings",
        "",
        f"Command: `{result['command']}`",
        "",
        common.machine_markdown(result["machine"]),
        f"- transformers {result['transformers']}; base: {s['base']} ({s['architecture']}, "
        f"{s['base_params'] / 1e6:.1f}M parameters, {s['layers']} layers, d {s['hidden']}); "
        f"memory: {s['memory_params'] / 1e6:.1f}M parameters ({s['memory_settings']})",
        f"- text: {s['text']}",
        "",
        "### Parity at initialisation",
        "",
        "The read's output projection starts at zero, so the model with memory must give the "
        "base's logits exactly (segment k with the model's window, the previous segment, before "
        "it), also once the memory holds earlier segments. "
        f"Batch {s['batch']}, segments of L = {s['segment_len']}.",
        "",
        common.markdown_table(
            ["model", "segment 1", "segment 2", "segment 3"],
            [
                [row["model"], *(f"{d:.3g}" for d in row["max_abs_logit_diff"])]
                for row in result["parity"]
            ],
        ),
        "",
        "(max |Δlogit| per segment, float32)",
        "",
    ]
    g = result["generation"]
    lines += [
        "### Generation with a memory",
        "",
        "Output projections set to N(0, 0.02²) so that the memory changes the logits; two "
        f"segments streamed into the memory, then greedy `generate` of {g['new_tokens']} tokens "
        f"after a {g['prompt_tokens']}-token prompt ({g['rows']} rows), against recomputing "
        "`model(text so far, state=m)` from scratch at every step.",
        "",
        f"- same tokens as the recomputation: {g['tokens_equal_recomputation']}; "
        f"max |Δlogit| {g['max_abs_logit_diff_vs_recomputation']:.3g}",
        f"- tokens differ from generating without the memory: {g['tokens_differ_from_no_memory']}",
        f"- generate took {g['generate_seconds']:.2f} s",
    ]
    if "sample_with_memory" in g:
        lines += [
            f"- row 1 with memory: {g['sample_with_memory']!r}",
            f"- row 1 without memory: {g['sample_without_memory']!r}",
        ]
    v = result["save_load"]
    lines += [
        "",
        "### Save and load",
        "",
        f"- `save_pretrained` ({v['save_seconds']:.1f} s, {v['model_dir_mib']:.0f} MiB: "
        f"{', '.join(v['files'])}) → `AutoModelForCausalLM.from_pretrained` "
        f"({v['load_seconds']:.1f} s) gives a {v['loaded_class']}",
        f"- memory state through `save_state`/`load_state`: {v['memory_state_mib']:.1f} MiB",
        f"- next segment's logits, reloaded model + reloaded memory vs the original: "
        f"max |Δlogit| {v['max_abs_logit_diff']:.3g}",
        "",
        "### Cost of the memory",
        "",
        f"Batch {s['batch']} × L = {s['segment_len']} tokens per call, "
        f"{result['repeats']} interleaved rounds, one torch thread. Steady state: each timed "
        "call fits the previous segment into every block's memory (resample + refit) and reads "
        "it. Forward + backward: all parameters trainable.",
        "",
        common.markdown_table(
            [
                "pass",
                "base ms (median)",
                "memory ms (median)",
                "base ms/token",
                "memory ms/token",
                "memory / base (median [min, max])",
            ],
            [
                [
                    kind,
                    f"{r['base']['median_ms']:.0f}",
                    f"{r['memory']['median_ms']:.0f}",
                    f"{r['base_ms_per_token']:.2f}",
                    f"{r['memory_ms_per_token']:.2f}",
                    f"{r['ratio_median']:.2f}× [{r['ratio_min']:.2f}, {r['ratio_max']:.2f}]",
                ]
                for kind, r in result["cost"].items()
            ],
        ),
        "",
        common.kept_notes(ROOT / result["markdown"]),
    ]
    return "\n".join(lines)


def write_reports(args, stem: str, result: dict[str, Any]) -> None:
    """The JSON and the Markdown rendered from it."""
    common.write_json(args.out_dir / f"{stem}.json", result)
    common.write_text(args.out_dir / f"{stem}.md", markdown(result))
    print(f"wrote {args.out_dir / stem}.json and .md")


def _shown(path: Path) -> str:
    """`path` relative to the repository when it is inside it."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def add_flags(parser) -> None:
    parser.add_argument("--quick", action="store_true", help="--tiny, one round")
    parser.add_argument("--render-only", action="store_true", help="rewrite reports from JSON")


def main(argv: list[str] | None = None) -> int:
    parser = setup.parser(__doc__, repeats=5)
    add_flags(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.tiny, args.repeats, args.segment_len = True, 1, 16
    torch.set_num_threads(args.threads)

    import transformers

    from inftyformer.hf import add_long_term_memory

    stem = "pretrained_cost_tiny" if args.tiny else "pretrained_cost"
    json_path = args.out_dir / f"{stem}.json"
    if args.render_only:
        write_reports(args, stem, json.loads(json_path.read_text()))
        return 0
    machine = common.machine_info()
    base, tokenizer, name = setup.load_base(args, parser)
    B, L = args.batch, args.segment_len
    vocab = base.config.vocab_size
    ids, text = setup.book_ids(tokenizer, vocab, B, 4 * L)
    print(f"base {name}: {type(base).__name__}, text: {text}", flush=True)

    reference = copy.deepcopy(base)  # the base alone, for parity and cost
    parity_rows = [
        {
            "model": f"{name} ({type(base).__name__})",
            "max_abs_logit_diff": parity(base, ids[:, : 3 * L], L),
        }
    ]
    gpt2 = setup.random_gpt2(args.tiny)
    g_ids = torch.randint(0, 50257, (2, 3 * L), generator=torch.Generator().manual_seed(1))
    shape = "tiny" if args.tiny else "GPT-2 small shape"
    parity_rows.append(
        {
            "model": f"random GPT-2, {shape} (GPT2LMHeadModel)",
            "max_abs_logit_diff": parity(gpt2, g_ids, L),
        }
    )
    del gpt2
    print("parity", parity_rows, flush=True)

    model = add_long_term_memory(base, segment_len=L).eval()
    lt = model.config.adapter.long_term
    memory_settings = (
        f"N {lt.num_basis}, widths {lt.widths}, λ {lt.ridge_lambda}, τ {lt.tau}, "
        f"M {lt.num_samples}, {lt.num_heads} heads, own W^Q, CNN gate {lt.conv_gate}"
    )
    cost_rows = cost(reference, model, ids[:, :L], args.repeats)
    print("cost", {k: round(v["ratio_median"], 3) for k, v in cost_rows.items()}, flush=True)

    activate(model)
    prompt = min(32, L // 2)  # prompt + new tokens within one call (no streaming)
    generation = generation_check(model, ids[:, : 3 * L], L, prompt, min(20, L - prompt), tokenizer)
    print("generation", generation, flush=True)
    save_load = save_load_check(model, ids[:, : 2 * L], L)
    print("save/load", save_load, flush=True)

    result = {
        "command": common.command_line(),
        "machine": machine,
        "transformers": transformers.__version__,
        "repeats": args.repeats,
        "setup": {
            "base": name,
            "architecture": type(base).__name__,
            "base_params": sum(p.numel() for p in model.base_parameters()),
            "memory_params": sum(p.numel() for p in model.memory_parameters()),
            "layers": model.num_layers,
            "hidden": model.config.hidden_size,
            "memory_settings": memory_settings,
            "batch": B,
            "segment_len": L,
            "text": text,
        },
        "parity": parity_rows,
        "generation": generation,
        "save_load": save_load,
        "cost": cost_rows,
        "markdown": _shown(args.out_dir / f"{stem}.md"),
    }
    write_reports(args, stem, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
