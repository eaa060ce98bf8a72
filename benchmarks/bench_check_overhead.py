"""The per-step cost of argument validation: the four models' training and inference steps at the
small size (cpu-small, as in bench_models.py), timed for two source trees of the library in one
run, next to a plain-PyTorch reference step timed in the same processes.

    python benchmarks/bench_check_overhead.py --tree before=git:6916a27 --tree after=src
    python benchmarks/bench_check_overhead.py --render-only

A tree is a source directory (`src`) or `git:COMMIT`, the src directory of that commit of this
repository (extracted to a temporary directory). Each tree is imported in its own worker
subprocess (PYTHONPATH=tree), and the workers alternate (before, after, before, after, …) so that
the load of a shared machine falls on every tree alike. In a worker, the four models and the
reference are timed round-robin (`_measure.interleaved`); the reference is a pre-norm
`nn.TransformerEncoder` language model of the same width, depth, heads, batch and segment,
causal, with Adam, with no memory and none of this library's code. Reported: per tree, the
median over workers of each model's median step time and of its per-round ratio to the reference
step, and each tree's ratio over the first tree's; and the cost of the model's boundary checks
timed alone.

Writes docs/benchmarks/check_overhead.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench_models_measure import MODEL_TYPES, SIZES, VOCAB, make_config

from inftyformer import _measure as common

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "benchmarks" / "check_overhead"
SIZE = "cpu-small"
REFERENCE = "reference"


def _reference_lm(config):
    """A plain-PyTorch causal LM of the backbone's size (no memory)."""
    import torch
    from torch import nn

    class ReferenceLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d = config.d_model
            self.embedding = nn.Embedding(config.vocab_size, d)
            layer = nn.TransformerEncoderLayer(
                d,
                config.n_heads,
                config.d_ff,
                dropout=0.0,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            self.encoder = nn.TransformerEncoder(layer, config.n_layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d)

        def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None):
            length = tokens.shape[1]
            mask = nn.Transformer.generate_square_subsequent_mask(length)
            x = self.encoder(self.embedding(tokens), mask=mask, is_causal=True)
            logits = self.norm(x) @ self.embedding.weight.T  # tied head  [batch, L, V]
            if targets is None:
                return logits
            return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    return ReferenceLM()


def worker_steps(args: dict[str, Any]) -> dict[str, Any]:
    """The four models and the reference at cpu-small, training and inference steps timed
    round-robin in this process (memories full after the warm-up)."""
    import torch

    import inftyformer
    from inftyformer import MemoryLM

    torch.set_num_threads(args["threads"])
    batch = SIZES[SIZE]["batch"]
    models, optims = {}, {}
    for mt in MODEL_TYPES:
        torch.manual_seed(0)
        models[mt] = MemoryLM(make_config(SIZE, mt))
    torch.manual_seed(0)
    models[REFERENCE] = _reference_lm(make_config(SIZE, "xl"))
    for name, model in models.items():
        optims[name] = torch.optim.Adam(model.parameters(), lr=1e-4)
    L = models["xl"].config.segment_len
    tokens = torch.randint(0, VOCAB, (batch, L), generator=torch.Generator().manual_seed(0))
    states: dict[str, Any] = dict.fromkeys(models)

    def run(name: str, train: bool):
        def call():
            model = models[name]
            model.train(train)
            with torch.set_grad_enabled(train):
                if name == REFERENCE:
                    out = model(tokens, tokens if train else None)
                    loss = out if train else None
                else:
                    out = model(tokens, states[name], targets=tokens if train else None)
                    states[name] = out.state
                    loss = out.loss
            if train:
                optims[name].zero_grad(set_to_none=True)
                loss.backward()
                optims[name].step()

        return call

    result: dict[str, Any] = {"inftyformer_file": inftyformer.__file__, "modes": {}}
    for mode in ("train", "infer"):
        times = common.interleaved(
            {name: run(name, mode == "train") for name in models},
            args["repeats"],
            warmup=args["warmup"],
        )
        result["modes"][mode] = {
            name: {
                "median_ms": 1000 * statistics.median(t),
                "ratio_to_reference": statistics.median(
                    x / y for x, y in zip(t, times[REFERENCE], strict=True)
                ),
            }
            for name, t in times.items()
        }
    # what the model's boundary checks cost alone, on the states of the timed calls: the token
    # ids, the targets and the carried state (the calls and signatures of both trees)
    from inftyformer._checks import check_token_ids

    def boundary(name: str):
        model, device = models[name], models[name].embedding.weight.device
        return lambda: (
            check_token_ids("tokens", tokens, VOCAB, device),
            check_token_ids("targets", tokens, VOCAB, device, -100),
            model.check_state(states[name], batch),
        )

    times = common.interleaved(
        {name: boundary(name) for name in MODEL_TYPES}, args["repeats"] * 10, warmup=10
    )
    result["validation_ms"] = {name: 1000 * statistics.median(t) for name, t in times.items()}
    return result


def summarize(workers: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per tree, mode and model: the median over workers of the step time and of the ratio to
    the reference step; and each later tree's ratio over the first tree's."""
    trees = list(workers)
    summary: dict[str, Any] = {}
    for tree, runs in workers.items():
        summary[tree] = {
            "validation_ms": {
                name: statistics.median(r["validation_ms"][name] for r in runs)
                for name in MODEL_TYPES
            }
        }
        summary[tree] |= {
            mode: {
                name: {
                    key: statistics.median(r["modes"][mode][name][key] for r in runs)
                    for key in ("median_ms", "ratio_to_reference")
                }
                for name in runs[0]["modes"][mode]
            }
            for mode in runs[0]["modes"]
        }
    first = trees[0]
    for tree in trees[1:]:
        for mode in ("train", "infer"):
            for name, row in summary[tree][mode].items():
                row[f"over_{first}"] = (
                    row["ratio_to_reference"] / summary[first][mode][name]["ratio_to_reference"]
                )
    return summary


def write_report(result: dict[str, Any], out: Path) -> None:
    trees = list(result["trees"])
    first = trees[0]
    lines = [
        "# Per-step cost of argument validation (cpu-small)",
        "",
        "Generated by `benchmarks/bench_check_overhead.py` from `check_overhead.json`; do not edit "
        "the tables by hand.",
        "",
        f"Command: `{result['command']}`",
        "",
        "Trees: " + ", ".join(f"`{t}` = {result['trees'][t]}" for t in trees) + ".",
        f"Workers per tree: {result['settings']['workers']}, alternating; "
        f"{result['settings']['repeats']} timed rounds each (after "
        f"{result['settings']['warmup']} warm-up rounds), batch {result['batch']}, segment "
        f"{result['segment_len']}, {result['machine']['torch_threads']} torch thread.",
        "",
        "Step time: the median over workers of each worker's median (ms). Ratio: the step time "
        "over the plain-PyTorch reference step of the same round (median over rounds, then over "
        f"workers). Last column: a tree's ratio over `{first}`'s (below 1: faster).",
        "",
    ]
    for t in trees[1:]:
        over = [result["summary"][t]["train"][name][f"over_{first}"] for name in MODEL_TYPES]
        lines.append(
            f"Training step, `{t}` over `{first}` (ratio to the reference): "
            f"{min(over):.3f} to {max(over):.3f} across the four models."
        )
    spreads = []  # between the workers of one tree: max − min over the median
    for t in trees:
        for name in MODEL_TYPES:
            r = [w["modes"]["train"][name]["ratio_to_reference"] for w in result["workers"][t]]
            if len(r) > 1:
                spreads.append((max(r) - min(r)) / statistics.median(r))
    if spreads:
        lines.append(
            "Spread of the same ratio between the workers of one tree (max − min over the median, "
            f"the noise to read the last column against): up to {max(spreads):.3f}, median "
            f"{statistics.median(spreads):.3f} over trees and models."
        )
    shares = [
        result["summary"][t]["validation_ms"][name]
        / result["summary"][t]["train"][name]["median_ms"]
        for t in trees
        for name in MODEL_TYPES
    ]
    lines += [
        f"The boundary checks alone: at most {max(shares):.2%} of a training step (last table).",
        "",
        common.kept_notes(out.with_suffix(".md")),
        "",
    ]
    for mode, title in (("train", "Training step"), ("infer", "Inference step (no grad)")):
        headers = ["model"]
        for t in trees:
            headers += [f"{t} ms", f"{t} / reference"]
        headers += [f"{t} / {first}" for t in trees[1:]]
        rows = []
        for name in [*MODEL_TYPES, REFERENCE]:
            row: list[Any] = [name]
            for t in trees:
                cell = result["summary"][t][mode][name]
                row += [common.fmt_ms(cell["median_ms"]), f"{cell['ratio_to_reference']:.3f}"]
            row += [f"{result['summary'][t][mode][name][f'over_{first}']:.3f}" for t in trees[1:]]
            rows.append(row)
        lines += [f"## {title}", "", common.markdown_table(headers, rows), ""]
    headers = ["model"]
    for t in trees:
        headers += [f"{t}: checks ms", f"{t}: share of the training step"]
    rows = []
    for name in MODEL_TYPES:
        row = [name]
        for t in trees:
            cell = result["summary"][t]
            ms = cell["validation_ms"][name]
            row += [f"{ms:.2f}", f"{ms / cell['train'][name]['median_ms']:.2%}"]
        rows.append(row)
    lines += [
        "## The boundary checks alone",
        "",
        "What `MemoryLM.forward` checks of what it is handed, timed on its own (median of "
        f"{10 * result['settings']['repeats']} calls per worker, then over workers): the token "
        "ids, the targets and the carried state (`check_token_ids` twice, "
        "`MemoryLM.check_state`), each reading its values on its own; the forward reads them "
        "together, with one host synchronisation.",
        "",
        common.markdown_table(headers, rows),
        "",
        "## Machine",
        "",
        common.machine_markdown(result["machine"]),
        "",
    ]
    common.write_text(out.with_suffix(".md"), "\n".join(lines))


def source_tree(spec: str, scratch: Path) -> Path:
    """The src directory a tree spec names: a path, or `git:COMMIT` (extracted under
    `scratch`)."""
    if not spec.startswith("git:"):
        return Path(spec).resolve()
    commit = spec[len("git:") :]
    target = scratch / commit
    target.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", commit, "src"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target / "src"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="NAME=SRC",
        help="a source tree to import the library from (its src directory, or git:COMMIT); "
        "repeat; the first is the baseline",
    )
    parser.add_argument("--workers", type=int, default=3, help="worker processes per tree")
    parser.add_argument("--repeats", type=int, default=15, help="timed rounds per worker")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--out", type=Path, default=OUT, help="path without suffix")
    parser.add_argument("--render-only", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-args", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        Path(args.worker_out).write_text(json.dumps(worker_steps(json.loads(args.worker_args))))
        return
    json_path = args.out.with_suffix(".json")
    if args.render_only:
        write_report(json.loads(json_path.read_text()), args.out)
        return
    trees = dict(t.split("=", 1) for t in args.tree) or {"current": str(ROOT / "src")}
    settings = {"workers": 0, "repeats": args.repeats, "warmup": 4}
    machine = common.machine_info()
    machine["torch_threads"] = args.threads
    script = Path(__file__).resolve()
    t0 = time.perf_counter()
    workers: dict[str, list[dict[str, Any]]] = {t: [] for t in trees}
    with tempfile.TemporaryDirectory() as scratch:
        sources = {tree: source_tree(spec, Path(scratch)) for tree, spec in trees.items()}
        for i in range(args.workers):
            for tree, src in sources.items():
                print(f"[check_overhead {time.perf_counter() - t0:4.0f} s] {tree} #{i + 1}")
                run = common.run_worker(
                    script,
                    "steps",
                    dict(threads=args.threads, repeats=args.repeats, warmup=settings["warmup"]),
                    env_extra={"PYTHONPATH": str(src)},
                )
                expected = src / "inftyformer" / "__init__.py"
                if Path(run["inftyformer_file"]).resolve() != expected:
                    raise SystemExit(f"{tree}: imported {run['inftyformer_file']}, not {expected}")
                workers[tree].append(run)
            # after every round of workers: a run cut short keeps the rounds it finished
            settings["workers"] = i + 1
            result = {
                "command": common.command_line(),
                "machine": machine,
                "load_average_end": list(os.getloadavg()),
                "settings": settings,
                "size": SIZE,
                "batch": SIZES[SIZE]["batch"],
                "segment_len": make_config(SIZE, "xl").segment_len,
                "trees": trees,
                "workers": workers,
                "summary": summarize(workers),
                "wall_s": time.perf_counter() - t0,
            }
            common.write_json(json_path, result)
            write_report(result, args.out)
    print(json_path.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
