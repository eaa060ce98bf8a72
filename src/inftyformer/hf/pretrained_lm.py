"""`PretrainedMemoryLM`: a pretrained causal LM with long-term memory behind the `MemoryLM`
contract, so that the tasks, the whole-document evaluation and the trainer use it like a native
model (`inftyformer.model_kinds`):

    model(tokens, state=, targets=, reset=)   targets aligned with tokens (position t predicts
                                              targets[t], −100 ignored), explicit state
    → LMOutput(logits, state, loss = lm_loss + kl_weight·KL, lm_loss, token_loss, aux={"kl"})
    init_state(batch, device), config.segment_len, config.vocab_size

It holds an `InftyformerForCausalLM` (`.lm`, the Hugging Face model with its own `generate`) and
knows the paper's optimiser split (`param_groups`): the memory at `memory_lr` without weight
decay, the base at the run's learning rate (none of it when frozen).

With targets and a frozen output head (GPT-2, Llama), the loss is computed from the head's input
in chunks of positions (`loss.lean_token_losses`): no [batch, L, V] logits, log-probabilities or
gradients of them are made, and the output's logits are computed from the head's input when
first used (the same tensor the head gives), so that a caller that needs only the loss (the
language-model task) never makes them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForCausalLM

from ..model_kinds import PretrainedMemoryConfig
from ..native.model import IGNORE_INDEX, LMOutput, decay_groups, token_losses
from ..native.state import MemoryState
from .loss import HeadInputs, lean_head, lean_token_losses
from .model import add_long_term_memory


def _load_quietly(path: str) -> nn.Module:
    """The base model in float32, without transformers' "Loading weights" bar (a second bar
    under the run's own, on every load; the setting is restored after)."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    finally:
        if shown:
            hf_logging.enable_progress_bar()


class _LazyLogits(LMOutput):
    """An `LMOutput` whose logits [batch, L, V] are the output head's on `hidden` [batch, L, d],
    computed on first use (as the head computes them), so that a caller that needs only the
    loss never holds them."""

    def __init__(self, hidden: torch.Tensor, head: nn.Linear, **fields: Any) -> None:
        super().__init__(logits=None, **fields)
        self._source: tuple[torch.Tensor, nn.Linear] | None = (hidden, head)

    @property
    def logits(self) -> torch.Tensor:
        if self._logits is None and self._source is not None:
            hidden, head = self._source
            self._logits = F.linear(hidden, head.weight, head.bias)
        return self._logits

    @logits.setter
    def logits(self, value: torch.Tensor | None) -> None:  # set: what was set, from now on
        self._logits, self._source = value, None


class PretrainedMemoryLM(nn.Module):
    def __init__(self, config: PretrainedMemoryConfig) -> None:
        super().__init__()
        if not isinstance(config, PretrainedMemoryConfig):
            raise TypeError(f"config must be a PretrainedMemoryConfig, got {type(config)}")
        self.config = config
        base = _load_quietly(config.base_model)
        if config.memory:
            self.lm = add_long_term_memory(base, adapter=config.adapter)
            if config.freeze_base:
                self.lm.freeze_base()
        else:  # the base alone: no state, each segment on its own
            if config.freeze_base:
                raise ValueError("freeze_base without memory would leave nothing to train")
            self.lm = base
        self._architecture = type(base).__name__
        head = self.lm.get_output_embeddings()
        if head is not None:
            HeadInputs.attach(head)  # idle unless `forward` asks (with targets)

    def init_state(
        self, batch_size: int, device: torch.device | str | None = None
    ) -> MemoryState | None:
        return self.lm.init_state(batch_size, device) if self.config.memory else None

    def forward(
        self,
        tokens: torch.Tensor,
        state: MemoryState | None = None,
        targets: torch.Tensor | None = None,
        reset: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> LMOutput:
        """tokens [batch, L] (one segment), targets [batch, L] aligned with tokens."""
        if targets is not None and (
            not isinstance(targets, torch.Tensor) or targets.shape != tokens.shape
        ):
            raise ValueError(
                f"targets must be a tensor of the shape of tokens {tuple(tokens.shape)}"
            )
        head = None
        # keep_salient reads the call's surprisal from its logits: they are computed then
        lean = not (self.config.memory and self.config.adapter.salience[0])
        if targets is not None and tokens.shape[1] <= self.config.segment_len and lean:
            head = lean_head(self.lm, self._architecture)  # None: the loss through the logits
        with contextlib.nullcontext(None) if head is None else HeadInputs(head, skip=True) as seen:
            if self.config.memory:  # the reads' KL over the tokens the loss scores
                scored = None if targets is None else targets.to(tokens.device) != IGNORE_INDEX
                out = self.lm(
                    tokens, state=state, reset=reset, generator=generator, kl_weights=scored
                )
                logits, state, aux = out.logits, out.state, {"kl": out.kl}
                memory_loss = out.memory_loss
            else:
                logits, state, aux, memory_loss = self.lm(input_ids=tokens).logits, None, {}, 0.0
        if head is None:
            output = LMOutput(logits=logits, state=state, aux=aux)
        else:  # the head computed nothing: the logits come from its input when asked for
            if len(seen.inputs) != 1:
                raise RuntimeError(f"the output head ran {len(seen.inputs)} times in one call")
            output = _LazyLogits(seen.inputs[0], head, state=state, aux=aux)
        if targets is not None:
            if head is not None:
                targets = targets.to(seen.inputs[0].device)
                token_loss, lm_loss = lean_token_losses(
                    seen.inputs[0], head.weight, head.bias, targets
                )
            else:
                token_loss, lm_loss = token_losses(output.logits, targets.to(logits.device))
            output.loss = lm_loss + memory_loss
            output.lm_loss, output.token_loss = lm_loss, token_loss
        return output

    @torch.no_grad()
    def push(self, tokens: torch.Tensor, state: MemoryState | None = None) -> MemoryState:
        """Stream tokens [batch, T] into the memory in segments of `segment_len`."""
        L = self.config.segment_len
        state = self.init_state(tokens.shape[0], tokens.device) if state is None else state
        if not self.config.memory:
            return None
        for start in range(0, tokens.shape[1], L):
            state = self(tokens[:, start : start + L], state=state).state
        return state

    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        state: MemoryState | None = None,
        generator: torch.Generator | None = None,
        end_ids: Sequence[int] = (),
        with_state: bool = True,
    ) -> tuple[torch.Tensor, MemoryState | None]:
        """Continue prompt [batch, T0] (any length): all but its last, partial segment goes into
        the memory first, the rest is the context Hugging Face's `generate` continues, reading
        the memory (temperature 0: greedy; otherwise sampling with top-k / nucleus top-p, from
        torch's global generator: `generator` is not used). Generation stops at the first of
        `end_ids` (shorter rows padded with it). Returns (new tokens [batch, ≤ max_new_tokens],
        the memory after the prompt and the new tokens, or None without `with_state`: that
        costs another pass over them), like `MemoryLM.generate`."""
        L = self.config.segment_len
        cut = (prompt.shape[1] - 1) // L * L
        state = self.push(prompt[:, :cut], state) if cut else state
        context = prompt[:, cut:]
        base_config = getattr(self.lm.config, "text_config", None) or self.lm.config
        limit = getattr(base_config, "max_position_embeddings", None)
        if isinstance(limit, int) and context.shape[1] + max_new_tokens > limit:
            raise ValueError(
                f"max_new_tokens={max_new_tokens} is too many: the prompt's last segment "
                f"({context.shape[1]} tokens) and the new tokens must fit the base model's "
                f"{limit} positions; ask for at most {limit - context.shape[1]} new tokens"
            )
        options: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "do_sample": temperature > 0,
            "attention_mask": torch.ones_like(context),  # no padding (an end id may occur)
        }
        if temperature > 0:
            options.update(temperature=float(temperature), top_k=top_k or 0, top_p=top_p or 1.0)
        if end_ids:
            options.update(eos_token_id=list(end_ids), pad_token_id=end_ids[0])
        if self.config.memory:
            options["state"] = state
        out = self.lm.generate(context, **options)
        new = out[:, context.shape[1] :]
        return new, self.push(out, state) if with_state else None

    def param_groups(self, lr: float, weight_decay: float) -> list[dict[str, Any]]:
        """The paper's split: the memory at `memory_lr`, no weight decay (its density heads at
        `density_lr` when set); the base (if it trains) at `lr`, with weight decay on its
        matrices other than embeddings."""
        c = self.config
        if c.memory:
            memory, base_model = list(self.lm.memory_parameters()), self.lm.base
        else:
            memory, base_model = [], self.lm
        density: list[nn.Parameter] = []
        if memory and c.density_lr is not None:  # the μ and σ² heads in a group of their own
            heads = [(m.attention.mu_head, m.attention.sigma_head) for m in self.lm.long_term]
            density = [p for pair in heads for head in pair for p in head.parameters()]
            chosen = {id(p) for p in density}
            memory = [p for p in memory if id(p) not in chosen]
        groups = [
            {"params": memory, "lr": c.memory_lr, "weight_decay": 0.0},
            {"params": density, "lr": c.density_lr, "weight_decay": 0.0},
        ]
        return [g for g in groups if g["params"]] + decay_groups(base_model, lr, weight_decay)


__all__ = ["PretrainedMemoryLM"]
