"""`inftyformer bench`: a quick training-speed benchmark (seconds per sorting step and tokens/s
for each model type), and the project's benchmark scripts run by name (`--script`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from .native.model import MemoryLM
from .native.model_config import ModelConfig
from .tasks import RunContext, SortingConfig, SortingTask
from .training.config import TrainConfig
from .training.optim import build_optimizer, seed_everything


def quick_benchmark(
    models: list[str],
    *,
    preset: str = "cpu-small",
    seq_len: int = 1024,
    batch_size: int = 8,
    steps: int = 3,
    seed: int = 0,
    threads: int = 0,
) -> list[dict[str, Any]]:
    """Time `steps` training steps (after one untimed warm-up step) per model type."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if threads < 0:
        raise ValueError(f"threads must be >= 0, got {threads}")
    if threads:
        torch.set_num_threads(threads)
    rows = []
    task_cfg = SortingConfig(seq_len=seq_len)
    train_cfg = TrainConfig(batch_size=batch_size, seed=seed, out_dir="-")
    for name in models:
        model_cfg = ModelConfig.preset(
            preset, model_type=name, **SortingTask.model_overrides(task_cfg)
        )
        seed_everything(seed)
        model = MemoryLM(model_cfg)
        model.train()
        optimizer = build_optimizer(model, train_cfg)
        task = SortingTask(task_cfg, model_cfg, RunContext(batch_size=batch_size, seed=seed))
        elapsed = 0.0
        tokens = 0.0
        for step in range(steps + 1):
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            out = task.loss(model, task.batch(step), slice(None), 0)
            out.loss.backward()
            optimizer.step()
            if step:  # the first step pays one-off costs (caches, allocator)
                elapsed += time.perf_counter() - start
                tokens += out.sums["tokens"]
        rows.append(
            {
                "model": name,
                "params": sum(p.numel() for p in model.parameters()),
                "seconds_per_step": elapsed / steps,
                "tokens_per_s": tokens / max(elapsed, 1e-9),
                "threads": torch.get_num_threads(),
            }
        )
    return rows


BENCHMARK_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
MAIN_GUARD = re.compile(r"""^if __name__ == ["']__main__["']:""", re.MULTILINE)


def benchmarks_dir() -> Path | None:
    """benchmarks/ of the source checkout this package was loaded from (an editable install, or
    src/ on the path): beside src/, two levels above the package. None when the package is not
    in a checkout's src/ (an installed wheel: the scripts are not part of the package)."""
    package = Path(__file__).resolve().parent
    if package.parent.name != "src":
        return None
    folder = package.parents[1] / "benchmarks"
    return folder if folder.is_dir() else None


def benchmark_scripts(root: Path | None = None) -> dict[str, Path]:
    """The project's scripts by name: benchmarks/*.py (speed and cost) and experiments/*.py
    (the measured rows behind docs/) of the source tree (`root`, by default the checkout this
    package was loaded from) that run as a program (a top-level `if __name__ == "__main__":`);
    helpers (names starting with _) and shared modules such as experiment.py are not scripts."""
    folder = benchmarks_dir() if root is None else root / "benchmarks"
    if folder is None or not folder.is_dir():
        return {}
    found = {}
    for where in (folder, folder.parent / "experiments"):
        for p in sorted(where.glob("*.py")):
            if BENCHMARK_NAME.fullmatch(p.stem) and p.is_file() and _runs_as_a_program(p):
                found[p.stem] = p
    return found


def _runs_as_a_program(path: Path) -> bool:
    text = path.read_text(encoding="utf-8", errors="replace")
    return MAIN_GUARD.search(text) is not None


def run_script(script: str, args: list[str]) -> int:
    """Run one of the project's benchmark scripts, by name only: no paths, nothing outside
    benchmarks/. The scripts live in the source checkout, not in the installed package: without
    one, a ValueError says so."""
    if benchmarks_dir() is None:
        raise ValueError(
            "--script runs the benchmark scripts of a source checkout (benchmarks/ beside src/), "
            f"and this installation has none: the package at {Path(__file__).resolve().parent} "
            "does not sit in a checkout's src/ folder. Clone the repository and install it with "
            "pip install -e ., or run python benchmarks/NAME.py in the clone"
        )
    scripts = benchmark_scripts()
    name = script[: -len(".py")] if script.endswith(".py") else script
    if not BENCHMARK_NAME.fullmatch(name) or name not in scripts:
        raise ValueError(
            f"no benchmark script {script!r}: --script takes the name of one of the project's "
            f"benchmarks ({', '.join(scripts)})"
        )
    return subprocess.call([sys.executable, str(scripts[name]), *args], env=dict(os.environ))


__all__ = ["BENCHMARK_NAME", "benchmark_scripts", "benchmarks_dir", "quick_benchmark", "run_script"]
