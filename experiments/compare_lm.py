"""Long-document language modelling on real books: vanilla transformer vs Transformer-XL vs
Compressive Transformer vs ∞-former (± sticky memories), scaled down to a 2-core CPU.

Every model is trained from scratch on the pg19-mini training books with the library's trainer
(the `lm` task), with the same backbone, segment length, training budget (tokens), memory budget
(`experiment.memory_settings`) and about the same number of parameters (each model's FFN width
matches the ∞-former's count). Its best-on-valid checkpoint is evaluated with `evaluate_run` over
whole documents streamed with memory: the test books (a prefix of each, from its first byte) and
WikiText-103 test articles (out of domain; skipped when that directory is absent). Byte-level
tokens by default. Writes OUT/lm.json (everything), and renders from it alone OUT/lm.md (mean ±
std over seeds, with the discussion kept by hand in OUT/lm.notes.md) and OUT/lm_position_loss.png
(mean loss by position in the document).

    python experiments/compare_lm.py                 # the documented experiment (~1.5 h, 2 cores)
    python experiments/compare_lm.py --quick         # smoke run of the pipeline (~1 min)
    python experiments/compare_lm.py --render-only   # re-render docs/ from docs/results/lm.json

Data: --data-dir (a data root holding pg19-mini/ and wikitext103-eval/, or the corpus itself),
else $INFTYFORMER_DATA, else ../shared/data; without data the script says so and stops.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import experiment as ex

from inftyformer._measure import pyplot

NAME = "lm"
CHOICES = ("transformer", "xl", "compressive", "infty", "infty-sticky")
SLOW_FIRST = ("compressive", "infty-sticky", "infty", "xl", "transformer")
LN2 = math.log(2)


@dataclass
class Setup(ex.Recipe):
    variants: list[str] = field(default_factory=lambda: list(CHOICES))
    tokenizer: str = "bytes"
    n_layers: int = 3
    segment_len: int = 256
    memory_budget: int = 512
    widths: tuple[float, ...] = (0.01, 0.05)
    ridge_lambda: float = 0.5
    tau: float = 0.5
    dropout: float = 0.0
    steps: int = 250
    lr: float = 2e-3
    warmup_steps: int = 25
    eval_every: int = 125
    eval_batches: int = 8  # segments per valid book at each periodic check
    test_max_tokens: int | None = 65_536  # prefix of each test book (None: whole books)
    wikitext_docs: int | None = 8  # first WikiText-103 test articles (None: all)

    @classmethod
    def quick(cls) -> Setup:
        return cls(
            seeds=[0],
            d_model=32,
            n_layers=1,
            n_heads=2,
            d_ff=64,
            segment_len=32,
            memory_budget=64,
            steps=4,
            batch_size=2,
            warmup_steps=1,
            eval_every=2,
            eval_batches=2,
            test_max_tokens=256,
            wikitext_docs=2,
        )


def data_facts(setup: Setup, corpus: Path, wikitext: Path | None) -> dict[str, Any]:
    """What the report says about the data, read through the library (cached tokenisation)."""
    from inftyformer.data import load_split, load_tokenizer

    tokenizer = load_tokenizer(setup.tokenizer, corpus)
    train, test = (load_split(corpus, s, tokenizer) for s in ("train", "test"))
    facts = {
        "corpus": corpus.name,
        "vocab_size": tokenizer.vocab_size,
        "train_docs": train.num_docs,
        "train_tokens": train.num_tokens,
        "train_bytes": train.total_bytes,
        "test_docs": test.num_docs,
    }
    if wikitext is not None:
        facts["wikitext_test_docs"] = load_split(wikitext, "test", tokenizer).num_docs
    return facts


def jobs(setup: Setup, variants: dict, corpus: Path, wikitext: Path | None, runs_dir: Path):
    """The slow models first, so that the workers finish at about the same time."""
    evaluations: dict[str, Any] = {
        "test": {"split": "test", "task_settings": {"max_tokens": setup.test_max_tokens}}
    }
    if wikitext is not None:
        wiki = {"data_dir": str(wikitext), "max_docs": setup.wikitext_docs}
        evaluations["wikitext"] = {"split": "test", "task_settings": wiki}
    out = []
    for v in sorted(setup.variants, key=SLOW_FIRST.index):
        for seed in setup.seeds:
            spec = {
                "model": variants[v]["model"],
                "task": {"data_dir": str(corpus), "tokenizer": setup.tokenizer},
                "train": setup.train_settings(NAME, seed),
                "evaluations": evaluations,
            }
            out.append(ex.make_job((v, None, seed), spec, runs_dir, f"{v}-s{seed}"))
    return out


# --------------------------------------------------------------------------- rendering
def bucket_mean(position: dict[str, list], lo: float, hi: float) -> float:
    """Mean loss (nats) of the tokens at positions in [lo, hi) from the bucketed profile."""
    total = count = 0.0
    for start, stop, n, loss in zip(
        position["start"], position["stop"], position["count"], position["mean_loss"], strict=True
    ):
        if start >= lo and stop <= hi:
            total, count = total + n * loss, count + n
    return total / count if count else math.nan


def per_variant(data: dict[str, Any], get: Callable[[dict], float]) -> dict[str, list[float]]:
    """{variant: [get(run) per seed]} in the recipe's order (runs lacking the value skipped)."""
    out: dict[str, list[float]] = {v: [] for v in data["setup"]["variants"]}
    for r in data["runs"]:
        try:
            out[r["variant"]].append(get(r))
        except KeyError:
            continue
    return out


def train_curve(run: dict[str, Any], every: int) -> dict[int, float]:
    """Logged training loss (nats) averaged over windows of `every` steps, by window end."""
    windows: dict[int, list[float]] = {}
    for step, value in zip(run["train_loss"]["step"], run["train_loss"]["value"], strict=True):
        windows.setdefault(math.ceil(step / every) * every, []).append(value)
    return {k: statistics.fmean(v) for k, v in sorted(windows.items())}


def render(data: dict[str, Any], out: Path) -> None:
    s, variants, facts = data["setup"], data["variants"], data["data"]
    seg, late = s["segment_len"], 8 * s["segment_len"]
    unit = "bytes" if s["tokenizer"] == "bytes" else "tokens"  # what one token is
    names = [n for n in ("test", "wikitext") if any(n in r["evals"] for r in data["runs"])]
    label = {v: ex.VARIANTS[v].label for v in s["variants"]}

    def metric(name: str, key: str) -> dict[str, list[float]]:
        return per_variant(data, lambda r: r["evals"][name]["metrics"][key])

    def position(name: str, lo: float, hi: float) -> dict[str, list[float]]:
        """Bits per token of the positions in [lo, hi), per seed."""
        profile = lambda r: r["evals"][name]["details"]["position"]  # noqa: E731
        return per_variant(data, lambda r: bucket_mean(profile(r), lo, hi) / LN2)

    minutes = per_variant(data, lambda r: r["train_seconds"] / 60)
    headers, columns = ["model", "params", "d_ff", "train min"], []
    for name in names:
        title = "test" if name == "test" else "WikiText"
        headers += [f"{title} ppl", f"{title} bits/byte"]
        columns += [metric(name, "ppl"), metric(name, "bpb")]
    rows = [
        [label[v], f"{variants[v]['params']:,}", variants[v]["d_ff"]]
        + [f"{statistics.fmean(minutes[v]):.1f}" if minutes[v] else "–"]
        + [ex.fmt_mean_std(col[v]) for col in columns]
        for v in s["variants"]
    ]
    tokens = s["steps"] * s["batch_size"] * seg
    test_scope = (
        f"the first {s['test_max_tokens']:,} {unit} of each of the {facts['test_docs']} test books"
        if s["test_max_tokens"]
        else f"the {facts['test_docs']} whole test books"
    )
    wiki_scope = (
        f"the first {s['wikitext_docs']} articles of wiki.test.tokens, whole"
        if s["wikitext_docs"]
        else f"all {facts.get('wikitext_test_docs')} articles of wiki.test.tokens"
    )
    bytes_note = " (bits per byte = bits per token here)" if s["tokenizer"] == "bytes" else ""
    lines = [
        f"# Long-document language modelling on real books ({facts['corpus']})",
        "",
        "Generated by `python experiments/compare_lm.py` from `lm.json`.",
        "",
        "## Set-up",
        "",
        f"- Tokenizer {s['tokenizer']} (vocabulary {facts['vocab_size']}), {s['n_layers']} "
        f"layers, d_model {s['d_model']}, {s['n_heads']} heads, segment {seg} {unit}, dropout "
        f"{s['dropout']}. Memory budget {s['memory_budget']} vectors per layer: "
        f"{ex.describe_memory(variants)}.",
        f"- Equal parameters: the FFN width of each model is chosen so that its parameter count "
        f"matches the ∞-former's (table). Equal budget: {s['steps']} steps × {s['batch_size']} "
        f"rows × {seg} {unit} = {tokens:,} training {unit} (≈{tokens / facts['train_tokens']:.1%}"
        f" of one pass over the {facts['train_docs']} training books), AdamW lr {s['lr']}, "
        f"{s['warmup_steps']} warm-up steps then cosine; truncated back-propagation over one "
        f"segment, memory carried across steps and reset at document boundaries. Seeds "
        f"{s['seeds']}.",
        f"- Test: {test_scope} — documents streamed from their start with the memory "
        f"carried, every token scored once{bytes_note}. Out of domain: {wiki_scope}. Evaluation "
        "memory = training memory.",
        ex.cost_line(data),
        "",
        "## Results (mean ± std over seeds)",
        "",
        ex.table(headers, rows),
    ]
    if "test" in names:
        first, far = position("test", 0, seg), position("test", late, math.inf)
        lines += [
            "",
            f"Where the memory can matter: test bits/byte of the {unit} in the first segment of a "
            f"book (positions < {seg}: no model has any past yet) and of the {unit} at positions ≥ "
            f"{late:,} (far beyond every short-term window).",
            "",
            ex.table(
                ["model", f"positions < {seg}", f"positions ≥ {late:,}"],
                [
                    [label[v], ex.fmt_mean_std(first[v]), ex.fmt_mean_std(far[v])]
                    for v in s["variants"]
                ],
            ),
        ]
    every = max(1, s["steps"] // 5)
    curves = per_variant(data, lambda r: train_curve(r, every))
    steps = sorted({k for c in curves.values() for curve in c for k in curve})

    def window_mean(v: str, k: int) -> str:
        vals = [c[k] / LN2 for c in curves[v] if k in c]
        return f"{statistics.fmean(vals):.2f}" if vals else "–"

    lines += [
        "",
        f"Training loss (bits per {unit[:-1]}, mean of the logged steps in each window, mean "
        "over seeds):",
        "",
        ex.table(
            ["model"] + [f"steps ≤ {k}" for k in steps],
            [[label[v]] + [window_mean(v, k) for k in steps] for v in s["variants"]],
        ),
    ]
    if "test" in names:
        bpb = metric("test", "bpb")
        lines += [
            "",
            "Per seed (test bits/byte): "
            + "; ".join(
                f"{label[v]} " + ", ".join(f"{x:.4f}" for x in bpb[v]) for v in s["variants"]
            )
            + ".",
        ]
    lines += [
        "",
        f"![loss by position]({NAME}_position_loss.png)",
        "",
        "## What the numbers show",
        "",
        ex.hand_notes(out / f"{NAME}.md"),
        "",
    ]
    (out / f"{NAME}.md").write_text("\n".join(lines), encoding="utf-8")
    if names:
        plot(data, names, out / f"{NAME}_position_loss.png")


def profile(data: dict[str, Any], variant: str, name: str) -> tuple[list, list]:
    """Seed-averaged per-position loss (bits) of a variant: (bucket centres, values)."""
    profiles = [
        r["evals"][name]["details"]["position"]
        for r in data["runs"]
        if r["variant"] == variant and name in r["evals"]
    ]
    if not profiles:
        return [], []
    xs, ys = [], []
    for i, (start, stop) in enumerate(zip(profiles[0]["start"], profiles[0]["stop"], strict=True)):
        vals = [p["mean_loss"][i] for p in profiles if p["start"][i] == start]
        xs.append(math.sqrt((start + 1) * stop))  # geometric middle of 1 + position
        ys.append(statistics.fmean(vals) / LN2)
    return xs, ys


def plot(data: dict[str, Any], names: list[str], path: Path) -> None:
    plt = pyplot()
    s = data["setup"]
    fig, axes = plt.subplots(1, len(names), figsize=(6.4 * len(names), 4.4), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        for v in s["variants"]:
            xs, ys = profile(data, v, name)
            if xs:
                ax.plot(xs, ys, marker="o", markersize=3, label=ex.VARIANTS[v].label)
        ax.set_xscale("log", base=2)
        ax.axvline(s["segment_len"], color="grey", lw=0.8, ls=":")
        unit = "byte" if s["tokenizer"] == "bytes" else "token"
        ax.set_xlabel(f"1 + position of the {unit} in its document (log scale)")
        ax.set_ylabel(f"mean loss (bits per {unit})")
        corpus = data["data"]["corpus"]
        ax.set_title(
            f"{corpus} test books" if name == "test" else "WikiText-103 test (out of domain)"
        )
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(
        f"Loss by position, mean over seeds {s['seeds']} (dotted line: one segment)", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None, echo: Callable[[str], None] = print) -> int:
    parser = ex.parser(__doc__, NAME)
    parser.add_argument("--data-dir", type=Path, help="data root (with pg19-mini/) or a corpus")
    parser.add_argument("--wikitext-dir", type=Path, help="WikiText-103 evaluation directory")
    args = parser.parse_args(argv)
    if args.render_only:
        out, _ = ex.directories(args, NAME)
        render(ex.load_report(out / f"{NAME}.json"), out)
        echo(f"rendered {out / f'{NAME}.md'} and {out / f'{NAME}_position_loss.png'}")
        return 0

    from inftyformer.data import is_wikitext_dir, resolve_corpus_dir, resolve_data_dir
    from inftyformer.tasks import LanguageModelTask, LMConfig

    try:
        corpus = resolve_corpus_dir(args.data_dir)
    except FileNotFoundError as err:
        echo(f"skipped: no corpus to train on ({err})")
        return 0
    root = resolve_data_dir(args.data_dir)
    wikitext = args.wikitext_dir or root / "wikitext103-eval"
    if not (wikitext.is_dir() and is_wikitext_dir(wikitext)):
        echo(f"no WikiText-103 directory at {wikitext}: the out-of-domain evaluation is skipped")
        wikitext = None
    else:
        wikitext = wikitext.resolve()
    out, runs_dir = ex.directories(args, NAME)

    setup = Setup.quick() if args.quick else Setup()
    setup = replace(setup, **ex.common_overrides(args, CHOICES))
    task_cfg = LMConfig(data_dir=str(corpus), tokenizer=setup.tokenizer)
    base = {
        **setup.backbone(),
        **LanguageModelTask.model_overrides(task_cfg),  # the tokenizer's vocabulary
        **{k: getattr(setup, k) for k in ("widths", "ridge_lambda", "tau", "dropout")},
    }
    variants = ex.matched_variants(setup.variants, base, setup.memory_budget, setup.d_ff)
    for v, info in variants.items():
        echo(f"{v:<13} d_ff {info['d_ff']:>5}  {info['params']:>10,} parameters")

    store = ex.ResultStore(runs_dir / "results.jsonl", fresh=args.fresh)
    todo = jobs(setup, variants, corpus, wikitext, runs_dir)
    runs, failed, elapsed = ex.run_jobs(todo, store, args.workers)
    facts = data_facts(setup, corpus, wikitext)
    result = ex.report(NAME, asdict(setup), variants, facts, runs, args.workers, elapsed)
    ex.write_report(out / f"{NAME}.json", result)
    render(result, out)
    echo(f"done in {elapsed / 60:.1f} min -> {out / f'{NAME}.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    ex.run_main(main)
