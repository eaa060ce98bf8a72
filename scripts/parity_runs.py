"""Twenty-step runs of every task, native and pretrained, for checking that a refactoring leaves
behaviour unchanged: each run's metrics.csv (without the timing rows) and its results.json are
gathered into one JSON file, and two such files are compared value by value.

    python scripts/parity_runs.py --out before.json          # on the old commit
    python scripts/parity_runs.py --out after.json           # on the new one
    python scripts/parity_runs.py --compare before.json after.json

The pretrained runs use tiny random Llama and GPT-2 models written by the tests' helper
(`tests/tiny_pretrained.py`), so nothing is downloaded; the book runs read the shared data
(`--data-dir`, default: the one the CLI finds). One run takes seconds to a minute on one thread.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

SHORT = ["--steps", "20", "--eval-every", "10", "--threads", "1", "--no-progress"]
FEW_BATCHES = ["--set", "eval_batches=2", "--set", "test_batches=2"]
# a pretrained memory small enough for a 64-position tiny model
TINY_MEMORY = ["--set", "segment_len=16", "--set", "window=16", "-b", "2"]
TINY_ADDED = [*TINY_MEMORY, "--set", "num_basis=16", "--set", "num_samples=16"]
TINY_RETRIEVAL = [
    *TINY_MEMORY,
    *("--set", "memory_read=heads", "--set", "density=mixture", "--set", "min_sigma_sq=1e-6"),
    *("--set", "num_basis=32", "--set", "widths=0.003"),
    *("--set", "squeeze=fill", "--set", "edge_padding=false", "--set", "keep_first=2"),
    *("--set", "keep_last=8"),
    *("--set", "memory_positions=ranks"),
]


def fill_samples() -> list[str]:
    """Code from before the squeezes were strategies wants num_samples = K for squeeze=fill."""
    import dataclasses

    try:
        from inftyformer.core.config import LongTermConfig
    except ImportError:  # before the core had a package of its own
        from inftyformer.long_term_config import LongTermConfig

    old = "num_samples" in {f.name for f in dataclasses.fields(LongTermConfig)}
    return ["--set", "num_samples=32"] if old else []


def runs(data: Path, llama: Path, gpt2: Path, chat: Path) -> dict[str, list[str]]:
    """Each run's arguments to `inftyformer train`."""
    books = ["--data-dir", str(data / "pg19-mini")]
    return {
        "sorting-infty": ["sorting", "-T", "512", *FEW_BATCHES],
        "sorting-infty-sticky": ["sorting", "-T", "512", "--set", "sticky=true", *FEW_BATCHES],
        "sorting-infty-paper": ["sorting", "-T", "512", "--set", "density=paper", *FEW_BATCHES],
        "sorting-xl": ["sorting", "-m", "xl", "-T", "512", *FEW_BATCHES],
        "sorting-compressive": ["sorting", "-m", "compressive", "-T", "512", *FEW_BATCHES],
        "sorting-transformer": ["sorting", "-m", "transformer", "-T", "512", *FEW_BATCHES],
        "recall-infty": ["recall", *FEW_BATCHES],
        "lm-bytes-infty": [
            "lm",
            "--tokenizer",
            "bytes",
            *books,
            "-b",
            "2",
            "--set",
            "max_docs=4",
            *FEW_BATCHES,
        ],  # fmt: skip
        "lm-llama-added": ["lm", "--base-model", str(llama), *books, *TINY_ADDED, *FEW_BATCHES],
        "lm-gpt2-added": ["lm", "--base-model", str(gpt2), *books, *TINY_ADDED, *FEW_BATCHES],
        "lm-llama-frozen-retrieval": [
            "lm",
            "--base-model",
            str(llama),
            "--freeze-base",
            *books,
            *TINY_RETRIEVAL,
            *fill_samples(),
            *FEW_BATCHES,
        ],  # fmt: skip
        "facts-llama": [
            "facts",
            "--base-model",
            str(llama),
            "--freeze-base",
            *books,
            *TINY_ADDED,
            "--set",
            "distance=80",
            "--set",
            "lead=4",
            *FEW_BATCHES,
        ],  # fmt: skip
        "dialogue-chat": [
            "dialogue",
            "--base-model",
            str(chat),
            "--freeze-base",
            "--data-dir",
            str(data / "cmu-dog"),
            *TINY_ADDED,
            "--set",
            "max_context=48",
            "--set",
            "eval_examples=2",
            "--set",
            "max_new_tokens=4",
            "--set",
            "max_reply=8",
            *FEW_BATCHES,
        ],  # fmt: skip
    }


def read_run(out: Path) -> dict:
    rows = []
    with open(out / "metrics.csv", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["metric"] in ("tokens_per_s",):  # timing: differs run to run
                continue
            rows.append([int(row["step"]), row["split"], row["metric"], float(row["value"])])
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    return {"metrics": rows, "results": results}


def measure(args: argparse.Namespace) -> None:
    from tiny_pretrained import write_tiny_model

    data = Path(args.data_dir)
    todo = args.only.split(",") if args.only else None
    gathered: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        llama = write_tiny_model(tmp / "llama", "llama")
        gpt2 = write_tiny_model(tmp / "gpt2", "gpt2")
        chat = write_tiny_model(tmp / "chat", "llama", chat=True)
        for name, argv in runs(data, llama, gpt2, chat).items():
            if todo and name not in todo:
                continue
            out = tmp / "runs" / name
            command = [sys.executable, "-m", "inftyformer.cli", "train", *argv, *SHORT]
            start = time.perf_counter()
            done = subprocess.run([*command, "-o", str(out)], capture_output=True, text=True)
            if done.returncode:  # recorded, and the other runs go on
                print(done.stdout[-2000:], done.stderr[-4000:], file=sys.stderr)
                gathered[name] = {"failed": done.stderr[-500:]}
            else:
                gathered[name] = read_run(out)
            print(f"{name}: {time.perf_counter() - start:.0f} s", flush=True)
            # written after every run: a long measurement keeps what it has
            Path(args.out).write_text(json.dumps(gathered, indent=1) + "\n", encoding="utf-8")


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def compare(before: Path, after: Path) -> int:
    a = json.loads(before.read_text(encoding="utf-8"))
    b = json.loads(after.read_text(encoding="utf-8"))
    bad = 0
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"{name}: only in {'after' if name not in a else 'before'}")
            bad += 1
        elif "failed" in a[name] or "failed" in b[name]:
            print(f"{name}: failed in {'before' if 'failed' in a[name] else 'after'}")
            bad += 1
        elif not same(a[name], b[name]):
            print(f"{name}: DIFFERS")
            for x, y in zip(a[name]["metrics"], b[name]["metrics"], strict=False):
                if not same(x, y):
                    print(f"  {x} != {y}")
            bad += 1
        else:
            print(f"{name}: identical ({len(a[name]['metrics'])} values)")
    return 1 if bad else 0


def main() -> None:
    from inftyformer.data.paths import default_data_dir

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", help="write the runs' metrics to this JSON file")
    p.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    p.add_argument("--only", default="", help="comma-separated run names")
    p.add_argument("--data-dir", default=str(default_data_dir() or ""))
    args = p.parse_args()
    if args.compare:
        raise SystemExit(compare(Path(args.compare[0]), Path(args.compare[1])))
    if not args.out:
        p.error("--out or --compare")
    measure(args)


if __name__ == "__main__":
    main()
