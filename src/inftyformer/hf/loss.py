"""The next-token loss of a pretrained model without [batch, T, V] tensors.

`F.cross_entropy` on logits [n, V] keeps its log-probabilities [n, V] for the backward pass, and
the backward pass makes two more tensors of that size (the gradient of the log-probabilities,
then of the logits) before the output head turns them into the gradient of its input [n, d].
With SmolLM2's vocabulary (V = 49,152) a segment of batch 4 × 256 makes the logits and each of
those 201 MB, while what the memory's parameters need is the gradient of the head's input,
2.4 MB.

`lean_token_losses(hidden, weight, bias, targets)` gives the per-token NLL of the logits
hidden @ weightᵀ + bias (the head's weights frozen) in chunks of rows (`CHUNK_ELEMENTS`): each
chunk's logits, their `F.cross_entropy`, and the gradient of each row's NLL with respect to
`hidden`, (softmax − one-hot) @ weight. Only that [n, d] is kept for the backward pass, which
scales its rows by the incoming gradient; no [n, V] tensor is made but one chunk's. The same
matrix products as autograd's through the head (one forward, one backward), so no extra time;
the values equal `token_losses` of the full logits to round-off (`tests/hf/test_hf_loss.py`).

`HeadInputs` records what the output head is called with during a forward pass (a forward
pre-hook that acts only inside `with HeadInputs(head)` on the same thread, like the adapter's
hooks) and, with `skip=True`, hands the head zero positions instead, so that the Hugging Face
model computes no logits: the caller computes what it needs from the recorded input
(`hf.pretrained_lm.PretrainedMemoryLM` gives them on first use).
"""

from __future__ import annotations

import contextvars
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..native.model import IGNORE_INDEX

CHUNK_ELEMENTS = 1 << 22  # rows × V per chunk: 16 MB of float32 at a time

# architectures whose logits are their output head's output, unscaled (the adapters' two)
PLAIN_HEADS = ("GPT2LMHeadModel", "LlamaForCausalLM")


class _LeanNLL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, rows):
        n = hidden.shape[0]
        loss = torch.empty(n, dtype=torch.float32, device=hidden.device)
        need = ctx.needs_input_grad[0]
        grad = torch.empty_like(hidden) if need else None
        for start in range(0, n, rows):
            stop = min(start + rows, n)
            x = F.linear(hidden[start:stop], weight, bias).float()  # this chunk's logits
            t = targets[start:stop]
            loss[start:stop] = F.cross_entropy(x, t, ignore_index=IGNORE_INDEX, reduction="none")
            if need:
                p = torch.softmax(x, dim=-1)  # d NLL / d logits = softmax − one-hot
                valid = t != IGNORE_INDEX
                index = torch.arange(stop - start, device=p.device)[valid]
                p[index, t[valid]] -= 1.0
                p[~valid] = 0.0  # ignored targets: no gradient
                grad[start:stop] = (p.to(weight.dtype) @ weight).to(hidden.dtype)
        ctx.save_for_backward(grad)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        (grad,) = ctx.saved_tensors
        return grad * grad_loss[:, None].to(grad.dtype), None, None, None, None


def lean_token_losses(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token_loss [batch, L], lm_loss) as `model.token_losses(logits, targets)` gives them for
    logits = hidden [batch, L, d] @ weight [V, d]ᵀ + bias [V] (or None), the gradient flowing to
    `hidden` only (`weight` and `bias` must not train)."""
    if hidden.dim() != 3 or targets.shape != hidden.shape[:2]:
        raise ValueError(
            f"hidden must be [batch, L, d] and targets [batch, L], got {tuple(hidden.shape)} "
            f"and {tuple(targets.shape)}"
        )
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"weight {tuple(weight.shape)} must be the head's [V, d] with d = {hidden.shape[-1]}"
        )
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias {tuple(bias.shape)} must be [V] = ({weight.shape[0]},)")
    if weight.requires_grad or (bias is not None and bias.requires_grad):
        raise ValueError("lean_token_losses gives no gradient to the head's weights: freeze them")
    batch, length = targets.shape
    rows = max(1, chunk_elements // max(weight.shape[0], 1))
    flat = _LeanNLL.apply(
        hidden.reshape(batch * length, -1), weight, bias, targets.reshape(-1), rows
    )
    token_loss = flat.view(batch, length)
    lm_loss = token_loss.sum() / (targets != IGNORE_INDEX).sum().clamp(min=1)
    return token_loss, lm_loss


# ----------------------------------------------------------------------------- the head's input
_ACTIVE: contextvars.ContextVar[HeadInputs | None] = contextvars.ContextVar(
    "inftyformer_head_inputs", default=None
)


def _record(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    box = _ACTIVE.get()
    if box is None or box.head is not module or not args:
        return None
    box.inputs.append(args[0])
    if box.skip:  # zero positions: the head computes nothing
        return (args[0].narrow(-2, 0, 0), *args[1:])
    return None


class HeadInputs:
    """`with HeadInputs(head) as seen: model(...)` → seen.inputs: the input of each call of
    `head` inside the block, on this thread; `skip`: the head computes nothing (zero positions).
    `attach(head)` adds the (idle) hook once."""

    def __init__(self, head: nn.Module, skip: bool = False) -> None:
        self.head = head
        self.skip = skip
        self.inputs: list[torch.Tensor] = []
        self._token: contextvars.Token | None = None

    @staticmethod
    def attach(head: nn.Module) -> None:
        if _record not in head._forward_pre_hooks.values():
            head.register_forward_pre_hook(_record)

    def __enter__(self) -> HeadInputs:
        self._token = _ACTIVE.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.reset(self._token)


def lean_head(model: nn.Module, architecture: str) -> nn.Module | None:
    """The output head `lean_token_losses` can take the gradient through: a linear head of an
    architecture in `PLAIN_HEADS` whose weights (and bias) are frozen; None otherwise."""
    head = model.get_output_embeddings()
    if architecture not in PLAIN_HEADS or not isinstance(head, nn.Linear):
        return None
    if head.weight.requires_grad or (head.bias is not None and head.bias.requires_grad):
        return None
    return head


__all__ = ["CHUNK_ELEMENTS", "PLAIN_HEADS", "HeadInputs", "lean_head", "lean_token_losses"]
