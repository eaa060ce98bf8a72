"""Recording a stream: what every layer's memories did while a model streamed real input (the
reads' μ and σ², the long-term updates, the coefficients after each call, the compressions).
The package docstring (`inftyformer.inspection`) says how the stream is cut into calls."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .._checks import check_tensor
from .._progress import progress as show_progress
from ..native.model import MemoryLM


@dataclass
class LayerRecord:
    """What one layer's memories did over a stream (lists are per call unless noted).

    reads        (call, mu [batch, H, C], sigma_sq [batch, H, C]) for the calls whose long-term
                 memory was not empty
    updates      (call, stored [batch, C, e], samples [M] | [batch, M] | None) per long-term
                 update, in order (update j stores block j)
    coefficients B [batch, N, e] after each call (∞-former), index = call
    compressions (call, source [batch, F, d], count [batch], slots [batch, F/c, d]) per call that
                 compressed something (compressive)
    """

    reads: list[tuple[int, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    updates: list[tuple[int, torch.Tensor, torch.Tensor | None]] = field(default_factory=list)
    coefficients: list[torch.Tensor] = field(default_factory=list)
    compressions: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = field(
        default_factory=list
    )


@dataclass
class StreamRecord:
    model_type: str
    segment_len: int  # C: tokens per call, and per long-term update
    num_tokens: int  # T
    batch_size: int
    layers: list[LayerRecord]


@torch.no_grad()
def record_stream(model: MemoryLM, tokens: torch.Tensor, progress: bool = False) -> StreamRecord:
    """Stream `tokens` [batch, T] through `model` in calls of `segment_len` from a fresh memory,
    in evaluation mode, and record what every layer's memories did (see the module docstring).
    `progress`: a bar over the calls, with the time left."""
    if not isinstance(model, MemoryLM):
        raise TypeError(
            f"model must be a MemoryLM (the native transformer, xl, compressive or infty), got "
            f"{type(model).__name__}: inspection does not follow a pretrained model's memory yet "
            "(experiments/compare_pretrained.py measures its reads' σ, μ and size)"
        )
    check_tensor("tokens", tokens, 2)
    c = model.config
    C = c.segment_len
    batch, total = tokens.shape
    if total < 1:
        raise ValueError("tokens must hold at least one token per row")
    was_training = model.training
    model.eval()
    layers = [LayerRecord() for _ in range(c.n_layers)]
    try:
        state = model.init_state(batch)
        starts = show_progress(
            range(0, total, C), desc="streaming", unit=" segments", enabled=progress
        )
        for call, start in enumerate(starts):
            out = model(tokens[:, start : start + C], state=state, return_trace=True)
            state = out.state
            assert out.trace is not None
            for layer, trace, record in zip(state.layers, out.trace, layers, strict=True):
                if trace.mu is not None and not bool(trace.read_empty.any()):
                    record.reads.append((call, trace.mu.cpu(), trace.sigma_sq.cpu()))
                for update, rows in trace.updates:
                    if not bool(rows.all()):
                        raise RuntimeError("rows of one stream updated their memory apart")
                    samples = None if update.samples is None else update.samples.cpu()
                    record.updates.append((call, update.stored.cpu(), samples))
                if layer.long_term is not None:
                    record.coefficients.append(layer.long_term.coefficients.cpu())
                if trace.compressed is not None:
                    record.compressions.append(
                        (
                            call,
                            trace.compressed_from.cpu(),
                            trace.compressed_count.cpu(),
                            trace.compressed.cpu(),
                        )
                    )
    finally:
        model.train(was_training)
    for record in layers:
        calls = [call for call, *_ in record.updates]
        if len(set(calls)) != len(calls):
            raise RuntimeError("a call made two long-term updates: calls must be whole blocks")
    return StreamRecord(c.model_type, C, total, batch, layers)
