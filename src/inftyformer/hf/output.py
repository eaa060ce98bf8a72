"""`InftyformerOutput`: what a call of `InftyformerForCausalLM` returns, the same fields whether
the call held one segment (`forward_pass.segment_forward`) or was streamed through the memory
segment by segment (`segments.stream_forward`). A `ModelOutput`, so that Hugging Face's
generation reads its logits and cache as it reads a base model's."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.utils import ModelOutput

from ..native.state import MemoryState


@dataclass
class InftyformerOutput(ModelOutput):
    """loss        lm_loss + memory_loss (when labels are given)
    logits      [batch, T, V]
    state       the new memory state (MemoryState, detached), to pass to the next call
    cache       the base model's key/value cache (generation)
    lm_loss     mean next-token NLL over labels ≠ −100 (labels shifted inside, as in HF)
    token_loss  [batch, T − 1] NLL per predicted position, 0 where ignored
    kl          variance KL of the reads, mean over layers (unweighted)
    memory_loss kl_weight · kl + 0·Σp over memory parameters that had nothing to do; kl the
                mean over the scored positions of each token's read KL (`kl_term.py`)"""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    state: MemoryState | None = None
    cache: object | None = None
    lm_loss: torch.Tensor | None = None
    token_loss: torch.Tensor | None = None
    kl: torch.Tensor | None = None
    memory_loss: torch.Tensor | None = None


__all__ = ["InftyformerOutput"]
