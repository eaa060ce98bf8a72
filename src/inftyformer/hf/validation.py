"""What a call of an `InftyformerForCausalLM` (`model.py`) is handed, checked at the boundary with
a clear ValueError: the token ids and labels, the attention mask, the positions the call reaches,
the options of an input longer than a segment, and a memory (its layers, shapes, dtypes, device,
window and provenance). The internal calls that follow run unchecked (the memory's and the
attention's private methods and the attention's module call).

This module does not import `model.py` (the model imports it): the model is passed in.
"""

from __future__ import annotations

import torch
from torch import nn

from .._checks import STATE_MAGNITUDE, ValueChecks, check_token_ids
from ..core.state import LongTermState
from ..native.model import IGNORE_INDEX
from ..native.state import LayerState, MemoryState, TokenWindow, check_salience
from ..native.state_record import check_memory_record


def position_limit(config) -> int | None:
    """The base's number of positions (max_position_embeddings), None when it has none."""
    limit = getattr(config.text_config, "max_position_embeddings", None)
    return None if limit is None else int(limit)


def check_ids(config, name: str, ids: object, device, allow_ignore: bool) -> torch.Tensor:
    vocab = config.text_config.vocab_size
    ignore = IGNORE_INDEX if allow_ignore else None
    return check_token_ids(name, ids, vocab, device, ignore)


def check_labels(labels: torch.Tensor, ids: torch.Tensor) -> None:
    if labels.shape != ids.shape:
        raise ValueError(
            f"labels must have the shape of input_ids {tuple(ids.shape)}, got {tuple(labels.shape)}"
        )


def check_call(model: nn.Module, kwargs: dict) -> None:
    """What no call may use: input embeddings, gradient checkpointing, an unwrapped model."""
    if kwargs.get("inputs_embeds") is not None:
        raise ValueError("inputs_embeds is not supported: pass input_ids")
    if model.training and any(
        getattr(m, "gradient_checkpointing", False) for m in model.base.modules()
    ):
        raise ValueError(
            "gradient checkpointing is not supported with the long-term memory "
            "(the recomputed blocks would run without it)"
        )
    if not model._hooks:
        raise RuntimeError("this model was unwrapped: its hooks are gone")


def check_mask(attention_mask: object, batch: int, length: int, device) -> torch.Tensor | None:
    """The [batch, T] validity of this call's tokens, or None when all are valid."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2:
        raise ValueError(
            "attention_mask must be a [batch, length] tensor of 0/1 "
            "(4-D masks are not supported with the long-term memory)"
        )
    if attention_mask.shape[0] != batch or attention_mask.shape[1] < length:
        raise ValueError(
            f"attention_mask must have shape ({batch}, >= {length}), "
            f"got {tuple(attention_mask.shape)}"
        )
    valid = attention_mask[:, -length:].to(device) != 0  # [batch, T]
    return None if bool(valid.all()) else valid


def check_positions(config, length: int, position_ids: object, cache: object) -> None:
    """Refuse a call reaching beyond the base's positions (max_position_embeddings), which
    would fail inside the base (an IndexError in GPT-2's position table) or run where it was
    never trained (explicit position_ids, or a call continuing a cache: a longer input
    without them is streamed, segment by segment, through the memory)."""
    limit = getattr(config.text_config, "max_position_embeddings", None)
    if not isinstance(limit, int):
        return
    if isinstance(position_ids, torch.Tensor) and position_ids.numel():
        end = int(position_ids.max()) + 1
    else:
        past = cache.get_seq_length() if hasattr(cache, "get_seq_length") else 0
        end = int(past) + length
    if end > limit:
        raise ValueError(
            f"the input reaches position {end}, but the base model has {limit} positions "
            f"(max_position_embeddings): feed a longer text segment by segment (segment_len "
            f"{config.adapter.segment_len}) with the memory carried between calls"
        )


def check_stream(
    config, length: int, position_ids: object, past: object, logits_to_keep: object
) -> None:
    """What a call on more than `segment_len` tokens (streamed, `segments.stream_forward`)
    refuses: continuing a cache, explicit positions, a tensor or negative logits_to_keep."""
    seg = config.adapter.segment_len
    if hasattr(past, "get_seq_length") and int(past.get_seq_length()):
        raise ValueError(
            f"a call continuing a key/value cache takes at most segment_len={seg} tokens, "
            f"got {length}"
        )
    if position_ids is not None:
        raise ValueError(
            f"position_ids are not supported on inputs longer than segment_len={seg} "
            f"(got {length} tokens): they are cut into calls of {seg} whose positions count "
            "from each call's window; leave position_ids out"
        )
    if isinstance(logits_to_keep, torch.Tensor) or logits_to_keep < 0:
        raise ValueError(
            f"logits_to_keep must be an int >= 0 on inputs longer than segment_len={seg}"
        )


def check_reset(reset: object, batch_size: int) -> None:
    if not isinstance(reset, torch.Tensor) or reset.dtype != torch.bool:
        raise ValueError("reset must be a bool tensor of shape [batch]")
    if tuple(reset.shape) != (batch_size,):
        raise ValueError(f"reset must have shape ({batch_size},), got {tuple(reset.shape)}")


def check_state(model: nn.Module, state: object, batch_size: int) -> MemoryState:
    """A clear ValueError when `state` does not fit `model` and a batch of `batch_size`
    rows."""
    if not isinstance(state, MemoryState):
        raise ValueError(f"state must be a MemoryState or None, got {type(state).__name__}")
    if len(state.layers) != model.num_layers:
        raise ValueError(f"state has {len(state.layers)} layers, the model has {model.num_layers}")
    if state.batch_size != batch_size:
        raise ValueError(
            f"state has batch size {state.batch_size} but input_ids have {batch_size} rows "
            "(pass reset=all True to start new streams)"
        )
    d, device = model.config.hidden_size, model._param().device
    limit = position_limit(model.config)
    values = ValueChecks()  # every layer's values, read with one host synchronisation
    for i, (layer, part) in enumerate(zip(model.long_term, state.layers, strict=True)):
        name = f"state.layers[{i}]"
        if not isinstance(part, LayerState) or part.long_term is None:
            raise ValueError(f"{name} must be a LayerState with a long_term state")
        if part.compressed is not None:
            raise ValueError(f"{name}.compressed must be None for this model")
        # what waits is one call's hidden states: at most the base's positions
        part.short_term.check(f"{name}.short_term", batch_size, d, limit or 1 << 30, values=values)
        if not isinstance(part.long_term, LongTermState):
            raise ValueError(f"{name}.long_term must be a LongTermState")
        try:  # like a native model's states: dtypes, shapes, values within STATE_MAGNITUDE
            part.long_term.check(
                layer.memory.config,
                f"{name}.long_term",
                layer.memory.state_dtypes(),
                values,
                STATE_MAGNITUDE,
            )
        except TypeError as err:
            raise ValueError(str(err)) from err
        if part.long_term.batch_size != batch_size:
            raise ValueError(
                f"{name}.long_term has batch size {part.long_term.batch_size}, "
                f"expected {batch_size}"
            )
        if part.long_term.coefficients.device != device:
            raise ValueError(
                f"{name} is on {part.long_term.coefficients.device}, the model on {device}: "
                "use state.to(device)"
            )
    check_window(model.config, state.window, batch_size, device, values)
    check_salience(state, batch_size, values)
    values.run()
    # provenance last: a state of other shapes is named by its shapes above
    if state.source is not None and state.source != model.state_source:
        raise ValueError(
            f"state was made by {state.source}; this model is {model.state_source}: a "
            "memory state holds one base model's hidden states and cannot be read by another"
        )
    check_memory_record(state, model.state_record)
    return state


def check_window(
    config, window: TokenWindow | None, batch_size: int, device, values: ValueChecks
) -> None:
    """The memory's token window for this model; its values queued in `values`."""
    size = config.adapter.window
    if not size:
        if window is not None:
            raise ValueError(
                "state has a token window, but this model attends within each call "
                "(window=0): was the state made by a model with a window?"
            )
        return
    if window is None:
        raise ValueError(
            f"state has no token window, but this model attends to the previous {size} "
            "tokens (window > 0): was the state made by a model with window=0?"
        )
    window.check(batch_size, values)
    if window.tokens.shape[1] > size:
        raise ValueError(
            f"state.window holds {window.tokens.shape[1]} tokens, more than this model's "
            f"window of {size}"
        )
    if window.tokens.device != device:
        raise ValueError(
            f"state.window is on {window.tokens.device}, the model on {device}: "
            "use state.to(device)"
        )
    vocab = config.text_config.vocab_size
    values.require(window.tokens < vocab, f"state.window.tokens must be in [0, {vocab})")


__all__ = [
    "check_call",
    "check_ids",
    "check_labels",
    "check_mask",
    "check_state",
    "check_positions",
    "check_reset",
    "check_stream",
    "check_window",
    "position_limit",
]
