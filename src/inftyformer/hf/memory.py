"""The memory state (`MemoryState`) an `InftyformerForCausalLM` (`model.py`) reads and writes,
one call at a time: an empty state, a state handed in (checked, rows reset), what enters the
long-term memory at the start of a call (step 1) and the state a call returns (step 3).

1. The inputs that left the window (waiting in `LayerState.short_term`: each block's normalised
   attention inputs, computed in the previous call) enter each block's long-term memory
   (`LongTermMemory.update`: first fit, or squeeze-resample-refit) at the START of this call,
   inside this call's graph, so the CNN gate gets gradient from this call's loss; the stored
   coefficients come in detached (`fit_waiting`).
3. The new state is returned, detached: each layer's long-term state after step 1 (with the
   sticky histogram of this call's reads); the window moves on to the last W valid tokens; the
   h_i of the tokens that left it (with L-token calls and W = L: the previous segment, as
   recomputed in this call; with W = 0: this segment) wait in `short_term` (valid positions
   only, right-aligned, per row: `attention_mask` zeros are not stored) (`written`).

Every memory parameter is in the graph of every call made with gradients: a layer whose memory
had nothing to fit this call adds 0·Σp of its gate (`memory_loss`), the reads always run (rows
with an empty memory read exactly 0), so DistributedDataParallel needs no
`find_unused_parameters`.

This module does not import `model.py` (the model imports it): the model is passed in.
"""

from __future__ import annotations

import torch
from torch import nn

from ..core.state import LongTermState
from ..extensions.places import salience as token_salience
from ..native.kl_term import scored_mean, token_kl
from ..native.model import IGNORE_INDEX
from ..native.short_term_memory import ShortTermState
from ..native.state import LayerState, MemoryState, TokenWindow
from ..native.state_record import memory_record
from .hooks import Call
from .validation import check_reset, check_state
from .window import WindowedInputs, pack


def source(model: nn.Module) -> str:
    """The provenance stamped on `model`'s memory states: the base it stores the hidden states
    of."""
    config = model.config
    text = config.text_config
    return (
        f"pretrained {config.base_architecture} (model_type {text.model_type}, hidden "
        f"size {config.hidden_size}, {model.num_layers} layers, vocabulary "
        f"{text.vocab_size})"
        + (
            ""
            if config.adapter.memory_layers is None
            else f", memory in blocks {model.memory_blocks}"
        )
    )


def record(model: nn.Module) -> dict:
    """What `model`'s states record of its memory (`state_record.memory_record`), computed
    once by the model (`model.state_record`)."""
    return memory_record(model.config.adapter.settings())


def init_state(model: nn.Module, batch_size: int, device=None) -> MemoryState:
    """An empty memory state for `batch_size` parallel streams."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    p = model._param()
    device = p.device if device is None else device
    d = model.config.hidden_size
    return MemoryState(
        tuple(
            LayerState(
                short_term=ShortTermState.empty(batch_size, d, device, p.dtype),
                long_term=layer.memory.init_state(batch_size, device, p.dtype),
            )
            for layer in model.long_term
        ),
        TokenWindow.empty(batch_size, device) if model.config.adapter.window else None,
        model.state_source,
        memory=model.state_record,
    )


def prepare_state(
    model: nn.Module,
    state: MemoryState | None,
    batch_size: int,
    reset: torch.Tensor | None = None,
) -> MemoryState:
    """Check `state` (None: empty) and clear the rows flagged by `reset` [batch] bool."""
    if reset is not None:
        check_reset(reset, batch_size)
        reset = reset.to(model._param().device)
        if state is not None and bool(reset.all()):
            state = None  # every row starts over (possibly with another batch size)
    if state is None:
        return model.init_state(batch_size)
    if getattr(state, "issued_by", None) == model._owner and state.batch_size == batch_size:
        trusted = state  # this model's own call returned it: checked when it was made
        return trusted if reset is None else trusted.reset(reset)
    state = check_state(model, state, batch_size)
    return state if reset is None else state.reset(reset)


def fit_waiting(
    layers: nn.ModuleList, state: MemoryState, generator: torch.Generator | None
) -> tuple[list[LongTermState], list[torch.Tensor]]:
    """Step 1: each layer's waiting segment enters its long-term memory (in the caller's
    graph). Returns the long-term states and 0·Σp of the gates that had nothing to fit."""
    states, unused = [], []
    for layer, part in zip(layers, state.layers, strict=True):
        long_term, waiting = part.long_term, part.short_term
        counts = waiting.length  # [batch]
        if not bool((counts > 0).any()):
            if torch.is_grad_enabled() and layer.memory.gate is not None:
                unused += [p.sum() * 0.0 for p in layer.memory.gate.parameters()]
            states.append(long_term)
            continue
        width = waiting.memory.shape[1]
        # rows may hold segments of different lengths (padding): one fit per distinct length
        for n in counts.unique().tolist():
            if n == 0:
                continue
            rows = counts == n  # [batch]
            x = waiting.memory[:, width - n :]  # the last n are valid (right-aligned)
            salience = None
            if layer.memory.config.squeeze.wants_salience:  # zeros: none computed (no logits)
                waiting_salience = state.salience
                if waiting_salience is None or waiting_salience.shape[1] != width:
                    waiting_salience = x.new_zeros(x.shape[0], width, dtype=torch.float64)
                salience = waiting_salience[:, width - n :]
            updated = layer.memory._update(long_term, x, generator, salience)[0]
            long_term = updated if bool(rows.all()) else updated.select(rows, long_term)
        states.append(long_term)
    return states, unused


@torch.no_grad()
def consolidate(
    model: nn.Module, state: MemoryState, generator: torch.Generator | None = None
) -> MemoryState:
    """Fit the waiting segment into the long-term memory now (no gradient) and return a
    state with nothing waiting: what `generate` reads."""
    check_state(model, state, state.batch_size)
    states, _ = fit_waiting(model.long_term, state, generator)
    return MemoryState(
        tuple(
            LayerState(
                short_term=ShortTermState.empty(
                    state.batch_size,
                    model.config.hidden_size,
                    lt.coefficients.device,
                    lt.coefficients.dtype,
                ),
                long_term=lt.detach(),
            )
            for lt in states
        ),
        state.window,
        state.source,
        memory=state.memory,
    )


@torch.no_grad()
def surprisal(logits: torch.Tensor, ids: torch.Tensor, extra: int) -> torch.Tensor:
    """−log p(x_i | x_<i) of a call's tokens ids [batch, T] → float64 [batch, T], from its
    logits [batch, extra + T', V]: with `extra` = 1 the first logit is the window's last
    position's (it scores x_0), else x_0 scores 0. Zeros when fewer logits were computed (the
    caller asked for some positions only)."""
    batch, T = ids.shape
    if logits.shape[1] - extra < T:
        return torch.zeros(batch, T, dtype=torch.float64, device=ids.device)
    scores = logits[:, : T - 1 + extra].float()  # [batch, T − 1 + extra, V]
    targets = ids[:, 1 - extra :]
    logp = torch.log_softmax(scores, -1).gather(2, targets[..., None])[..., 0]
    out = -logp.double()
    return out if extra else torch.cat([out.new_zeros(batch, 1), out], 1)


def written(
    model: nn.Module,
    call: Call,
    long_term: list[LongTermState],
    unused: list[torch.Tensor],
    inputs: WindowedInputs,
    window: TokenWindow | None,
    batch: int,
    past: int,
    surprisal: torch.Tensor | None = None,
) -> tuple[MemoryState, torch.Tensor, torch.Tensor]:
    """Step 3: the memory a call returns (detached), the KL of each of the call's tokens' reads
    [batch, T] (mean over layers and heads, 0 in rows with an empty memory: `kl_term.py`) and
    0·Σp over the memory parameters that had nothing to do (`unused`, DDP). `window`: the one
    this call read. A call continuing a cache (`past` > 0, generation) writes nothing: its
    memory is the one it read, nothing waiting.
    `surprisal` [batch, T] of this call's tokens (keep_salient): their salience
    (`places.salience`, over the window's surprisal before them, then theirs) goes into
    the window with them, and the salience of the tokens that leave the window waits beside
    them for the long-term memory."""
    salience = None
    if past:
        leaving = None
    else:
        if surprisal is not None:  # aligned with the call's positions: the window's, then its
            c, before = inputs.context, model.config.adapter.salience[1]
            if c:
                held = lambda t: t[:, t.shape[1] - c :]  # noqa: E731
                surprisal = torch.cat([held(window.surprisal), surprisal], 1)  # [batch, c + T]
                fresh = token_salience(surprisal, before=before)  # [batch, c + T]
                # the window's tokens: their bursts before (held) or, looking ahead, in this call
                seen = torch.maximum(held(window.salience), fresh[:, :c])
                salience = torch.cat([seen, fresh[:, c:]], 1)
            else:
                salience = token_salience(surprisal, before=before)
        leaving, window = inputs.advance(model.config.adapter.window, surprisal, salience)
        if salience is not None:
            salience = pack(salience, leaving)[0]
    layers = []
    for i, layer in enumerate(model.long_term):
        read = call.reads[i]
        lt = layer.memory._observe(long_term[i], read.mu, read.sigma_sq)
        if past:
            d = model.config.hidden_size
            h = call.normed[i]
            waiting = ShortTermState.empty(batch, d, h.device, h.dtype)
        else:
            waiting = ShortTermState(*pack(call.normed[i].detach(), leaving))
        layers.append(LayerState(short_term=waiting, long_term=lt.detach()))
    c = inputs.context  # the reads of the window's tokens come first: the call's after them
    per_token = torch.stack(
        [
            token_kl(r.sigma_sq[..., c:], layer.attention.config.sigma_0, ~lt.empty)
            for r, layer, lt in zip(call.reads, model.long_term, long_term, strict=True)
        ]
    ).mean(0)  # [batch, T]
    zeros = per_token.new_zeros(())
    for zero in unused:
        zeros = zeros + zero
    if model.config.adapter.heads_read:  # the reads' own output projections are unused
        for layer in model.long_term:
            out = layer.attention.out
            zeros = zeros + 0.0 * (out.weight.sum() + out.bias.sum())
    record = model.state_record
    new_state = MemoryState(tuple(layers), window, model.state_source, salience, record)
    return new_state, per_token, zeros


def kl_loss(
    model: nn.Module,
    per_token: torch.Tensor,
    zeros: torch.Tensor,
    labels: torch.Tensor | None,
    valid: torch.Tensor | None,
    kl_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(kl, memory_loss = kl_weight · kl + `zeros`) of a call: kl the mean of `per_token`
    [batch, T] over the positions the loss scores (`kl_term.py`): those `kl_weights` [batch, T]
    marks (a caller that scores its own targets), else those whose next label is scored (HF's
    shift: position t predicts labels[t + 1]), else the valid positions (`valid`, None: all)."""
    scored = kl_weights
    if scored is None and labels is not None:
        last = torch.zeros_like(labels[:, :1], dtype=torch.bool)  # predicts nothing here
        scored = torch.cat([labels[:, 1:] != IGNORE_INDEX, last], 1)
    elif scored is None:
        scored = valid
    if scored is not None and tuple(scored.shape) != tuple(per_token.shape):
        raise ValueError(
            f"kl_weights must have the shape of input_ids {tuple(per_token.shape)}, got "
            f"{tuple(scored.shape)}"
        )
    kl = scored_mean(per_token, scored)
    return kl, model.config.adapter.kl_weight * kl + zeros


__all__ = [
    "consolidate",
    "fit_waiting",
    "init_state",
    "kl_loss",
    "prepare_state",
    "record",
    "source",
    "surprisal",
    "written",
]
