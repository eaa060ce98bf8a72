"""Is the SnapKV row of docs/ruler.md a fault of the integration or the method's own? Run with
the python of the kvpress virtualenv (`scripts/kvpress_env.sh`), on the prompts
`experiments/ruler.py --dump-prompts` wrote:

    .venv-kvpress/bin/python experiments/ruler_snapkv_check.py \\
        --prompts runs/ruler-prompts.jsonl --base-model MODEL_DIR --limit 6

Two checks, written to OUT/ruler_snapkv.{json,md}:

1. The press's own computation: kvpress's SnapKV scores a context token by the attention the
   context's last 64 queries pay it (`SnapKVPress.compute_window_attention`). On the first
   prompt, at `--layer`, that attention is compared with the attention weights the base itself
   computes for the same queries (its eager attention, read by a forward hook): a wrong rotary,
   mask or grouped-head mapping in the integration would show as a difference.
2. Where the needle goes: in every layer and key/value head, the rank of the needle's digit
   tokens among the context's tokens by SnapKV's score, the heads where some digit falls below
   the `--kept` best (so the press drops it there), the answer as the row gives it, and the
   answer when those digits are kept in exactly those layers (every other choice of the press
   unchanged).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import ruler_kvpress as rk  # noqa: E402

from inftyformer._measure import write_json, write_text  # noqa: E402

WINDOW = 64  # SnapKV's observation window in kvpress (its default)


def needle_span(tokenizer, record: dict) -> tuple[int, int]:
    """Where the expected value's tokens sit in the context: [start, end)."""
    value = tokenizer(record["expected"][0], add_special_tokens=False).input_ids
    context = record["input_ids"][: record["context_tokens"]]
    for i in range(len(context) - len(value) + 1):
        if context[i : i + len(value)] == value:
            return i, i + len(value)
    raise ValueError(f"the value {record['expected'][0]!r} is not among the context's tokens")


@torch.no_grad()
def window_against_eager(model_dir: str, record: dict, layer: int) -> dict:
    """Check 1 on `record` (module doc)."""
    from kvpress.presses.snapkv_press import SnapKVPress
    from transformers import AutoModelForCausalLM, DynamicCache

    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    n = record["context_tokens"]
    seen: dict[str, torch.Tensor] = {}

    def own(module, args, kwargs, out):  # the base's attention weights of the last queries
        seen["eager"] = out[1][:, :, -WINDOW:, : n - WINDOW].clone()

    original = SnapKVPress.score

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        if module.layer_idx == layer:
            seen["press"] = SnapKVPress.compute_window_attention(
                module, hidden_states, keys, WINDOW, kwargs["position_embeddings"]
            )
        return original(self, module, hidden_states, keys, values, attentions, kwargs)

    hook = model.model.layers[layer].self_attn.register_forward_hook(own, with_kwargs=True)
    SnapKVPress.score = score
    try:
        with SnapKVPress(compression_ratio=0.5)(model):
            model.model(input_ids=torch.tensor([record["input_ids"][:n]]),
                        past_key_values=DynamicCache())  # fmt: skip
    finally:
        SnapKVPress.score = original
        hook.remove()
    eager, press = seen["eager"], seen["press"]
    return {
        "layer": layer, "shape": list(eager.shape),
        "max_abs_difference": float((eager - press).abs().max()),
        "largest_weight": float(eager.max()),
    }  # fmt: skip


@torch.no_grad()
def needle_ranks(model, tokenizer, record: dict, kept: int) -> dict:
    """Check 2 on `record` (module doc)."""
    from kvpress.presses.snapkv_press import SnapKVPress

    n = record["context_tokens"]
    start, end = needle_span(tokenizer, record)
    ranks: dict[int, list[list[int]]] = {}
    protect: set[int] = set()
    original = SnapKVPress.score

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        s = original(self, module, hidden_states, keys, values, attentions, kwargs)
        layer = module.layer_idx
        if layer in protect:
            s[..., start:end] = float("inf")
        else:
            order = s[0].argsort(-1, descending=True).argsort(-1)  # 0 = kept first
            ranks[layer] = order[:, start:end].tolist()  # [kv heads, value tokens]
        return s

    SnapKVPress.score = score
    try:
        ratio = rk.compression_ratio(n, kept)
        text, _ = rk.answer(model, tokenizer, rk.make_press("kvpress_snapkv", ratio), record, n, 32)
        dropped = sorted(
            (layer, head) for layer, heads in ranks.items()
            for head, r in enumerate(heads) if max(r) >= kept
        )  # fmt: skip
        protect.update(layer for layer, _ in dropped)
        kept_text, _ = rk.answer(
            model, tokenizer, rk.make_press("kvpress_snapkv", ratio), record, n, 32
        )
    finally:
        SnapKVPress.score = original
    return {
        "prompt_hash": record["prompt_hash"], "expected": record["expected"],
        "value_tokens": end - start, "context_tokens": n,
        "ranks": {str(k): v for k, v in sorted(ranks.items())},
        "dropped_in": [list(x) for x in dropped],
        "written": text, "score": rk.ruler_score(text, record["expected"]),
        "written_kept": kept_text, "score_kept": rk.ruler_score(kept_text, record["expected"]),
    }  # fmt: skip


def render(data: dict) -> str:
    """docs/ruler_snapkv.md from the JSON `main` wrote."""
    one, rows = data["window_check"], data["prompts"]
    right = sum(r["score"] for r in rows)
    right_kept = sum(r["score_kept"] for r in rows)
    heads = [len(r["dropped_in"]) for r in rows]
    lines = [
        "# Is the SnapKV row a fault of the integration? (docs/ruler.md)",
        "",
        f"kvpress {data['kvpress']}, transformers {data['transformers']}; base "
        f"`{data['base_model']}`; the first {len(rows)} dumped prompts of {data['task']} "
        f"at {data['length']:,} tokens; SnapKV keeping {data['kept']:,} context entries per "
        "layer and key/value head, the question read after (the `kvpress_snapkv` row). "
        "Rendered from `ruler_snapkv.json` by `experiments/ruler_snapkv_check.py`.",
        "",
        "## 1. The press computes what SnapKV means",
        "",
        f"Layer {one['layer']}, the attention of the context's last {WINDOW} queries over the "
        f"rest ({' × '.join(str(x) for x in one['shape'])}): kvpress's window attention against "
        f"the base's own eager attention weights differ by at most "
        f"{one['max_abs_difference']:.3g} (largest weight {one['largest_weight']:.3g}).",
        "",
        "## 2. Where the needle's value goes",
        "",
        "| prompt | value | layer-heads dropping some of its tokens | answer | answer, the value "
        "kept in those layer-heads' layers |",
        "| --- | --- | --- | --- | --- |",
    ]
    for i, r in enumerate(rows):
        lines.append(
            f"| {i} | {r['expected'][0]} | {len(r['dropped_in'])} | "
            f"`{r['written'][:24].strip()!r}` ({r['score']:.0f}) | "
            f"`{r['written_kept'][:24].strip()!r}` ({r['score_kept']:.0f}) |"
        )
    common = set.intersection(*(set(map(tuple, r["dropped_in"])) for r in rows))
    lines += [
        "",
        f"Right as the row runs: {right:.0f} of {len(rows)}; with the value's tokens kept in the "
        f"layers where SnapKV dropped them (a median of {sorted(heads)[len(heads) // 2]} of "
        f"{data['layers'] * data['kv_heads']} layer-heads), everything else as the press chose: "
        f"{right_kept:.0f} of {len(rows)}. The layer-heads (layer, key/value head) that drop "
        "some of the value in every prompt: "
        + (", ".join(f"({a}, {b})" for a, b in sorted(common)) or "none")
        + ". The ranks of the value's tokens in every layer and head are in the JSON.",
        "",
        "```",
        data["command"],
        "```",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", required=True)
    p.add_argument("--base-model", required=True)
    p.add_argument("--task", default="niah_single_1")
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--limit", type=int, default=6)
    p.add_argument("--kept", type=int, default=rk.KEPT)
    p.add_argument("--layer", type=int, default=15, help="the layer of check 1")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(rk.OUT))
    p.add_argument("--render-only", action="store_true", help="OUT/ruler_snapkv.md from its JSON")
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.render_only:
        write_text(
            out / "ruler_snapkv.md", render(json.loads((out / "ruler_snapkv.json").read_text()))
        )
        return
    from importlib import metadata

    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    records = rk.read_prompts(Path(args.prompts)).get((args.task, args.length), [])[: args.limit]
    if not records:
        p.error(f"no prompt of {args.task} at {args.length} in {args.prompts}")
    tokenizer = AutoTokenizer.from_pretrained(args.base_model)
    check = window_against_eager(args.base_model, records[0], args.layer)
    print(f"window attention against eager: {check}", flush=True)
    model = AutoModelForCausalLM.from_pretrained(args.base_model, dtype=torch.float32).eval()
    rows = []
    for i, record in enumerate(records):
        rows.append(needle_ranks(model, tokenizer, record, args.kept))
        r = rows[-1]
        print(f"prompt {i}: dropped in {r['dropped_in']}; {r['written'][:20]!r} "
              f"→ kept: {r['written_kept'][:20]!r}", flush=True)  # fmt: skip
    text = model.config
    data = {
        "task": args.task, "length": args.length, "kept": args.kept,
        "base_model": Path(args.base_model).name, "layers": text.num_hidden_layers,
        "kv_heads": text.num_key_value_heads,
        "kvpress": metadata.version("kvpress"), "transformers": metadata.version("transformers"),
        "command": ".venv-kvpress/bin/python experiments/ruler_snapkv_check.py --prompts "
        f"runs/ruler-prompts.jsonl --base-model MODEL_DIR --limit {args.limit} --kept {args.kept}",
        "window_check": check, "prompts": rows,
    }  # fmt: skip
    write_json(out / "ruler_snapkv.json", data)
    write_text(out / "ruler_snapkv.md", render(data))
    print(f"wrote {out / 'ruler_snapkv.md'}", flush=True)


if __name__ == "__main__":
    main()
