"""Recall across a distance: how far back can each model retrieve a key's value?

Every model is trained once on the recall task (`inftyformer.tasks.recall`: P key→value pairs,
G filler tokens, then the P keys as queries; chance 1/V) with a mix of gaps and loads, then its
best-on-valid checkpoint is evaluated on the test split at every (G, P) of the sweep: G in
multiples of the window W = segment + budget (the span the whole memory budget covers when it
holds plain states), P pairs (the load). Same backbone, segment, memory budget per layer
(`experiment.memory_settings`) and parameter count (each model's FFN width matched to the
∞-former's) for:

    transformer   no memory: attends within its segment only
    xl            short-term memory of B states
    compressive   short-term B/2 + B/2 slots compressed c:1 (covering c·B/2 older states)
    infty         short-term B/2 + N = B/2 basis functions (unbounded span), M = B/2 samples
    infty-sticky  the same with sticky memories

The runs go through the comparisons' shared module (`experiment.py`: worker pool, resumable
results in RUNS_DIR/results.jsonl). Writes OUT/recall.json (everything), and renders from it
alone OUT/recall.md (tables, with the discussion kept by hand in OUT/recall.notes.md) and
OUT/recall.png (accuracy vs G, one line per model, one panel per load).

    python experiments/compare_recall.py                  # the documented experiment
    python experiments/compare_recall.py --quick          # a smoke test of the whole pipeline
    python experiments/compare_recall.py --render-only    # redraw docs/results/recall.{md,png}
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import experiment as ex

from inftyformer._measure import pyplot

NAME = "recall"
TRAINED_ON = "mix"  # every run trains on the mix of gaps and loads: the jobs' setting


@dataclass
class Setup(ex.Recipe):
    variants: list[str] = field(default_factory=lambda: list(ex.VARIANTS))
    d_model: int = 64
    n_heads: int = 2
    d_ff: int = 256  # the ∞-former's; the others get the width matching its parameter count
    segment_len: int = 32
    memory_budget: int = 64  # B: vectors per layer besides the segment
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

    @classmethod
    def quick(cls) -> Setup:
        return cls(d_model=16, d_ff=32, segment_len=16, memory_budget=16, pairs=[2, 4],
                   train_gaps=[0, 1], eval_gaps=[0, 1, 4], steps=6, eval_every=3,
                   eval_batches=1, sweep_batches=1, batch_size=4, warmup_steps=1)  # fmt: skip

    @property
    def window(self) -> int:
        """W = segment + budget: the span of the budget held as plain states (XL's window)."""
        return self.segment_len + self.memory_budget

    def gaps(self, multiples: list[float]) -> list[int]:
        return [int(round(x * self.window)) for x in multiples]

    def base(self) -> dict[str, Any]:
        """The model settings every variant shares (`experiment.model_config`'s `base`)."""
        vocab = self.num_keys + self.num_values + self.num_fillers
        return {**self.backbone(), "vocab_size": vocab, "dropout": 0.0}  # fresh examples


def matched_variants(setup: Setup) -> dict[str, dict[str, Any]]:
    """{variant: {"d_ff", "params", "model"}} of `setup`'s variants (`experiment.py`'s rule)."""
    return ex.matched_variants(setup.variants, setup.base(), setup.memory_budget, setup.d_ff)


def task_settings(setup: Setup, gaps: list[int], pairs: list[int]) -> dict[str, Any]:
    return dict(
        num_pairs=tuple(pairs),
        gap=tuple(gaps),
        num_keys=setup.num_keys,
        num_values=setup.num_values,
        num_fillers=setup.num_fillers,
    )


def point(gap: int, pairs: int) -> str:
    """The name of the sweep's evaluation at (G, P)."""
    return f"G{gap}-P{pairs}"


def jobs(setup: Setup, variants: dict[str, dict], runs_dir: Path) -> list[ex.Job]:
    """One job per (variant, seed), the slowest variants first: train on the mix, then
    evaluate the best checkpoint at every (G, P) of the sweep."""
    evaluations = {
        point(g, p): {
            "split": "test",
            "num_batches": setup.sweep_batches,
            "task_settings": {"gap": g, "num_pairs": p},
        }
        for g in setup.gaps(setup.eval_gaps)
        for p in setup.pairs
    }
    task = task_settings(setup, setup.gaps(setup.train_gaps), setup.pairs)
    out = []
    for seed in setup.seeds:
        for v in reversed(setup.variants):
            spec = {
                "model": variants[v]["model"],
                "task": task,
                "train": setup.train_settings(NAME, seed),
                "evaluations": evaluations,
            }
            out.append(ex.make_job((v, TRAINED_ON, seed), spec, runs_dir, f"{v}-s{seed}"))
    return out


# --------------------------------------------------------------------------- results
def summarize(data: dict[str, Any]) -> dict[str, dict[str, dict[str, list[float]]]]:
    """variant -> pairs -> gap -> [test accuracy per seed]."""
    s = data["setup"]
    window = s["segment_len"] + s["memory_budget"]
    gaps = [int(round(x * window)) for x in s["eval_gaps"]]
    table: dict[str, Any] = {}
    for r in data["runs"]:
        for p in s["pairs"]:
            for g in gaps:
                ev = r["evals"].get(point(g, p))
                if ev is not None:
                    cells = table.setdefault(r["variant"], {}).setdefault(str(p), {})
                    cells.setdefault(str(g), []).append(ev["metrics"]["accuracy"])
    return table


def windows(setup: dict[str, Any], variant: str) -> dict[str, int | bool]:
    """Tokens before a query a model can attend to: directly (its last layer) and through the
    layers (each layer's memory holds states that attended further back)."""
    model_type = ex.VARIANTS[variant].model_type
    C, B, L = setup["segment_len"], setup["memory_budget"], setup["n_layers"]
    c = setup["compression_rate"]
    span = {"transformer": 0, "xl": B, "compressive": B // 2 + c * B // 2, "infty": B // 2}
    direct = C + span[model_type]
    return {"direct": direct, "layers": C + L * span[model_type],
            "unbounded": model_type == "infty"}  # fmt: skip


# --------------------------------------------------------------------------- report
def render(data: dict[str, Any], out: Path) -> None:
    setup = data["setup"]
    table = summarize(data)
    W = setup["segment_len"] + setup["memory_budget"]
    gaps = [int(round(x * W)) for x in setup["eval_gaps"]]
    pairs = setup["pairs"]
    chance = data["data"]["chance"]
    variants = [v for v in setup["variants"] if v in table]
    label = {v: ex.VARIANTS[v].label for v in ex.VARIANTS}

    def cell(v: str, p: int, g: int) -> str:
        return ex.fmt_mean_std(table.get(v, {}).get(str(p), {}).get(str(g), []), digits=2)

    def gap_head(g: int) -> str:
        return f"G = {g} ({g / W:g}W)"

    lines = [
        "# Recall across a distance: how far back each model retrieves",
        "",
        f"Generated by `python experiments/compare_recall.py` from `{NAME}.json`. The recall "
        "task (`inftyformer train recall`): P key→value pairs, then G filler tokens, then the P "
        "keys again as queries; test accuracy on the queries, mean ± std over seeds "
        f"{setup['seeds']}. Chance is 1/V = {chance:.3f}. G is given in tokens and in multiples "
        f"of W = segment + memory budget = {setup['segment_len']} + {setup['memory_budget']} = "
        f"{W} tokens. Models were trained on G ∈ {{"
        + ", ".join(str(int(round(x * W))) for x in setup["train_gaps"])
        + "} and P ∈ {"
        + ", ".join(map(str, pairs))
        + "} (mixed per batch); larger G are beyond every training distance.",
        "",
    ]
    for p in pairs:
        rows = [[label[v]] + [cell(v, p, g) for g in gaps] for v in variants]
        lines += [f"**P = {p} pairs**", "", ex.table(["model"] + [gap_head(g) for g in gaps],
                                                     rows), ""]  # fmt: skip
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
        reach = f"{w['direct']} / {w['layers']}"
        reach += " + long-term (unbounded)" if w["unbounded"] else ""
        lines.append(f"| {label[v]} | {info['params']:,} | {info['d_ff']} | {memory} | {reach} |")
    lines += [
        "",
        f"- Backbone: {setup['n_layers']} layers, d_model {setup['d_model']}, "
        f"{setup['n_heads']} heads, segment {setup['segment_len']}; vocabulary "
        f"{setup['num_keys']} keys + {setup['num_values']} values + {setup['num_fillers']} "
        f"fillers; memory budget {setup['memory_budget']} vectors per layer besides the segment.",
        f"- Training: {setup['steps']} steps of batch {setup['batch_size']}, AdamW lr "
        f"{setup['lr']} (warm-up {setup['warmup_steps']}, cosine), fresh memory per example, "
        "every block but the last (the queries) without gradient; best-on-valid checkpoint "
        f"(every {setup['eval_every']} steps, {setup['eval_batches']} batches of the training "
        f"mix), evaluated on {setup['sweep_batches']} test batches of {setup['batch_size']} "
        "examples per (G, P).",
        ex.cost_line(data),
        "",
        f"![accuracy vs distance]({NAME}.png)",
        "",
        "## Notes",
        "",
        ex.hand_notes(out / f"{NAME}.md"),
        "",
    ]
    (out / f"{NAME}.md").write_text("\n".join(lines), encoding="utf-8")
    plot(table, setup, variants, out / f"{NAME}.png")


def plot(table: dict[str, Any], setup: dict[str, Any], variants: list[str], path: Path) -> None:
    plt = pyplot()
    W = setup["segment_len"] + setup["memory_budget"]
    pairs = setup["pairs"]
    fig, axes = plt.subplots(1, len(pairs), figsize=(4 * len(pairs), 3.4), sharey=True)
    axes = list(axes) if len(pairs) > 1 else [axes]
    for ax, p in zip(axes, pairs, strict=True):
        for v in variants:
            cells = table[v].get(str(p), {})
            gs = sorted(int(g) for g in cells)
            x = [max(g / W, 1 / 8) for g in gs]  # G = 0 drawn at W/8 on the log axis
            stats = [ex.mean_std(cells[str(g)]) for g in gs]
            ax.errorbar(x, [m for m, _ in stats], yerr=[s for _, s in stats],
                        marker=ex.VARIANTS[v].marker, capsize=2, ms=4,
                        label=ex.VARIANTS[v].label)  # fmt: skip
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
def main(argv: list[str] | None = None, echo: Callable[[str], None] = print) -> int:
    args = ex.parser(__doc__, NAME).parse_args(argv)
    out, runs_dir = ex.directories(args, NAME)
    if args.render_only:
        render(ex.load_report(out / f"{NAME}.json"), out)
        echo(f"rendered {out / f'{NAME}.md'} and {out / f'{NAME}.png'}")
        return 0

    setup = Setup.quick() if args.quick else Setup()
    setup = replace(setup, **ex.common_overrides(args, list(ex.VARIANTS)))
    variants = matched_variants(setup)
    for v, info in variants.items():
        echo(f"{v:<13} d_ff {info['d_ff']:>5}  {info['params']:>10,} parameters")

    store = ex.ResultStore(runs_dir / "results.jsonl", fresh=args.fresh)
    runs, failed, elapsed = ex.run_jobs(jobs(setup, variants, runs_dir), store, args.workers)
    order = {v: i for i, v in enumerate(setup.variants)}
    runs.sort(key=lambda r: (order[r["variant"]], r["seed"]))
    facts = {"chance": 1.0 / setup.num_values, "window": setup.window}
    result = ex.report(NAME, asdict(setup), variants, facts, runs, args.workers, elapsed)
    ex.write_report(out / f"{NAME}.json", result)
    render(result, out)
    echo(f"done in {elapsed / 60:.1f} min -> {out / f'{NAME}.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    ex.run_main(main)
