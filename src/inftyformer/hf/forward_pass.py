"""What one call of `InftyformerForCausalLM` does with the ids its `forward` checked (`model.py`'s
docstring, steps 0–3):

    segment_forward  one segment (T ≤ segment_len): the waiting inputs enter the long-term
                     memory, the window is recomputed before the segment, the base runs with
                     the reads added by the hooks, and the new state is written
    long_forward     more than a segment: checked as a whole, then streamed through the memory
                     in calls of one segment each (`segments.stream_forward`), so that the
                     positions never pass the base's and older text reaches later tokens
                     through the memory

Both return an `InftyformerOutput`. This module does not import `model.py` (the model imports
it): the model is passed in, as to the other modules of its jobs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..core.density import PreparedMemory
from ..native.model import token_losses
from ..native.state import MemoryState
from . import hooks, validation
from . import memory as memories
from .head_read import WindowMass
from .output import InftyformerOutput
from .segments import stream_forward
from .window import WindowedInputs


def segment_forward(
    model: nn.Module,
    ids: torch.Tensor,
    state: MemoryState | None,
    labels: torch.Tensor | None,
    reset: torch.Tensor | None,
    *,
    read_cache: tuple[PreparedMemory, ...] | None,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    cache: object | None,
    use_cache: bool | None,
    generator: torch.Generator | None,
    logits_to_keep: int | torch.Tensor,
    kl_weights: torch.Tensor | None,
    **kwargs: Any,
) -> InftyformerOutput:
    """One call of `model` on ids [batch, T] of one segment (T ≤ segment_len), labels [batch, T]
    checked already; the other arguments as `InftyformerForCausalLM.forward` takes them."""
    batch, length = ids.shape
    past_cache = cache or kwargs.get("past_key_values")
    validation.check_positions(model.config, length, position_ids, past_cache)
    valid = validation.check_mask(attention_mask, batch, length, model._param().device)
    if read_cache is None or reset is not None or not isinstance(state, MemoryState):
        state = model.prepare_state(state, batch, reset)
    elif state.batch_size != batch or len(read_cache) != model.num_layers:
        raise ValueError("read_cache and state must come from prepare_reads for this batch")
    # else: a generation step; generate() checked this state once, it does not change
    past = 0 if cache is None else int(cache.get_seq_length())

    # 1. what the previous call stored enters the long-term memory, in this call's graph
    long_term, unused = memories.fit_waiting(model.long_term, state, generator)

    # the short-term window: the previous tokens, recomputed before this call's as context
    # (a call that continues a base cache has them in the cache already)
    limit = validation.position_limit(model.config)
    inputs = WindowedInputs.build(
        state.window, ids, valid, attention_mask, position_ids, past, limit
    )

    # 2. the base model, with the reads added by the hooks
    call = hooks.Call(
        owner=model._owner,
        norms=model._norms,
        outputs=model._outputs,
        layers=model.long_term,
        long_term=long_term,
        normed=[None] * model.num_layers,
        reads=[None] * model.num_layers,
        prepared=read_cache,
    )
    adapter = model.config.adapter
    if model._attentions is not None:  # the heads read
        call.attentions = model._attentions
        call.token_mass = adapter.memory_read.token_mass
        call.window_mass = WindowMass({id(m) for m in call.attentions})
    if model._rotary is not None:  # each place at its own position
        call.rotary, call.limit = model._rotary, limit
        call.positions, call.past = inputs.position_ids, past
        call.ranks = adapter.positions == "ranks"
    salient = model._salient and not past  # the call's surprisal wanted
    keep, extra = inputs.logits_to_keep(logits_to_keep, salient)
    with hooks.active(call):
        base_out = model.base(
            input_ids=inputs.ids,
            attention_mask=inputs.attention_mask,
            position_ids=inputs.position_ids,
            cache=cache,
            use_cache=use_cache,
            logits_to_keep=keep,
            **kwargs,
        )
    if any(r is None for r in call.reads):
        missing = [model.memory_blocks[i] for i, r in enumerate(call.reads) if r is None]
        raise RuntimeError(f"the long-term memory of blocks {missing} was not read")

    # 3. the new state: long-term after step 1 (+ sticky histogram); what left the window
    # waits (this segment, without a window), the window moves on. A call continuing a
    # cache (generation) writes nothing.
    logits = base_out.logits
    surprisal = memories.surprisal(logits, ids, extra) if salient else None
    logits = logits[:, extra:]
    new_state, per_token, zeros = memories.written(
        model, call, long_term, unused, inputs, state.window, batch, past, surprisal
    )
    kl, memory_loss = memories.kl_loss(model, per_token, zeros, labels, valid, kl_weights)
    new_state.issued_by = model._owner  # taken back unchecked by the next call
    output = InftyformerOutput(
        logits=logits,
        state=new_state,
        cache=getattr(base_out, "cache", None),
        kl=kl,
        memory_loss=memory_loss,
    )
    if labels is not None:
        if logits.shape[1] != length:
            raise ValueError("labels need the logits of every position (logits_to_keep=0)")
        # position t predicts token t + 1
        token_loss, lm_loss = token_losses(logits[:, :-1], labels[:, 1:])
        output.loss = lm_loss + memory_loss
        output.lm_loss, output.token_loss = lm_loss, token_loss
    return output


def long_forward(
    model: nn.Module,
    ids: torch.Tensor,
    state: MemoryState | None,
    labels: torch.Tensor | None,
    reset: torch.Tensor | None,
    *,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    cache: object | None,
    use_cache: bool | None,
    generator: torch.Generator | None,
    logits_to_keep: int | torch.Tensor,
    **kwargs: Any,
) -> InftyformerOutput:
    """`forward` on ids [batch, T] of more than `segment_len` tokens: what a streamed call
    cannot take is refused (`validation.check_stream`), then the calls of one segment each
    (`segments.stream_forward`; `kwargs` hold the rest of the call's arguments, `kl_weights`
    among them)."""
    batch, length = ids.shape
    past = cache or kwargs.pop("past_key_values", None)
    validation.check_stream(model.config, length, position_ids, past, logits_to_keep)
    valid = validation.check_mask(attention_mask, batch, length, model._param().device)
    fields = stream_forward(
        model,
        ids,
        state,
        labels,
        reset,
        valid,
        use_cache=use_cache,
        logits_to_keep=logits_to_keep,
        generator=generator,
        **kwargs,
    )
    return InftyformerOutput(**fields)


__all__ = ["long_forward", "segment_forward"]
