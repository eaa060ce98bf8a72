"""Long-term memory on a pretrained language model: SmolLM2-135M on the pg19-mini books, the paper's
GPT-2 fine-tuning experiment (§4.2) scaled down to a 2-core CPU.

Rows, with the same data order, segments (L = 256 tokens; the base attends within its segment) and
steps for every row that trains:

    base            (a) the pretrained model as it is: no memory, no training
    finetune        (b) the base fine-tuned, no memory
    memory-frozen   (c) memory added, base frozen (only the memory trains)
    memory-all      (d) memory added, everything fine-tuned
    memory-sticky   (e) (c) with sticky memories
    memory-density  (f) (c) with the density heads w_μ, w_σ at a learning rate of their own

Evaluation: a fixed prefix of each test book, streamed with the memory (perplexity and bits per
byte overall and over the positions [0, 256), [256, 2048), [2048, …) in the book), and the first
WikiText-103 test articles (out of domain). For the memory rows, a diagnosis of the reads on the
first test book: the size of the memory's read against the attention output it is added to, and
where the densities sit (μ, σ). Writes OUT/pretrained.json, and renders from it alone
OUT/pretrained.md (with the hand-kept notes of OUT/pretrained.notes.md) and OUT/pretrained.png.

    python experiments/compare_pretrained.py                  # the documented experiment
    python experiments/compare_pretrained.py --quick          # smoke run, tiny random model
    python experiments/compare_pretrained.py --render-only    # re-render docs/ from the JSON

The base model: --base-model DIR (default: $INFTYFORMER_PRETRAINED, else models/smollm2-135m,
made by `inftyformer convert-gguf smollm2 models/smollm2-135m`).
Data: --data-dir (a data root holding
pg19-mini/ and wikitext103-eval/), else $INFTYFORMER_DATA, else ../shared/data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import experiment as ex

from inftyformer._measure import pyplot

NAME = "pretrained"
LN2 = math.log(2)
ROWS = {  # name: (label, model settings, trains)
    "base": ("(a) base model, no memory, no training", {"memory": False}, False),
    "finetune": ("(b) fine-tuned, no memory", {"memory": False}, True),
    "memory-frozen": ("(c) memory, base frozen", {"freeze_base": True}, True),
    "memory-all": ("(d) memory, all fine-tuned", {}, True),
    "memory-sticky": (
        "(e) memory, base frozen, sticky",
        {"freeze_base": True, "sticky": True},
        True,
    ),
    "memory-density": (  # can the density heads learn to focus when they may move?
        "(f) memory, base frozen, density heads at lr 0.02",
        {"freeze_base": True, "density_lr": 0.02},
        True,
    ),
}
SLOW_FIRST = ("memory-all", "memory-frozen", "memory-sticky", "memory-density", "finetune", "base")
RANGES = ("< 256", "256–2K", "≥ 2K")


@dataclass
class Setup:
    base_model: str = field(default_factory=ex.default_base_model)
    rows: list[str] = field(default_factory=lambda: list(ROWS))
    seed: int = 0
    segment_len: int = 256
    # 0: each segment attends within itself, as the base rows do and as this experiment was
    # documented (the short-term window of `docs/hf.md` is off)
    window: int = 0
    batch_size: int = 4
    steps: int = 60
    lr: float = 5e-5  # the base (paper: GPT-2 at 5e-5)
    memory_lr: float = 2.5e-4  # the memory (paper), no weight decay
    warmup_steps: int = 10
    weight_decay: float = 0.01
    eval_batches: int = 2  # segments per valid book at the end of training
    num_basis: int = 512  # the paper's GPT-2 settings: N = M = 512, widths, λ, τ
    num_samples: int = 512
    widths: tuple[float, ...] = (0.005, 0.01)
    ridge_lambda: float = 0.5
    tau: float = 0.5
    kl_weight: float = 1e-6
    test_max_tokens: int = 4096  # prefix of each test book
    wikitext_docs: int = 8
    wikitext_max_tokens: int = 2048
    diagnose_tokens: int = 2048  # of the first test book, for the reads' diagnosis

    @classmethod
    def quick(cls, base_model: str) -> Setup:
        return cls(base_model=base_model, segment_len=16, batch_size=2, steps=3, warmup_steps=1,
                   eval_batches=1, num_basis=8, num_samples=8, test_max_tokens=64,
                   wikitext_docs=2, wikitext_max_tokens=64, diagnose_tokens=48)  # fmt: skip


def model_settings(setup: Setup, row: str) -> dict[str, Any]:
    keys = ("segment_len", "window", "memory_lr", "num_basis", "num_samples", "widths",
            "ridge_lambda", "tau", "kl_weight")  # fmt: skip
    return {"base_model": setup.base_model, **{k: getattr(setup, k) for k in keys}, **ROWS[row][1]}


def job(setup: Setup, row: str, data_root: Path, runs_dir: Path) -> ex.Job:
    train = dict(
        task="lm", steps=setup.steps if ROWS[row][2] else 0, batch_size=setup.batch_size,
        lr=setup.lr, warmup_steps=setup.warmup_steps, weight_decay=setup.weight_decay,
        eval_every=setup.steps, eval_batches=setup.eval_batches, test_batches=0,
        log_every=5, seed=setup.seed, progress=False, tensorboard=False, threads=1,
    )  # fmt: skip
    evaluations = {
        "test": {"split": "test", "task_settings": {"max_tokens": setup.test_max_tokens}},
    }
    wiki = data_root / "wikitext103-eval"
    if wiki.is_dir():
        evaluations["wikitext"] = {
            "split": "test",
            "task_settings": {
                "eval_data": str(wiki),
                "max_docs": setup.wikitext_docs,
                "max_tokens": setup.wikitext_max_tokens,
            },  # fmt: skip
        }
    spec = {
        "model_kind": "pretrained",
        "model": model_settings(setup, row),
        "task": {"data_dir": str(data_root), "tokenizer": setup.base_model},
        "train": train,
        "evaluations": evaluations,
        "diagnose_tokens": setup.diagnose_tokens,
    }
    return ex.make_job((row, "smollm2", setup.seed), spec, runs_dir, f"{NAME}-{row}")


# --------------------------------------------------------------------------- one row (a worker)
def run_row(spec: dict[str, Any]) -> dict[str, Any]:
    """Train (or, for a row that does not train, take the base as it is), evaluate on one loaded
    model, then diagnose the memory's reads."""
    import torch

    from inftyformer.model_kinds import build_model, config_from_dict
    from inftyformer.training import load_run

    torch.set_num_threads(1)
    if spec["train"]["steps"]:
        result = ex.train_spec(spec)
        model = load_run(spec["train"]["out_dir"]).model
    else:
        result = {"train_seconds": 0.0}
        model = build_model(config_from_dict("pretrained", spec["model"])).eval()
    result["evals"] = ex.evaluate_model(spec, model)
    result["trainable_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    result["params"] = sum(p.numel() for p in model.parameters())
    if model.config.memory:
        result["reads"] = diagnose(model, spec)
    return result


def diagnose(model: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Stream the first test book's prefix and record, per layer, the read's size against the
    attention output it is added to (‖read‖ / ‖attention output without it‖, mean over tokens),
    and the densities' μ and σ (every head and query), from the segments that have a memory."""
    import torch

    from inftyformer.data import load_split, load_tokenizer
    from inftyformer.data.corpus import with_bos

    torch.set_num_threads(1)
    tokenizer = load_tokenizer(spec["task"]["tokenizer"])
    corpus = with_bos(load_split(spec["task"]["data_dir"], "test", tokenizer))
    ids = torch.as_tensor(corpus.document(0)[: spec["diagnose_tokens"]])[None]  # [1, T]
    lm, L = model.lm, model.config.segment_len
    layers = len(lm.long_term)
    reads: list[Any] = [None] * layers
    ratio: list[list[float]] = [[] for _ in range(layers)]
    mu: list[list[float]] = [[] for _ in range(layers)]
    sigma: list[list[float]] = [[] for _ in range(layers)]

    def read_hook(i):
        def hook(module, args, out):
            reads[i] = out

        return hook

    def output_hook(i):
        def hook(module, args, out):  # runs after the read was added to the output
            read = reads[i].context  # [1, T, d]
            own = (out - read).norm(dim=-1)  # [1, T]
            ratio[i].extend((read.norm(dim=-1) / own.clamp(min=1e-12)).flatten().tolist())
            mu[i].extend(reads[i].mu.flatten().tolist())
            sigma[i].extend(reads[i].sigma_sq.sqrt().flatten().tolist())

        return hook

    outputs = lm.adapter.attention_outputs(lm.base)
    handles = [m.attention.register_forward_hook(read_hook(i)) for i, m in enumerate(lm.long_term)]
    state = model.init_state(1)
    with torch.no_grad():
        for start in range(0, ids.shape[1], L):
            if start:  # the first segment reads an empty memory
                handles += [o.register_forward_hook(output_hook(i)) for i, o in enumerate(outputs)]
            state = model(ids[:, start : start + L], state=state).state
            if start:
                for h in handles[layers:]:
                    h.remove()
                del handles[layers:]
    for h in handles:
        h.remove()

    def quantiles(values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        return torch.quantile(t, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()

    return {
        "tokens": int(ids.shape[1]),
        "ratio_mean": [sum(r) / len(r) for r in ratio],
        "sigma_q": [quantiles(s) for s in sigma],
        "mu_q": [quantiles(m) for m in mu],
        "mu_hist": [torch.histc(torch.tensor(m), bins=20, min=0.0, max=1.0).tolist() for m in mu],
        "sigma_0": model.config.sigma_0,
    }


# --------------------------------------------------------------------------- the report
def by_range(ev: dict[str, Any]) -> list[float]:
    """Bits per byte over the position ranges (NaN where no token was there)."""
    out = []
    for r in ev["details"]["ranges"]:
        out.append(r["nll_sum"] / (LN2 * r["bytes"]) if r["bytes"] else math.nan)
    return out


def render(data: dict[str, Any], out_dir: Path) -> None:
    setup, runs = data["setup"], {r["variant"]: r for r in data["runs"]}
    rows = [name for name in setup["rows"] if name in runs]
    lines = [
        "# Long-term memory on a pretrained LM (SmolLM2-135M on pg19-mini)",
        "",
        f"Base model `{Path(setup['base_model']).name}`; segments of {setup['segment_len']} "
        f"tokens (the base attends within its segment), batch {setup['batch_size']}, "
        f"{setup['steps']} steps for every row that trains (the same data order), base lr "
        f"{setup['lr']:g}, memory lr {setup['memory_lr']:g} without weight decay, warm-up "
        f"{setup['warmup_steps']} then cosine. Memory: N = {setup['num_basis']}, "
        f"M = {setup['num_samples']}, widths {tuple(setup['widths'])}, λ = "
        f"{setup['ridge_lambda']}, τ = {setup['tau']} (the paper's GPT-2 settings). Test: the "
        f"first {setup['test_max_tokens']:,} tokens of each of the "
        f"{data['data']['test_books']} test books, streamed with memory; out of domain: the first "
        f"{setup['wikitext_max_tokens']:,} tokens of the first {setup['wikitext_docs']} "
        "WikiText-103 test articles. Seed " + str(setup["seed"]) + ".",
        "",
    ]
    header = ["row", "test ppl", "test bits/byte", *(f"bpb {r}" for r in RANGES),
              "WikiText ppl", "WikiText bpb", "trainable params", "train min",
              "CPU min"]  # fmt: skip
    table = []
    for name in rows:
        r = runs[name]
        test, wiki = r["evals"]["test"], r["evals"].get("wikitext")
        table.append([
            ROWS[name][0], f"{test['metrics']['ppl']:.2f}", f"{test['metrics']['bpb']:.4f}",
            *(f"{v:.4f}" for v in by_range(test)),
            f"{wiki['metrics']['ppl']:.2f}" if wiki else "–",
            f"{wiki['metrics']['bpb']:.4f}" if wiki else "–",
            f"{r['trainable_params'] / 1e6:.1f}M of {r['params'] / 1e6:.1f}M",
            f"{r['train_seconds'] / 60:.1f}", f"{r['cpu_seconds'] / 60:.1f}",
        ])  # fmt: skip
    lines += [ex.table(header, table), ""]
    tokens = [runs[n]["evals"]["test"]["details"]["ranges"] for n in rows[:1]]
    if tokens:
        counts = ", ".join(f"{r} {t['tokens']:,}" for r, t in zip(RANGES, tokens[0], strict=True))
        lines += [f"Test tokens by position in the book: {counts}.", ""]
    diag = [n for n in rows if runs[n].get("reads")]
    if diag:
        lines += [
            "The reads, on the first test book's first "
            f"{runs[diag[0]]['reads']['tokens']:,} tokens (segments after the first): the read's "
            "size against the attention output it is added to, and the densities (σ₀ = "
            f"{runs[diag[0]]['reads']['sigma_0']}), as medians over layers of each layer's figure:",
            "",
        ]
        dh = ["row", "‖read‖ / ‖attention‖", "σ 10% / 50% / 90%", "μ 10% / 50% / 90%"]
        drows = []
        for name in diag:
            d = runs[name]["reads"]
            med = sorted(d["ratio_mean"])[len(d["ratio_mean"]) // 2]
            sq = [sorted(q[i] for q in d["sigma_q"])[len(d["sigma_q"]) // 2] for i in range(3)]
            mq = [sorted(q[i] for q in d["mu_q"])[len(d["mu_q"]) // 2] for i in range(3)]
            drows.append([ROWS[name][0], f"{med:.3f}", " / ".join(f"{v:.3f}" for v in sq),
                          " / ".join(f"{v:.2f}" for v in mq)])  # fmt: skip
        lines += [ex.table(dh, drows), ""]
    lines += [ex.cost_line(data), "", "![bits per byte by position](pretrained.png)", ""]
    lines += [ex.hand_notes(out_dir / f"{NAME}.md"), ""]
    (out_dir / f"{NAME}.md").write_text("\n".join(lines), encoding="utf-8")
    plot(runs, rows, out_dir / f"{NAME}.png")


def plot(runs: dict[str, Any], rows: list[str], path: Path) -> None:
    """Test bits per byte by position range (bars) and the training loss (lines), a colour per
    row fixed by its place in ROWS, one legend below. Lines that coincide stay visible: each
    drawn thinner than the one before it, with its own marker and dash."""
    from _plot_style import legend_below

    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.6))
    width = 0.8 / max(len(rows), 1)
    trained = [n for n in rows if (runs[n].get("train_loss") or {}).get("step")]
    handles = {}
    for k, name in enumerate(rows):
        values = by_range(runs[name]["evals"]["test"])
        xs = [i + (k - (len(rows) - 1) / 2) * width for i in range(len(values))]
        color = f"C{list(ROWS).index(name)}"  # the row's own colour in both panels
        handles[name] = left.bar(xs, values, width, label=ROWS[name][0], color=color)
        if name in trained:
            j = trained.index(name)
            curve = runs[name]["train_loss"]
            right.plot(curve["step"], [v / LN2 for v in curve["value"]], color=color,
                       linewidth=1 + 2.5 * (len(trained) - 1 - j) / max(len(trained) - 1, 1),
                       linestyle=("-", "--", ":", "-.")[j % 4], marker="os^vDP"[j % 6],
                       markersize=5, markevery=(j, len(trained)))  # fmt: skip
    left.set_xticks(range(len(RANGES)), [f"positions {r}" for r in RANGES])
    left.set_ylabel("test bits per byte")
    left.set_ylim(bottom=min(min(by_range(runs[n]["evals"]["test"])) for n in rows) * 0.9)
    right.set_xlabel("step")
    right.set_ylabel("training loss (bits per token)")
    legend_below(fig, [handles[n] for n in rows], [ROWS[n][0] for n in rows], columns=3)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- main
def tiny_base(directory: Path) -> str:
    """A tiny random Llama and a byte-level BPE tokenizer trained on a few words (--quick)."""
    write_tiny_model = ex.tiny_model_writer()

    return str(write_tiny_model(directory))


def main(argv: list[str] | None = None) -> None:
    p = ex.parser(__doc__, NAME, tuple(ROWS))
    p.add_argument("--base-model", help="Hugging Face model directory (default: SmolLM2-135M)")
    p.add_argument("--data-dir", type=Path, help="data root holding pg19-mini/")
    args = p.parse_args(argv)
    out_dir, runs_dir = ex.directories(args, NAME)
    if args.render_only:
        render(ex.load_report(out_dir / f"{NAME}.json"), out_dir)
        return
    from inftyformer.data import load_split, load_tokenizer, resolve_data_dir

    data_root = resolve_data_dir(args.data_dir)
    setup = ex.pretrained_setup(args, Setup, tuple(ROWS), tiny_base)
    books = load_split(data_root, "test", load_tokenizer(setup.base_model))
    jobs = [job(setup, row, data_root, runs_dir) for row in SLOW_FIRST if row in setup.rows]
    facts = {"test_books": books.num_docs}
    ex.run_and_report(NAME, setup, jobs, facts, args, (out_dir, runs_dir), run_row, render)


if __name__ == "__main__":
    ex.run_main(main)
