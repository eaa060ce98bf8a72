"""Starting a run in its directory, or resuming one: the checks of what a resume may change
(the run's settings, the model's fixed settings, the data's contents), each allowed change
recorded in the run's history, and what to do when the newest checkpoint is damaged."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..model_kinds import changeable_settings, config_from_dict, model_kind
from ..native.state_record import STATE_SETTINGS
from ..tasks import Task, TaskConfig
from .checkpoint import (
    Checkpoint,
    CheckpointError,
    checkpoint_exists,
    clean_stale_files,
    load_checkpoint,
)
from .checkpoint_weights import check_base, relocate
from .config import RUN_SETTINGS, TrainConfig
from .distributed import DistEnv, barrier
from .logger import CSV_NAME
from .run_lock import RunLock

RUN_FILES = ("best", "last")
# model settings a run cannot take on resume even with --allow-changes: its data position
# (the language model's stream cursor) counts segments of this length
RESUME_FIXED = ("segment_len",)
# model settings whose change on resume adds or removes a group of parameters the optimiser's
# saved state is laid out by (a rate set or left unset, not one rate for another)
GROUP_SETTINGS = ("density_lr",)
# model settings the carried memory is shaped or given its meaning by (`state_record.py`, the
# token window, the sticky histogram, the compressed slots a compressive memory holds): a
# resume that changes one starts each stream's memory again (said, and recorded in the
# history). The short-term memory takes another mem_len as it is (it holds what it may).
MEMORY_BOUND = (*STATE_SETTINGS, "window", "sticky_bins", "compressed_len")


def changed(a: dict[str, Any], b: dict[str, Any], keys: Any = None) -> dict[str, list[Any]]:
    """{key: [old, new]} for the keys (default: all) whose values differ."""
    keys = sorted(set(a) | set(b)) if keys is None else keys
    return {k: [a.get(k), b.get(k)] for k in keys if a.get(k) != b.get(k)}


class RunDirectory:
    """The trainer's part that opens its run directory (a part of `Trainer`)."""

    cfg: TrainConfig
    task_cfg: TaskConfig
    model_cfg: Any
    env: DistEnv
    out_dir: Path
    task: Task
    history: list[dict[str, Any]]
    _renamed_base: str
    _data_fingerprint: dict[str, str] | None
    _lock: RunLock | None
    _fresh_memory: bool
    echo: Callable[[str], None]

    def _open_run_dir(
        self, resume: bool, overwrite: bool, allow_changes: bool
    ) -> Checkpoint | None:
        """Clean what a killed save left behind; with `resume`, the `last` checkpoint once its
        settings are checked against this run's; else make sure no run is overwritten unasked.
        The process that writes the checkpoints first locks the directory for the run
        (`run_lock.py`): a second run on it is refused before it touches anything."""
        self.history = []
        self._fresh_memory = False  # set when an allowed change leaves the carried memory
        self._renamed_base = ""  # a hint when data "changes" because the base's folder did
        if self.env.is_main:
            self._lock = RunLock(self.out_dir).acquire()  # released when training ends
            clean_stale_files(self.out_dir)  # what a killed save left behind
        barrier(self.env)
        checkpoint: Checkpoint | None = None
        if resume:
            if not checkpoint_exists(self.out_dir, "last"):
                raise CheckpointError(
                    f"cannot resume: no checkpoint 'last' in {self.out_dir} "
                    "(start without --resume, or point --out-dir at the run)"
                )
            try:
                checkpoint = load_checkpoint(self.out_dir / "last")
            except CheckpointError as err:
                raise CheckpointError(f"{err}. {self._fallback(err)}") from None
            # a pretrained base in another folder is the same run (its weights are checked)
            moved = relocate(
                checkpoint.meta, self.model_cfg.to_dict().get("base_model"), self.out_dir
            )
            self._check_resumable(checkpoint, allow_changes)
            check_base(checkpoint, self.model_cfg)
            if moved is not None:
                now = self.model_cfg.to_dict()["base_model"]
                if Path(moved).name != Path(now).name:
                    self._renamed_base = (
                        f" (or is it the base model's folder, renamed from {Path(moved).name} to "
                        f"{Path(now).name}? its tokenizer is named after it: keep the old name)"
                    )
                self.echo(f"note: the base model is now {now} (was {moved})")
        elif any(checkpoint_exists(self.out_dir, n) for n in RUN_FILES):
            if not overwrite:
                raise FileExistsError(
                    f"{self.out_dir} already holds a run; pass --resume to continue it, "
                    "--overwrite to start over, or choose another --out-dir"
                )
            barrier(self.env)  # every rank has looked before rank 0 clears
            if self.env.is_main:
                self._clear_run_dir()
        barrier(self.env)
        return checkpoint

    def _release_run_dir(self, started: bool = True) -> None:
        """Free the run directory for another run (the end of this process does it too); a
        run that never `started` leaves no folder it created."""
        lock = getattr(self, "_lock", None)
        if lock is not None and started:
            lock.release()
        elif lock is not None:
            lock.abandon()

    def _clear_run_dir(self) -> None:
        for name in RUN_FILES:
            for suffix in (".safetensors", ".json", ".manifest.json"):
                path = self.out_dir / f"{name}{suffix}"
                if path.exists():
                    path.unlink()
        for extra in (CSV_NAME, "results.json"):
            if (self.out_dir / extra).exists():
                (self.out_dir / extra).unlink()
        shutil.rmtree(self.out_dir / "tensorboard", ignore_errors=True)

    def _fallback(self, error: CheckpointError) -> str:
        """What a run whose newest checkpoint is damaged can do: whether the 'best' one is
        intact (and how to continue from it), or that nothing is left to resume."""
        out = self.out_dir
        if not checkpoint_exists(out, "best"):
            return "There is no other checkpoint to resume from: start again with --overwrite"
        try:
            best = load_checkpoint(out / "best")
        except CheckpointError as err:
            return f"The 'best' checkpoint is damaged too ({err}): start again with --overwrite"
        return (
            f"The 'best' checkpoint (step {best.meta.get('step')}) is intact: to continue from "
            f'it, copy it over the newest (cd {out} && for f in best.*; do cp "$f" '
            f'"last${{f#best}}"; done) and resume; `inftyformer evaluate {out / "best"}` '
            "evaluates it as it is"
        )

    def _check_resumable(self, ckpt: Checkpoint, allow_changes: bool) -> None:
        meta = ckpt.meta
        saved_model = meta.get("model_config", {})
        if not isinstance(saved_model, dict):
            raise CheckpointError(f"{ckpt.path}: the metadata's model_config is not an object")
        if meta.get("model_kind", "native") != model_kind(self.model_cfg):
            raise CheckpointError(
                f"{ckpt.path}: the checkpoint holds a {meta.get('model_kind', 'native')} model, "
                f"not a {model_kind(self.model_cfg)} one"
            )
        if meta.get("model_type") != self.model_cfg.model_type:
            raise CheckpointError(
                f"{ckpt.path}: the checkpoint holds a {meta.get('model_type')!r} model, "
                f"not a {self.model_cfg.model_type!r} one"
            )
        if meta.get("task") != self.cfg.task:
            raise CheckpointError(
                f"{ckpt.path}: the checkpoint was trained on task {meta.get('task')!r}, "
                f"not {self.cfg.task!r}"
            )
        try:  # as saved, with the settings added since at what they were then (their defaults)
            saved_model = config_from_dict(model_kind(self.model_cfg), saved_model).to_dict()
        except (TypeError, ValueError, FileNotFoundError):
            pass  # compared as it is: the differences are named below
        model_now = self.model_cfg.to_dict()
        changeable = changeable_settings(self.model_cfg)
        fixed = changed(saved_model, model_now, sorted(set(model_now) - set(changeable)))
        if fixed:
            raise CheckpointError(
                f"{ckpt.path}: the model configuration differs from the checkpoint's: "
                + "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in fixed.items())
                + " (these fix the weights; start a new run to change them)"
            )
        changes = {
            **{
                f"train.{k}": v
                for k, v in changed(
                    meta.get("train_config", {}), self.cfg.to_dict(), RUN_SETTINGS
                ).items()
            },
            **{
                f"task.{k}": v
                for k, v in changed(meta.get("task_config", {}), self.task_cfg.to_dict()).items()
            },
            **{f"model.{k}": v for k, v in changed(saved_model, model_now, changeable).items()},
        }
        history = meta.get("history", [])
        self.history = list(history) if isinstance(history, list) else []
        if not changes:
            return
        self._check_takeable(ckpt, changes)
        shown = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changes.items())
        if not allow_changes:
            raise CheckpointError(
                f"resuming would change the run in {self.out_dir}: {shown}. Resume without "
                "these settings to continue the run as it was, or allow the change explicitly "
                "(--allow-changes; it is recorded in the run's history)"
            )
        entry = {
            "step": int(meta.get("step", 0)),
            "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "changes": changes,
        }
        bound = [k for k in MEMORY_BOUND if f"model.{k}" in changes]
        if bound:  # the carried memory was made under the old values: each stream starts anew
            self._fresh_memory = True
            entry["memory"] = f"started again (made with the old {', '.join(bound)})"
        self.history.append(entry)
        self.echo(f"note: changing the run from step {meta.get('step')}: {shown}")
        if bound:
            self.echo(
                f"note: the carried memory was made with the old {', '.join(bound)}: each "
                "stream's memory starts again from the next step"
            )

    def _check_takeable(self, ckpt: Checkpoint, changes: dict[str, list[Any]]) -> None:
        """Refuse, even with --allow-changes, the changes a resumed run cannot continue with
        (`RESUME_FIXED`; a rate of `GROUP_SETTINGS` set or unset)."""
        for name in RESUME_FIXED:
            if f"model.{name}" in changes:
                old, new = changes[f"model.{name}"]
                raise CheckpointError(
                    f"{ckpt.path}: {name} cannot change on resume ({old!r} -> {new!r}): the "
                    "run's data position counts segments of it. Start a new run with it, or "
                    f"evaluate this one with it (inftyformer evaluate {self.out_dir} --set "
                    f"{name}={new})"
                )
        for name in GROUP_SETTINGS:
            old, new = changes.get(f"model.{name}", (0, 0))
            if (old is None) != (new is None):
                raise CheckpointError(
                    f"{ckpt.path}: {name} cannot be set or unset on resume ({old!r} -> "
                    f"{new!r}): it gives its parameters a group of their own in the optimiser, "
                    "whose saved state is laid out by the groups; change its value instead, or "
                    "start a new run"
                )

    def _fingerprint(self) -> dict[str, str]:
        if self._data_fingerprint is None:  # the data does not change during a run
            self._data_fingerprint = self.task.data_fingerprint(self._data_splits())
        return self._data_fingerprint

    def _data_splits(self) -> list[str]:
        """The splits a run reads: train, and those it evaluates."""
        evaluated = (("valid", self.cfg.eval_batches), ("test", self.cfg.test_batches))
        return ["train", *(split for split, batches in evaluated if batches)]

    def _check_same_data(self, ckpt: Checkpoint, allow_changes: bool) -> None:
        """Refuse to resume on data whose contents changed since the checkpoint (the same
        number of files with other text included), like a changed setting."""
        saved = ckpt.meta.get("data_fingerprint")
        if not isinstance(saved, dict) or not saved:
            return  # a checkpoint from before fingerprints, or generated data
        now = self.task.data_fingerprint(sorted(saved))
        moved = sorted(split for split in saved if now.get(split) != saved[split])
        if not moved:
            return
        shown = ", ".join(moved)
        if not allow_changes:
            raise CheckpointError(
                f"resuming would change the run in {self.out_dir}: the contents of the "
                f"{shown} data changed since step {ckpt.meta.get('step')} (same settings, "
                "other text). Restore the data to continue the run as it was, or allow the "
                "change explicitly (--allow-changes; it is recorded in the run's history)"
                + self._renamed_base
            )
        changes = {f"data.{split}": [saved[split], now.get(split)] for split in moved}
        self.history.append(
            {
                "step": int(ckpt.meta.get("step", 0)),
                "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "changes": changes,
            }
        )
        self.echo(f"note: the {shown} data changed since step {ckpt.meta.get('step')}")


__all__ = ["GROUP_SETTINGS", "MEMORY_BOUND", "RESUME_FIXED", "RUN_FILES", "RunDirectory", "changed"]
