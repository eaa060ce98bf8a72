"""The reads' variance KL as a term of the loss, weighted per scored token.

Each read of the long-term memory has a Gaussian density N(μ, σ²); the paper (§3.2) keeps σ
near σ₀ with KL(N(μ, σ²) ‖ N(μ, σ₀²)) = ½(σ²/σ₀² − log(σ²/σ₀²) − 1). The loss adds kl_weight ×
the mean of that KL over the tokens the loss scores, the same tokens and denominator as the
next-token NLL:

    KL_token[b, t]  = mean over the memory layers and heads of the KL of the read at (b, t);
                      0 where row b's memory is empty (it reads nothing)       [batch, T]
    KL              = Σ_{b,t scored} KL_token[b, t] / (number of scored tokens)

A batch's loss is then one mean over its scored tokens of NLL + kl_weight·KL_token, so the
trainer's split of a step into micro-batches and processes, each part's mean loss weighted by
its share of the scored tokens (`training/step.py`), gives the gradient of the whole batch
exactly. A mean over each part's rows with memory, as the reads report it
(`LongTermAttentionOutput.kl`), could not: a part's empty rows and its number of scored tokens
weigh it otherwise.
"""

from __future__ import annotations

import torch

from ..core.continuous_softmax import _variance_kl


def token_kl(sigma_sq: torch.Tensor, sigma_0: float, filled: torch.Tensor) -> torch.Tensor:
    """The KL of each query's read, averaged over the heads: sigma_sq [batch, H, Q] of reads
    whose rows hold a memory where `filled` [batch] (bool) → [batch, Q], 0 in the other rows."""
    kl = _variance_kl(sigma_sq, sigma_0).mean(dim=1)  # [batch, Q]
    return kl * filled.to(device=kl.device, dtype=kl.dtype)[:, None]


def scored_mean(per_token: torch.Tensor, scored: torch.Tensor | None = None) -> torch.Tensor:
    """Σ per_token[b, t] over the scored positions (`scored` [batch, T] bool; None: every
    position) / their number (at least 1): the loss term of `per_token` [batch, T]."""
    if scored is None:
        return per_token.mean() if per_token.numel() else per_token.sum()
    weight = scored.to(device=per_token.device, dtype=per_token.dtype)
    return (per_token * weight).sum() / weight.sum().clamp(min=1.0)


__all__ = ["scored_mean", "token_kl"]
