"""Shared helpers for the benchmark and experiment scripts (benchmarks/, experiments/): timing,
resident memory, machine description, running a measurement in a fresh subprocess (own allocator
settings, own peak RSS) and writing the results as JSON, Markdown and PNG.

Benchmarks here run on shared, noisy CPUs: measure ratios against a baseline *in the same run*,
interleave the variants, repeat and report medians (with min and quartiles), never single timings.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

# glibc serves allocations above M_MMAP_THRESHOLD with a fresh mmap (page-faulted on first touch,
# unmapped on free) and gives free heap memory back above M_TRIM_THRESHOLD. PyTorch's CPU tensors
# of tens of MB are then re-faulted every step; raising both thresholds keeps them in the heap.
# A measurement records which of these the run had set (`machine_info`).
MALLOC_VARS = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_ARENA_MAX",
)


# ----------------------------------------------------------------------------- timing
# the source checkout this module was loaded from (src/inftyformer/_measure.py: parents[2])
_ROOT = Path(__file__).resolve().parents[2]


def default_base_model() -> str:
    """The pretrained model the comparisons use when no --base-model is given:
    $INFTYFORMER_PRETRAINED, else models/smollm2-135m in the checkout (the README's conversion
    command writes it there; git ignores it), else models/smollm2-135m beside the checkout."""
    if os.environ.get("INFTYFORMER_PRETRAINED"):
        return os.environ["INFTYFORMER_PRETRAINED"]
    inside = _ROOT / "models" / "smollm2-135m"
    return str(inside if inside.is_dir() else _ROOT.parent / "models" / "smollm2-135m")


def timed(fn: Callable[[], Any]) -> float:
    """Wall-clock seconds of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def summarize(seconds: Sequence[float]) -> dict[str, float]:
    """Median, min, max and quartiles, in milliseconds."""
    ms = sorted(1000.0 * s for s in seconds)
    if not ms:
        raise ValueError("no timings to summarize")
    q = statistics.quantiles(ms, n=4, method="inclusive") if len(ms) > 1 else [ms[0]] * 3
    return {
        "n": len(ms),
        "median_ms": statistics.median(ms),
        "min_ms": ms[0],
        "max_ms": ms[-1],
        "q1_ms": q[0],
        "q3_ms": q[2],
    }


def interleaved(
    variants: dict[str, Callable[[], Any]],
    repeats: int,
    warmup: int = 1,
    between: Callable[[], Any] | None = None,
) -> dict[str, list[float]]:
    """Time each variant `repeats` times, round-robin (rotating the order every round) so that
    the load of a shared machine falls on all of them alike. `between` runs untimed before each
    call (e.g. clearing gradients). Returns seconds per variant."""
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            if between is not None:
                between()
            variants[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            if between is not None:
                between()
            times[name].append(timed(variants[name]))
    return times


# ----------------------------------------------------------------------------- memory
def _proc_kb(field: str, path: str = "/proc/self/status") -> float | None:
    """A "Field: N kB" line of a /proc file (None where it is missing)."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def rss_mb() -> float:
    """Current resident set size (VmRSS) in MiB; ru_maxrss where /proc is missing."""
    kb = _proc_kb("VmRSS")
    return (kb if kb is not None else _maxrss_kb()) / 1024.0


def peak_rss_mb() -> float:
    """Peak resident set size of this process (VmHWM) in MiB."""
    kb = _proc_kb("VmHWM")
    return (kb if kb is not None else _maxrss_kb()) / 1024.0


def reset_peak_rss() -> bool:
    """Set this process's peak RSS (VmHWM) back to its current RSS, so that `peak_rss_mb`
    measures what comes after (Linux: "5" written to /proc/self/clear_refs). False where the
    kernel does not allow it: the peak then counts from the process's start."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _maxrss_kb() -> float:
    value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return value / 1024.0 if sys.platform == "darwin" else float(value)


# ----------------------------------------------------------------------------- machine
def machine_info() -> dict[str, Any]:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_total = _proc_kb("MemTotal", "/proc/meminfo")
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": None if mem_total is None else round(mem_total / 2**20, 1),
        "platform": platform.platform(),
        "libc": " ".join(platform.libc_ver()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "malloc_env": {k: os.environ[k] for k in MALLOC_VARS if k in os.environ},
    }


def command_line() -> str:
    """How this script was invoked, relative to the working directory."""
    return " ".join(shlex.quote(a) for a in ["python", *sys.argv])


def git_revision(root: str | Path, paths: Sequence[str] = ()) -> str:
    """Short commit hash of `root`'s HEAD, with "+dirty" if any of `paths` has local changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", *paths],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if paths and dirty else "")


# ----------------------------------------------------------------------------- subprocesses
def run_worker(
    script: str | Path,
    worker: str,
    args: dict[str, Any],
    env_extra: dict[str, str] | None = None,
    clean_malloc_env: bool = True,
    extra_argv: Sequence[str] = (),
) -> dict[str, Any]:
    """Run `python script --worker NAME --worker-args JSON --worker-out FILE` in a fresh process
    (its own allocator settings and peak RSS) and return the JSON it wrote."""
    env = dict(os.environ)
    if clean_malloc_env:
        for k in MALLOC_VARS:
            env.pop(k, None)
    env.update(env_extra or {})
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            str(script),
            "--worker",
            worker,
            "--worker-args",
            json.dumps(args),
            "--worker-out",
            str(out),
            *extra_argv,
        ]
        subprocess.run(cmd, env=env, check=True)
        return json.loads(out.read_text())


# ----------------------------------------------------------------------------- output
def write_json(path: str | Path, data: Any) -> None:
    """Write `data` as JSON, whole or not at all (a kill mid-write keeps the old results)."""
    from inftyformer._files import write_atomic  # here: a measuring worker does not import it

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=1, sort_keys=False) + "\n")


def write_text(path: str | Path, text: str) -> None:
    """Write `text` (ending in a newline), whole or not at all (the hand-kept notes inside a
    report survive a kill mid-write)."""
    from inftyformer._files import write_atomic

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text if text.endswith("\n") else text + "\n")


NOTES_BEGIN = "<!-- notes: kept when the script rewrites this file -->"
NOTES_END = "<!-- /notes -->"


def kept_notes(path: str | Path) -> str:
    """The hand-written discussion between the notes markers of a generated Markdown file that
    is about to be rewritten (a placeholder between the markers when there is none yet)."""
    path = Path(path)
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    if NOTES_BEGIN in old and NOTES_END in old:
        return old[old.index(NOTES_BEGIN) : old.index(NOTES_END) + len(NOTES_END)]
    return f"{NOTES_BEGIN}\n(no notes yet)\n{NOTES_END}"


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    def cell(x: Any) -> str:
        return str(x).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |"]
    lines.append("|" + "|".join(" --- " for _ in headers) + "|")
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def machine_markdown(info: dict[str, Any]) -> str:
    load = info.get("load_average")
    load_s = "n/a" if not load else ", ".join(f"{x:.2f}" for x in load)
    return "\n".join(
        [
            f"- CPU: {info['cpu']}, {info['logical_cpus']} logical CPUs, "
            f"{info['memory_gib']} GiB RAM; torch threads: {info['torch_threads']}",
            f"- Platform: {info['platform']} ({info['libc']}); Python {info['python']}; "
            f"torch {info['torch']}",
            f"- Load average when the run started (1, 5, 15 min): {load_s}",
        ]
    )


def pyplot():
    """matplotlib.pyplot with the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def fmt_ms(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}"
