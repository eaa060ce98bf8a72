"""Recall across a distance: how far back can each model retrieve a key's value?

Every model is trained once on the recall task (`inftyformer.tasks.recall`: P key→value pairs,
G filler tokens, then the P keys as queries; chance 1/V) with a mix of gaps and loads, then its
best-on-valid checkpoint is evaluated on the test split at every (G, P) of the sweep: G in
multiples of the window W = segment + budget (the span the whole memory budget covers when it
holds plain states), P pairs (the load). Same backbone, segment, memory budget per layer and
parameter count (the FFN width of each model matched to the ∞-former's) for:

    transformer   no memory: attends within its segment only
    xl            short-term memory of B states
    compressive   short-term B/2 + B/2 slots compressed c:1 (covering c·B/2 older states)
    infty         short-term B/2 + N = B/2 basis functions (unbounded span), M = B/2 samples
    infty-sticky  the same with sticky memories

Writes docs/recall.json (everything), docs/recall.md (tables rendered from the JSON, with the
hand-written notes kept) and docs/recall.png (accuracy vs G, one line per model, one panel per
load). Runs go to parallel worker processes, one torch thread each; finished runs are kept in
RUNS_DIR/results.jsonl and reused when the script is run again with the same recipe.

    python benchmarks/compare_recall.py              # the documented experiment
    python benchmarks/compare_recall.py --quick      # a smoke test of the whole pipeline
    python benchmarks/compare_recall.py --render     # redraw docs/recall.{md,png} from the JSON
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import experiment as ex
from _common import kept_notes, machine_info

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RUNS = ROOT / "runs" / "compare_recall"

# --------------------------------------------------------------------------- variants
VARIANTS = {  # name -> (model type, extra settings, label, marker)
    "transformer": ("transformer", {}, "Transformer (no memory)", "x"),
    "xl": ("xl", {}, "Transformer-XL", "s"),
    "compressive": ("compressive", {}, "Compressive Transformer", "^"),
    "infty": ("infty", {"sticky": False}, "∞-former", "o"),
    "infty-sticky": ("infty", {"sticky": True}, "∞-former (sticky memories)", "D"),
}
REFERENCE = "infty"  # keeps the recipe's FFN width; the others are matched to its parameters


@dataclass
class Setup:
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    variants: list[str] = field(default_factory=lambda: list(VARIANTS))
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 2
    d_ff: int = 256  # the ∞-former's; the others get the width matching its parameter count
    segment_len: int = 32
    budget: int = 64  # B: vectors per layer besides the segment
    compression_rate: int = 4
    num_keys: int = 16
    num_values: int = 16
    num_fillers: int = 16
    pairs: list[int] = field(default_factory=lambda: [2, 4, 8])  # loads, trained as a mix
    train_gaps: list[float] = field(default_factory=lambda: [0, 0.5, 1, 2, 4])  # × W
    eval_gaps: list[float] = field(default_factory=lambda: [0, 0.5, 1, 2, 4, 8, 16])  # × W
    steps: int = 4000
    batch_size: int = 16
    lr: float = 2e-3
    warmup_steps: int = 100
    eval_every: int = 500
    eval_batches: int = 4
    sweep_batches: int = 8  # test batches per (G, P) of the sweep
    workers: int = 2

    @property
    def window(self) -> int:
        """W = segment + budget: the span of the budget held as plain states (XL's window)."""
        return self.segment_len + self.budget

    def gaps(self, multiples: list[float]) -> list[int]:
        return [int(round(x * self.window)) for x in multiples]


def model_settings(setup: Setup, variant: str, d_ff: int) -> dict[str, Any]:
    model_type, extra, _, _ = VARIANTS[variant]
    values: dict[str, Any] = dict(
        model_type=model_type,
        vocab_size=setup.num_keys + setup.num_values + setup.num_fillers,
        d_model=setup.d_model,
        n_layers=setup.n_layers,
        n_heads=setup.n_heads,
        d_ff=d_ff,
        segment_len=setup.segment_len,
        compression_rate=setup.compression_rate,
        dropout=0.0,  # fresh examples every step: nothing to overfit
    )
    values.update(ex.memory_settings(model_type, setup.budget))  # the same rule as elsewhere
    values.update(extra)
    return values


def build_config(settings: dict[str, Any]):
    from inftyformer import ModelConfig

    values = dict(settings)
    return ModelConfig.preset("cpu-small", model_type=values.pop("model_type"), **values)


def count_params(settings: dict[str, Any]) -> int:
    from inftyformer import MemoryLM

    return sum(p.numel() for p in MemoryLM(build_config(settings)).parameters())


def match_width(setup: Setup, variant: str, target: int, multiple: int = 8) -> int:
    """The FFN width (a multiple of 8) whose parameter count is closest to `target`."""
    count = lambda w: count_params(model_settings(setup, variant, w))  # noqa: E731
    lo, hi = multiple, 2 * multiple
    while count(hi) < target:
        lo, hi = hi, 2 * hi
    while hi - lo > multiple:
        mid = (lo + hi) // 2 // multiple * multiple
        lo, hi = (mid, hi) if count(mid) < target else (lo, mid)
    return lo if target - count(lo) <= count(hi) - target else hi


def matched_variants(setup: Setup) -> dict[str, dict[str, Any]]:
    target = count_params(model_settings(setup, REFERENCE, setup.d_ff))
    out = {}
    for v in setup.variants:
        width = setup.d_ff if VARIANTS[v][0] == "infty" else match_width(setup, v, target)
        settings = model_settings(setup, v, width)
        out[v] = {
            "d_ff": width,
            "params": count_params(settings),
            "settings": settings,
            "model": build_config(settings).to_dict(),
        }
    return out


def task_settings(setup: Setup, gaps: list[int], pairs: list[int]) -> dict[str, Any]:
    return dict(
        num_pairs=tuple(pairs),
        gap=tuple(gaps),
        num_keys=setup.num_keys,
        num_values=setup.num_values,
        num_fillers=setup.num_fillers,
    )


# --------------------------------------------------------------------------- one job
def _worker_init() -> None:
    # the parent decides when to stop: workers ignore Ctrl-C (the trainer would otherwise stop a
    # run gracefully and the pool would move on to the next one)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run_one(job: dict[str, Any]) -> dict[str, Any]:
    """Train one (variant, seed) and sweep its best checkpoint over every (G, P)."""
    import torch

    torch.set_num_threads(1)
    from inftyformer.tasks import RecallConfig
    from inftyformer.training import TrainConfig, Trainer, evaluate_run

    setup = Setup(**job["setup"])
    train = TrainConfig(
        task="recall",
        steps=setup.steps,
        batch_size=setup.batch_size,
        lr=setup.lr,
        warmup_steps=setup.warmup_steps,
        eval_every=setup.eval_every,
        eval_batches=setup.eval_batches,
        test_batches=0,
        seed=job["seed"],
        threads=1,
        progress=False,
        tensorboard=False,
        log_every=max(1, setup.steps // 20),
        out_dir=job["out_dir"],
    )
    task = RecallConfig(**task_settings(setup, setup.gaps(setup.train_gaps), setup.pairs))
    start, cpu = time.perf_counter(), time.process_time()
    result = Trainer(train, task, build_config(job["settings"]), overwrite=True,
                     echo=lambda s: None).fit()  # fmt: skip
    if result.interrupted:
        raise RuntimeError(f"run {job['out_dir']} was interrupted")
    train_cpu = time.process_time() - cpu
    sweep = []
    for gap in setup.gaps(setup.eval_gaps):
        for pairs in setup.pairs:
            point = {"gap": gap, "num_pairs": pairs}
            metrics, _, _ = evaluate_run(job["out_dir"], "test", setup.sweep_batches,
                                         task_settings=point)  # fmt: skip
            sweep.append({"gap": gap, "pairs": pairs, "accuracy": metrics["accuracy"],
                          "loss": metrics["loss"], "queries": metrics["queries"]})  # fmt: skip
    return {
        "variant": job["variant"],
        "seed": job["seed"],
        "best_step": result.best_step,
        "best_valid_accuracy": result.best_metric,
        "sweep": sweep,
        "train_cpu_seconds": train_cpu,
        "cpu_seconds": time.process_time() - cpu,
        "seconds": time.perf_counter() - start,
    }


# --------------------------------------------------------------------------- results
_GRID = ("workers", "variants", "seeds")


def result_key(setup: Setup, settings: dict[str, Any]) -> str:
    """Everything that determines a run but the grid: a finished (variant, seed) is reused while
    its recipe and settings are unchanged."""
    recipe = {k: v for k, v in asdict(setup).items() if k not in _GRID}
    return json.dumps({"setup": recipe, "settings": settings}, sort_keys=True)


def load_results(path: Path, setup: Setup, keys: dict[str, str]) -> list[dict[str, Any]]:
    results = []
    if path.exists():
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            r = entry["result"]
            if r["variant"] in keys and r["seed"] in setup.seeds:
                if entry["key"] == keys[r["variant"]]:
                    results.append(r)
    return results


def summarize(data: dict[str, Any]) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """variant -> pairs -> gap -> {mean, std, n} of the test accuracy over seeds."""
    table: dict[str, Any] = {}
    for r in data["runs"]:
        for point in r["sweep"]:
            cell = table.setdefault(r["variant"], {}).setdefault(str(point["pairs"]), {})
            cell.setdefault(str(point["gap"]), []).append(point["accuracy"])
    for rows in table.values():
        for cells in rows.values():
            for gap, accs in cells.items():
                cells[gap] = {
                    "mean": statistics.fmean(accs),
                    "std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
                    "n": len(accs),
                }
    return table


# --------------------------------------------------------------------------- report
def windows(setup: dict[str, Any], variant: str) -> dict[str, int | None]:
    """Tokens before a query a model can attend to: directly (its last layer) and through the
    layers (each layer's memory holds states that attended further back)."""
    model_type = VARIANTS[variant][0]
    C, B, L, c = setup["segment_len"], setup["budget"], setup["n_layers"], setup["compression_rate"]
    span = {"transformer": 0, "xl": B, "compressive": B // 2 + c * B // 2, "infty": B // 2}
    direct = C + span[model_type]
    return {"direct": direct, "layers": C + L * span[model_type],
            "unbounded": model_type == "infty"}  # fmt: skip


def render(data: dict[str, Any], out: Path) -> None:
    setup = data["setup"]
    table = summarize(data)
    W = setup["segment_len"] + setup["budget"]
    gaps = [int(round(x * W)) for x in setup["eval_gaps"]]
    pairs = setup["pairs"]
    chance = 1.0 / setup["num_values"]
    variants = [v for v in setup["variants"] if v in table]
    label = {v: VARIANTS[v][2] for v in VARIANTS}

    def cell(v: str, p: int, g: int) -> str:
        s = table.get(v, {}).get(str(p), {}).get(str(g))
        return "–" if s is None else f"{s['mean']:.2f} ± {s['std']:.2f}"

    def gap_head(g: int) -> str:
        return f"G = {g} ({g / W:g}W)"

    lines = [
        "# Recall across a distance: how far back each model retrieves",
        "",
        "Generated by `python benchmarks/compare_recall.py` from `docs/recall.json`. The recall "
        "task (`inftyformer train recall`): P key→value pairs, then G filler tokens, then the P "
        "keys again as queries; test accuracy on the queries, mean ± std over seeds "
        f"{setup['seeds']}. Chance is 1/V = {chance:.3f}. G is given in tokens and in multiples "
        f"of W = segment + memory budget = {setup['segment_len']} + {setup['budget']} = {W} "
        "tokens. Models were trained on G ∈ {"
        + ", ".join(str(int(round(x * W))) for x in setup["train_gaps"])
        + "} and P ∈ {"
        + ", ".join(map(str, pairs))
        + "} (mixed per batch); larger G are "
        "beyond every training distance.",
        "",
    ]
    for p in pairs:
        lines += [
            f"**P = {p} pairs**",
            "",
            "| model | " + " | ".join(gap_head(g) for g in gaps) + " |",
            "|---|" + "---:|" * len(gaps),
        ]
        lines += [f"| {label[v]} | " + " | ".join(cell(v, p, g) for g in gaps) + " |"
                  for v in variants]  # fmt: skip
        lines.append("")
    lines += [
        "## Set-up",
        "",
        "| model | params | FFN width | memory per layer | reach of attention (direct / "
        "through the layers), tokens |",
        "|---|---:|---:|---|---|",
    ]
    for v in variants:
        info = data["variants"][v]
        m = info["model"]
        memory = f"{m['mem_len']} states" if m["mem_len"] else "none"
        if m["model_type"] == "compressive":
            memory += f" + {m['compressed_len']} slots (rate {m['compression_rate']})"
        elif m["model_type"] == "infty":
            memory += (f" + N = {m['num_basis']} basis functions (M = {m['num_samples']}, "
                       f"τ = {m['tau']}, widths {tuple(m['widths'])})")  # fmt: skip
        w = windows(setup, v)
        reach = f"{w['direct']} / {w['layers']}" + (" + long-term (unbounded)" if w["unbounded"]
                                                      else "")  # fmt: skip
        lines.append(f"| {label[v]} | {info['params']:,} | {info['d_ff']} | {memory} | {reach} |")
    cpu = sum(r["cpu_seconds"] for r in data["runs"])
    train_cpu = sum(r["train_cpu_seconds"] for r in data["runs"])
    lines += [
        "",
        f"- Backbone: {setup['n_layers']} layers, d_model {setup['d_model']}, "
        f"{setup['n_heads']} heads, segment {setup['segment_len']}; vocabulary "
        f"{setup['num_keys']} keys + {setup['num_values']} values + {setup['num_fillers']} "
        "fillers; memory budget "
        f"{setup['budget']} vectors per layer besides the segment.",
        f"- Training: {setup['steps']} steps of batch {setup['batch_size']}, AdamW lr "
        f"{setup['lr']} (warm-up {setup['warmup_steps']}, cosine), fresh memory per example, "
        "every block but the last (the queries) without gradient; best-on-valid checkpoint "
        f"(every {setup['eval_every']} steps, {setup['eval_batches']} batches of the training "
        f"mix), evaluated on {setup['sweep_batches']} test batches of {setup['batch_size']} "
        "examples per (G, P).",
        f"- Cost: {cpu / 60:.1f} CPU-minutes in all ({train_cpu / 60:.1f} training, "
        f"{(cpu - train_cpu) / 60:.1f} for the sweep), one thread per run, "
        f"{setup['workers']} runs in parallel on a {data['machine']['logical_cpus']}-core "
        f"{data['machine']['cpu']}; the machine was shared, so wall times are not comparable.",
        "",
        "![accuracy vs distance](recall.png)",
        "",
        "## Notes",
        "",
        kept_notes(out / "recall.md"),
        "",
    ]
    (out / "recall.md").write_text("\n".join(lines))
    plot(table, setup, variants, out / "recall.png")


def plot(table: dict[str, Any], setup: dict[str, Any], variants: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    W = setup["segment_len"] + setup["budget"]
    pairs = setup["pairs"]
    fig, axes = plt.subplots(1, len(pairs), figsize=(4 * len(pairs), 3.4), sharey=True)
    axes = list(axes) if len(pairs) > 1 else [axes]
    for ax, p in zip(axes, pairs, strict=True):
        for v in variants:
            cells = table[v].get(str(p), {})
            gs = sorted(int(g) for g in cells)
            x = [max(g / W, 1 / 8) for g in gs]  # G = 0 drawn at W/8 on the log axis
            ax.errorbar(x, [cells[str(g)]["mean"] for g in gs],
                        yerr=[cells[str(g)]["std"] for g in gs], marker=VARIANTS[v][3],
                        capsize=2, ms=4, label=VARIANTS[v][2])  # fmt: skip
        ax.axhline(1 / setup["num_values"], color="grey", ls=":", lw=1, label="chance")
        ax.axvspan(max(setup["train_gaps"]), max(setup["eval_gaps"]) * 1.2, color="grey",
                   alpha=0.08, lw=0)  # fmt: skip
        ax.set_xscale("log", base=2)
        ticks = [1 / 8] + [x for x in setup["eval_gaps"] if x > 0]
        ax.set_xticks(ticks, ["0"] + [f"{x:g}" for x in ticks[1:]])
        ax.set_xlabel(f"gap G / W (W = {W} tokens)")
        ax.set_title(f"P = {p} pairs")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy on the queries")
    axes[-1].legend(fontsize=7)
    fig.suptitle("Recall across a distance (shaded: beyond the training gaps)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke run (a minute)")
    parser.add_argument("--out", type=Path, help="output directory (default docs/; --quick: tmp)")
    parser.add_argument("--runs-dir", type=Path, help=f"runs (default: {DEFAULT_RUNS})")
    parser.add_argument("--render", action="store_true", help="redraw from OUT/recall.json")
    parser.add_argument("--fresh", action="store_true", help="ignore finished runs")
    parser.add_argument("--steps", type=int, help="training steps per run")
    parser.add_argument("--seeds", type=str, help="comma-separated seeds")
    parser.add_argument("--workers", type=int, help="parallel runs (one thread each)")
    parser.add_argument("--variants", type=str, help=f"subset of {','.join(VARIANTS)}")
    args = parser.parse_args(argv)
    if args.out is None:  # a smoke run never overwrites the documented report
        args.out = Path(tempfile.mkdtemp(prefix="compare_recall_")) if args.quick else ROOT / "docs"
    if args.render:
        render(json.loads((args.out / "recall.json").read_text()), args.out)
        print(f"rendered {args.out / 'recall.md'}")
        return 0

    setup = Setup()
    if args.quick:
        setup = Setup(d_model=16, n_heads=2, d_ff=32, segment_len=16, budget=16, pairs=[2, 4],
                      train_gaps=[0, 1], eval_gaps=[0, 1, 4], steps=6, eval_every=3,
                      eval_batches=1, sweep_batches=1, batch_size=4, warmup_steps=1)  # fmt: skip
    if args.steps:
        setup.steps = args.steps
    if args.seeds:
        setup.seeds = [int(s) for s in args.seeds.split(",")]
    if args.workers:
        setup.workers = args.workers
    if args.variants:
        setup.variants = [v for v in args.variants.split(",") if v]
        unknown = set(setup.variants) - set(VARIANTS)
        if unknown:
            parser.error(f"unknown variants {sorted(unknown)}")

    variants = matched_variants(setup)
    print({v: (i["params"], i["d_ff"]) for v, i in variants.items()}, flush=True)
    runs_dir = args.runs_dir or (
        Path(tempfile.mkdtemp(prefix="compare_recall_")) if args.quick else DEFAULT_RUNS
    )
    runs_dir.mkdir(parents=True, exist_ok=True)
    log = runs_dir / "results.jsonl"
    if args.fresh and log.exists():
        log.unlink()
    keys = {v: result_key(setup, variants[v]["settings"]) for v in setup.variants}
    results = load_results(log, setup, keys)
    if results:
        print(f"reusing {len(results)} finished runs from {log}", flush=True)
    done = {(r["variant"], r["seed"]) for r in results}
    jobs = [
        {
            "setup": asdict(setup),
            "settings": variants[v]["settings"],
            "variant": v,
            "seed": s,
            "out_dir": str(runs_dir / f"{v}-s{s}"),
        }  # fmt: skip
        for s in setup.seeds
        for v in reversed(setup.variants)  # the slowest first
        if (v, s) not in done
    ]
    os.environ.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    start = time.perf_counter()
    pool = multiprocessing.get_context("fork").Pool(setup.workers, initializer=_worker_init)
    try:
        for r in pool.imap_unordered(run_one, jobs):
            results.append(r)
            with open(log, "a") as f:
                f.write(json.dumps({"key": keys[r["variant"]], "result": r}) + "\n")
            best = max(p["accuracy"] for p in r["sweep"])
            print(f"{r['variant']:<13} seed {r['seed']}: best sweep accuracy {best:.3f} "
                  f"({r['cpu_seconds'] / 60:.1f} CPU-min, "
                  f"{(time.perf_counter() - start) / 60:.1f} min elapsed)", flush=True)  # fmt: skip
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()
    order = {v: i for i, v in enumerate(setup.variants)}
    data = {
        "setup": asdict(setup),
        "window": setup.window,
        "variants": variants,
        "machine": machine_info(),
        "runs": sorted(results, key=lambda r: (order[r["variant"]], r["seed"])),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "recall.json").write_text(json.dumps(data, indent=1) + "\n")
    render(data, args.out)
    print(f"done -> {args.out / 'recall.md'}", flush=True)
    return 0


if __name__ == "__main__":
    ex.run_main(main)
