"""Whether the long-term reads depend on the query, measured on every training step.

A stuck density (every query reading the same flat average of the past, the failure of the
paper's form at small scores: core/attention.py) looks like a healthy run in the loss. The
monitor watches every `LongTermAttention` of a model through forward hooks, native or pretrained,
and gives per memory layer i, averaged over the step's reads of non-empty memories (weighted by
their rows) and over processes:

    density/L{i}/sigma_median   median σ of the reads
    density/L{i}/mu_spread      μ's standard deviation across the queries of a head

The trainer logs them with the step's metrics (metrics.csv, TensorBoard); `inftyformer inspect`
reports the same two figures from a recorded stream.
"""

from __future__ import annotations

import torch
from torch import nn

from ..core.attention import LongTermAttention, density_statistics
from ..core.state import LongTermState
from .distributed import DistEnv, reduce_sums


class DensityMonitor:
    """Accumulates `density_statistics` of every long-term read between `start()` and
    `metrics()`; holds nothing for a model without long-term memory."""

    def __init__(self, model: nn.Module) -> None:
        self.layers = [m for m in model.modules() if isinstance(m, LongTermAttention)]
        self._sums: list[torch.Tensor | None] = []
        self._handles = [
            layer.register_forward_hook(self._hook(i)) for i, layer in enumerate(self.layers)
        ]
        self.start()

    def _hook(self, index: int):
        def record(module: nn.Module, args: tuple, output) -> None:
            state = args[1] if len(args) > 1 else None
            if not isinstance(state, LongTermState):
                return
            sigma_median, mu_spread, rows = density_statistics(
                output.mu, output.sigma_sq, state.empty
            )
            # kept on the model's device: read back once per step, in `metrics()`
            step = torch.stack([sigma_median * rows, mu_spread * rows, rows])
            previous = self._sums[index]
            self._sums[index] = step if previous is None else previous + step

        return record

    def start(self) -> None:
        """Forget what was recorded (e.g. by an evaluation between two steps)."""
        self._sums = [None for _ in self.layers]

    def metrics(self, env: DistEnv) -> dict[str, float]:
        """The step's figures per layer, over every process's reads; then `start()`. Layers
        whose memories were all empty this step are left out (on every process alike)."""
        sums: dict[str, float] = {}
        for i, s in enumerate(self._sums):
            sigma, spread, rows = [0.0, 0.0, 0.0] if s is None else s.tolist()
            sums.update({f"{i}/sigma": sigma, f"{i}/spread": spread, f"{i}/rows": rows})
        sums = reduce_sums(sums, env)  # every process holds the same keys
        out: dict[str, float] = {}
        for i in range(len(self.layers)):
            rows = sums[f"{i}/rows"]
            if rows > 0:
                out[f"density/L{i}/sigma_median"] = sums[f"{i}/sigma"] / rows
                out[f"density/L{i}/mu_spread"] = sums[f"{i}/spread"] / rows
        self.start()
        return out

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
