"""Long-document language modelling on real books: vanilla transformer vs Transformer-XL vs
Compressive Transformer vs ∞-former (± sticky memories), scaled down to a 2-core CPU.

Every model is trained from scratch on the pg19-mini training books through the library's CLI
(`inftyformer train lm`) with the same backbone, segment length, training budget (tokens) and
about the same number of parameters (each model's FFN width is chosen to match the ∞-former's
count), then evaluated with `inftyformer evaluate` over whole documents streamed with memory:
the test books (a prefix of each, from its first byte, see --test-max-tokens) and WikiText-103
test articles (out of domain). Byte-level tokens: see docs/lm.md for why.

    memory budget 2m vectors per layer besides the current segment:
      transformer  none
      xl           short-term memory 2m
      compressive  short-term memory m + m compressed slots (rate c: they cover c·m tokens)
      infty        short-term memory m + N = m basis functions (unbounded span)

Writes docs/lm.json (everything), docs/lm.md (tables: mean ± std over seeds) and
docs/lm_position_loss.png (mean loss by position in the document). Runs go to --runs-dir; a run
whose results are already there is not redone, so an interrupted comparison can be restarted.
Runs go in parallel worker threads, each driving single-threaded CLI subprocesses. Usage:

    python benchmarks/compare_lm.py               # the documented experiment (~40 min, 2 cores)
    python benchmarks/compare_lm.py --quick       # a smoke test of the whole pipeline
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

VARIANTS = {  # name -> (model_type, extra settings)
    "transformer": ("transformer", {}),
    "xl": ("xl", {}),
    "compressive": ("compressive", {}),
    "infty": ("infty", {"sticky": False}),
    "infty-sticky": ("infty", {"sticky": True}),
}
LABELS = {
    "transformer": "Transformer (no memory)",
    "xl": "Transformer-XL",
    "compressive": "Compressive Transformer",
    "infty": "∞-former",
    "infty-sticky": "∞-former (sticky memories)",
}


@dataclass
class Setup:
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    variants: list[str] = field(default_factory=lambda: list(VARIANTS))
    tokenizer: str = "bytes"
    d_model: int = 128
    n_layers: int = 3
    n_heads: int = 4
    d_ff: int = 512  # the ∞-former's; the others get a width matching its parameter count
    segment_len: int = 256
    memory: int = 256  # m: see the module docstring
    compression_rate: int = 4
    widths: tuple[float, ...] = (0.01, 0.05)
    ridge_lambda: float = 0.5
    tau: float = 0.5
    dropout: float = 0.0
    steps: int = 250
    batch_size: int = 8
    lr: float = 2e-3
    warmup_steps: int = 25
    eval_every: int = 125
    eval_batches: int = 8  # segments per valid book at each periodic check
    test_max_tokens: int | None = 65_536  # prefix of each test book (None: whole books)
    wikitext_docs: int | None = 8  # first WikiText-103 test articles (None: all 62)
    workers: int = 2


def model_settings(setup: Setup, variant: str, d_ff: int | None = None) -> dict[str, Any]:
    model_type, extra = VARIANTS[variant]
    m = setup.memory
    values: dict[str, Any] = dict(
        model_type=model_type,
        d_model=setup.d_model,
        n_layers=setup.n_layers,
        n_heads=setup.n_heads,
        d_ff=d_ff or setup.d_ff,
        dropout=setup.dropout,
        segment_len=setup.segment_len,
        mem_len={"transformer": 0, "xl": 2 * m}.get(model_type, m),
        compression_rate=setup.compression_rate,
        compressed_len=m,
        num_basis=m,
        num_samples=m,
        widths=tuple(setup.widths),
        ridge_lambda=setup.ridge_lambda,
        tau=setup.tau,
    )
    values.update(extra)
    return values


def vocab_size(setup: Setup, data_dir: Path) -> int:
    from inftyformer.training.lm_task import load_text_tokenizer, resolve_corpus_dir

    return load_text_tokenizer(setup.tokenizer, resolve_corpus_dir(data_dir)).vocab_size


def count_params(values: dict[str, Any], vocab: int) -> int:
    from inftyformer.config import ModelConfig
    from inftyformer.model import MemoryLM

    model = MemoryLM(ModelConfig(vocab_size=vocab, **values))
    return sum(p.numel() for p in model.parameters())


def matched_widths(setup: Setup, vocab: int) -> dict[str, tuple[int, int]]:
    """FFN width and parameter count per variant, matching the ∞-former's count (the count is
    linear in d_ff: two evaluations give the slope)."""
    target = count_params(model_settings(setup, "infty"), vocab)
    out = {}
    for variant in setup.variants:
        if VARIANTS[variant][0] == "infty":
            out[variant] = (setup.d_ff, target)
            continue
        p0 = count_params(model_settings(setup, variant, setup.d_ff), vocab)
        p1 = count_params(model_settings(setup, variant, setup.d_ff + 64), vocab)
        slope = (p1 - p0) / 64
        d_ff = max(8, int(round((setup.d_ff + (target - p0) / slope) / 8)) * 8)
        out[variant] = (d_ff, count_params(model_settings(setup, variant, d_ff), vocab))
    return out


# ----------------------------------------------------------------------------- one run
def cli(args: list[str], log: Path) -> float:
    """Run `python -m inftyformer.cli ARGS` single-threaded; seconds taken. Output goes to log."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    start = time.perf_counter()
    with open(log, "a", encoding="utf-8") as f:
        f.write("$ inftyformer " + " ".join(args) + "\n")
        f.flush()
        proc = subprocess.run(
            [sys.executable, "-m", "inftyformer.cli", *args], stdout=f, stderr=subprocess.STDOUT
        )
    if proc.returncode != 0:
        raise RuntimeError(
            f"inftyformer {' '.join(args[:2])} failed ({proc.returncode}); see {log}"
        )
    return time.perf_counter() - start


def run_one(job: dict[str, Any]) -> dict[str, Any]:
    setup = Setup(**job["setup"])
    out = Path(job["out"])
    done = out / "summary.json"
    if done.exists():
        summary = json.loads(done.read_text())
        if "finished_at" not in summary:  # written by an older version of this script
            summary["finished_at"] = done.stat().st_mtime
            busy = summary["train_seconds"] + sum(summary["eval_seconds"].values())
            summary["started_at"] = summary["finished_at"] - busy
        return summary
    out.mkdir(parents=True, exist_ok=True)
    log = out / "log.txt"
    stamp = out / "started_at.txt"  # the first start, also across restarts of the script
    if not stamp.exists():
        stamp.write_text(f"{time.time()}\n")
    started_at = float(stamp.read_text())
    settings = model_settings(setup, job["variant"], job["d_ff"])
    model_type = settings.pop("model_type")
    sets: list[str] = []
    for key, value in settings.items():
        text = ",".join(str(v) for v in value) if isinstance(value, tuple) else str(value)
        sets += ["--set", f"{key}={text}"]
    train_sets = {
        "warmup_steps": setup.warmup_steps,
        "eval_batches": setup.eval_batches,
        "test_batches": 0,
        "log_every": 10,
        "tensorboard": "false",
    }
    for key, value in train_sets.items():
        sets += ["--set", f"{key}={value}"]
    train_seconds = _finished_training(out, setup.steps)
    if train_seconds is None:
        train_seconds = cli(
        ["train", "lm", "--data-dir", job["data_dir"], "--tokenizer", setup.tokenizer,
         "--model", model_type, "--steps", str(setup.steps), "--batch-size",
         str(setup.batch_size), "--lr", str(setup.lr), "--seed", str(job["seed"]),
         "--eval-every", str(setup.eval_every), "--threads", "1", "--no-progress",
         "--overwrite", "-o", str(out / "run"), *sets],
        log,
        )  # fmt: skip
        (out / "train_seconds.txt").write_text(f"{train_seconds}\n")
    evals = {}
    eval_seconds = {}
    test_args = ["--max-tokens", str(setup.test_max_tokens)] if setup.test_max_tokens else []
    wiki_args = ["--max-docs", str(setup.wikitext_docs)] if setup.wikitext_docs else []
    for name, data, extra in (
        ("test", job["data_dir"], test_args),
        ("wikitext", job["wikitext_dir"], wiki_args),
    ):
        if data is None:
            continue
        path = out / f"eval_{name}.json"
        if not path.exists():  # rows: min(training batch, documents), the CLI's default
            eval_seconds[name] = cli(
                ["evaluate", str(out / "run"), "--split", "test", "--data-dir", str(data),
                 "--json", str(path), *extra],
                log,
            )  # fmt: skip
        else:
            eval_seconds[name] = json.loads(path.read_text())["seconds"]
        evals[name] = json.loads(path.read_text())
    metrics = _train_metrics(out / "run")
    summary = {
        "variant": job["variant"],
        "seed": job["seed"],
        "d_ff": job["d_ff"],
        "params": job["params"],
        "train_seconds": train_seconds,
        "eval_seconds": eval_seconds,
        "train_tokens": setup.steps * setup.batch_size * setup.segment_len,
        "started_at": started_at,
        "finished_at": time.time(),
        "final_train_loss": metrics.get("final_train_loss"),
        "valid_ppl": metrics.get("valid_ppl"),
        "evals": {
            k: {key: v[key] for key in EVAL_KEYS if key in v} | {"position": v["position"]}
            for k, v in evals.items()
        },
    }
    done.write_text(json.dumps(summary, indent=1))
    return summary


def _finished_training(out: Path, steps: int) -> float | None:
    """Seconds of a training run that already reached `steps` (None: train it)."""
    manifest, seconds = out / "run" / "last.manifest.json", out / "train_seconds.txt"
    if not (manifest.exists() and seconds.exists()):
        return None
    if json.loads(manifest.read_text()).get("step") != steps:
        return None
    return float(seconds.read_text())


EVAL_KEYS = (
    "num_tokens",
    "num_docs",
    "num_bytes",
    "nll_sum",
    "loss",
    "perplexity",
    "bits_per_byte",
    "seconds",
    "doc_names",
    "doc_tokens",
    "doc_nll",
)


def _train_metrics(run_dir: Path) -> dict[str, float]:
    from inftyformer.training import read_metrics

    rows = read_metrics(run_dir)
    train = [r for r in rows if r["split"] == "train" and r["metric"] == "lm_loss"]
    valid = [r for r in rows if r["split"] == "valid" and r["metric"] == "ppl"]
    tail = [r["value"] for r in train[-5:]]
    return {
        "final_train_loss": sum(tail) / len(tail) if tail else math.nan,
        "valid_ppl": valid[-1]["value"] if valid else math.nan,
    }


# ----------------------------------------------------------------------------- reporting
def mean_std(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if v == v]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def fmt(values: list[float], digits: int = 3) -> str:
    m, s = mean_std(values)
    if m != m:
        return "–"
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def bucket_mean(position: dict[str, list], lo: int, hi: float) -> float:
    """Mean loss (nats) of the tokens at positions in [lo, hi) from the bucketed profile."""
    total = count = 0.0
    for start, stop, n, loss in zip(
        position["start"], position["stop"], position["count"], position["mean_loss"], strict=True
    ):
        if start >= lo and stop <= hi:
            total += n * loss
            count += n
    return total / count if count else math.nan


def train_curve(run_dir: Path, every: int) -> dict[int, float]:
    """Training LM loss (nats) averaged over windows of `every` steps, keyed by the window end."""
    from inftyformer.training import read_metrics

    rows = [r for r in read_metrics(run_dir) if r["split"] == "train" and r["metric"] == "lm_loss"]
    out: dict[int, list[float]] = {}
    for r in rows:
        out.setdefault(math.ceil(r["step"] / every) * every, []).append(r["value"])
    return {k: statistics.fmean(v) for k, v in sorted(out.items())}


def aggregate(runs: list[dict[str, Any]], setup: Setup, runs_dir: Path) -> dict[str, Any]:
    table = {}
    ln2 = math.log(2)
    cut_lo, cut_hi = setup.segment_len, 8 * setup.segment_len
    for variant in setup.variants:
        mine = [r for r in runs if r["variant"] == variant]
        if not mine:
            continue
        row: dict[str, Any] = {
            "label": LABELS[variant],
            "params": mine[0]["params"],
            "d_ff": mine[0]["d_ff"],
            "seeds": [r["seed"] for r in mine],
            "train_minutes": [r["train_seconds"] / 60 for r in mine],
            "train_loss": [r["final_train_loss"] for r in mine],
            "train_curve": [
                train_curve(
                    runs_dir / f"{variant}-seed{r['seed']}" / "run", max(1, setup.steps // 5)
                )
                for r in mine
            ],
        }
        for name in ("test", "wikitext"):
            evals = [r["evals"][name] for r in mine if name in r["evals"]]
            if not evals:
                continue
            row[name] = {
                "ppl": [e["perplexity"] for e in evals],
                "bpb": [e["bits_per_byte"] for e in evals],
                "tokens": evals[0]["num_tokens"],
                "bpb_first_segment": [bucket_mean(e["position"], 0, cut_lo) / ln2 for e in evals],
                "bpb_late": [bucket_mean(e["position"], cut_hi, math.inf) / ln2 for e in evals],
            }
        table[variant] = row
    return table


def profile(runs: list[dict[str, Any]], variant: str, name: str) -> tuple[list, list]:
    """Seed-averaged per-position loss (bits) of a variant: (bucket centres, values)."""
    profiles = [r["evals"][name]["position"] for r in runs if r["variant"] == variant]
    if not profiles:
        return [], []
    starts = profiles[0]["start"]
    xs, ys = [], []
    for i, start in enumerate(starts):
        vals = [p["mean_loss"][i] for p in profiles if p["start"][i] == start]
        stop = profiles[0]["stop"][i]
        xs.append(math.sqrt((start + 1) * stop))  # geometric middle of 1 + position
        ys.append(statistics.fmean(vals) / math.log(2))
    return xs, ys


def plot(runs: list[dict[str, Any]], setup: Setup, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in ("test", "wikitext") if any(n in r["evals"] for r in runs)]
    fig, axes = plt.subplots(1, len(names), figsize=(6.4 * len(names), 4.4), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        for variant in setup.variants:
            xs, ys = profile(runs, variant, name)
            if xs:
                ax.plot(xs, ys, marker="o", markersize=3, label=LABELS[variant])
        ax.set_xscale("log", base=2)
        ax.axvline(setup.segment_len, color="grey", lw=0.8, ls=":")
        ax.set_xlabel("1 + position of the byte in its document (log scale)")
        ax.set_ylabel("mean loss (bits per byte)")
        title = "pg19-mini test books" if name == "test" else "WikiText-103 test (out of domain)"
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(
        f"Loss by position, mean over seeds {setup.seeds} (dotted line: one segment)", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def write_markdown(path: Path, setup: Setup, table: dict[str, Any], meta: dict[str, Any]) -> None:
    from _common import kept_notes

    notes = kept_notes(path)
    s = setup
    test_scope = (
        f"the first {s.test_max_tokens:,} bytes of each of the 3 test books"
        if s.test_max_tokens
        else "the 3 whole test books"
    )
    wiki_scope = (
        f"the first {s.wikitext_docs} articles of wiki.test.tokens, whole"
        if s.wikitext_docs
        else "all 62 articles of wiki.test.tokens"
    )
    lines = [
        "# Long-document language modelling on real books (pg19-mini)",
        "",
        f"Made by `{meta['command']}` in {meta['minutes']:.1f} min on {meta['machine']} "
        f"({s.workers} runs in parallel, one thread each). Raw numbers: `docs/lm.json`.",
        "",
        "## Set-up",
        "",
        f"- Byte-level models (UTF-8 bytes, vocabulary 257), {s.n_layers} layers, "
        f"d_model {s.d_model}, {s.n_heads} heads, segment {s.segment_len} bytes, dropout "
        f"{s.dropout}. Memory budget 2m = {2 * s.memory} vectors per layer: Transformer-XL "
        f"keeps {2 * s.memory} past states; the Compressive Transformer {s.memory} + "
        f"{s.memory} slots compressed {s.compression_rate}:1; the ∞-former {s.memory} + "
        f"N = {s.memory} basis functions (widths {s.widths}, λ {s.ridge_lambda}, "
        f"τ {s.tau}, M = {s.memory}).",
        f"- Equal parameters: the FFN width of each model is chosen so that its parameter count "
        f"matches the ∞-former's (table). Equal budget: {s.steps} steps × {s.batch_size} rows × "
        f"{s.segment_len} bytes = {s.steps * s.batch_size * s.segment_len:,} training bytes "
        f"(≈{s.steps * s.batch_size * s.segment_len / 19.2e6:.1%} of one pass over the 39 "
        f"training books), AdamW lr {s.lr}, {s.warmup_steps} warm-up steps then cosine; "
        f"truncated back-propagation over one segment, memory carried across steps and reset at "
        f"document boundaries. Seeds {s.seeds}.",
        f"- Test: {test_scope} — documents streamed from their first byte with the memory "
        f"carried, every byte scored once (bits per byte = bits per token here). Out of domain: "
        f"{wiki_scope}. Evaluation memory = training memory.",
        "",
        "## Results (mean ± std over seeds)",
        "",
        "| model | params | d_ff | train min | test ppl | test bits/byte | WikiText ppl | "
        "WikiText bits/byte |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in table.values():
        t, w = row.get("test", {}), row.get("wikitext", {})
        lines.append(
            f"| {row['label']} | {row['params']:,} | {row['d_ff']} | "
            f"{statistics.fmean(row['train_minutes']):.1f} | {fmt(t.get('ppl', []))} | "
            f"{fmt(t.get('bpb', []))} | {fmt(w.get('ppl', []))} | {fmt(w.get('bpb', []))} |"
        )
    lines += [
        "",
        f"Where the memory can matter: test bits/byte of the bytes in the first segment of a "
        f"book (positions < {s.segment_len}: no model has any past yet) and of the bytes at "
        f"positions ≥ {8 * s.segment_len:,} (far beyond every short-term window).",
        "",
        f"| model | positions < {s.segment_len} | positions ≥ {8 * s.segment_len:,} |",
        "|---|---:|---:|",
    ]
    for row in table.values():
        t = row.get("test", {})
        lines.append(
            f"| {row['label']} | {fmt(t.get('bpb_first_segment', []))} | "
            f"{fmt(t.get('bpb_late', []))} |"
        )
    steps = sorted({k for row in table.values() for c in row["train_curve"] for k in c})
    lines += [
        "",
        "Training loss (bits per byte, mean of the logged steps in each window, mean over seeds):",
        "",
        "| model | " + " | ".join(f"steps ≤ {k}" for k in steps) + " |",
        "|---|" + "---:|" * len(steps),
    ]
    for row in table.values():
        cells = []
        for k in steps:
            vals = [c[k] / math.log(2) for c in row["train_curve"] if k in c]
            cells.append(f"{statistics.fmean(vals):.2f}" if vals else "–")
        lines.append(f"| {row['label']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Per seed (test bits/byte): "
        + "; ".join(
            f"{row['label']} " + ", ".join(f"{v:.4f}" for v in row.get("test", {}).get("bpb", []))
            for row in table.values()
        )
        + ".",
        "",
        "![loss by position](lm_position_loss.png)",
        "",
        "## What the numbers show",
        "",
        notes,
        "",
    ]
    path.write_text("\n".join(lines), encoding="utf-8")


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=None, help="shared data root or pg19-mini dir")
    parser.add_argument("--wikitext-dir", default=None, help="WikiText-103 eval directory")
    parser.add_argument("--runs-dir", default=str(ROOT / "runs" / "compare_lm"))
    parser.add_argument("--docs-dir", default=str(ROOT / "docs"))
    parser.add_argument("--seeds", default=None, help="comma-separated, e.g. 0,1")
    parser.add_argument("--variants", default=None, help=f"subset of {','.join(VARIANTS)}")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="tiny smoke test of the pipeline")
    args = parser.parse_args(argv)

    from inftyformer.tasks import resolve_data_dir

    setup = Setup()
    if args.quick:
        setup = Setup(
            seeds=[0],
            d_model=32,
            n_layers=1,
            n_heads=2,
            d_ff=64,
            segment_len=32,
            memory=32,
            steps=4,
            batch_size=2,
            eval_every=2,
            eval_batches=2,
            warmup_steps=1,
            test_max_tokens=256,
            wikitext_docs=2,
        )
    if args.seeds:
        setup.seeds = [int(s) for s in args.seeds.split(",")]
    if args.variants:
        setup.variants = [v.strip() for v in args.variants.split(",")]
        unknown = set(setup.variants) - set(VARIANTS)
        if unknown:
            parser.error(f"unknown variants {sorted(unknown)}")
    if args.steps:
        setup.steps = args.steps
    if args.workers:
        setup.workers = args.workers

    root = resolve_data_dir(args.data_dir)
    corpus_dir = root / "pg19-mini" if (root / "pg19-mini").is_dir() else root
    wiki = Path(args.wikitext_dir) if args.wikitext_dir else root / "wikitext103-eval"
    wikitext_dir = str(wiki) if wiki.is_dir() else None
    runs_dir = Path(args.runs_dir) / ("quick" if args.quick else "full")
    docs = Path(args.docs_dir)
    if args.quick:
        docs = runs_dir / "docs"
    docs.mkdir(parents=True, exist_ok=True)

    import torch

    torch.set_num_threads(1)
    vocab = vocab_size(setup, corpus_dir)
    widths = matched_widths(setup, vocab)
    for variant, (d_ff, params) in widths.items():
        print(f"{variant:<13} d_ff {d_ff:>5}  {params:>10,} parameters", flush=True)

    jobs = [
        {
            "setup": asdict(setup),
            "variant": variant,
            "seed": seed,
            "d_ff": widths[variant][0],
            "params": widths[variant][1],
            "data_dir": str(corpus_dir),
            "wikitext_dir": wikitext_dir,
            "out": str(runs_dir / f"{variant}-seed{seed}"),
        }
        for seed in setup.seeds
        for variant in setup.variants
    ]
    # the slow models first, so the two workers finish at about the same time
    order = {"compressive": 0, "infty-sticky": 1, "infty": 2, "xl": 3, "transformer": 4}
    jobs.sort(key=lambda j: (order.get(j["variant"], 9), j["seed"]))
    start = time.perf_counter()
    runs: list[dict[str, Any]] = []
    with ThreadPoolExecutor(max_workers=setup.workers) as pool:
        futures = {pool.submit(run_one, job): job for job in jobs}
        for future, job in futures.items():
            try:
                summary = future.result()
            except Exception as err:  # noqa: BLE001 - report and keep the other runs
                print(f"FAILED {job['variant']} seed {job['seed']}: {err}", flush=True)
                continue
            runs.append(summary)
            test = summary["evals"].get("test", {})
            print(
                f"{job['variant']:<13} seed {job['seed']}: test bpb "
                f"{test.get('bits_per_byte', math.nan):.4f}, ppl {test.get('perplexity', 0):.3f} "
                f"({summary['train_seconds'] / 60:.1f} min training)",
                flush=True,
            )
    minutes = (time.perf_counter() - start) / 60
    if runs:  # wall-clock span of the runs, also when some were done by an earlier invocation
        span = max(r["finished_at"] for r in runs) - min(r["started_at"] for r in runs)
        minutes = max(minutes, span / 60)

    from _common import command_line, machine_info

    info = machine_info()
    meta = {
        "command": command_line().replace(str(ROOT) + "/", ""),
        "minutes": minutes,
        "machine": f"{info['cpu']}, {info['logical_cpus']} logical CPUs",
        "machine_info": info,
    }
    table = aggregate(runs, setup, runs_dir)
    (docs / "lm.json").write_text(
        json.dumps({"setup": asdict(setup), "meta": meta, "table": table, "runs": runs}, indent=1)
    )
    if runs:
        plot(runs, setup, docs / "lm_position_loss.png")
    write_markdown(docs / "lm.md", setup, table, meta)
    print(f"wrote {docs / 'lm.md'}, {docs / 'lm.json'}, {docs / 'lm_position_loss.png'} "
          f"in {minutes:.1f} min", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
