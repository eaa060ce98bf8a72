"""The base's attention during one call of the retrieval (`model.py`): the per-call context
(`Call`: the model, the state, the call's rotary angles, the keys and values it computes, the
blocks it chooses) travels in a context variable to `retrieval_attention`, which transformers
calls in every block of the base in place of its own attention (registered as
`ATTENTION`). In each block the call's queries attend to [sink; chosen blocks; window] (the
context `RetrievalLM.context` gathers, packed before the call's first token) and to the call's
own keys, causally. A first pass that only chooses (`reselect`) ends at the block where it
chooses (`select_layer`, or a question's own: `Call.choosing_layer`) by raising `Chosen`: the
blocks above it would compute nothing that is kept."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .decode import DecodeRun
from .state import turn, unturn

ATTENTION = "inftyformer_retrieval"


@dataclass
class Call:
    """What the attention function needs during one call of the base."""

    model: Any  # the RetrievalLM
    state: Any  # its RetrievalState
    layer_of: dict[int, int]  # id(attention module) → block index
    cos: torch.Tensor  # the call's rotary angles  [b, T, d]
    sin: torch.Tensor
    new_k: dict[int, torch.Tensor] = field(default_factory=dict)  # before rotary [b, Hkv, T, d]
    new_v: dict[int, torch.Tensor] = field(default_factory=dict)
    selected: torch.Tensor | None = None  # [b, blocks] ids of the blocks read
    selected_valid: torch.Tensor | None = None  # [b, blocks] bool
    question: torch.Tensor | None = None  # the queries that chose them, at P0 + t  [b, H, T, d]
    stop_after_select: bool = False  # a first pass that only chooses (`forward`'s reselect)
    question_call: bool = False  # the prompt's last call, whose answer is read next (reselect)
    hold: bool = False  # every block reads the state's choice; nothing chosen (`keep_choice`)
    chosen_first: bool = False  # its first pass chose; every block reads that choice
    layouts: dict = field(default_factory=dict)  # id(valid) → its angles and mask
    valids: dict = field(default_factory=dict)  # what a layer's valid slots depend on → them
    at: int = 0  # a one-token call's place in its run: its token sits at P0 + at
    run: DecodeRun | None = None  # the run of one-token calls this call extends

    @property
    def choosing_layer(self) -> int:
        """The block of the base where this call chooses its blocks: a question's own
        (`RetrievalLM.question_layer`, whose stored keys `select` then scores) or the model's
        `select_layer`."""
        return self.model.question_layer if self.question_call else self.model.select_layer


class Chosen(Exception):
    """Ends a first pass once the call has chosen its blocks."""


CALL: contextvars.ContextVar[Call | None] = contextvars.ContextVar(
    "inftyformer_retrieval_call", default=None
)


def retrieval_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """The base's attention over [context; the call's tokens] (module doc): query [b, H, T, d]
    and key/value [b, H_kv, T, d] of the call's tokens, turned to their positions P0 + t."""
    call = CALL.get()
    if call is None or id(module) not in call.layer_of:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    layer = call.layer_of[id(module)]
    if call.stop_after_select and layer == call.choosing_layer:
        # scored as `choice` scores: the queries turned back to P0 + t
        call.question = call.model.at_context_end(query, call.at)
        chosen = call.model.select(call.state, call.question, call.question_call)
        call.selected, call.selected_valid = chosen
        raise Chosen
    call.new_k[layer] = unturn(key, call.cos, call.sin)  # kept before rotary
    call.new_v[layer] = value
    if call.run is not None:  # one token of a run: the context turned once (retrieval_decode)
        out = call.run.attend(call, layer, query, key, value, scaling)
        if out is not None:
            return out, None
    ctx_k, ctx_v, valid = call.model.context(call, layer, query)  # [b, Hkv, P0, d], [b, P0]
    # the valid slots packed next to the call's first token (at P0 + at): slot j at
    # P0 + at − (valid slots from j on), so that what is read keeps its order without gaps
    # (the layers of a call share a few layouts: their angles and mask made once each)
    layout = call.layouts.get(id(valid))
    if layout is None:
        cos, sin = call.model.layout_angles(key, valid, call.at)
        T = query.shape[2]
        if T == 1 and bool(valid.all()):
            mask = None  # one query reading every slot: nothing to hide
        else:
            causal = torch.ones(T, T, dtype=torch.bool, device=query.device).tril()
            mask = torch.cat([valid[:, None, None, :].expand(-1, 1, T, -1),
                              causal.expand(valid.shape[0], 1, T, T)], -1)  # fmt: skip
        layout = call.layouts[id(valid)] = (cos, sin, mask, valid)  # valid kept: its id stays
    cos, sin, mask, _ = layout
    ctx_k = turn(ctx_k.to(key.dtype), cos, sin)
    out = F.scaled_dot_product_attention(
        query,
        torch.cat([ctx_k, key], 2),
        torch.cat([ctx_v.to(value.dtype), value], 2),
        attn_mask=mask,
        scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION, retrieval_attention)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)


__all__ = ["ATTENTION", "CALL", "Call", "Chosen", "retrieval_attention"]
