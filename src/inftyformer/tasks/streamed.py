"""Synthetic tasks scored on the last block of a stream (sorting, recall).

Their examples are drawn fresh for every batch (`self.datasets[split].batch(index)` →
(inputs [B, S], targets [B, S])); each batch starts from an empty memory, streams every block but
the last without gradients (every memory detaches what it stores, so no gradient could reach them
anyway), then the last block, which holds every scored position, with gradients. Loss and accuracy
count only the positions whose target is not ignored. A task subclasses `LastBlockTask`, sets
`datasets` and says where its blocks are (`blocks`) and how its examples are counted
(`eval_metrics`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .._progress import progress as show_progress
from ..data import check_split
from ..model_kinds import unwrap
from .base import Evaluation, Shard, StepOutput, Task, add_sums, scored_sums


class LastBlockTask(Task):
    """The streaming, training step and evaluation shared by sorting and recall."""

    datasets: dict[str, Any]  # split → dataset with .batch(index) -> (inputs, targets)

    def blocks(self, length: int, segment_len: int) -> list[tuple[int, int]]:
        """[start, stop) of each block of a stream of `length` tokens; the last one is scored."""
        raise NotImplementedError

    def _run(
        self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, with_grad: bool
    ) -> tuple[Any, torch.Tensor]:
        """Stream every block but the last without gradients, then the last one.
        inputs, targets [batch, S] → (the model's output on the last block, its targets)."""
        raw = unwrap(model)  # gradients go through `model` (a DDP wrapper synchronises them)
        device = self.context.device
        inputs, targets = inputs.to(device), targets.to(device)
        state = raw.init_state(inputs.shape[0], device)
        *memory, (start, stop) = self.blocks(inputs.shape[1], raw.config.segment_len)
        with torch.no_grad():
            for a, b in memory:
                state = raw(inputs[:, a:b], state=state).state
        last_targets = targets[:, start:stop]
        with torch.set_grad_enabled(with_grad):
            out = model(inputs[:, start:stop], state=state, targets=last_targets)
        return out, last_targets

    # ---- training
    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.datasets["train"].batch(step)

    def loss(self, model: nn.Module, batch: Any, rows: slice, part: int) -> StepOutput:
        inputs, targets = batch[0][rows], batch[1][rows]
        out, last_targets = self._run(model, inputs, targets, with_grad=True)
        sums = scored_sums(out.logits, last_targets)
        sums["tokens"] = float(inputs.numel())
        return StepOutput(out.loss, sums, {k: float(v.detach()) for k, v in out.aux.items()})

    def train_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        out = super().train_metrics(sums)
        if sums.get("count"):
            out["accuracy"] = sums["correct"] / sums["count"]
        return out

    # ---- evaluation
    @torch.no_grad()
    def evaluate(
        self, model: nn.Module, split: str, num_batches: int | None, shard: Shard
    ) -> Evaluation:
        check_split(split)
        if num_batches is None or num_batches < 1:
            raise ValueError(
                f"the {self.name} task evaluates a number of batches, got {num_batches}"
            )
        was_training = model.training
        model.eval()
        total: dict[str, float] = {}
        try:
            batches = show_progress(
                range(num_batches),
                desc=f"evaluating {split}",
                enabled=self.context.progress,
                leave=False,
            )
            for index in batches:
                inputs, targets = self.eval_batch(split, index)
                rows = shard.rows(inputs.shape[0])
                out, last_targets = self._run(model, inputs[rows], targets[rows], False)
                add_sums(total, self.batch_sums(out.logits, last_targets))
        finally:
            model.train(was_training)
        return Evaluation(total)

    def eval_batch(self, split: str, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) [batch, S] of evaluation batch `index` of `split`."""
        return self.datasets[split].batch(index)

    def batch_sums(self, logits: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        """The statistics of one scored block (`scored_sums`: nll, correct, count)."""
        return scored_sums(logits, targets)

    def scored_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """Mean loss and accuracy over the scored positions."""
        count = max(sums.get("count", 0.0), 1.0)
        return {
            "loss": sums.get("nll", 0.0) / count,
            "accuracy": sums.get("correct", 0.0) / count,
        }
