"""The report of experiments/passkey.py: the rows' labels, gathering the rows' JSON files into
passkey.json (rows measured before and not measured again are kept), and rendering passkey.md."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import experiment as ex

NAME = "passkey"
ROWS = {
    "window": "(i) base, window: each block of C with the W tokens before it",
    "full": "(ii) base, full context (its last P positions)",
    "window-2048": "(i′) base, window of 2,048: each block of C with the 2,048 tokens before it "
    "(the cheapest way to the recent past the memory rows keep exact)",
    "untrained": "(iii) memory, untrained",
    "lm": "(iv) memory trained on plain LM",
    "facts": "(v) memory trained on facts, read supervision per answer token",
    "facts-sticky": "(vi) = (v), read with sticky memories",
    "facts-start": "(v′) as (v), every answer query supervised to the key's start",
    "content": "(vii) as (v), density = content (a softmax over the basis keys)",
    "content-f6": "(viii) as (vii), σ² floor 1e-6 (min_sigma_sq; default 1e-4)",
    "content-n2048": "(ix) as (viii), N = 2,048, widths (0.00125, 0.0025)",
    "heads": "(x) the base's own heads read the memory, untrained (memory_read = heads)",
    "heads-facts": "(xi) (x) trained on facts, answer loss only",
    "mixture": "(xii) (x) with density = mixture (the discrete attention over the centres "
    "itself, β = 1), untrained",
    "mixture-n2048": "(xiii) (xii) with N = 2,048, widths (0.00125, 0.0025)",
    "mixture-length": "(xiv) (xii) with N = 2,048, widths (0.00125, 0.0025), squeeze = "
    "by_length (every stored token an equal share, τ ≤ 0.95)",
    "mixture-fill": "(xv) (xii) with squeeze = fill: one token per centre until 2,048 are "
    "stored (N = 2,048, width 0.0003), then by length (measured before the merge past K "
    "replaced that squeeze)",
    "mixture-fill-sink": "(xvi) (xv)'s settings, merged past K (equal runs of tokens per "
    "centre), reading the memory's first tokens too (sink edge 0)",
    "mixture-fill-keep": "(xvii) (xvi) with the first 64 tokens never merged (keep_first)",
    "mixture-fill-positions": "(xviii) (xvii) with every place at its own stream position "
    "(memory_positions = places, rotary)",
    "mixture-fill-recent": "(xix) (xviii) with the last 1,024 tokens never merged (keep_last)",
    "mixture-fill-salient": "(xx) (xix) with 256 places kept for the most salient older tokens "
    "(keep_salient: the text right after a burst of the base's surprisal)",
    "mixture-fill-ranks": "(xxi) (xx) with every place at its rank (memory_positions = ranks: "
    "the K places read as the last K tokens before the window, in order, however far back their "
    "tokens lie)",
    "mixture-fill-ranks-salient": "(xxii) (xxi) with 959 places for salient tokens "
    "(keep_salient: every place between the first 64 and the last 1,024 tokens but one, which "
    "holds the mean of the rest)",
    "mixture-fill-ranks-before": "(xxiii) (xxii) with the 2 tokens before a burst of surprise "
    "salient too (salient_before = 2: the words that open a fact)",
    "exact": "ceiling: the heads read the exact stored states (a growing cache, not a memory)",
    "exact-positions": "ceiling, each stored state at its own stream position (rotary)",
}
# the rows whose answer reads are recorded and tabled (trained with read supervision)
READ_ROWS = (
    "facts", "facts-start", "content", "content-f6", "content-n2048", "heads", "heads-facts",
    "mixture", "mixture-n2048", "exact", "exact-positions",
)  # fmt: skip
# the rows whose every block reads with the base's heads: which blocks find the key, compactly
HEADS_ROWS = ("heads", "heads-facts", "mixture", "mixture-n2048", "exact", "exact-positions")


def render(data: dict[str, Any], out_dir: Path) -> None:
    setup, rows = data["setup"], data["rows"]
    order = [r for r in ROWS if r in rows]
    C, W = setup["segment_len"], setup["window"]
    lines = [
        "# Retrieval on the pretrained path: pass keys and test books, side by side",
        "",
        f"Base model `{Path(setup['base_model']).name}`; blocks of C = {C} tokens with a "
        f"window of W = {W}. Pass keys: {setup['keys']} per distance, in the test books "
        "(the facts task's evaluation wording and five-digit keys, never trained); exact = every "
        "answer token is the argmax (greedy decoding would write the key), NLL = the answer's "
        "mean NLL per token (the digit prior: ln 10 ≈ 2.30). Rendered from "
        f"`{NAME}.json` by `experiments/{NAME}.py`.",
        "",
        "This page is the history of how the continuous memory's training-free reading was "
        "found (its best row is the `salient-places` preset). What retrieval finds today, "
        "against the base's full context and at one budget with the peers, is "
        "`docs/results/retrieval.md`.",
        "",
        "## Pass keys",
        "",
    ]
    ds = [str(d) for d in setup["distances"]]
    header = ["row", *(f"d = {d}" for d in ds)]
    body = []
    for r in order:
        res = rows[r].get("passkey", {})
        cells = [f"{res[d]['exact']:.2f} ({res[d]['nll']:.2f})" if d in res else "–" for d in ds]
        body.append([ROWS[r], *cells])
    skipped = [f"{ROWS[r].split(' ')[0]} ran no prompt over {rows[r]['max_prompt_tokens']:,} "
               "tokens" for r in order if rows[r].get("max_prompt_tokens")]  # fmt: skip
    note = (
        " –: not run (the ceiling rows: prompts over 8,192 tokens"
        + ("; " + "; ".join(skipped) if skipped else "")
        + ")."
    )
    lines += [ex.table(header, body), "", "Cells: exact (answer NLL per token)." + note, ""]
    full = rows.get("full", {}).get("positions")
    if full:
        lines += [f"The full-context row sees the last {full:,} tokens of each prompt; prompt "
                  "lengths: " + ", ".join(f"d = {d}: {v['tokens']:,}"
                  for d, v in rows["full"]["passkey"].items()) + ".", ""]  # fmt: skip
    body = []
    for r in READ_ROWS:
        if r in HEADS_ROWS:  # every block: one line per distance, below
            continue
        blocks = rows.get(r, {}).get("memory_layers") or []
        for d, v in rows.get(r, {}).get("passkey", {}).items():
            for i, layer in enumerate(v.get("reads", [])):
                if layer:
                    body.append([r, f"d = {d}", blocks[i] if i < len(blocks) else i,
                                 f"{layer['distance_tokens']:.0f}", f"{layer['sigma']:.3f}",
                                 _tokens(layer["sigma_tokens"], int(d)),
                                 f"{layer['within_sigma']:.2f}"])  # fmt: skip
    if body:
        lines += ["## Where the answer's reads land (the rows trained with read supervision)", "",
                  "Per memory layer (block), over keys, heads and the answer's queries (the "
                  "query writing answer token j against key token j): median distance from μ to "
                  "that token in stream tokens, median σ (in [0, 1] and in tokens there), and "
                  "the share of reads with the token within one σ of μ.", ""]  # fmt: skip
        lines += [ex.table(["row", "distance", "block", "|μ − key| tokens", "σ", "σ tokens",
                            "key within σ"], body, numeric_from=3), ""]  # fmt: skip
    body = []
    for r in HEADS_ROWS:
        for d, v in rows.get(r, {}).get("passkey", {}).items():
            found = [f"{i}: {layer['best_head']}" for i, layer in enumerate(v.get("reads", []))
                     if layer and layer["best_head_distance_tokens"] <= 1.0]  # fmt: skip
            body.append([r, f"d = {d}", str(len(found)), ", ".join(found) or "–"])
    if body:
        settings = ", ".join(
            f"{k} = {v}" for k, v in rows.get("heads", {}).get("settings", {}).items()
        )
        lines += ["## Rows (x)–(xiii): which blocks' heads find the key", "",
                  f"Every block reads its memory with its own heads (row (x): {settings}). Per "
                  "distance: the blocks in which some head's median |μ − key token| over the "
                  "answer's queries is at most one token (block: head).", ""]  # fmt: skip
        lines += [ex.table(["row", "distance", "blocks", "block: head"], body), ""]
    books = {r: rows[r]["books"] for r in order if "books" in rows[r]}
    if books:
        buckets = list(next(iter(books.values()))["buckets"])
        lines += ["## Test books: NLL per token by position", "",
                  f"{setup['docs']} windows of {setup['doc_len']:,} tokens of the test books. "
                  "Gap closed: (row − window) / (full − window) at positions ≥ 1K, the share of "
                  "the full context's gain the row recovers. CPU: one thread, per token.",
                  ""]  # fmt: skip
        w, f = books.get("window", {}).get("from_1k"), books.get("full", {}).get("from_1k")
        body = []
        for r, b in books.items():
            gap = "–"
            if w is not None and f is not None and abs(w - f) > 1e-9 and b["from_1k"] is not None:
                gap = f"{(w - b['from_1k']) / (w - f):.0%}"
            body.append([ROWS[r], *(f"{b['buckets'].get(k, math.nan):.3f}" for k in buckets),
                         gap, f"{b['cpu_per_token_ms']:.1f} ms"])  # fmt: skip
        lines += [ex.table(["row", *buckets, "gap closed ≥ 1K", "CPU / token"], body), ""]
    parity = data.get("parity")
    if parity is not None:
        lines += [f"Parity: rows (i) and (iii) differ by at most {parity:.1e} nats per token on "
                  "the test books (the untrained read adds zero).", ""]  # fmt: skip
    trained = [r for r in order if rows[r].get("training")]
    if trained:
        lines += ["## The trained rows", "", "From each run's checkpoint and metrics.csv "
                  "(validation on the task's valid split: the facts task's held-out wording).",
                  ""]  # fmt: skip
        for r in trained:
            t = rows[r]["training"]
            curve = ", ".join(f"{k} " + " → ".join(f"{v:.3g}" for _, v in vals)
                              for k, vals in t["valid"].items())  # fmt: skip
            settings = ", ".join(f"{k}={v}" for k, v in {**t["model"], **t["task_config"]}.items())
            lines += [f"- {ROWS[r]}: `{t['task']}` task, step {t['step']}, batch "
                      f"{t['batch_size']}; {settings}. Valid: {curve}."]  # fmt: skip
        lines += [""]
    lines += [ex.hand_notes(out_dir / f"{NAME}.md"), ""]
    (out_dir / f"{NAME}.md").write_text("\n".join(lines), encoding="utf-8")


def training_summary(run: str) -> dict[str, Any]:
    """What a trained row's run was: its step, the settings that make the recipe, and its
    validation curve (metrics.csv)."""
    import csv

    from inftyformer.training.checkpoint import load_checkpoint

    meta = load_checkpoint(run).meta
    model, task = meta["model_config"], meta["task_config"]
    keep = ("memory_layers", "window", "memory_lr", "segment_len", "num_basis", "tau", "sticky")
    out = {"task": meta["task"], "step": meta["step"], "model": {k: model.get(k) for k in keep},
           "task_config": {k: v for k, v in task.items() if k not in ("data_dir", "tokenizer")},
           "batch_size": meta["train_config"]["batch_size"], "valid": {}}  # fmt: skip
    directory = Path(run) if Path(run).is_dir() else Path(run).parent
    with open(directory / "metrics.csv", newline="") as f:
        for r in csv.DictReader(f):
            if r["split"] == "valid" and r["metric"] in ("loss", "exact", "ppl", "perplexity"):
                out["valid"].setdefault(r["metric"], []).append([int(r["step"]), float(r["value"])])
    return out


def _tokens(value: float, distance: int) -> str:
    """σ in tokens, or "≫ d" where the key's block is squeezed below the basis's resolution."""
    return f"{value:.0f}" if value <= distance else f"≫ {distance:,}"


def gather(out_dir: Path, setup: dict[str, Any]) -> dict[str, Any]:
    """passkey.json from the row files of this setup, on top of the rows of the existing report
    with the same setup (a row measured once stays until it is measured again)."""
    rows = {}
    old = out_dir / f"{NAME}.json"
    if old.exists():
        previous = ex.load_report(old)
        if previous.get("setup") == setup:
            rows.update(previous.get("rows", {}))
    parts = []
    for path in sorted((out_dir / f"{NAME}.rows").glob("*.json")):
        entry = json.loads(path.read_text(encoding="utf-8"))
        if entry["setup"] != setup:
            continue
        if "@" in path.stem:  # a part of a row (passkey.py --part): added once all rows are in
            parts.append((path.stem.partition("@")[0], entry["row"]))
            continue
        rows[path.stem] = entry["row"]
        if entry["row"].get("run") and Path(entry["row"]["run"]).parent.exists():
            rows[path.stem]["training"] = training_summary(entry["row"]["run"])
    for name, part in parts:  # its longer prompts join the row's; the row then has them all
        if name not in rows:
            continue
        row = rows[name]
        row["passkey"] = {**row["passkey"], **part["passkey"]}
        row["seconds"] += part["seconds"]
        if row.get("max_prompt_tokens", 0) + 1 >= part.get("min_prompt_tokens", math.inf):
            row.pop("max_prompt_tokens")  # the part goes on where the row stopped
            if part.get("max_prompt_tokens"):  # up to its own limit
                row["max_prompt_tokens"] = part["max_prompt_tokens"]
    data = ex.report(NAME, setup, {}, {}, [], 1, sum(r["seconds"] for r in rows.values()))
    data["rows"] = rows
    w, u = rows.get("window", {}).get("books"), rows.get("untrained", {}).get("books")
    if w and u:
        diffs = [abs(a - b) for a, b in zip(w["per_position"], u["per_position"], strict=True)]
        data["parity"] = max(diffs) if diffs else None
    return data
