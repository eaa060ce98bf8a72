"""What the comparison experiments (`compare_sorting.py`, `compare_lm.py`) share: the model
variants, the memory-budget rule, the parameter matcher, a resumable store of results, a pool of
worker processes that train and evaluate through the library, and the pieces of the reports.

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
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import multiprocessing
import os
import queue
import signal
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import command_line, machine_info

ROOT = Path(__file__).resolve().parents[1]
FORMAT = 2  # layout of the report JSON (format 1: the scripts before this module)


def tiny_model_writer() -> Any:
    """`write_tiny_model` of the tests' fixtures (tests/tiny_pretrained.py), for the --quick runs:
    tiny random model directories, nothing downloaded."""
    tests = str(ROOT / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from tiny_pretrained import write_tiny_model

    return write_tiny_model


def default_base_model() -> str:
    """The pretrained model the comparisons use when no --base-model is given:
    $INFTYFORMER_PRETRAINED, else models/smollm2-135m in the checkout (the README's conversion
    command writes it there; git ignores it), else models/smollm2-135m beside the checkout."""
    if os.environ.get("INFTYFORMER_PRETRAINED"):
        return os.environ["INFTYFORMER_PRETRAINED"]
    inside = ROOT / "models" / "smollm2-135m"
    return str(inside if inside.is_dir() else ROOT.parent / "models" / "smollm2-135m")


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


# --------------------------------------------------------------------------- results store
class ResultStore:
    """`results.jsonl`: one line per finished job, {"key": [variant, setting, seed],
    "fingerprint", "elapsed", "result"}. Only the process that runs the pool writes, one whole
    line at a time, flushed to disk; a line cut short by a kill is ignored. A result is reused
    when its key and fingerprint match, whatever the grid or the number of workers of the
    invocation that made it; results of other recipes stay in the file (one runs directory per
    invocation at a time)."""

    def __init__(self, path: str | Path, fresh: bool = False) -> None:
        self.path = Path(path)
        self.entries: dict[tuple[tuple, str], dict[str, Any]] = {}
        if fresh and self.path.exists():  # start over; the old results stay aside
            self.path.replace(self.path.with_name(self.path.name + ".old"))
        if self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    entry = json.loads(line)
                    self.entries[(tuple(entry["key"]), entry["fingerprint"])] = entry
                except (ValueError, KeyError, TypeError):
                    continue  # cut short by a kill, or written by an older script

    def get(self, key: tuple, fp: str) -> dict[str, Any] | None:
        entry = self.entries.get((tuple(key), fp))
        return None if entry is None else entry["result"]

    def elapsed(self, keys: Iterable[tuple[tuple, str]]) -> float:
        """Wall time of the invocations that produced the results `keys` (cumulative)."""
        return max(
            (self.entries[k].get("elapsed", 0.0) for k in keys if k in self.entries), default=0.0
        )

    def add(self, key: tuple, fp: str, result: dict[str, Any], elapsed: float = 0.0) -> bool:
        """Append a result; False (nothing written) when (key, fingerprint) is there already."""
        if (tuple(key), fp) in self.entries:
            return False
        entry = {"key": list(key), "fingerprint": fp, "elapsed": elapsed, "result": result}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a+", encoding="utf-8") as f:
            f.seek(0, os.SEEK_END)
            if f.tell():  # a line cut short by a kill must not swallow this one
                f.seek(f.tell() - 1)
                if f.read(1) != "\n":
                    f.write("\n")
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.entries[(tuple(key), fp)] = entry
        return True


# --------------------------------------------------------------------------- jobs
@dataclass(frozen=True)
class Job:
    key: tuple  # (variant, setting, seed)
    spec: dict[str, Any]  # model, task, train settings and evaluations: see train_and_evaluate
    fingerprint: str  # hash of everything that determines the result


def make_job(key: tuple, spec: dict[str, Any], runs_dir: Path, stem: str) -> Job:
    """A job whose run directory runs_dir/<stem>-<fingerprint> no other recipe shares."""
    text = json.dumps({**spec, "train": {**spec["train"], "out_dir": None}}, sort_keys=True)
    fp = hashlib.sha256(text.encode()).hexdigest()[:16]
    spec["train"]["out_dir"] = str(Path(runs_dir) / f"{stem}-{fp}")
    return Job(key, spec, fp)


def train_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """Train spec["model"] (of kind spec.get("model_kind", "native"): `inftyformer.models`) on
    spec["task"] with spec["train"] (the library's Trainer). The trainer (model, optimiser) is
    freed before this returns, so that the caller can load the best checkpoint. JSON-able:
    time, best step and valid figure, the training loss and valid headline curves."""
    import torch

    from inftyformer.models import config_from_dict
    from inftyformer.tasks import get_task
    from inftyformer.training import TrainConfig, Trainer, read_metrics

    torch.set_num_threads(1)
    train = TrainConfig.from_dict(spec["train"])
    task_cls = get_task(train.task)
    model = config_from_dict(spec.get("model_kind", "native"), spec["model"])
    start = time.perf_counter()
    trainer = Trainer(
        train, task_cls.Config.from_dict(spec["task"]), model, overwrite=True, echo=lambda _: None
    )
    result = trainer.fit()
    if not result.finished:
        raise RuntimeError(f"training in {train.out_dir} stopped at step {result.step}")
    train_seconds = time.perf_counter() - start
    del trainer  # the evaluations load the best checkpoint: free the model and the optimiser
    gc.collect()
    rows = read_metrics(train.out_dir)

    def curve(split: str, metric: str) -> dict[str, list]:
        mine = [r for r in rows if r["split"] == split and r["metric"] == metric]
        return {"step": [r["step"] for r in mine], "value": [r["value"] for r in mine]}

    return {
        "train_seconds": train_seconds,
        "best_step": result.best_step,
        "best_valid": result.best_metric,
        "train_loss": curve("train", "lm_loss"),  # nats per target token, as logged
        "valid": curve("valid", task_cls.headline().name),
    }


def evaluate_model(spec: dict[str, Any], model: Any) -> dict[str, Any]:
    """Evaluate a loaded `model` (built from spec["model"]) on each of spec["evaluations"] with
    the task of spec["train"]["task"]: one model in memory for all of them."""
    from inftyformer.models import config_from_dict
    from inftyformer.tasks import RunContext, Shard, get_task

    task_cls = get_task(spec["train"]["task"])
    config = config_from_dict(spec.get("model_kind", "native"), spec["model"])
    context = RunContext(batch_size=spec["train"]["batch_size"], seed=spec["train"]["seed"])
    evals = {}
    for name, ev in spec["evaluations"].items():
        start = time.perf_counter()
        settings = {**spec["task"], **(ev.get("task_settings") or {})}
        task = task_cls(task_cls.Config.from_dict(settings), config, context)
        evaluation = task.evaluate(model, ev["split"], ev.get("num_batches"), Shard())
        evals[name] = {
            "metrics": task.eval_metrics(evaluation.sums),
            "details": evaluation.details,
            "seconds": time.perf_counter() - start,
        }
    return evals


def train_and_evaluate(spec: dict[str, Any]) -> dict[str, Any]:
    """`train_spec`, then evaluate the best checkpoint with `evaluate_run` for each of
    spec["evaluations"] ({name: {"split", "num_batches", "task_settings"}}). JSON-able."""
    from inftyformer.training import evaluate_run

    result = train_spec(spec)
    evals = {}
    for name, ev in spec["evaluations"].items():
        start = time.perf_counter()
        metrics, evaluation, _ = evaluate_run(
            spec["train"]["out_dir"], ev["split"], ev.get("num_batches"),
            task_settings=ev.get("task_settings"),
        )  # fmt: skip
        seconds = time.perf_counter() - start
        evals[name] = {"metrics": metrics, "details": evaluation.details, "seconds": seconds}
    return {**result, "evals": evals}


def _worker(fn: Callable, todo: Any, done: Any) -> None:
    if sys.platform.startswith("linux"):  # die with the parent, even after a kill -9
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if hasattr(os, "setpgrp"):  # out of the terminal's process group: Ctrl-C reaches the
        os.setpgrp()  # parent only, which stops every worker (else the trainer stops gently)
    while (item := todo.get()) is not None:
        index, spec = item
        wall, cpu, started = time.perf_counter(), time.process_time(), time.time()
        try:
            result = fn(spec)
        except Exception:  # reported by the parent, which carries on with the other jobs
            done.put((index, traceback.format_exc(), None))
            continue
        result.update(
            seconds=time.perf_counter() - wall,
            cpu_seconds=time.process_time() - cpu,
            started_at=started,
            finished_at=time.time(),
        )
        done.put((index, None, result))


def run_jobs(
    jobs: Sequence[Job],
    store: ResultStore,
    workers: int,
    fn: Callable[[dict[str, Any]], dict[str, Any]] = train_and_evaluate,
    echo: Callable[[str], None] = print,
) -> tuple[list[dict[str, Any]], list[tuple], float]:
    """(records, failed keys, elapsed seconds): every job's record ({variant, setting, seed,
    **result}), reused from `store` or run by `fn` in `workers` processes (one torch thread
    each, in the given order) and stored as each finishes. Ctrl-C or SIGTERM kills the workers
    at once and raises KeyboardInterrupt; finished results stay in the store."""
    keys = [(job.key, job.fingerprint) for job in jobs]
    results = {i: store.get(*k) for i, k in enumerate(keys)}
    todo_ids = [i for i, r in results.items() if r is None]
    if len(todo_ids) < len(jobs):
        echo(f"reusing {len(jobs) - len(todo_ids)} finished runs from {store.path}")
    start = time.perf_counter() - store.elapsed(k for i, k in enumerate(keys) if results[i])
    failed: list[tuple] = []
    if todo_ids:
        os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        # a killed worker leaves its progress-bar lock (a semaphore) for multiprocessing's
        # resource tracker to remove, which it does with a warning that is only noise here
        os.environ.setdefault("PYTHONWARNINGS", "ignore:resource_tracker:UserWarning")
        ctx = multiprocessing.get_context("spawn")
        todo, done = ctx.Queue(), ctx.Queue()
        for i in todo_ids:
            todo.put((i, jobs[i].spec))
        n = max(1, min(workers, len(todo_ids)))
        for _ in range(n):
            todo.put(None)
        procs = [ctx.Process(target=_worker, args=(fn, todo, done), daemon=True) for _ in range(n)]
        previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            ignore = signal.signal(signal.SIGINT, signal.SIG_IGN)  # workers start ignoring it
            for p in procs:
                p.start()
            signal.signal(signal.SIGINT, ignore)
            for _ in todo_ids:
                while True:
                    try:
                        i, error, result = done.get(timeout=1.0)
                        break
                    except queue.Empty:
                        if not any(p.is_alive() for p in procs):
                            raise RuntimeError("the workers died with jobs unfinished") from None
                key = jobs[i].key
                if error is not None:
                    failed.append(key)
                    echo(f"FAILED {key}:\n{error}")
                    continue
                store.add(key, keys[i][1], result, time.perf_counter() - start)
                results[i] = result
                echo(
                    f"done {key} in {result['seconds'] / 60:.1f} min "
                    f"({(time.perf_counter() - start) / 60:.1f} min elapsed)"
                )
        finally:
            signal.signal(signal.SIGTERM, previous)
            for p in procs:
                if p.is_alive():
                    p.kill()
                p.join()
            for q in (todo, done):
                q.cancel_join_thread()
                q.close()
    records = [
        {"variant": job.key[0], "setting": job.key[1], "seed": job.key[2], **results[i]}
        for i, job in enumerate(jobs)
        if results[i] is not None
    ]
    return records, failed, time.perf_counter() - start


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
    out = args.out or (tmp / "docs" if tmp else ROOT / "docs")
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


# --------------------------------------------------------------------------- reports
def report(
    name: str, setup: dict, variants: dict, data: dict, runs: list, workers: int, elapsed: float
) -> dict[str, Any]:
    """The report JSON: everything the Markdown and the plots are rendered from."""
    command = command_line().replace(str(ROOT) + "/", "")
    meta = dict(command=command, machine=machine_info(), workers=workers, elapsed_seconds=elapsed)
    head = dict(format=FORMAT, experiment=name, setup=setup, variants=variants, data=data)
    return head | {"meta": meta, "runs": runs}


def load_report(path: Path) -> dict[str, Any]:
    if not Path(path).exists():
        raise SystemExit(f"no report to render: {path} does not exist")
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if data.get("format") != FORMAT:
        raise SystemExit(
            f"{path} is not in report format {FORMAT}: "
            "convert it once with python benchmarks/_migrate_format1.py"
        )
    return data


def write_report(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def hand_notes(report_md: Path) -> str:
    """The discussion kept by hand beside a generated report: docs/X.md reads docs/X.notes.md."""
    path = report_md.with_suffix(".notes.md")
    if path.exists():
        return path.read_text(encoding="utf-8").strip()
    return f"(no notes yet: write them by hand in `{path.name}`; they are kept verbatim)"


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


def cost_line(data: dict[str, Any]) -> str:
    """What the runs cost and how they were made, from the report alone."""
    meta, runs = data["meta"], data["runs"]
    cpu = [r.get("cpu_seconds") for r in runs]
    text = f"- Cost: {len(runs)} runs, {meta['workers']} in parallel (one thread each)"
    if runs and None not in cpu:
        text = (
            f"- Cost: the {len(runs)} runs took {sum(cpu) / 60:.1f} CPU-minutes (one thread each),"
            f" i.e. {sum(cpu) / 60 / meta['workers']:.1f} min of wall time with {meta['workers']}"
            " in parallel"
        )
    machine = meta.get("machine", {})
    text += f" on {machine.get('cpu', 'a machine')}"
    if machine.get("logical_cpus"):
        text += f" ({machine['logical_cpus']} logical CPUs)"
    text += (
        "; elapsed across the invocations that produced them (finished runs are reused when the "
        f"script is restarted): {meta['elapsed_seconds'] / 60:.1f} min, on a shared machine."
    )
    return text + (f" Made by `{meta['command']}`." if meta.get("command") else "")


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value) of the finite values; NaN if none."""
    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return math.nan, math.nan
    return statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0


def fmt_mean_std(values: Iterable[float], digits: int = 3) -> str:
    """'0.236 ± 0.003', or '–' when there is no value."""
    mean, std = mean_std(values)
    return "–" if math.isnan(mean) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], numeric_from: int = 1) -> str:
    """A Markdown table whose columns from `numeric_from` on are right-aligned."""
    align = ["---" if i < numeric_from else "---:" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])
