"""The segment loop of the pretrained path: a long input [batch, T] through an
`InftyformerForCausalLM` in calls of L = `segment_len` tokens (the last one shorter), the memory
carried from call to call: a token sees the earlier tokens of its own segment and the model's
window (by default the previous segment) through the base model's attention, and everything
before the window only through the long-term memory (detached between calls). Rows are parallel
streams; `reset` [batch] clears rows before the first segment (their document starts here).

    segment_calls   the loop (also under `streaming.stream_loss`)
    stream_forward  what `model(input_ids)` does with more than `segment_len` tokens: the
                    outputs of one call (logits of every position, the loss with HF's shift
                    inside, the final memory), so tools that call the model on a long sequence
                    use the memory without knowing about it

This module does not import `model.py` (the model imports it): the model is passed in.
Runs under the caller's grad mode; with gradients, every call's outputs stay in the graph.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from .._checks import check_segment_len
from ..native.model import IGNORE_INDEX, token_losses
from ..native.state import MemoryState


def segment_calls(
    model: nn.Module,
    tokens: torch.Tensor,
    state: MemoryState | None = None,
    segment_len: int | None = None,
    reset: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    attention_mask: torch.Tensor | None = None,
    options: Callable[[int, int], dict[str, Any]] | None = None,
) -> Iterator[tuple[int, int, Any]]:
    """(start, stop, output) of each call of `model` (an `InftyformerForCausalLM`) on
    tokens[:, start:stop], in order, the memory state carried from call to call (`reset` applies to
    the first). `segment_len`: the tokens per call, None for the model's own (declared once, in
    its `AdapterConfig`). `attention_mask` [batch, T] is cut like the tokens; `options(start,
    stop)`: further keyword arguments of that call."""
    seg = model.config.adapter.segment_len  # the model's (its config's, decided for its base)
    if segment_len is not None:  # this stream's own calls (a longer one is cut again by the model)
        seg = check_segment_len(segment_len)
    length = tokens.shape[1]
    for start in range(0, length, seg):
        stop = min(start + seg, length)
        out = model(
            tokens[:, start:stop],
            state=state,
            reset=reset if start == 0 else None,
            generator=generator,
            attention_mask=None if attention_mask is None else attention_mask[:, start:stop],
            **({} if options is None else options(start, stop)),
        )
        state = out.state
        yield start, stop, out


def _tokens_first(valid: torch.Tensor) -> torch.Tensor | None:
    """The order [batch, T] that moves each row's valid tokens to its start (in their order),
    or None when they are there already (no padding, or padding on the right only)."""
    count = valid.sum(1, keepdim=True)
    if bool((valid == (torch.arange(valid.shape[1], device=valid.device) < count)).all()):
        return None
    return torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices


def stream_forward(
    model: nn.Module,
    ids: torch.Tensor,
    state: MemoryState | None,
    labels: torch.Tensor | None,
    reset: torch.Tensor | None,
    valid: torch.Tensor | None,
    use_cache: bool | None,
    logits_to_keep: int,
    generator: torch.Generator | None,
    **kwargs: Any,
) -> dict[str, Any]:
    """`model(ids)` for ids [batch, T] longer than a segment (checked by the caller): calls of
    `segment_len` tokens each (with the window before them, so never past the base's positions)
    and the fields of one `InftyformerOutput`, as a single call gives them:

        logits       of every position [batch, T, V] (the last `logits_to_keep` when > 0)
        state        after the last segment
        lm_loss      mean next-token NLL over labels ≠ −100, labels shifted over the whole input
        token_loss   [batch, T − 1]
        kl, memory_loss  over the calls, each weighed by the positions it scores (the labels',
                     or `kl_weights` [batch, T]; else equally), so that kl is the mean over
                     every scored position of its read's KL, as in one call (`kl_term.py`);
                     loss = lm_loss + memory_loss
        cache        the last call's (the base's cache over the window and the last segment)

    Padding (`valid` [batch, T], False at attention-mask zeros): each row's tokens are streamed
    from its first one, so a padded row gives what the row alone gives, whatever side it is
    padded on (left-padded rows are moved to the left and their outputs moved back)."""
    batch, length = ids.shape
    targets = None
    if labels is not None:  # position t predicts labels[t + 1], as in one call
        targets = torch.cat([labels[:, 1:], labels.new_full((batch, 1), IGNORE_INDEX)], dim=1)
    scored = kwargs.pop("kl_weights", None)  # the positions whose reads' KL counts
    if scored is None and targets is not None:
        scored = targets != IGNORE_INDEX
    order = None if valid is None else _tokens_first(valid)
    if order is not None:
        ids, valid = ids.gather(1, order), valid.gather(1, order)
        targets = None if targets is None else targets.gather(1, order)
        scored = None if scored is None else scored.gather(1, order)
    mask = None if valid is None else valid.long()
    inverse = None if order is None else order.argsort(dim=1)  # caller's column → stream place
    # the first stream place whose logits are kept: a call before it computes none (a long
    # prompt's logits are its length × the vocabulary, 6.4 GB at 32K tokens of SmolLM2)
    first = 0
    if logits_to_keep and targets is None:
        first = max(0, length - logits_to_keep)
        if inverse is not None:  # the caller's last columns, wherever each row's tokens went
            first = int(inverse[:, -logits_to_keep:].min())

    def kept(start: int, stop: int) -> int:  # the call's places whose logits are kept
        return max(0, stop - max(start, first))

    def options(start: int, stop: int) -> dict[str, Any]:  # only the last call keeps a cache
        weights = {} if scored is None else {"kl_weights": scored[:, start:stop]}
        # a call keeping none asks for one (0 would be all of them) and drops it
        keep = {} if not first else {"logits_to_keep": max(1, kept(start, stop))}
        return {"use_cache": use_cache if stop == length else False, **weights, **keep, **kwargs}

    logits, losses, kls, memory_losses, counts, out = [], [], [], [], [], None
    calls = segment_calls(model, ids, state, None, reset, generator, mask, options)
    for start, stop, out in calls:
        logits.append(out.logits[:, out.logits.shape[1] - kept(start, stop) :])
        kls.append(out.kl)
        memory_losses.append(out.memory_loss)
        counts.append(1.0 if scored is None else float(scored[:, start:stop].sum()))
        if targets is not None:
            losses.append(token_losses(out.logits, targets[:, start:stop])[0])
    all_logits = torch.cat(logits, dim=1)  # of stream places first … length − 1
    token_loss = torch.cat(losses, dim=1) if losses else None
    if inverse is not None:  # back to the caller's columns (the kept ones)
        columns = inverse[:, -logits_to_keep:] if logits_to_keep else inverse  # [batch, kept]
        where = (columns - first)[..., None].expand(-1, -1, all_logits.shape[-1])
        all_logits = all_logits.gather(1, where)
        token_loss = None if token_loss is None else token_loss.gather(1, inverse)
    elif logits_to_keep:
        all_logits = all_logits[:, -logits_to_keep:]
    # each call's terms are means over its scored positions: weighed by their number
    share = torch.tensor(counts, dtype=torch.float64)
    share = share / share.sum() if share.sum() > 0 else torch.full_like(share, 1 / len(counts))
    memory_loss = sum(m * float(w) for m, w in zip(memory_losses, share, strict=True))
    output = dict(
        logits=all_logits,
        state=out.state,
        cache=out.cache,
        kl=sum(k * float(w) for k, w in zip(kls, share, strict=True)),
        memory_loss=memory_loss,
    )
    if labels is not None:
        token_loss = token_loss[:, :-1]
        lm_loss = token_loss.sum() / (labels[:, 1:] != IGNORE_INDEX).sum().clamp(min=1)
        output.update(loss=lm_loss + memory_loss, lm_loss=lm_loss, token_loss=token_loss)
    return output


__all__ = ["segment_calls", "stream_forward"]
