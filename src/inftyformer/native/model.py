"""`MemoryLM`: the decoder-only language model on one backbone, with the memory chosen by
`ModelConfig.model_type` ("transformer", "xl", "compressive", "infty").

    tokens [batch, L] → embedding → blocks (each with its memory, `block.py`) → LayerNorm
    → logits [batch, L, V] (tied or untied output embedding)

    loss = lm_loss + kl_weight · kl + reconstruction_weight · reconstruction

`lm_loss` is the mean next-token NLL over targets ≠ −100; `kl` (∞-former) is the mean over the
same scored tokens of each token's read KL (averaged over layers and heads, `kl_term.py`) and
`reconstruction` (compressive) is averaged over layers; both are reported unweighted in `aux`.
The memory is explicit: pass `state` (None for a fresh stream), get the new, detached `state`
back. `reset` [batch] bool clears rows (documents that ended) before the call is processed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import ValueChecks, check_positive_int, check_token_ids
from .._init import init_projection
from ..precision import allowed_dtypes
from . import streaming
from .block import LayerTrace, MemoryBlock
from .kl_term import scored_mean
from .model_config import ModelConfig
from .state import LayerState, MemoryState
from .state_record import check_memory_record, memory_record

IGNORE_INDEX = -100


@dataclass
class LMOutput:
    logits: torch.Tensor  # [batch, L, V]
    state: MemoryState  # detached
    loss: torch.Tensor | None = None  # scalar: lm_loss + weighted aux terms
    lm_loss: torch.Tensor | None = None  # scalar: mean NLL over targets ≠ −100
    token_loss: torch.Tensor | None = None  # [batch, L]: NLL per token, 0 where ignored
    aux: dict[str, torch.Tensor] = field(default_factory=dict)  # unweighted "kl", "reconstruction"
    trace: tuple[LayerTrace, ...] | None = None  # per layer, with `return_trace=True`


def token_losses(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(token_loss [batch, L]: the NLL of each target, 0 where it is −100; lm_loss: their mean
    over the targets that count) for logits [batch, L, V] and targets [batch, L] aligned with
    them (position t predicts targets[t])."""
    batch, length = targets.shape
    token_loss = F.cross_entropy(
        logits.reshape(batch * length, logits.shape[-1]).float(),  # also for 0 positions
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    ).view(batch, length)
    lm_loss = token_loss.sum() / (targets != IGNORE_INDEX).sum().clamp(min=1)
    return token_loss, lm_loss


def decay_groups(module: nn.Module, lr: float, weight_decay: float) -> list[dict[str, Any]]:
    """Optimiser groups of `module`'s trainable parameters at rate `lr`: weight decay for the
    weight matrices, none for biases, norms and embeddings (empty groups left out)."""
    embedding = {
        id(p) for m in module.modules() if isinstance(m, nn.Embedding) for p in m.parameters()
    }
    decay, no_decay = [], []
    for p in module.parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or id(p) in embedding else decay).append(p)
    groups = [
        {"params": decay, "lr": lr, "weight_decay": weight_decay},
        {"params": no_decay, "lr": lr, "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


class MemoryLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
        self.config = config
        # what its states record of the memory (`state_record.py`; the config is frozen)
        self.state_record = memory_record(config.to_dict())
        self.embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        designs: dict = {}  # the layers' bases are equal: one cache of design matrices G
        self.blocks = nn.ModuleList(MemoryBlock(config, designs) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.head = (
            None
            if config.tie_embeddings
            else nn.Linear(config.d_model, config.vocab_size, bias=False)
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """N(0, 0.02²) weights, zero biases, unit LayerNorms (`MemoryBlock.reset_parameters`
        says which parts keep PyTorch's default initialisation). The long-term attention's
        projections start at the backbone's scale: left at PyTorch's default (≈ 2.5× larger) the
        continuous read dominated every attention output from step 0 and the ∞-former learned
        much more slowly than Transformer-XL (docs/results/lm.md)."""
        std = 0.02
        init_projection(self.embedding, std)
        for block in self.blocks:
            block.reset_parameters(std)
        self.norm.reset_parameters()
        if self.head is not None:
            init_projection(self.head, std)
        for block in self.blocks:  # last, as they always were: same draws for the same seed
            block.attention.reset_position_biases(std)

    # ------------------------------------------------------------------ state
    @property
    def _param(self) -> torch.Tensor:
        return self.embedding.weight

    def init_state(self, batch_size: int, device: torch.device | str | None = None) -> MemoryState:
        """An empty memory (fresh streams) for `batch_size` rows."""
        check_positive_int("batch_size", batch_size)
        device = self._param.device if device is None else device
        dtype = self._param.dtype
        layers = tuple(b.init_state(batch_size, device, dtype) for b in self.blocks)
        return MemoryState(layers, memory=self.state_record)

    def param_groups(self, lr: float, weight_decay: float) -> list[dict[str, Any]]:
        """The optimiser's parameter groups (`decay_groups`): one rate for all."""
        return decay_groups(self, lr, weight_decay)

    # ------------------------------------------------------------------ streaming
    def push(self, tokens: torch.Tensor, state: MemoryState | None = None) -> MemoryState:
        """The state after streaming tokens [batch, T] (any T ≥ 1) in block-aligned calls, no
        gradients (`streaming.push`)."""
        return streaming.push(self, tokens, state)[1]

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
    ) -> tuple[torch.Tensor, MemoryState]:
        """Continue prompt [batch, T0] by `max_new_tokens` tokens, one call per token with the
        carried memory (`streaming.generate`): (new tokens, the state after prompt and new
        tokens). Every token is generated; the caller cuts at `end_ids`. The state comes for
        free here, so `with_state` changes nothing."""
        return streaming.generate(
            self, prompt, max_new_tokens, temperature, top_k, top_p, state, generator
        )

    def check_state(
        self,
        state: MemoryState,
        batch_size: int | None = None,
        values: ValueChecks | None = None,
    ) -> None:
        """Validate a state for this model before any computation: one layer state per block,
        each matching the model type (provenance), shapes, dtypes (the model's floating dtype,
        under autocast also the autocast dtype; lengths int64, `empty` bool), the model's
        device, and the values (finite, lengths in range, sticky histograms), the values read
        with one host synchronisation for the whole state (here, or by the caller that passes
        `values`)."""
        if not isinstance(state, MemoryState):
            raise TypeError(f"state must be a MemoryState, got {type(state).__name__}")
        if len(state.layers) != len(self.blocks):
            raise ValueError(
                f"state has {len(state.layers)} layers, the model has {len(self.blocks)}"
            )
        batch = state.batch_size if batch_size is None else batch_size
        device = self._param.device
        dtypes = allowed_dtypes(self._param)
        own = values is None
        values = ValueChecks() if own else values
        for i, (block, layer) in enumerate(zip(self.blocks, state.layers, strict=True)):
            block.check_state(layer, batch, f"state.layers[{i}]", dtypes, values)
            for name, t in layer.tensors().items():
                if t.device != device:
                    raise ValueError(
                        f"state.layers[{i}].{name} is on {t.device}, the model on "
                        f"{device}: use state.to(device)"
                    )
        if own:
            values.run()
        check_memory_record(state, self.state_record)

    # ------------------------------------------------------------------ inputs
    def _check_ids(
        self, name: str, ids: object, allow_ignore: bool, values: ValueChecks
    ) -> torch.Tensor:
        ignore = IGNORE_INDEX if allow_ignore else None
        device = self._param.device
        return check_token_ids(name, ids, self.config.vocab_size, device, ignore, values)

    def _prepare_state(
        self,
        state: MemoryState | None,
        batch: int,
        reset: torch.Tensor | None,
        values: ValueChecks,
    ) -> MemoryState:
        if reset is not None:
            if not isinstance(reset, torch.Tensor) or reset.dtype != torch.bool:
                raise ValueError("reset must be a bool tensor of shape [batch]")
            if tuple(reset.shape) != (batch,):
                raise ValueError(f"reset must have shape ({batch},), got {tuple(reset.shape)}")
            reset = reset.to(self._param.device)
        if state is None:
            return self.init_state(batch)
        if not isinstance(state, MemoryState):
            raise ValueError(f"state must be a MemoryState or None, got {type(state).__name__}")
        if state.batch_size != batch:
            if reset is not None and bool(reset.all()):
                return self.init_state(batch)  # every row starts over: the old state is moot
            raise ValueError(
                f"state has batch size {state.batch_size} but tokens have {batch} rows "
                "(pass reset=all True to start new streams)"
            )
        self.check_state(state, batch, values)
        return state if reset is None else state.reset(reset)

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        tokens: torch.Tensor,
        state: MemoryState | None = None,
        targets: torch.Tensor | None = None,
        reset: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        return_trace: bool = False,
    ) -> LMOutput:
        """tokens [batch, L] (L ≤ segment_len), targets [batch, L] with −100 ignored.
        `generator` seeds the sticky-memory sampling in training mode. `return_trace`: also
        return what each layer's memories did (`LMOutput.trace`, for `inftyformer.inspection`:
        the long-term reads' μ, σ², the long-term updates, the compressed slots)."""
        c = self.config
        # what the caller hands in is checked here, once; the values (token ranges, the state's
        # finiteness and invariants) with one host synchronisation. The blocks run unchecked.
        values = ValueChecks()
        tokens = self._check_ids("tokens", tokens, False, values)
        batch, length = tokens.shape
        if length > c.segment_len:
            raise ValueError(
                f"segment of {length} tokens is longer than segment_len={c.segment_len}; "
                "cut it with inftyformer.stream_loss or raise segment_len"
            )
        if targets is not None:
            targets = self._check_ids("targets", targets, True, values)
            if targets.shape != tokens.shape:
                raise ValueError(
                    f"targets must have the shape of tokens {tuple(tokens.shape)}, "
                    f"got {tuple(targets.shape)}"
                )
        state = self._prepare_state(state, batch, reset, values)
        values.run()

        x = self.dropout(self.embedding(tokens))  # [batch, L, d]
        layers: list[LayerState] = []
        kl, reconstruction, unused, traces = [], [], [], []
        for block, layer_state in zip(self.blocks, state.layers, strict=True):
            out = block(x, layer_state, generator, return_trace)
            x = out.hidden
            layers.append(out.state)
            traces.append(out.trace)
            if out.kl is not None:
                kl.append(out.kl)
            if out.reconstruction is not None:
                reconstruction.append(out.reconstruction)
            if out.unused is not None:
                unused.append(out.unused)
        x = self.norm(x)
        weight = self.embedding.weight if self.head is None else self.head.weight
        logits = F.linear(x, weight)  # [batch, L, V]

        aux: dict[str, torch.Tensor] = {}
        if kl:  # per token, over the layers; a mean over the scored tokens (`kl_term.py`)
            scored = None if targets is None else targets != IGNORE_INDEX
            aux["kl"] = scored_mean(torch.stack(kl).mean(0), scored)
        if reconstruction:
            aux["reconstruction"] = torch.stack(reconstruction).mean()
        state = MemoryState(tuple(layers), memory=self.state_record).detach()
        output = LMOutput(logits=logits, state=state, aux=aux)
        if return_trace:
            output.trace = tuple(traces)
        if targets is not None:
            token_loss, lm_loss = token_losses(logits, targets)
            loss = lm_loss
            if "kl" in aux:
                loss = loss + c.long_term.kl_weight * aux["kl"]
            if "reconstruction" in aux:
                loss = loss + c.reconstruction_weight * aux["reconstruction"]
            for zero in unused:  # keeps every parameter in the graph (DDP)
                loss = loss + zero
            output.loss, output.lm_loss, output.token_loss = loss, lm_loss, token_loss
        return output


__all__ = ["IGNORE_INDEX", "LMOutput", "MemoryLM"]
