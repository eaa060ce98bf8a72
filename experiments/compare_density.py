"""The ∞-former's density heads compared on recall, sorting and books: the paper's form against
the scores standardised over the basis (core/attention.py), two seeds each, fixed budgets.

    python experiments/compare_density.py                  # every task and form (~2 CPU-hours)
    python experiments/compare_density.py --tasks recall   # one task
    python experiments/compare_density.py --render-only    # density.md from density.json

Each task keeps its comparison's recipe (compare_recall.py, compare_sorting.py, compare_lm.py),
except recall's budget: half of compare_recall's steps. Every run records its cost per training
step, and per memory layer the median σ and μ's spread across queries (the trainer's
density/L{i}/… metrics) at the first logged step and at the end.
"""

from __future__ import annotations

import fnmatch
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import compare_lm as lm
import compare_recall as recall
import compare_sorting as sorting
import experiment as ex

from inftyformer import _measure as common

NAME = "density"
FORMS: dict[str, dict[str, Any]] = {  # name -> (settings, label)
    "paper": {
        "settings": {"density": "paper", "sigma_init": None},
        "label": "sigmoid(w_μᵀ s), softplus(w_σᵀ s), as in the paper",
    },
    "normalized": {
        "settings": {"density": "normalized", "sigma_init": None},
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
    timing_repeats: int = 15
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


def committed_paper_runs(setup: Setup, own: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The paper form's sorting and books runs of the committed comparisons
    (docs/results/sorting.json, docs/results/lm.json: the same recipes, made before the density
    setting existed, i.e. with the paper's form), for the settings this sweep did not train the
    paper form on. Each is marked with its "source"."""
    have = {(r["variant"], r["setting"]) for r in own}
    out = []
    for name, task, setting_of in (
        ("sorting.json", "sorting", lambda r: f"sorting/T{r['setting']}"),
        ("lm.json", "books", lambda r: "books"),
    ):
        path = ex.ROOT / "docs" / "results" / name
        if task not in setup.tasks or not path.exists():
            continue
        for r in ex.load_report(path)["runs"]:
            setting = setting_of(r)
            wanted = task == "books" or int(setting.split("/T")[1]) in setup.sorting_seq_lens
            if r["variant"] == "infty" and wanted and ("paper", setting) not in have:
                out.append({"variant": "paper", "setting": setting, "seed": r["seed"],
                            "evals": r["evals"], "source": f"docs/{name}"})  # fmt: skip
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


def time_forms(jobs: list[ex.Job], forms: list[str], repeats: int) -> dict[str, Any]:
    """Training-step time of each form on each task's model (one thread, one process): a batch
    streams one segment into memory, then one segment forward + backward + AdamW step is timed,
    every form round-robin (`_measure.interleaved`), so that a shared machine's load falls on all
    alike. {setting: {form: summary in ms}}."""
    import torch

    from inftyformer import MemoryLM, ModelConfig

    torch.set_num_threads(1)
    out: dict[str, Any] = {}
    for setting in dict.fromkeys(job.key[1] for job in jobs):
        job = next(j for j in jobs if j.key[1] == setting)
        batch = job.spec["train"]["batch_size"]
        steps: dict[str, Callable[[], None]] = {}
        for form in forms:
            settings = {**job.spec["model"], "density": "paper", "sigma_init": None}
            config = ModelConfig.from_dict({**settings, **FORMS[form]["settings"]})
            torch.manual_seed(0)
            model = MemoryLM(config)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            C = config.segment_len
            tokens = torch.randint(0, config.vocab_size, (batch, 3 * C + 1))
            with torch.no_grad():  # memory holds two segments: the long-term read is used
                state = model(tokens[:, :C], state=model.init_state(batch)).state
                state = model(tokens[:, C : 2 * C], state=state).state

            def step(model=model, optimizer=optimizer, state=state, tokens=tokens, C=C) -> None:
                optimizer.zero_grad(set_to_none=True)
                out = model(tokens[:, 2 * C : 3 * C], state=state, targets=tokens[:, 2 * C + 1 :])
                out.loss.backward()
                optimizer.step()

            steps[form] = step
        times = common.interleaved(steps, repeats, warmup=2)
        out[setting] = {form: common.summarize(t) for form, t in times.items()}
    return out


# --------------------------------------------------------------------------- rendering
def _runs(data: dict[str, Any], form: str, setting: str) -> list[dict[str, Any]]:
    return [r for r in data["runs"] if r["variant"] == form and r["setting"] == setting]


def _form(data: dict[str, Any], form: str, settings: list[str]) -> str:
    """The form's name, with † where its runs come from a committed report."""
    sourced = any(r.get("source") for s in settings for r in _runs(data, form, s))
    return f"{form} †" if sourced else form


def _sources(data: dict[str, Any], settings: list[str]) -> list[str]:
    """The footnote for rows taken from committed reports."""
    sources = sorted(
        {r["source"] for r in data["runs"] if r.get("source") and r["setting"] in settings}
    )
    if not sources:
        return []
    return [
        f"† from {', '.join(f'`{s}`' for s in sources)}: the same recipe and seeds, trained "
        "before the density setting existed, i.e. with the paper's form (this sweep did not "
        "train it again; its density figures and cost are not in those reports).",
        "",
    ]


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
        f"Generated by `python experiments/compare_density.py` from `{NAME}.json`. The ∞-former's "
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
                    if not runs:
                        continue
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
            [_form(data, f, sorting_settings)]
            + [
                _cell([r["evals"]["test"]["metrics"]["accuracy"] for r in _runs(data, f, s)])
                for s in sorting_settings
            ]
            for f in forms
            if any(_runs(data, f, s) for s in sorting_settings)
        ]
        lines += [ex.table(head, rows), "", "Recipe: compare_sorting.py's (600 steps).", ""]
        lines += _sources(data, sorting_settings)
    if "books" in settings:
        lines += ["## Books (pg19-mini): test bits per byte (lower is better)", ""]
        rows = [
            [
                _form(data, f, ["books"]),
                _cell([r["evals"]["test"]["metrics"]["bpb"] for r in _runs(data, f, "books")], 4),
            ]
            for f in forms
            if _runs(data, f, "books")
        ]
        lines += [ex.table(["form", "test bits/byte"], rows), ""]
        lines += ["Recipe: compare_lm.py's ∞-former (250 steps, bytes).", ""]
        lines += _sources(data, ["books"])
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
            runs = [r for r in _runs(data, f, s) if r.get("density")]
            if runs:
                rows.append([s, f, *_density_cells(runs, "first"), *_density_cells(runs, "last")])
    lines += [ex.table(head, rows, numeric_from=2), ""]
    lines += ["## Cost per training step", ""]
    timing = data["data"].get("timing", {})
    forms_timed = [f for f in forms if any(f in t for t in timing.values())]
    others = [f for f in forms_timed if f != "paper"]
    head = ["task"] + [f"{f}, ms" for f in forms_timed] + [f"{f} / paper" for f in others]
    rows = []
    for s, t in timing.items():
        ms = {f: t[f]["median_ms"] if f in t else math.nan for f in forms_timed}
        paper = ms.get("paper", math.nan)
        rows.append(
            [s] + [f"{ms[f]:.1f}" for f in forms_timed] + [f"{ms[f] / paper:.2f}×" for f in others]
        )
    lines += [ex.table(head, rows), ""]
    lines += [
        "One training step (forward + backward + AdamW) of one segment over a memory that holds "
        f"two, each task's model and batch, one thread, the forms timed round-robin in one "
        f"process, median of {data['setup'].get('timing_repeats', '?')} rounds.",
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
    parser.add_argument(
        "--only",
        type=str,
        help="run only the jobs FORM:SETTING matching these comma-separated patterns "
        "(e.g. 'narrow:recall/*,normalized:sorting/*'); the report keeps every finished job",
    )
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
    for task in setup.tasks:  # in the order given: the longest first ends the pool sooner
        if task == "recall":
            jobs += recall_jobs(setup, runs_dir)
        elif task == "sorting":
            jobs += sorting_jobs(setup, runs_dir)
        else:
            from inftyformer.data import resolve_corpus_dir

            try:
                jobs += books_jobs(setup, runs_dir, resolve_corpus_dir(args.data_dir))
            except (FileNotFoundError, ValueError) as err:
                echo(f"books skipped: no corpus ({err})")
    store = ex.ResultStore(runs_dir / "results.jsonl", fresh=args.fresh)
    if args.only:
        patterns = [p.strip() for p in args.only.split(",") if p.strip()]
        jobs = [
            j
            for j in jobs
            if store.get(j.key, j.fingerprint) is not None
            or any(fnmatch.fnmatch(f"{j.key[0]}:{j.key[1]}", p) for p in patterns)
        ]
    runs, failed, elapsed = ex.run_jobs(jobs, store, args.workers, fn=run, echo=echo)
    for r in runs:
        r["window"] = next((j.spec.get("window") for j in jobs if j.key[1] == r["setting"]), None)
        if r["window"] is None:
            del r["window"]
    if "paper" in setup.forms and not setup.quick:
        runs += committed_paper_runs(setup, runs)
    echo("timing one training step of each form ...")
    if setup.quick:
        setup.timing_repeats = 2
    timing = time_forms(jobs, setup.forms, setup.timing_repeats)
    result = ex.report(NAME, asdict(setup), {}, {"timing": timing}, runs, args.workers, elapsed)
    ex.write_report(out / f"{NAME}.json", result)
    render(result, out)
    echo(f"done in {elapsed / 60:.1f} min -> {out / f'{NAME}.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    ex.run_main(main)
