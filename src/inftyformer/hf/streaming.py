"""Long documents through an `InftyformerForCausalLM`, in segments of L tokens.

`stream_loss` cuts tokens [batch, T] into consecutive segments of L = `segment_len` (the last
one shorter), calls the model once per segment and carries the memory (`segments.py`, the loop
that `model(input_ids)` on more than a segment uses too): a token sees the earlier tokens of its
own segment and the model's window (by default the previous segment) through the base model's
attention, and everything before the window only through the long-term memory (detached between
calls). Rows are parallel streams; `reset` [batch] clears rows before the first segment (their
document starts here).

The targets are aligned with the tokens (targets[:, t] is the token that follows tokens[:, t];
−100 is ignored), so the prediction of a segment's last position counts too: with
tokens = doc[:-1] and targets = doc[1:], every token of the document but the first is predicted
once. (The model's own `labels` shift inside one call, as in HF; a call on more than a segment
shifts over its whole input, so it too loses no prediction at the segment boundaries.)

Runs under the caller's grad mode: under torch.no_grad() it is whole-document evaluation; with
gradients, the per-token losses of all segments stay in the graph (the memory between segments
is detached, so each segment's graph is its own).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..native.model import token_losses
from ..native.state import MemoryState
from .model import InftyformerForCausalLM
from .segments import segment_calls


@dataclass
class StreamOutput:
    token_loss: torch.Tensor | None  # [batch, T] NLL per token, 0 where targets are −100
    state: MemoryState  # after the last segment (detached)
    memory_loss: torch.Tensor  # scalar: mean over segments of kl_weight·KL (+ 0·Σp, DDP)
    segments: int  # number of model calls


def stream_loss(
    model: InftyformerForCausalLM,
    tokens: torch.Tensor,
    targets: torch.Tensor | None = None,
    state: MemoryState | None = None,
    segment_len: int | None = None,
    reset: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> StreamOutput:
    """Per-token NLL of tokens [batch, T] against targets [batch, T] (None: only fill the
    memory), in segments of `segment_len` (default: the model's; a longer one is cut again by
    the model's own calls), carrying the memory `state`.
    Training loss: `token_loss.sum() / (targets != -100).sum() + memory_loss`."""
    if not isinstance(model, InftyformerForCausalLM):
        raise TypeError(f"model must be an InftyformerForCausalLM, got {type(model).__name__}")
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.shape[1] == 0:
        raise ValueError("tokens must be a tensor of shape [batch, T] with T >= 1")
    if targets is not None and (
        not isinstance(targets, torch.Tensor) or targets.shape != tokens.shape
    ):
        raise ValueError(
            f"targets must have the shape of tokens {tuple(tokens.shape)}, got "
            f"{tuple(targets.shape) if isinstance(targets, torch.Tensor) else type(targets)}"
        )
    if targets is not None:
        targets = model._check_ids("targets", targets, allow_ignore=True)
    losses, memory_losses = [], []
    for start, stop, out in segment_calls(model, tokens, state, segment_len, reset, generator):
        state = out.state
        memory_losses.append(out.memory_loss)
        if targets is not None:
            losses.append(token_losses(out.logits, targets[:, start:stop])[0])
    return StreamOutput(
        token_loss=torch.cat(losses, dim=1) if losses else None,
        state=state,
        memory_loss=torch.stack(memory_losses).mean(),
        segments=len(memory_losses),
    )


__all__ = ["StreamOutput", "stream_loss"]
