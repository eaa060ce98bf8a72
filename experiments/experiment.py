"""What the comparison experiments (`compare_sorting.py`, `compare_lm.py`, `compare_recall.py`
and the others) share: the model variants, the memory-budget rule, the parameter matcher, a
resumable store of results, a pool of worker processes that train and evaluate through the
library, and the pieces of the reports.

    variants      transformer, xl, compressive, infty, infty-sticky -> model type + settings
    budget B      vectors each layer keeps besides the current segment (see `memory_settings`)
    d_ff          every variant's FFN width is chosen so its parameter count matches the
                  ∞-former's (`match_width`, one rule for every variant)
    job           one (variant, setting, seed): train with `Trainer`, evaluate the best checkpoint
                  with `evaluate_run` (`train_and_evaluate`), in a worker process, one thread
    results.jsonl one line per finished job, keyed by (variant, setting, seed) and the fingerprint
                  of everything that determines it; a rerun reuses what is there
    report        <name>.json holds everything; <name>.md and plots are rendered from it alone,
                  with the hand-kept discussion from <name>.notes.md

The jobs and their pool are `_experiment_runs.py`, the reports' pieces `_experiment_report.py`;
both are re-exported here, so a script needs only `import experiment as ex`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _experiment_report import (  # noqa: F401  (re-exported)
    FORMAT,
    ROOT,
    cost_line,
    fmt_mean_std,
    hand_notes,
    load_report,
    mean_std,
    report,
    table,
    write_report,
)
from _experiment_runs import (  # noqa: F401  (re-exported)
    Job,
    ResultStore,
    evaluate_model,
    make_job,
    run_jobs,
    train_and_evaluate,
    train_spec,
)

from inftyformer._measure import default_base_model  # noqa: F401  (the scripts' name)


def tiny_model_writer() -> Any:
    """`write_tiny_model` of the tests' fixtures (tests/tiny_pretrained.py), for the --quick runs:
    tiny random model directories, nothing downloaded."""
    tests = str(ROOT / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from tiny_pretrained import write_tiny_model

    return write_tiny_model


# --------------------------------------------------------------------------- variants
@dataclass(frozen=True)
class Variant:
    model_type: str
    label: str
    overrides: tuple[tuple[str, Any], ...] = ()
    marker: str = "o"


VARIANTS = {
    "transformer": Variant("transformer", "Transformer (no memory)", marker="x"),
    "xl": Variant("xl", "Transformer-XL", marker="s"),
    "compressive": Variant("compressive", "Compressive Transformer", marker="^"),
    "infty": Variant("infty", "∞-former", (("sticky", False),), marker="o"),
    "infty-sticky": Variant("infty", "∞-former (sticky memories)", (("sticky", True),), "D"),
}
REFERENCE = "infty"  # keeps the recipe's d_ff; the others are matched to its parameter count


def memory_settings(model_type: str, budget: int) -> dict[str, int]:
    """Memory settings that give every model type the same budget B (even) of vectors per layer
    besides the current segment; m = B/2:

        transformer  none (mem_len 0)
        xl           short-term memory B
        compressive  short-term memory m + m compressed slots (they cover c·m older tokens)
        infty        short-term memory m + N = m basis functions (unbounded span), M = m samples
    """
    if not isinstance(budget, int) or budget < 2 or budget % 2:
        raise ValueError(f"the memory budget must be an even int >= 2, got {budget!r}")
    m = budget // 2
    return {
        "transformer": {"mem_len": 0},
        "xl": {"mem_len": budget},
        "compressive": {"mem_len": m, "compressed_len": m},
        "infty": {"mem_len": m, "num_basis": m, "num_samples": m},
    }[model_type]


def memory_vectors(model: dict[str, Any]) -> int:
    """Vectors per layer a model's memory holds besides the current segment (settings dict)."""
    kind = model["model_type"]
    extra = {"compressive": model["compressed_len"], "infty": model["num_basis"]}.get(kind, 0)
    return model["mem_len"] + extra


def model_config(variant: str, base: dict[str, Any], budget: int, d_ff: int):
    """The `ModelConfig` of `variant`: the cpu-small preset, then `base`, the memory budget rule,
    the variant's own settings and `d_ff`."""
    from inftyformer import ModelConfig

    v = VARIANTS[variant]
    values = {**base, **memory_settings(v.model_type, budget), **dict(v.overrides), "d_ff": d_ff}
    return ModelConfig.preset("cpu-small", model_type=v.model_type, **values)


def count_params(config) -> int:
    from inftyformer import MemoryLM

    return sum(p.numel() for p in MemoryLM(config).parameters())


def match_width(count: Callable[[int], int], target: int, multiple: int = 8) -> int:
    """The width w (a multiple of `multiple`) whose count(w) is closest to `target` (ties: the
    smaller w), for any count that does not decrease with w. Bisection over multiples."""
    lo = multiple
    if count(lo) >= target:
        return lo
    hi = 2 * lo
    while count(hi) < target:  # invariant: count(lo) < target <= count(hi)
        lo, hi = hi, 2 * hi
        if hi > 1 << 24:
            raise ValueError(f"no width up to {hi} reaches {target} parameters")
    while hi - lo > multiple:
        mid = (lo + hi) // 2 // multiple * multiple
        lo, hi = (mid, hi) if count(mid) < target else (lo, mid)
    return lo if target - count(lo) <= count(hi) - target else hi


def matched_variants(
    names: Sequence[str], base: dict[str, Any], budget: int, d_ff: int
) -> dict[str, dict[str, Any]]:
    """{variant: {"d_ff", "params", "model": settings}}: the ∞-former keeps `d_ff`, every other
    variant gets the FFN width that brings its parameter count closest to the ∞-former's."""
    target = count_params(model_config(REFERENCE, base, budget, d_ff))
    out = {}
    for name in names:
        width = d_ff
        if name != REFERENCE:
            width = match_width(
                lambda w, n=name: count_params(model_config(n, base, budget, w)), target
            )
        config = model_config(name, base, budget, width).to_dict()
        assert memory_vectors(config) in (0, budget), (name, config)  # the rule holds
        out[name] = {
            "d_ff": width,
            "params": count_params(model_config(name, base, budget, width)),
            "model": config,
        }
    return out


@dataclass
class Recipe:
    """Fields both comparisons share (each script's recipe adds its own)."""

    seeds: list[int] = field(default_factory=lambda: [0, 1])
    variants: list[str] = field(default_factory=list)
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 512  # the ∞-former's; the others are matched to its parameter count
    segment_len: int = 64
    memory_budget: int = 128  # B: vectors per layer besides the current segment
    compression_rate: int = 4
    steps: int = 600
    batch_size: int = 8
    lr: float = 1e-3
    warmup_steps: int = 50
    eval_every: int = 100
    eval_batches: int = 2

    def backbone(self) -> dict[str, Any]:
        names = ("d_model", "n_layers", "n_heads", "segment_len", "compression_rate")
        return {k: getattr(self, k) for k in names}

    def train_settings(self, task: str, seed: int) -> dict[str, Any]:
        """TrainConfig fields of one run (no test at the end: the job evaluates the best
        checkpoint; `make_job` sets out_dir)."""
        names = ("steps", "batch_size", "lr", "warmup_steps", "eval_every", "eval_batches")
        fixed = dict(test_batches=0, threads=1, progress=False, tensorboard=False, out_dir="")
        log_every = max(1, self.steps // 25)
        return dict(task=task, seed=seed, log_every=log_every, **fixed) | {
            k: getattr(self, k) for k in names
        }


# --------------------------------------------------------------------------- the command line
def parser(doc: str, name: str, choices: Sequence[str] = VARIANTS) -> argparse.ArgumentParser:
    """The flags every comparison takes; `choices`: what --variants selects from."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny smoke run of the whole pipeline")
    p.add_argument("--render-only", action="store_true", help=f"re-render from OUT/{name}.json")
    p.add_argument("--out", "--docs-dir", type=Path, help="reports (default docs/; --quick: tmp)")
    p.add_argument("--runs-dir", type=Path, help=f"runs (default runs/compare_{name}/)")
    p.add_argument("--fresh", action="store_true", help="ignore results of earlier invocations")
    p.add_argument("--steps", type=int, help="training steps per run")
    p.add_argument("--seeds", type=str, help="comma-separated seeds")
    p.add_argument("--variants", type=str, help=f"subset of {','.join(choices)}")
    p.add_argument("--workers", type=int, default=2, help="parallel runs (one thread each)")
    return p


def common_overrides(args: argparse.Namespace, choices: Sequence[str]) -> dict[str, Any]:
    """Recipe fields set by the common flags."""
    out: dict[str, Any] = {}
    if args.steps:
        out["steps"] = args.steps
    if args.seeds:
        out["seeds"] = [int(s) for s in args.seeds.split(",") if s.strip()]
    if args.variants:
        out["variants"] = [v.strip() for v in args.variants.split(",") if v.strip()]
        unknown = sorted(set(out["variants"]) - set(choices))
        if unknown:
            raise SystemExit(f"unknown variants {unknown}; choose from {', '.join(choices)}")
    return out


def directories(args: argparse.Namespace, name: str) -> tuple[Path, Path]:
    """(report directory, runs directory) for this invocation."""
    import tempfile

    needed = args.quick and (args.out is None or args.runs_dir is None)
    tmp = Path(tempfile.mkdtemp(prefix=f"compare_{name}_")) if needed else None
    out = args.out or (tmp / "docs" if tmp else ROOT / "docs" / "results")
    runs = args.runs_dir or (tmp / "runs" if tmp else ROOT / "runs" / f"compare_{name}")
    return out, runs


def pretrained_setup(
    args: argparse.Namespace, setup_cls: Any, rows: Sequence[str], tiny_base: Callable[[Path], str]
) -> Any:
    """The settings of a comparison on a pretrained model, from the common flags: `--quick` on a
    tiny random base (`tiny_base(directory)` writes one), else `--base-model` or the default;
    `--steps`; `--variants` picks rows of `rows`. The base model must exist."""
    import tempfile
    from dataclasses import replace

    if args.quick:
        setup = setup_cls.quick(args.base_model or tiny_base(Path(tempfile.mkdtemp()) / "base"))
    else:
        setup = setup_cls(**({"base_model": args.base_model} if args.base_model else {}))
    if args.steps:
        setup = replace(setup, steps=args.steps)
    if args.variants:
        setup = replace(setup, rows=[v.strip() for v in args.variants.split(",") if v.strip()])
    unknown = sorted(set(setup.rows) - set(rows))
    if unknown:
        raise SystemExit(f"unknown rows {unknown}; choose from {', '.join(rows)}")
    if not Path(setup.base_model, "config.json").is_file():
        raise SystemExit(
            f"no model in {setup.base_model}: convert one first with "
            f"inftyformer convert-gguf smollm2 {setup.base_model}"
        )
    return setup


def run_and_report(
    name: str,
    setup: Any,
    jobs: list[Job],
    facts: dict[str, Any],
    args: argparse.Namespace,
    dirs: tuple[Path, Path],
    fn: Callable[[dict[str, Any]], dict[str, Any]],
    render: Callable[[dict[str, Any], Path], None],
) -> None:
    """Run the jobs (reusing finished ones), write OUT/NAME.json and render OUT/NAME.md."""
    from dataclasses import asdict

    out_dir, runs_dir = dirs
    store = ResultStore(runs_dir / "results.jsonl", fresh=args.fresh)
    records, failed, elapsed = run_jobs(jobs, store, args.workers, fn=fn)
    if failed:
        print(f"{len(failed)} rows failed: {failed}", file=sys.stderr)
    data = report(name, asdict(setup), {}, facts, records, args.workers, elapsed)
    write_report(out_dir / f"{name}.json", data)
    render(data, out_dir)
    print(f"wrote {out_dir / name}.md")


def run_main(main: Callable[[], int | None]) -> None:
    """A comparison's `if __name__ == "__main__":` — exit with main()'s code; Ctrl-C stops it
    with a note that finished runs are kept (in the `ResultStore`), exit code 130."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("stopped; finished runs are kept: run the same command again to continue")
        sys.exit(130)


# --------------------------------------------------------------------------- reports
def describe_memory(variants: dict[str, dict[str, Any]]) -> str:
    """One clause per variant saying what its memory holds (from the settings in the report)."""
    parts = []
    for name, v in variants.items():
        m, label = v["model"], VARIANTS[name].label
        c, n, N = m["compression_rate"], m["compressed_len"], m["num_basis"]
        text = {
            "transformer": "none",
            "xl": f"{m['mem_len']} past states",
            "compressive": f"{m['mem_len']} + {n} slots compressed {c}:1 (covering {c * n} tokens)",
            "infty": f"{m['mem_len']} + N = {N} basis functions (unbounded span; widths "
            f"{', '.join(map(str, m['widths']))}, λ {m['ridge_lambda']}, τ {m['tau']}, "
            f"M = {m['num_samples']})",
        }[m["model_type"]]
        if m["model_type"] == "infty" and m["sticky"]:
            same = f"{VARIANTS['infty'].label}: {text}" in parts
            text = "the same, with sticky memories" if same else f"{text}, sticky memories"
        parts.append(f"{label}: {text}")
    return "; ".join(parts)
