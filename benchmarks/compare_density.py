"""The ∞-former's density heads compared on recall, sorting and books: the paper's form against
the scores standardised over the basis (long_term_attention.py), two seeds each, fixed budgets.

    python benchmarks/compare_density.py                  # every task and form (~2 CPU-hours)
    python benchmarks/compare_density.py --tasks recall   # one task
    python benchmarks/compare_density.py --render-only    # docs/density.md from docs/density.json

Each task keeps its comparison's recipe (compare_recall.py, compare_sorting.py, compare_lm.py),
except recall's budget: half of compare_recall's steps. Every run records its cost per training
step, and per memory layer the median σ and μ's spread across queries (the trainer's
density/L{i}/… metrics) at the first logged step and at the end.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import compare_lm as lm
import compare_recall as recall
import compare_sorting as sorting
import experiment as ex

NAME = "density"
FORMS: dict[str, dict[str, Any]] = {  # name -> (settings, label)
    "paper": {
        "settings": {"density": "paper"},
        "label": "paper: sigmoid(w_μᵀ s), softplus(w_σᵀ s)",
    },
    "normalized": {
        "settings": {"density": "normalized"},
        "label": "s standardised over the basis first",
    },
    "narrow": {
        "settings": {"density": "normalized", "sigma_init": 0.1},
        "label": "normalized, σ = 0.1 at initialisation",
    },
}
TASKS = ("recall", "sorting", "books")


@dataclass
class Setup:
    forms: list[str] = field(default_factory=lambda: list(FORMS))
    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    recall_steps: int = 2000  # half of compare_recall's 4000
    recall_models: list[str] = field(default_factory=lambda: ["infty", "infty-sticky"])
    recall_gaps: list[float] = field(default_factory=lambda: [1, 2, 4, 8, 16])  # × W
    recall_pairs: list[int] = field(default_factory=lambda: [2, 4])
    sorting_seq_lens: list[int] = field(default_factory=lambda: [512, 1024])
    quick: bool = False


# --------------------------------------------------------------------------- jobs
def recall_jobs(setup: Setup, runs_dir: Path) -> list[ex.Job]:
    base = recall.Setup(steps=setup.recall_steps, variants=list(setup.recall_models))
    if setup.quick:
        base = replace(base, d_model=16, d_ff=32, steps=4, eval_every=2, sweep_batches=1)
    models = recall.matched_variants(base)
    evaluations = {
        f"G{g}-P{p}": {
            "split": "test",
            "num_batches": base.sweep_batches,
            "task_settings": {"gap": g, "num_pairs": p},
        }
        for g in base.gaps(setup.recall_gaps)
        for p in setup.recall_pairs
    }
    train = dict(
        task="recall", steps=base.steps, batch_size=base.batch_size, lr=base.lr,
        warmup_steps=base.warmup_steps, eval_every=base.eval_every,
        eval_batches=base.eval_batches, test_batches=0, threads=1, progress=False,
        tensorboard=False, log_every=max(1, base.steps // 20), out_dir="",
    )  # fmt: skip
    out = []
    for form in setup.forms:
        for model in setup.recall_models:
            for seed in setup.seeds:
                spec = {
                    "model": {**models[model]["model"], **FORMS[form]["settings"]},
                    "task": recall.task_settings(base, base.gaps(base.train_gaps), base.pairs),
                    "train": {**train, "seed": seed},
                    "evaluations": evaluations,
                    "task_name": "recall",
                    "window": base.window,
                }
                key = (form, f"recall/{model}", seed)
                out.append(ex.make_job(key, spec, runs_dir, f"recall-{model}-{form}-s{seed}"))
    return out


def sorting_jobs(setup: Setup, runs_dir: Path) -> list[ex.Job]:
    from inftyformer.tasks.sorting import SORTING_VOCAB

    base = sorting.Setup.quick() if setup.quick else sorting.Setup()
    base = replace(base, variants=["infty"], seeds=setup.seeds)
    backbone = {**base.backbone(), "vocab_size": SORTING_VOCAB, "dropout": 0.0}
    model = ex.matched_variants(["infty"], backbone, base.memory_budget, base.d_ff)["infty"]
    seq_lens = [128, 256] if setup.quick else setup.sorting_seq_lens
    out = []
    for T in sorted(seq_lens, reverse=True):
        for form in setup.forms:
            for seed in setup.seeds:
                spec = {
                    "model": {**model["model"], **FORMS[form]["settings"]},
                    "task": {"seq_len": T},
                    "train": base.train_settings("sorting", seed),
                    "evaluations": {"test": {"split": "test", "num_batches": base.test_batches}},
                    "task_name": "sorting",
                }
                key = (form, f"sorting/T{T}", seed)
                out.append(ex.make_job(key, spec, runs_dir, f"sorting-T{T}-{form}-s{seed}"))
    return out


def books_jobs(setup: Setup, runs_dir: Path, corpus: Path) -> list[ex.Job]:
    base = lm.Setup.quick() if setup.quick else lm.Setup()
    base = replace(base, variants=["infty"], seeds=setup.seeds)
    backbone = {**base.backbone(), "dropout": base.dropout, "widths": base.widths,
                "ridge_lambda": base.ridge_lambda, "tau": base.tau}  # fmt: skip
    from inftyformer.data import load_tokenizer

    backbone["vocab_size"] = load_tokenizer(base.tokenizer, corpus).vocab_size
    model = ex.matched_variants(["infty"], backbone, base.memory_budget, base.d_ff)["infty"]
    evaluations = {"test": {"split": "test", "task_settings": {"max_tokens": base.test_max_tokens}}}
    out = []
    for form in setup.forms:
        for seed in setup.seeds:
            spec = {
                "model": {**model["model"], **FORMS[form]["settings"]},
                "task": {"data_dir": str(corpus), "tokenizer": base.tokenizer},
                "train": base.train_settings("lm", seed),
                "evaluations": evaluations,
                "task_name": "books",
            }
            out.append(ex.make_job((form, "books", seed), spec, runs_dir, f"books-{form}-s{seed}"))
    return out


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Train and evaluate one job (experiment.train_and_evaluate), with its CPU time and the
    density figures the trainer logged."""
    from inftyformer.training import read_metrics

    cpu = time.process_time()
    result = ex.train_and_evaluate(spec)
    result["cpu_seconds"] = time.process_time() - cpu
    result["steps"] = spec["train"]["steps"]
    rows = [r for r in read_metrics(spec["train"]["out_dir"]) if r["metric"].startswith("density/")]
    rows = [r for r in rows if r["split"] == "train"]
    steps = sorted({r["step"] for r in rows})
    density = {}
    for name, step in (
        ("first", steps[0] if steps else None),
        ("last", steps[-1] if steps else None),
    ):
        if step is None:
            continue
        layers: dict[str, dict[str, float]] = {}
        for r in rows:
            if r["step"] == step:
                _, layer, metric = r["metric"].split("/")
                layers.setdefault(layer, {})[metric] = r["value"]
        density[name] = {"step": step, "layers": layers}
    result["density"] = density
    result.pop("train_loss", None)  # not reported here; keeps the JSON small
    return result


# --------------------------------------------------------------------------- rendering
def _runs(data: dict[str, Any], form: str, setting: str) -> list[dict[str, Any]]:
    return [r for r in data["runs"] if r["variant"] == form and r["setting"] == setting]


def _cell(values: list[float], digits: int = 3) -> str:
    return ex.fmt_mean_std(values, digits) if values else "–"


def _density_cells(runs: list[dict[str, Any]], when: str) -> tuple[str, str]:
    """(the largest layer μ spread, the smallest layer median σ), mean ± std over seeds."""
    spread, sigma = [], []
    for r in runs:
        layers = r.get("density", {}).get(when, {}).get("layers", {})
        if layers:
            spread.append(max(v["mu_spread"] for v in layers.values()))
            sigma.append(min(v["sigma_median"] for v in layers.values()))
    return _cell(spread), _cell(sigma)


def settings_of(data: dict[str, Any]) -> list[str]:
    seen: list[str] = []
    for r in data["runs"]:
        if r["setting"] not in seen:
            seen.append(r["setting"])
    return seen


def render(data: dict[str, Any], out: Path) -> None:
    setup = data["setup"]
    forms = [f for f in setup["forms"] if any(r["variant"] == f for r in data["runs"])]
    settings = settings_of(data)
    label = {f: FORMS[f]["label"] for f in FORMS}
    lines = [
        "# Density heads: do the reads depend on the query?",
        "",
        f"Generated by `python benchmarks/compare_density.py` from `{NAME}.json`. The ∞-former's "
        "density heads in each form (`density=` and `sigma_init=` of the model settings), "
        f"mean ± std over seeds {setup['seeds']}, each task at its comparison's recipe and budget.",
        "",
        "Forms: " + "; ".join(f"**{f}**: {label[f]}" for f in forms) + ".",
        "",
    ]
    recall_settings = [s for s in settings if s.startswith("recall/")]
    if recall_settings:
        window = next(r["window"] for r in data["runs"] if "window" in r)
        gaps = [int(round(g * window)) for g in setup["recall_gaps"]]
        for pairs in setup["recall_pairs"]:
            lines += [f"## Recall, P = {pairs}: test accuracy across G filler tokens", ""]
            head = ["model", "form"] + [f"G = {g} ({g / window:g}W)" for g in gaps]
            rows = []
            for s in recall_settings:
                for f in forms:
                    runs = _runs(data, f, s)
                    accs = [
                        [r["evals"][f"G{g}-P{pairs}"]["metrics"]["accuracy"] for r in runs]
                        for g in gaps
                    ]
                    rows.append([s.split("/")[1], f] + [_cell(a, 2) for a in accs])
            lines += [ex.table(head, rows, numeric_from=2), ""]
        lines += [
            f"Recall recipe: compare_recall.py's (2 layers, d_model 64, segment 32, W = {window}), "
            f"{setup['recall_steps']} steps (compare_recall.py: 4000); chance 1/16 = 0.062.",
            "",
        ]
    sorting_settings = [s for s in settings if s.startswith("sorting/")]
    if sorting_settings:
        lines += ["## Sorting: test accuracy", ""]
        head = ["form"] + [f"T = {s.split('/T')[1]}" for s in sorting_settings]
        rows = [
            [f]
            + [
                _cell([r["evals"]["test"]["metrics"]["accuracy"] for r in _runs(data, f, s)])
                for s in sorting_settings
            ]
            for f in forms
        ]
        lines += [ex.table(head, rows), "", "Recipe: compare_sorting.py's (600 steps).", ""]
    if "books" in settings:
        lines += ["## Books (pg19-mini): test bits per byte (lower is better)", ""]
        rows = [
            [f, _cell([r["evals"]["test"]["metrics"]["bpb"] for r in _runs(data, f, "books")], 4)]
            for f in forms
        ]
        lines += [ex.table(["form", "test bits/byte"], rows), ""]
        lines += ["Recipe: compare_lm.py's ∞-former (250 steps, bytes).", ""]
    lines += [
        "## Where the reads go: μ's spread across queries and median σ",
        "",
        "Per run, the largest μ spread and the smallest median σ over its memory layers, at the "
        "first logged training step and at the end (the trainer's `density/L{i}/mu_spread` and "
        "`density/L{i}/sigma_median`). A flat read of the whole past: spread ≈ 0, σ ≈ 0.83.",
        "",
    ]
    head = ["task", "form", "μ spread, start", "median σ, start", "μ spread, end", "median σ, end"]
    rows = []
    for s in settings:
        for f in forms:
            runs = _runs(data, f, s)
            if runs:
                rows.append([s, f, *_density_cells(runs, "first"), *_density_cells(runs, "last")])
    lines += [ex.table(head, rows, numeric_from=2), ""]
    lines += ["## Cost per training step", ""]
    head = ["task", "form", "ms per step", "against paper"]
    rows = []
    for s in settings:
        paper = [r["train_seconds"] / r["steps"] for r in _runs(data, "paper", s)]
        for f in forms:
            per = [r["train_seconds"] / r["steps"] for r in _runs(data, f, s)]
            ratio = f"{ex.mean_std(per)[0] / ex.mean_std(paper)[0]:.2f}×" if per and paper else "–"
            rows.append([s, f, _cell([1000 * p for p in per], 1), ratio])
    lines += [ex.table(head, rows, numeric_from=2), ""]
    lines += [
        "Training wall time per step, one thread per run, two runs in parallel on a shared "
        "machine: read the ratios, not the milliseconds.",
        "",
        ex.cost_line(data),
        "",
        "## Notes",
        "",
        "<!-- notes: kept when the script rewrites this file -->",
        ex.hand_notes(out / f"{NAME}.md"),
        "",
    ]
    (out / f"{NAME}.md").write_text("\n".join(lines), encoding="utf-8")


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None, echo: Callable[[str], None] = print) -> int:
    parser = ex.parser(__doc__, NAME, choices=tuple(FORMS))
    parser.add_argument("--tasks", type=str, help=f"subset of {','.join(TASKS)}")
    parser.add_argument("--data-dir", type=Path, help="data root (with pg19-mini/) or a corpus")
    args = parser.parse_args(argv)
    out, runs_dir = ex.directories(args, NAME)
    if args.render_only:
        render(ex.load_report(out / f"{NAME}.json"), out)
        echo(f"rendered {out / f'{NAME}.md'}")
        return 0
    setup = Setup(quick=args.quick)
    if args.seeds:
        setup.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if args.variants:
        setup.forms = [f.strip() for f in args.variants.split(",") if f.strip()]
    if args.tasks:
        setup.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    bad = sorted(set(setup.forms) - set(FORMS)) + sorted(set(setup.tasks) - set(TASKS))
    if bad:
        raise SystemExit(f"unknown forms or tasks {bad}: forms {list(FORMS)}, tasks {TASKS}")
    if args.steps:
        setup.recall_steps = args.steps
    if args.quick:
        setup.seeds = setup.seeds[:1]
    jobs: list[ex.Job] = []
    if "recall" in setup.tasks:
        jobs += recall_jobs(setup, runs_dir)
    if "books" in setup.tasks:  # the longest runs before the sorting ones, to end together
        from inftyformer.data import resolve_corpus_dir

        try:
            jobs += books_jobs(setup, runs_dir, resolve_corpus_dir(args.data_dir))
        except (FileNotFoundError, ValueError) as err:
            echo(f"books skipped: no corpus ({err})")
    if "sorting" in setup.tasks:
        jobs += sorting_jobs(setup, runs_dir)
    store = ex.ResultStore(runs_dir / "results.jsonl", fresh=args.fresh)
    runs, failed, elapsed = ex.run_jobs(jobs, store, args.workers, fn=run, echo=echo)
    for r in runs:
        r["window"] = next((j.spec.get("window") for j in jobs if j.key[1] == r["setting"]), None)
        if r["window"] is None:
            del r["window"]
    result = ex.report(NAME, asdict(setup), {}, {}, runs, args.workers, elapsed)
    ex.write_report(out / f"{NAME}.json", result)
    render(result, out)
    echo(f"done in {elapsed / 60:.1f} min -> {out / f'{NAME}.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("stopped; finished runs are kept: run the same command again to continue")
        sys.exit(130)
