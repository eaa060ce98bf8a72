"""Metric logging: a long-format CSV (`metrics.csv`) and TensorBoard, both in the run directory.

Rows are ``step,split,metric,value``; values are written with full precision (``repr``) so two
runs can be compared exactly. On resume, rows after the resumed step (written by the interrupted
run after its last checkpoint) are dropped, and TensorBoard purges the same range.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

from .._files import atomic_path, naming

CSV_NAME = "metrics.csv"
CSV_HEADER = ["step", "split", "metric", "value"]


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of a metrics CSV (file or run directory) as dicts with int step and float value."""
    p = Path(path)
    if p.is_dir():
        p = p / CSV_NAME
    with open(p, newline="") as f:
        return [
            {
                "step": int(r["step"]),
                "split": r["split"],
                "metric": r["metric"],
                "value": float(r["value"]),
            }
            for r in csv.DictReader(f)
        ]


class MetricsLogger:
    """Writes metrics of the main process; a no-op elsewhere (`enabled=False`)."""

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        *,
        enabled: bool = True,
        tensorboard: bool = True,
        resume_step: int | None = None,
    ) -> None:
        self.enabled = enabled
        self.out_dir = Path(out_dir)
        self._writer = None
        self._file = None
        if not enabled:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / CSV_NAME
        kept: list[list[str]] = []
        if resume_step is not None and path.exists():
            with open(path, newline="") as f:
                rows = list(csv.reader(f))
            kept = [
                r for r in rows[1:] if len(r) == 4 and r[0].isdigit() and int(r[0]) <= resume_step
            ]
        with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(CSV_HEADER)
            writer.writerows(kept)
        self._file = open(path, "a", newline="")  # noqa: SIM115 - closed in close()
        self._csv = csv.writer(self._file)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if resume_step is None else resume_step + 1
            self._writer = SummaryWriter(
                log_dir=str(self.out_dir / "tensorboard"), purge_step=purge
            )

    def log(self, step: int, split: str, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        with naming(self.out_dir / CSV_NAME):
            for name, value in metrics.items():
                self._csv.writerow([step, split, name, repr(float(value))])
                if self._writer is not None:
                    self._writer.add_scalar(f"{split}/{name}", float(value), step)
            self._file.flush()

    def flush(self) -> None:
        if self._file is not None:
            with naming(self.out_dir / CSV_NAME):
                self._file.flush()
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None


__all__ = ["CSV_HEADER", "CSV_NAME", "MetricsLogger", "read_metrics"]
