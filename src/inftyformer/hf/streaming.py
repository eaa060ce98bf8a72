"""Long documents through an `InftyformerForCausalLM`, in segments of L tokens.

`segment_calls` is the loop: it cuts tokens [batch, T] into consecutive segments of
L = `segment_len` (the last one shorter), calls the model once per segment and carries the
memory: a token sees the earlier tokens of its own segment and the model's window (by default
the previous segment) through the base model's attention, and everything before the window only
through the long-term memory (detached between calls). Rows are parallel streams; `reset`
[batch] clears rows before the first segment (their document starts here). Two users:

    stream_loss     per-token losses against targets aligned with the tokens
    stream_forward  what `model(input_ids)` does with more than `segment_len` tokens: the same
                    outputs as one call (logits of every position, the loss with HF's shift
                    inside, the final memory), so tools that call the model on a long sequence
                    use the memory without knowing about it

The targets of `stream_loss` are aligned with the tokens (targets[:, t] is the token that
follows tokens[:, t]; −100 is ignored), so the prediction of a segment's last position counts
too: with tokens = doc[:-1] and targets = doc[1:], every token of the document but the first is
predicted once. (The model's own `labels` shift inside one call, as in HF; a long call shifts
over the whole input, so it loses no prediction at the segment boundaries.)

Runs under the caller's grad mode: under torch.no_grad() it is whole-document evaluation; with
gradients, the per-token losses of all segments stay in the graph (the memory between segments
is detached, so each segment's graph is its own).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..model import IGNORE_INDEX, token_losses
from ..state import MemoryState
from .model import InftyformerForCausalLM, InftyformerOutput


@dataclass
class StreamOutput:
    token_loss: torch.Tensor | None  # [batch, T] NLL per token, 0 where targets are −100
    memory: MemoryState  # after the last segment (detached)
    memory_loss: torch.Tensor  # scalar: mean over segments of kl_weight·KL (+ 0·Σp, DDP)
    segments: int  # number of model calls


def segment_calls(
    model: InftyformerForCausalLM,
    tokens: torch.Tensor,
    memory: MemoryState | None = None,
    segment_len: int | None = None,
    reset: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    attention_mask: torch.Tensor | None = None,
    options: Callable[[int, int], dict[str, Any]] | None = None,
) -> Iterator[tuple[int, int, InftyformerOutput]]:
    """(start, stop, output) of each call on tokens[:, start:stop], in order, the memory carried
    from call to call (`reset` applies to the first). `attention_mask` [batch, T] is cut like
    the tokens; `options(start, stop)`: further keyword arguments of that call."""
    seg = model.config.segment_len if segment_len is None else segment_len
    if isinstance(seg, bool) or not isinstance(seg, int) or seg < 1:
        raise ValueError(f"segment_len must be a positive int, got {seg!r}")
    length = tokens.shape[1]
    for start in range(0, length, seg):
        stop = min(start + seg, length)
        out = model(
            tokens[:, start:stop],
            memory=memory,
            reset=reset if start == 0 else None,
            generator=generator,
            attention_mask=None if attention_mask is None else attention_mask[:, start:stop],
            **({} if options is None else options(start, stop)),
        )
        memory = out.memory
        yield start, stop, out


def stream_loss(
    model: InftyformerForCausalLM,
    tokens: torch.Tensor,
    targets: torch.Tensor | None = None,
    memory: MemoryState | None = None,
    segment_len: int | None = None,
    reset: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> StreamOutput:
    """Per-token NLL of tokens [batch, T] against targets [batch, T] (None: only fill the
    memory), in segments of `segment_len` (default: the model's; a longer one is cut again by
    the model's own calls), carrying `memory`.
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
    for start, stop, out in segment_calls(model, tokens, memory, segment_len, reset, generator):
        memory = out.memory
        memory_losses.append(out.memory_loss)
        if targets is not None:
            losses.append(token_losses(out.logits, targets[:, start:stop])[0])
    return StreamOutput(
        token_loss=torch.cat(losses, dim=1) if losses else None,
        memory=memory,
        memory_loss=torch.stack(memory_losses).mean(),
        segments=len(memory_losses),
    )


def _tokens_first(valid: torch.Tensor) -> torch.Tensor | None:
    """The order [batch, T] that moves each row's valid tokens to its start (in their order),
    or None when they are there already (no padding, or padding on the right only)."""
    count = valid.sum(1, keepdim=True)
    if bool((valid == (torch.arange(valid.shape[1], device=valid.device) < count)).all()):
        return None
    return torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices


def stream_forward(
    model: InftyformerForCausalLM,
    ids: torch.Tensor,
    memory: MemoryState | None,
    labels: torch.Tensor | None,
    reset: torch.Tensor | None,
    valid: torch.Tensor | None,
    use_cache: bool | None,
    logits_to_keep: int,
    generator: torch.Generator | None,
    **kwargs: Any,
) -> InftyformerOutput:
    """`model(ids)` for ids [batch, T] longer than a segment (checked by the caller): calls of
    `segment_len` tokens each (with the window before them, so never past the base's positions)
    and one output as a single call gives it:

        logits       of every position [batch, T, V] (the last `logits_to_keep` when > 0)
        memory       after the last segment
        lm_loss      mean next-token NLL over labels ≠ −100, labels shifted over the whole input
        token_loss   [batch, T − 1]
        kl, memory_loss  means over the calls; loss = lm_loss + memory_loss
        cache        the last call's (the base's cache over the window and the last segment)

    Padding (`valid` [batch, T], False at attention-mask zeros): each row's tokens are streamed
    from its first one, so a padded row gives what the row alone gives, whatever side it is
    padded on (left-padded rows are moved to the left and their outputs moved back)."""
    batch, length = ids.shape
    targets = None
    if labels is not None:  # position t predicts labels[t + 1], as in one call
        targets = torch.cat([labels[:, 1:], labels.new_full((batch, 1), IGNORE_INDEX)], dim=1)
    order = None if valid is None else _tokens_first(valid)
    if order is not None:
        ids, valid = ids.gather(1, order), valid.gather(1, order)
        targets = None if targets is None else targets.gather(1, order)
    mask = None if valid is None else valid.long()

    def options(start: int, stop: int) -> dict[str, Any]:  # only the last call keeps a cache
        return {"use_cache": use_cache if stop == length else False, **kwargs}

    logits, losses, kls, memory_losses, out = [], [], [], [], None
    calls = segment_calls(model, ids, memory, None, reset, generator, mask, options)
    for start, stop, out in calls:
        logits.append(out.logits)
        kls.append(out.kl)
        memory_losses.append(out.memory_loss)
        if targets is not None:
            losses.append(token_losses(out.logits, targets[:, start:stop])[0])
    all_logits = torch.cat(logits, dim=1)
    token_loss = torch.cat(losses, dim=1) if losses else None
    if order is not None:  # back to the caller's columns
        inverse = order.argsort(dim=1)
        all_logits = all_logits.gather(1, inverse[..., None].expand_as(all_logits))
        token_loss = None if token_loss is None else token_loss.gather(1, inverse)
    if logits_to_keep:
        all_logits = all_logits[:, -logits_to_keep:]
    memory_loss = torch.stack(memory_losses).mean()
    output = InftyformerOutput(
        logits=all_logits,
        memory=out.memory,
        cache=out.cache,
        kl=torch.stack(kls).mean(),
        memory_loss=memory_loss,
    )
    if labels is not None:
        token_loss = token_loss[:, :-1]
        lm_loss = token_loss.sum() / (labels[:, 1:] != IGNORE_INDEX).sum().clamp(min=1)
        output.loss = lm_loss + memory_loss
        output.lm_loss, output.token_loss = lm_loss, token_loss
    return output


__all__ = ["StreamOutput", "segment_calls", "stream_forward", "stream_loss"]
