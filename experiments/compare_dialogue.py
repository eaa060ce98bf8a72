"""Document-grounded dialogue on CMU-DoG (the paper's §4.3) with SmolLM2-135M-Instruct, scaled down
to a 2-core CPU: where the movie's document is when the model writes the next reply.

Rows (the base model is frozen in every row; the rows that train see the same steps and data):

    none      (1) no document: the base as it is, zero-shot with its chat template
    memory    (2) the document in long-term memory: memory added, only the memory trains
    sticky    (3) (2) with sticky memories
    context   (4) as much of the document as fits in the context window, before the history:
              the base as it is, zero-shot (a reference)

Every row is scored on the same fixed subset of test turns: teacher-forced reply perplexity, and
replies generated as the authors did (nucleus sampling p = 0.9, temperature 1, at most 50 new
tokens, a fixed seed per turn, cut at the end of the turn) scored with F1, ROUGE-1/L, METEOR and
BLEU (`inftyformer.metrics.dialogue_scores`). A control for (2): the same trained model with
another movie's document in its memory (teacher-forced perplexity only). Writes OUT/dialogue.json
and renders from it alone OUT/dialogue.md (with the hand-kept notes of OUT/dialogue.notes.md).

    python experiments/compare_dialogue.py                  # the documented experiment
    python experiments/compare_dialogue.py --quick          # smoke run, tiny random model (~2 min)
    python experiments/compare_dialogue.py --render-only    # re-render docs/ from the JSON

The base model: --base-model DIR (default: $INFTYFORMER_PRETRAINED, else models/smollm2-135m,
made by `inftyformer convert-gguf smollm2 models/smollm2-135m`).
Data: --data-dir (a data root holding
cmu-dog/), else $INFTYFORMER_DATA, else ../shared/data.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import experiment as ex

NAME = "dialogue"
ROWS = {  # name: (label, model settings, task settings, trains)
    "none": ("(1) no document (base, zero-shot)", {"memory": False}, {"placement": "none"}, False),
    "memory": (
        "(2) document in long-term memory",
        {"freeze_base": True},
        {"placement": "memory"},
        True,
    ),
    "sticky": (
        "(3) document in long-term memory, sticky memories",
        {"freeze_base": True, "sticky": True},
        {"placement": "memory"},
        True,
    ),
    "context": (
        "(4) document in the context, as much as fits (base, zero-shot)",
        {"memory": False},
        {"placement": "context"},
        False,
    ),
}
SLOW_FIRST = ("memory", "sticky", "context", "none")
PAPER = {  # Table 3 of the paper, ∞-former with sticky memories (GPT-2 small, the full test set)
    "f1": 9.01,
    "rouge1_authors": 15.37,
    "rougeL_authors": 12.56,
    "meteor": 7.55,
}
COLUMNS = (  # metric, header
    ("f1", "F1"),
    ("rouge1", "ROUGE-1"),
    ("rougeL", "ROUGE-L"),
    ("meteor", "METEOR"),
    ("bleu", "BLEU"),
    ("rouge1_authors", "ROUGE-1 recall"),
    ("rougeL_authors", "ROUGE-L recall"),
)


@dataclass
class Setup:
    base_model: str = field(default_factory=ex.default_base_model)
    rows: list[str] = field(default_factory=lambda: list(ROWS))
    seed: int = 0  # training data order and the memory's initialisation
    segment_len: int = 512  # the window (the paper's GPT-2 chunks: 512)
    batch_size: int = 4  # rows of one document per step
    # micro-batches of one reply: the memory's reads keep [rows, heads, T, N] tensors for the
    # backward pass (~2 GB per reply at N = 512, T ~ 300); each reply then weighs the same in the
    # step's loss (instead of each reply token)
    grad_accum: int = 4
    steps: int = 30
    lr: float = 5e-5  # the base's (unused: it is frozen)
    memory_lr: float = 1e-3  # the paper's 2.5e-4 is for far longer training
    warmup_steps: int = 3
    weight_decay: float = 0.01
    num_basis: int = 512  # the paper's GPT-2 settings: N = M = 512, widths, λ, τ
    num_samples: int = 512
    widths: tuple[float, ...] = (0.005, 0.01)
    ridge_lambda: float = 0.5
    tau: float = 0.5
    kl_weight: float = 1e-6
    grounding: str = "full"
    max_context: int = 256  # history tokens in the window
    max_reply: int = 64
    valid_examples: int = 4  # teacher-forced check on valid at the end of training
    eval_examples: int = 48  # the fixed subset of test turns
    eval_seed: int = 0  # draws the subset and seeds the sampling
    top_p: float = 0.9
    temperature: float = 1.0
    max_new_tokens: int = 50
    control: bool = True  # (2) with another movie's document
    samples: int = 3  # replies shown beside their references

    @classmethod
    def quick(cls, base_model: str) -> Setup:
        return cls(base_model=base_model, segment_len=192, batch_size=2, grad_accum=2, steps=2,
                   warmup_steps=1, num_basis=8, num_samples=8, max_context=32, max_reply=16,
                   valid_examples=2, eval_examples=3, max_new_tokens=8)  # fmt: skip


def model_settings(setup: Setup, row: str) -> dict[str, Any]:
    keys = ("segment_len", "memory_lr", "num_basis", "num_samples", "widths", "ridge_lambda",
            "tau", "kl_weight")  # fmt: skip
    return {"base_model": setup.base_model, **{k: getattr(setup, k) for k in keys}, **ROWS[row][1]}


def task_settings(setup: Setup, row: str, data_dir: Path) -> dict[str, Any]:
    return {
        "data_dir": str(data_dir),
        "tokenizer": setup.base_model,
        "grounding": setup.grounding,
        "max_context": setup.max_context,
        "max_reply": setup.max_reply,
        "eval_examples": setup.eval_examples,
        "top_p": setup.top_p,
        "temperature": setup.temperature,
        "max_new_tokens": setup.max_new_tokens,
        "seed": setup.eval_seed,
        "generate": False,  # while training: the valid check is teacher-forced
        **ROWS[row][2],
    }


def job(setup: Setup, row: str, data_dir: Path, runs_dir: Path) -> ex.Job:
    trains = ROWS[row][3]
    train = dict(
        task=NAME, steps=setup.steps if trains else 0, batch_size=setup.batch_size,
        grad_accum=setup.grad_accum, lr=setup.lr,
        warmup_steps=setup.warmup_steps, weight_decay=setup.weight_decay, eval_every=setup.steps,
        eval_batches=max(1, setup.valid_examples // setup.batch_size), test_batches=0,
        log_every=1, seed=setup.seed, progress=False, tensorboard=False, threads=1,
    )  # fmt: skip
    evaluations = {"test": {"split": "test", "task_settings": {"generate": True}}}
    if setup.control and ROWS[row][2]["placement"] == "memory" and row == "memory":
        evaluations["other_document"] = {
            "split": "test",
            "task_settings": {"generate": False, "other_document": True},
        }
    spec = {
        "model_kind": "pretrained",
        "model": model_settings(setup, row),
        "task": task_settings(setup, row, data_dir),
        "train": train,
        "evaluations": evaluations,
    }
    return ex.make_job((row, "smollm2", setup.seed), spec, runs_dir, f"{NAME}-{row}")


# --------------------------------------------------------------------------- one row (a worker)
def run_row(spec: dict[str, Any]) -> dict[str, Any]:
    """Train (memory rows) and evaluate one row; a row that does not train is the base model
    evaluated as it is. One model in memory at a time, every evaluation on it."""
    import torch

    from inftyformer.model_kinds import build_model, config_from_dict
    from inftyformer.training import load_run

    torch.set_num_threads(1)
    if spec["train"]["steps"]:
        result = ex.train_spec(spec)  # nats per reply token in its training loss curve
        model = load_run(spec["train"]["out_dir"]).model
    else:
        result = {"train_seconds": 0.0}
        model = build_model(config_from_dict("pretrained", spec["model"])).eval()
    result["evals"] = ex.evaluate_model(spec, model)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    result["trained_params"] = trainable if spec["train"]["steps"] else 0
    result["params"] = sum(p.numel() for p in model.parameters())
    return result


# --------------------------------------------------------------------------- the report
def _words(texts: list[str]) -> float:
    return statistics.fmean(len(t.split()) for t in texts) if texts else float("nan")


def _fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None or value != value else f"{value:.{digits}f}"


def render(data: dict[str, Any], out_dir: Path) -> None:
    setup, runs = data["setup"], {r["variant"]: r for r in data["runs"]}
    rows = [name for name in setup["rows"] if name in runs]
    facts = data["data"]
    lines = [
        "# Document-grounded dialogue (CMU-DoG) with SmolLM2-135M-Instruct",
        "",
        f"Base model `{Path(setup['base_model']).name}` (frozen in every row), its chat template "
        "(the reply's speaker is `assistant`, the other `user`; a system message with a short "
        "instruction opens the window). The document is the whole movie article (all four "
        f"sections, {facts['doc_tokens_min']:,}–{facts['doc_tokens_max']:,} tokens). Window of "
        f"{setup['segment_len']} tokens: history ≤ {setup['max_context']} tokens (newest whole "
        f"turns), {setup['max_reply']} tokens kept for the reply. Memory rows: N = "
        f"{setup['num_basis']}, M = {setup['num_samples']}, widths {tuple(setup['widths'])}, "
        f"λ = {setup['ridge_lambda']}, τ = {setup['tau']}"
        + (" (the paper's GPT-2 settings)" if setup["num_basis"] == 512 else "")
        + f"; trained "
        f"{setup['steps']} steps of {setup['batch_size']} replies about one document each "
        f"({setup['steps'] * setup['batch_size']} replies; micro-batches of "
        f"{setup['batch_size'] // setup['grad_accum']}), memory lr {setup['memory_lr']:g} "
        f"without weight decay, warm-up {setup['warmup_steps']} then cosine, seed "
        f"{setup['seed']}.",
        "",
        f"Test: {setup['eval_examples']} turns drawn with seed {setup['eval_seed']} from the "
        f"{facts['test_examples']:,} test turns from the fourth utterance on (the authors' "
        "setting); the same turns, prompts and sampling seeds for every row. Generation: nucleus "
        f"sampling p = {setup['top_p']}, temperature {setup['temperature']}, at most "
        f"{setup['max_new_tokens']} new tokens, cut at `<|im_end|>`. Scores in percent; ROUGE "
        "is the F-measure, and ROUGE recall is what the authors' script reports as ROUGE "
        "(`inftyformer.metrics`). Reply perplexity: teacher-forced, per reply token (the "
        "reply's `<|im_end|>` included).",
        "",
    ]
    header = ["row", *(h for _, h in COLUMNS), "reply ppl", "words per reply", "trained params",
              "train min", "eval min", "CPU min"]  # fmt: skip
    table = []
    for name in rows:
        r = runs[name]
        test = r["evals"]["test"]
        m = test["metrics"]
        predictions = [d["prediction"] for d in test["details"]["examples"]]
        table.append([
            ROWS[name][0], *(_fmt(m[k]) for k, _ in COLUMNS), _fmt(m["ppl"]),
            _fmt(_words(predictions), 1),
            f"{r['trained_params'] / 1e6:.1f}M of {r['params'] / 1e6:.1f}M",
            _fmt(r["train_seconds"] / 60, 1), _fmt(test["seconds"] / 60, 1),
            _fmt(r["cpu_seconds"] / 60, 1),
        ])  # fmt: skip
    table.append([
        "paper: ∞-former, sticky memories (GPT-2 small, full test set)",
        *(_fmt(PAPER.get(k)) for k, _ in COLUMNS), "–", "–", "–", "–", "–", "–",
    ])  # fmt: skip
    lines += [ex.table(header, table), ""]
    if rows:
        details = runs[rows[0]]["evals"]["test"]["details"]["examples"]
        lines += [
            f"The references: {_words([d['reference'] for d in details]):.1f} words per reply "
            f"on these {len(details)} turns. Standard errors of the per-turn means (F1 / "
            "ROUGE-L / METEOR): "
            + "; ".join(f"{ROWS[n][0].split(' ')[0]} {_standard_errors(runs[n])}" for n in rows)
            + ".",
            "",
        ]
    control = runs.get("memory", {}).get("evals", {}).get("other_document")
    if control:
        own = runs["memory"]["evals"]["test"]["metrics"]
        lines += [
            "Control: row (2)'s model with another movie's document in its memory (the next "
            f"document id): reply perplexity {_fmt(control['metrics']['ppl'])} against "
            f"{_fmt(own['ppl'])} with the conversation's own document, on the same turns.",
            "",
        ]
    gen = []
    for name in rows:
        d = runs[name]["evals"]["test"]["details"]["examples"]
        tokens = sum(x["new_tokens"] for x in d)
        seconds = sum(x["seconds"] for x in d)
        if tokens:
            gen.append(f"{ROWS[name][0].split(' ')[0]} {1000 * seconds / tokens:.0f} ms")
    if gen:
        lines += ["Generation time per new token (prompt included): " + ", ".join(gen) + ".", ""]
    lines += sample_replies(runs, rows, setup["samples"])
    lines += [
        ex.cost_line(data),
        "",
        f"The full test set ({facts['test_examples']:,} turns; about "
        f"{_full_hours(runs, facts):.0f} CPU-hours for a memory row at the speed measured here): "
        "every row with",
        "",
        "```bash",
        f"python experiments/compare_dialogue.py --eval-examples {facts['test_examples']} "
        "--runs-dir runs/compare_dialogue_full --out docs/dialogue_full",
        "```",
        "",
        "or one trained run with `inftyformer evaluate RUN_DIR --set generate=true "
        "--set eval_examples=none --json test.json`.",
        "",
        ex.hand_notes(out_dir / f"{NAME}.md"),
        "",
    ]
    (out_dir / f"{NAME}.md").write_text("\n".join(lines), encoding="utf-8")


def _standard_errors(run: dict[str, Any]) -> str:
    """± the standard error over the test turns of F1, ROUGE-L and METEOR."""
    examples = run["evals"]["test"]["details"]["examples"]
    if len(examples) < 2:
        return "–"
    parts = []
    for key in ("f1", "rougeL", "meteor"):
        values = [e[key] for e in examples]
        parts.append(f"±{statistics.stdev(values) / len(values) ** 0.5:.1f}")
    return " / ".join(parts)


def _full_hours(runs: dict[str, Any], facts: dict[str, Any]) -> float:
    r = runs.get("memory") or next(iter(runs.values()), None)
    if r is None:
        return float("nan")
    test = r["evals"]["test"]
    per_turn = test["seconds"] / max(1, test["metrics"]["examples"])
    return per_turn * facts["test_examples"] / 3600


def sample_replies(runs: dict[str, Any], rows: list[str], count: int) -> list[str]:
    """The first `count` turns of the subset (in its order, not chosen by score)."""
    if not rows or not count:
        return []
    first = runs[rows[0]]["evals"]["test"]["details"]["examples"]
    lines = [f"Replies to the first {count} turns of the subset (not chosen by score):", ""]
    for i, d in enumerate(first[:count]):
        lines += [
            f"**Turn {d['reply_index']} of conversation `{d['conversation_id'][:8]}` (document "
            f"{d['doc_id']})**, previous turn: “{d['previous']}”",
            "",
            f"- reference: “{d['reference']}”",
        ]
        for name in rows:
            mine = runs[name]["evals"]["test"]["details"]["examples"][i]
            assert mine["conversation_id"] == d["conversation_id"]
            lines.append(
                f"- {ROWS[name][0].split(' ')[0]}: “{mine['prediction']}” (F1 {mine['f1']:.1f})"
            )
        lines.append("")
    return lines


# --------------------------------------------------------------------------- main
def tiny_chat_base(directory: Path) -> str:
    """A tiny random Llama and a byte-level BPE with ChatML special tokens and template."""
    write_tiny_model = ex.tiny_model_writer()

    corpus = ["the movie was about a toy and its friends, said the user"] * 20
    return str(write_tiny_model(directory, chat=True, corpus=corpus, vocab_size=400,
                                max_positions=512))  # fmt: skip


def data_facts(setup: Setup, data_dir: Path) -> dict[str, Any]:
    """What the report says about the data, read through the library."""
    from inftyformer.model_kinds import PretrainedMemoryConfig
    from inftyformer.tasks import DialogueConfig, DialogueTask, RunContext

    settings = task_settings(setup, "memory", data_dir)
    model = PretrainedMemoryConfig(base_model=setup.base_model, segment_len=setup.segment_len)
    task = DialogueTask(DialogueConfig(**settings), model, RunContext(1, 0))
    lengths = [len(task.tokenizer.encode(d.text())) for d in task.documents.values()]
    return {
        "test_examples": len(task.examples("test")),
        "train_examples": len(task.examples("train")),
        "documents": len(lengths),
        "doc_tokens_min": min(lengths),
        "doc_tokens_max": max(lengths),
    }


def main(argv: list[str] | None = None) -> None:
    p = ex.parser(__doc__, NAME, tuple(ROWS))
    p.add_argument("--base-model", help="Hugging Face model directory (default: SmolLM2-135M)")
    p.add_argument("--data-dir", type=Path, help="data root holding cmu-dog/")
    p.add_argument("--eval-examples", type=int, help="test turns in the fixed subset")
    args = p.parse_args(argv)
    out_dir, runs_dir = ex.directories(args, NAME)
    if args.render_only:
        render(ex.load_report(out_dir / f"{NAME}.json"), out_dir)
        return
    from inftyformer.data.cmu_dog import resolve_cmu_dog_dir

    data_dir = resolve_cmu_dog_dir(args.data_dir)
    setup = ex.pretrained_setup(args, Setup, tuple(ROWS), tiny_chat_base)
    if args.eval_examples:
        setup = replace(setup, eval_examples=args.eval_examples)
    jobs = [job(setup, row, data_dir, runs_dir) for row in SLOW_FIRST if row in setup.rows]
    facts = data_facts(setup, data_dir)
    ex.run_and_report(NAME, setup, jobs, facts, args, (out_dir, runs_dir), run_row, render)


if __name__ == "__main__":
    ex.run_main(main)
