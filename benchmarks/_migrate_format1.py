"""One-off conversion of the reports written by the comparison scripts before `experiment.py`
(format 1) to the report format the scripts write and render now (format 2). Run once:

    INFTYFORMER_DATA=/path/to/shared/data python benchmarks/_migrate_format1.py

For each of docs/sorting.json, docs/sorting_long/sorting.json, docs/lm.json and docs/recall.json
still in format 1:

- every measured value is carried over as it was written (nothing is re-measured or typed in);
- the settings move to their new names (memory budget B = 2m, the number of workers into meta)
  and each variant's model settings are rebuilt with `experiment.model_config` from the recorded
  recipe; the rebuilt model must have exactly the recorded parameter count, or nothing is written;
- runs: the sorting test accuracy/loss go under evals.test.metrics; the LM evaluations are split
  into metrics (loss, ppl, bpb, tokens) and details (the rest); the LM training-loss curve, which
  format 1 kept only in its table averaged per window of steps/5, becomes the run's
  `train_loss` at the window ends (re-averaging per the same windows returns it unchanged);
- the LM report's facts about the data (vocabulary, number and size of the books) are read from
  the data directory through the library, as the script does now;
- the discussion kept by hand between the notes markers of X.md moves verbatim to X.notes.md.

Files already in format 2 are left alone.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import compare_lm
import compare_recall
import compare_sorting
import experiment as ex

DOCS = ex.ROOT / "docs"
BEGIN, END = "<!-- notes: kept when the script rewrites this file -->", "<!-- /notes -->"
RECIPE_FIELDS = {"workers", "memory"}


def setup_of(old: dict[str, Any], cls: type) -> Any:
    fields = {k: v for k, v in old.items() if k not in RECIPE_FIELDS}
    if "widths" in fields:
        fields["widths"] = tuple(fields["widths"])
    return cls(**fields, memory_budget=2 * old["memory"])


def variants_of(setup: Any, base: dict, d_ff: dict[str, int], params: dict[str, int]) -> dict:
    out = {}
    for v in setup.variants:
        config = ex.model_config(v, base, setup.memory_budget, d_ff[v])
        if ex.count_params(config) != params[v]:
            raise SystemExit(
                f"{v}: the rebuilt model has {ex.count_params(config)} parameters, "
                f"the report says {params[v]}"
            )
        out[v] = {"d_ff": d_ff[v], "params": params[v], "model": config.to_dict()}
    return out


def meta_of(old_meta: dict, machine: dict, workers: int, elapsed: float | None) -> dict[str, Any]:
    return {
        "command": old_meta.get("command"),
        "machine": machine,
        "workers": workers,
        "elapsed_seconds": elapsed,
        "migrated_from": "format 1",
    }


def sorting(old: dict[str, Any]) -> dict[str, Any]:
    from inftyformer.tasks.sorting import SORTING_VOCAB

    setup = setup_of(old["setup"], compare_sorting.Setup)
    base = {**setup.backbone(), "vocab_size": SORTING_VOCAB, "dropout": 0.0}
    machine = old["machine"]
    machine = {
        "logical_cpus": machine["cpus"],
        "platform": machine["platform"],
        "python": machine["python"],
    }
    runs = [
        {
            "variant": r["variant"],
            "setting": r["seq_len"],
            "seed": r["seed"],
            "seconds": r["seconds"],
            "cpu_seconds": r["cpu_seconds"],
            "best_step": r["best_step"],
            "best_valid": r["best_valid_accuracy"],
            "evals": {
                "test": {"metrics": {"accuracy": r["test_accuracy"], "loss": r["test_loss"]}}
            },
        }
        for r in old["runs"]
    ]
    return {
        "format": ex.FORMAT,
        "experiment": "sorting",
        "setup": asdict(setup),
        "variants": variants_of(setup, base, old["d_ff"], old["params"]),
        "data": {"chance": old["chance"]},
        "meta": meta_of({}, machine, old["setup"]["workers"], old["elapsed_seconds"]),
        "runs": runs,
    }


METRICS = {"loss": "loss", "ppl": "perplexity", "bpb": "bits_per_byte", "tokens": "num_tokens"}


def lm(old: dict[str, Any]) -> dict[str, Any]:
    from inftyformer.data import resolve_corpus_dir, resolve_data_dir

    setup = setup_of(old["setup"], compare_lm.Setup)
    corpus = resolve_corpus_dir(None)
    facts = compare_lm.data_facts(setup, corpus, resolve_data_dir(None) / "wikitext103-eval")
    base = {
        **setup.backbone(),
        "vocab_size": facts["vocab_size"],
        **{k: getattr(setup, k) for k in ("widths", "ridge_lambda", "tau", "dropout")},
    }
    table = old["table"]
    d_ff = {v: row["d_ff"] for v, row in table.items()}
    params = {v: row["params"] for v, row in table.items()}
    runs = []
    for r in old["runs"]:
        row = table[r["variant"]]
        curve = row["train_curve"][row["seeds"].index(r["seed"])]
        evals = {}
        for name, e in r["evals"].items():
            if e["num_docs"] != facts["test_docs"] and name == "test":
                raise SystemExit(f"the test books counted {e['num_docs']} != {facts['test_docs']}")
            details = {k: v for k, v in e.items() if k != "seconds"}
            evals[name] = {
                "metrics": {k: e[old_key] for k, old_key in METRICS.items()},
                "details": details,
                "seconds": r["eval_seconds"][name],
            }
        runs.append(
            {
                "variant": r["variant"],
                "setting": None,
                "seed": r["seed"],
                "train_seconds": r["train_seconds"],
                "seconds": r["train_seconds"] + sum(r["eval_seconds"].values()),
                "started_at": r["started_at"],
                "finished_at": r["finished_at"],
                "train_loss": {"step": [int(k) for k in curve], "value": list(curve.values())},
                "evals": evals,
            }
        )
    meta = old["meta"]
    return {
        "format": ex.FORMAT,
        "experiment": "lm",
        "setup": asdict(setup),
        "variants": variants_of(setup, base, d_ff, params),
        "data": facts,
        "meta": meta_of(meta, meta["machine_info"], old["setup"]["workers"], meta["minutes"] * 60),
        "runs": runs,
    }


def recall(old: dict[str, Any]) -> dict[str, Any]:
    """The recall report: its sweep's points become the evaluations `G<gap>-P<pairs>`; the
    model settings are carried over as recorded (they predate later settings), checked against
    the recorded parameter counts. Format 1 did not record the elapsed time."""
    fields = {k: v for k, v in old["setup"].items() if k not in ("workers", "budget")}
    setup = compare_recall.Setup(**fields, memory_budget=old["setup"]["budget"])
    rebuilt = variants_of(
        setup,
        setup.base(),
        {v: info["d_ff"] for v, info in old["variants"].items()},
        {v: info["params"] for v, info in old["variants"].items()},
    )
    variants = {v: {**rebuilt[v], "model": info["model"]} for v, info in old["variants"].items()}
    runs = [
        {
            "variant": r["variant"],
            "setting": compare_recall.TRAINED_ON,
            "seed": r["seed"],
            "seconds": r["seconds"],
            "cpu_seconds": r["cpu_seconds"],
            "train_cpu_seconds": r["train_cpu_seconds"],
            "best_step": r["best_step"],
            "best_valid": r["best_valid_accuracy"],
            "evals": {
                compare_recall.point(p["gap"], p["pairs"]): {
                    "metrics": {k: p[k] for k in ("accuracy", "loss", "queries")}
                }
                for p in r["sweep"]
            },
        }
        for r in old["runs"]
    ]
    return {
        "format": ex.FORMAT,
        "experiment": "recall",
        "setup": asdict(setup),
        "variants": variants,
        "data": {"chance": 1.0 / setup.num_values, "window": old["window"]},
        "meta": meta_of({}, old["machine"], old["setup"]["workers"], None),
        "runs": runs,
    }


def move_notes(md: Path) -> None:
    notes = md.with_suffix(".notes.md")
    text = md.read_text(encoding="utf-8")
    if notes.exists() or BEGIN not in text:
        return
    body = text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip("\n")
    notes.write_text(body + "\n", encoding="utf-8")
    print(f"moved the notes of {md} to {notes}")


def main() -> None:
    import json

    for path, convert in (
        (DOCS / "sorting.json", sorting),
        (DOCS / "sorting_long" / "sorting.json", sorting),
        (DOCS / "lm.json", lm),
        (DOCS / "recall.json", recall),
    ):
        old = json.loads(path.read_text(encoding="utf-8"))
        if old.get("format") == ex.FORMAT:
            print(f"{path} is already in format {ex.FORMAT}")
        else:
            ex.write_report(path, convert(old))
            print(f"converted {path}")
        move_notes(path.with_suffix(".md"))


if __name__ == "__main__":
    main()
