"""Running the comparison experiments' jobs: a resumable store of results (`results.jsonl`), one
job per (variant, setting, seed) with the fingerprint of everything that determines it, the
library calls a job makes (train with `Trainer`, evaluate the best checkpoint) and a pool of
worker processes, one torch thread each, that Ctrl-C stops at once (`experiment.py` says how the
comparisons use them)."""

from __future__ import annotations

import gc
import hashlib
import json
import multiprocessing
import os
import queue
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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
    """Train spec["model"] (of kind spec.get("model_kind", "native"): `inftyformer.model_kinds`) on
    spec["task"] with spec["train"] (the library's Trainer). The trainer (model, optimiser) is
    freed before this returns, so that the caller can load the best checkpoint. JSON-able:
    time, best step and valid figure, the training loss and valid headline curves."""
    import torch

    from inftyformer.model_kinds import config_from_dict
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
    from inftyformer.model_kinds import config_from_dict
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
