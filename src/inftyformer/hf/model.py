"""`InftyformerForCausalLM`: a pretrained Hugging Face causal LM (GPT-2, Llama family) with the
∞-former's long-term memory in every block (paper §4.2, fine-tuning GPT-2; `docs/hf.md`).

One call processes one segment of T ≤ L = `segment_len` tokens; a longer input is cut into
segments of L by the call itself and streamed through the memory, call after call, with one
call's outputs (`segments.stream_forward`: logits of every position, the loss over all of them,
the final memory). Like the paper's model, each segment also attends to a short-term window of
the W = `window` tokens before it (default one segment, W = L), and the long-term memory holds
the text that left the window:

0. The window (`MemoryState.window`: the previous W token ids per row, right-aligned with valid
   lengths, reset per row at document boundaries) is recomputed before the segment as unscored
   context: the base runs on [window; segment] with positions 0 … W + T − 1 counted over the
   valid tokens, and only the segment's logits are returned. Choice: recomputation rather than
   cached keys/values, because it is exact for every architecture. GPT-2's learned absolute
   positions enter every layer's keys, so cached keys could not be moved to new positions;
   Llama's rotary keys could, but a cache made while the previous segment attended to its own
   window would carry information from further back than the base would see. Recomputed, the
   logits of segment k at initialisation are exactly the base's for segment k with segment
   k − 1 before it. Cost: the base runs on W + T tokens per call (`docs/hf.md`). Positions
   never pass the base's `max_position_embeddings` (W + L is checked by the config, a longer
   input is streamed in calls of L, `generate` streams a long prompt into the memory first and
   shortens the window to fit). W = 0 is the older behaviour: each
   segment attends within itself.
1. The inputs that left the window (waiting in `LayerState.short_term`: each block's normalised
   attention inputs, computed in the previous call) enter each block's long-term memory
   (`LongTermMemory.update`: first fit, or squeeze-resample-refit) at the START of this call,
   inside this call's graph, so the CNN gate gets gradient from this call's loss; the stored
   coefficients come in detached.
2. The base model runs unchanged. In block i, two forward hooks (`adapters.py`):
       h_i = norm_i(x)                  the normalised attention input, recorded
       a_i = W_o Attn(h_i) + LTM_i(h_i) the continuous read is added to the output projection's
                                        output, before the residual (and, for GPT-2, before the
                                        residual dropout)
   at every position, the window's too (they read the memory of the text before them).
   LTM_i has its own W^Q, W^K, W^V and output projection (`LongTermAttention` with
   `query_projection=True`): queries W^Q h_i, keys/values from the memory's coefficients.
   Choice: its own W^Q rather than the block's query projection, because that works the same
   for every architecture (GPT-2's fused c_attn, Llama's grouped-query heads, rotary positions
   applied inside the attention) and stays trainable when the base is frozen.
3. The new memory is returned, detached: each layer's long-term state after step 1 (with the
   sticky histogram of this call's reads); the window moves on to the last W valid tokens; the
   h_i of the tokens that left it (with L-token calls and W = L: the previous segment, as
   recomputed in this call; with W = 0: this segment) wait in `short_term` (valid positions
   only, right-aligned, per row: `attention_mask` zeros are not stored).

At initialisation the read's output projection is zero (weight and bias), so the logits equal
the base model's exactly (`tests/hf`); W^Q, W^K, W^V ~ N(0, initializer_range²).

Hooks and call-scoped context. The hooks hold no state: they are `functools.partial`s of a
module-level function and the block index. What they need for one call (the layers' long-term
states, the recorded h_i, the reads) lives in a `_Call` object that `forward` puts in a
`contextvars.ContextVar` for the duration of the base model's forward and removes in a `finally`.
This is safe because (a) a ContextVar is private to its thread (and asyncio task), so concurrent
calls on other threads never see it; (b) nested calls restore the outer value on exit; (c) a hook
acts only when the active call lists the very module it is attached to, so the base model called
on its own (`model.base(...)`) or another model's modules run unchanged. Gradient checkpointing
would recompute the blocks outside the call, so it is refused.

Every memory parameter is in the graph of every call made with gradients: a layer whose memory
had nothing to fit this call adds 0·Σp of its gate (`memory_loss`), the reads always run (rows
with an empty memory read exactly 0), so DistributedDataParallel needs no
`find_unused_parameters`.

Generation (`generate`): the memory is read-only. The waiting segment is fitted once before
generating; the first step runs the window before the prompt, the base's key/value cache keeps
both, and every step reads the same long-term memory, so greedy `generate` gives the tokens of
recomputing `model(prompt + tokens so far, memory=m)` in one call at every step (the text
stays in the base's cache: past a segment, the reference is a model of longer segment_len). A
prompt longer than a segment goes into the memory first, all but its last part (1 … L tokens),
which generation continues. A call that continues a
non-empty cache writes nothing (its memory: the one it read, nothing waiting). Beam search and
`num_return_sequences` repeat each row's memory (window included) for its beams
(`repeat_interleave`); since all the beams of a row read the same, unchanging memory, reordering
beams needs nothing else.
"""

from __future__ import annotations

import contextvars
import copy
import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GenerationMixin,
    PreTrainedModel,
)
from transformers.utils import ModelOutput

from .._checks import STATE_MAGNITUDE, check_token_ids
from .._init import init_projection
from ..basis import GaussianBasis
from ..long_term_attention import (
    HeadsRead,
    LongTermAttention,
    LongTermAttentionOutput,
    PreparedMemory,
)
from ..long_term_memory import LongTermMemory, LongTermState
from ..model import IGNORE_INDEX, token_losses
from ..short_term_memory import ShortTermState
from ..state import LayerState, MemoryState, TokenWindow
from .adapters import BlockAdapter, adapter_for
from .config import MEMORY_FIELDS, MODEL_FIELDS, InftyformerConfig
from .head_read import (
    ATTENTION,
    WindowMass,
    head_projections,
    init_from_heads,
    merge_into_heads,
    recording,
    stop_recording,
)
from .segments import stream_forward
from .window import WindowedInputs, pack


class LayerMemory(nn.Module):
    """One block's long-term memory and its continuous attention (one basis ψ for both)."""

    def __init__(self, config) -> None:
        super().__init__()
        self.memory = LongTermMemory(config)
        self.attention = LongTermAttention(config, self.memory.basis)

    def reset_parameters(self, std: float) -> None:
        """W^Q, W^K, W^V ~ N(0, std²); the read's output projection zero (weight and bias), so
        the block's output is the base's at initialisation; w_μ, w_σ and the CNN gate keep
        PyTorch's default initialisation, as in the native model."""
        self.attention.reset_projections(std)
        nn.init.zeros_(self.attention.out.weight)
        nn.init.zeros_(self.attention.out.bias)
        self.attention.reset_density()
        if self.memory.gate is not None:
            self.memory.gate.reset_parameters()


@dataclass
class InftyformerOutput(ModelOutput):
    """loss        lm_loss + memory_loss (when labels are given)
    logits      [batch, T, V]
    memory      the new memory (MemoryState, detached), to pass to the next call
    cache       the base model's key/value cache (generation)
    lm_loss     mean next-token NLL over labels ≠ −100 (labels shifted inside, as in HF)
    token_loss  [batch, T − 1] NLL per predicted position, 0 where ignored
    kl          variance KL of the reads, mean over layers (unweighted)
    memory_loss kl_weight · kl + 0·Σp over memory parameters that had nothing to do"""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    memory: MemoryState | None = None
    cache: object | None = None
    lm_loss: torch.Tensor | None = None
    token_loss: torch.Tensor | None = None
    kl: torch.Tensor | None = None
    memory_loss: torch.Tensor | None = None


# ---------------------------------------------------------------------- call-scoped hook context
@dataclass
class _Call:
    owner: int  # the model whose hooks act in this call
    norms: list[nn.Module]  # per memory layer: the module whose output is h_i
    outputs: list[nn.Module]  # per memory layer: the attention output projection
    layers: nn.ModuleList  # per memory layer: LayerMemory
    long_term: list[LongTermState]  # per memory layer: the memory this call reads
    normed: list[torch.Tensor | None]  # per memory layer: h_i [batch, T, d]
    reads: list[LongTermAttentionOutput | HeadsRead | None]
    prepared: tuple[PreparedMemory, ...] | None = None  # per memory layer, unchanging memory
    # memory_read="heads": per memory layer the attention module, and log Z_W of this call
    attentions: list[nn.Module] | None = None
    window_mass: WindowMass | None = None


_OWNERS = itertools.count()
_ACTIVE: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "inftyformer_hf_call", default=None
)


def _record_attention_input(owner: int, index: int, module: nn.Module, args, output):
    call = _ACTIVE.get()
    if call is not None and call.owner == owner and call.norms[index] is module:
        call.normed[index] = output  # h_i = norm_i(x)  [batch, T, d]
    return None


def _add_long_term_read(owner: int, index: int, module: nn.Module, args, output):
    call = _ACTIVE.get()
    if call is None or call.owner != owner or call.outputs[index] is not module:
        return None
    h = call.normed[index]
    if h is None:
        raise RuntimeError(
            f"block {index}: the attention output ran before its normalised input was seen; "
            "the architecture adapter names the wrong modules"
        )
    prepared = None if call.prepared is None else call.prepared[index]
    if call.attentions is not None:  # memory_read="heads": merged into the base's heads
        attention = call.attentions[index]
        read = call.layers[index].attention
        heads = read(h, call.long_term[index], check=False, prepared=prepared, heads=True)
        call.reads[index] = heads
        value_bias = head_projections(attention, heads.z.shape[1]).value_bias
        log_window = call.window_mass.log_mass[id(attention)]
        return merge_into_heads(output, args[0], heads, log_window, module, value_bias)
    read = call.layers[index].attention(h, call.long_term[index], check=False, prepared=prepared)
    call.reads[index] = read
    return output + read.context.to(output.dtype)  # W_o Attn(h) + LTM(h)


# ---------------------------------------------------------------------- the model
class InftyformerForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = InftyformerConfig
    base_model_prefix = "base"
    supports_gradient_checkpointing = False
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True

    def __init__(self, config: InftyformerConfig, base_model: PreTrainedModel | None = None):
        super().__init__(config)
        if base_model is None:
            base_model = AutoModelForCausalLM.from_config(config.text_config)
        self.adapter: BlockAdapter = adapter_for(type(base_model).__name__)
        self.base = base_model
        n_blocks = len(self.adapter.block_list(base_model))
        self.memory_blocks = config.memory_blocks  # which blocks read a memory; i indexes these
        if self.memory_blocks and self.memory_blocks[-1] >= n_blocks:
            raise ValueError(
                f"memory_layers holds block {self.memory_blocks[-1]}, but the base has "
                f"{n_blocks} blocks"
            )
        lt_config = config.long_term_config()
        self.long_term = nn.ModuleList(LayerMemory(lt_config) for _ in self.memory_blocks)
        self._owner = next(_OWNERS)  # a base wrapped twice: only the calling model's hooks act
        self._hooks = []
        for i, (norm, out) in enumerate(
            zip(
                self._blocks(self.adapter.attention_inputs),
                self._blocks(self.adapter.attention_outputs),
                strict=True,
            )
        ):
            self._hooks.append(
                norm.register_forward_hook(
                    functools.partial(_record_attention_input, self._owner, i)
                )
            )
            self._hooks.append(
                out.register_forward_hook(functools.partial(_add_long_term_read, self._owner, i))
            )
        if config.memory_read == "heads":  # the base's heads read the memory (head_read.py)
            base_model.set_attn_implementation(ATTENTION)
        if getattr(base_model, "generation_config", None) is not None:
            self.generation_config = copy.deepcopy(base_model.generation_config)
        self.post_init()

    def _blocks(self, modules_of) -> list[nn.Module]:
        """`modules_of(base)` (one module per block) for the blocks with a memory."""
        modules = modules_of(self.base)
        return [modules[b] for b in self.memory_blocks]

    # ------------------------------------------------------------------ initialisation
    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """`PreTrainedModel.from_pretrained`, refusing weights that do not fit the config: a
        tensor missing from the files (e.g. the memory's, or a layer after the layer count in
        config.json was raised) would otherwise be initialised at random without a word, and
        an unexpected one (the layer count lowered) dropped. An adapter folder
        (`save_pretrained(..., adapter_only=True)`) loads on top of its base, from the folder it
        names or from `base_model=DIR`, checked by its weights hash (`saved_adapter.py`)."""
        from .saved_adapter import is_adapter, load_adapter

        where = args[0] if args else kwargs.get("pretrained_model_name_or_path", "")
        if is_adapter(where):  # an adapter folder: its base from the reference (base_model=)
            kwargs.pop("pretrained_model_name_or_path", None)
            return load_adapter(where, add_long_term_memory, **kwargs)
        want_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        tied = set(getattr(model, "all_tied_weights_keys", None) or ())
        missing = sorted(k for k in info.get("missing_keys", ()) if k not in tied)
        unexpected = sorted(info.get("unexpected_keys", ()))
        mismatched = sorted(str(k) for k in info.get("mismatched_keys", ()))
        problems = [
            f"{len(found)} {what} (e.g. {', '.join(found[:3])})"
            for what, found in (
                ("missing (they would be initialised at random)", missing),
                ("unexpected", unexpected),
                ("of another shape", mismatched),
            )
            if found
        ]
        if problems:
            raise ValueError(
                f"{where}: the weights do not fit the model its config.json describes: "
                + "; ".join(problems)
            )
        return (model, info) if want_info else model

    @property
    def _init_std(self) -> float:
        return float(getattr(self.config.text_config, "initializer_range", None) or 0.02)

    def _init_weights(self, module: nn.Module) -> None:
        """Only the memory's modules (by role, see `LayerMemory.reset_parameters`): the base
        keeps its own (pretrained) weights. HF calls this per leaf module, for the modules whose
        weights were not loaded; the basis buffers are constants recomputed from the config."""
        role = self._memory_roles().get(id(module))
        if role == "projection" and self.config.memory_read == "heads":
            for i, layer in enumerate(self.long_term):  # W^Q, W^K, W^V from the base's head
                if module is layer.attention.query:
                    init_from_heads(
                        layer,
                        self._blocks(self.adapter.attentions)[i],
                        self.config.num_heads,
                        self.adapter.rotary_embedding(self.base),
                        self.config.window or self.config.segment_len,
                    )
        elif role == "projection":
            init_projection(module, self._init_std)
        elif role == "zero":
            nn.init.zeros_(module.weight)
            nn.init.zeros_(module.bias)
        elif role == "default":
            module.reset_parameters()
        elif role == "density":  # w_μ, w_σ: PyTorch's default, then σ where the config puts it
            module.reset_parameters()
            if self.config.memory_read == "heads":  # a head reads where its content matches:
                nn.init.zeros_(module.weight)  # no prior over places, no extra variance
            for layer in self.long_term:
                if module is layer.attention.sigma_head:
                    layer.attention.init_sigma_bias()
        elif role == "basis":
            fresh = GaussianBasis(module.num_basis, module.width_values)
            for name, buffer in fresh.named_buffers():
                getattr(module, name).copy_(buffer)

    def _memory_roles(self) -> dict[int, str]:
        roles: dict[int, str] = {}
        for layer in getattr(self, "long_term", ()):
            attention, memory = layer.attention, layer.memory
            for projection in (attention.query, attention.key, attention.value):
                roles[id(projection)] = "projection"
            roles[id(attention.out)] = "zero"
            roles[id(attention.mu_head)] = roles[id(attention.sigma_head)] = "density"
            if memory.gate is not None:
                roles[id(memory.gate)] = "default"
            roles[id(memory.basis)] = "basis"
        return roles

    def save_pretrained(
        self, save_directory, *args, adapter_only: bool = False, base_model=None, **kwargs
    ):
        """`PreTrainedModel.save_pretrained`; with `adapter_only`, an adapter folder instead:
        the config and the memory's weights, plus the base's folder (`base_model`, default: the
        one it was loaded from) and weights hash, for a base that did not train
        (`saved_adapter.py`). Either folder also gets the loader module that lets Hugging Face
        tools load it with `trust_remote_code=True` without importing inftyformer first
        (`remote_code.py`)."""
        from .remote_code import mark_config, write_loader

        mark_config(self.config)
        if not adapter_only:
            result = super().save_pretrained(save_directory, *args, **kwargs)
            write_loader(save_directory)
            return result
        if args or kwargs:
            raise ValueError(f"adapter_only takes no other options, got {sorted(kwargs)}")
        from .saved_adapter import save_adapter

        save_adapter(self, save_directory, base_model)
        write_loader(save_directory)
        return None

    def unwrap(self) -> PreTrainedModel:
        """Remove the hooks from the base model and return it (as it was before wrapping; this
        model must not be called afterwards)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        if self.config.memory_read == "heads":
            self.base.set_attn_implementation("sdpa")
        return self.base

    # ------------------------------------------------------------------ parameter groups
    def memory_parameters(self) -> Iterator[nn.Parameter]:
        """The long-term memories' parameters (W^Q, W^K, W^V, output, w_μ, w_σ, CNN gates)."""
        return self.long_term.parameters()

    def base_parameters(self) -> Iterator[nn.Parameter]:
        """The pretrained model's parameters."""
        return self.base.parameters()

    def freeze_base(self) -> InftyformerForCausalLM:
        """Stop gradients to the pretrained model (only the memories train). Returns self."""
        for p in self.base.parameters():
            p.requires_grad_(False)
        return self

    def get_input_embeddings(self) -> nn.Module:
        return self.base.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.base.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Module | None:
        return self.base.get_output_embeddings()

    # ------------------------------------------------------------------ memory state
    @property
    def num_layers(self) -> int:
        return len(self.long_term)

    def _param(self) -> torch.Tensor:
        return next(iter(self.long_term.parameters()))

    def init_memory(self, batch_size: int, device=None) -> MemoryState:
        """An empty memory for `batch_size` parallel streams."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        p = self._param()
        device = p.device if device is None else device
        d = self.config.hidden_size
        return MemoryState(
            tuple(
                LayerState(
                    short_term=ShortTermState.empty(batch_size, d, device, p.dtype),
                    long_term=layer.memory.init_state(batch_size, device, p.dtype),
                )
                for layer in self.long_term
            ),
            TokenWindow.empty(batch_size, device) if self.config.window else None,
            self.memory_source,
        )

    @property
    def memory_source(self) -> str:
        """The provenance stamped on this model's memory states: the base it stores the hidden
        states of. A state stamped by another base (e.g. a Llama memory given to a GPT-2 model
        of the same shapes) is refused by `check_memory`."""
        text = self.config.text_config
        return (
            f"pretrained {self.config.base_architecture} (model_type {text.model_type}, hidden "
            f"size {self.config.hidden_size}, {self.num_layers} layers, vocabulary "
            f"{text.vocab_size})"
            + (
                ""
                if self.config.memory_layers is None
                else f", memory in blocks {self.memory_blocks}"
            )
        )

    def check_memory(self, memory: object, batch_size: int) -> MemoryState:
        """A clear ValueError when `memory` does not fit this model and a batch of
        `batch_size` rows."""
        if not isinstance(memory, MemoryState):
            raise ValueError(f"memory must be a MemoryState or None, got {type(memory).__name__}")
        if len(memory.layers) != self.num_layers:
            raise ValueError(
                f"memory has {len(memory.layers)} layers, the model has {self.num_layers}"
            )
        if memory.batch_size != batch_size:
            raise ValueError(
                f"memory has batch size {memory.batch_size} but input_ids have {batch_size} rows "
                "(pass reset=all True to start new streams)"
            )
        d, device = self.config.hidden_size, self._param().device
        for i, (layer, state) in enumerate(zip(self.long_term, memory.layers, strict=True)):
            name = f"memory.layers[{i}]"
            if not isinstance(state, LayerState) or state.long_term is None:
                raise ValueError(f"{name} must be a LayerState with a long_term state")
            if state.compressed is not None:
                raise ValueError(f"{name}.compressed must be None for this model")
            # what waits is one call's hidden states: at most the base's positions
            state.short_term.check(
                f"{name}.short_term", batch_size, d, self._position_limit or 1 << 30
            )
            if not isinstance(state.long_term, LongTermState):
                raise ValueError(f"{name}.long_term must be a LongTermState")
            try:  # like a native model's states: dtypes, shapes, values within STATE_MAGNITUDE
                state.long_term.check(
                    layer.memory.config, "state", layer.memory.state_dtypes(), None, STATE_MAGNITUDE
                )
            except (TypeError, ValueError) as err:
                raise ValueError(f"{name}.long_term: {err}") from err
            if state.long_term.batch_size != batch_size:
                raise ValueError(
                    f"{name}.long_term has batch size {state.long_term.batch_size}, "
                    f"expected {batch_size}"
                )
            if state.long_term.coefficients.device != device:
                raise ValueError(
                    f"{name} is on {state.long_term.coefficients.device}, the model on {device}: "
                    "use memory.to(device)"
                )
        self._check_window(memory.window, batch_size, device)
        # provenance last: a memory of other shapes is named by its shapes above
        if memory.source is not None and memory.source != self.memory_source:
            raise ValueError(
                f"memory was made by {memory.source}; this model is {self.memory_source}: a "
                "memory holds one base model's hidden states and cannot be read by another"
            )
        return memory

    def _check_window(self, window: TokenWindow | None, batch_size: int, device) -> None:
        size = self.config.window
        if not size:
            if window is not None:
                raise ValueError(
                    "memory has a token window, but this model attends within each call "
                    "(window=0): was the memory made by a model with a window?"
                )
            return
        if window is None:
            raise ValueError(
                f"memory has no token window, but this model attends to the previous {size} "
                "tokens (window > 0): was the memory made by a model with window=0?"
            )
        window.check(batch_size)
        if window.tokens.shape[1] > size:
            raise ValueError(
                f"memory.window holds {window.tokens.shape[1]} tokens, more than this model's "
                f"window of {size}"
            )
        if window.tokens.device != device:
            raise ValueError(
                f"memory.window is on {window.tokens.device}, the model on {device}: "
                "use memory.to(device)"
            )
        vocab = self.config.text_config.vocab_size
        if window.tokens.numel() and int(window.tokens.max()) >= vocab:
            raise ValueError(f"memory.window.tokens must be in [0, {vocab})")

    def prepare_memory(
        self, memory: MemoryState | None, batch_size: int, reset: torch.Tensor | None = None
    ) -> MemoryState:
        """Check `memory` (None: empty) and clear the rows flagged by `reset` [batch] bool."""
        if reset is not None:
            if not isinstance(reset, torch.Tensor) or reset.dtype != torch.bool:
                raise ValueError("reset must be a bool tensor of shape [batch]")
            if tuple(reset.shape) != (batch_size,):
                raise ValueError(f"reset must have shape ({batch_size},), got {tuple(reset.shape)}")
            reset = reset.to(self._param().device)
            if memory is not None and bool(reset.all()):
                memory = None  # every row starts over (possibly with another batch size)
        if memory is None:
            return self.init_memory(batch_size)
        memory = self.check_memory(memory, batch_size)
        return memory if reset is None else memory.reset(reset)

    def _fit_waiting(
        self, memory: MemoryState, generator: torch.Generator | None
    ) -> tuple[list[LongTermState], list[torch.Tensor]]:
        """Step 1: each layer's waiting segment enters its long-term memory (in the caller's
        graph). Returns the long-term states and 0·Σp of the gates that had nothing to fit."""
        states, unused = [], []
        for layer, state in zip(self.long_term, memory.layers, strict=True):
            long_term, waiting = state.long_term, state.short_term
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
                updated = layer.memory.update(long_term, x, generator, check=False)
                long_term = updated if bool(rows.all()) else updated.select(rows, long_term)
            states.append(long_term)
        return states, unused

    @torch.no_grad()
    def consolidate(
        self, memory: MemoryState, generator: torch.Generator | None = None
    ) -> MemoryState:
        """Fit the waiting segment into the long-term memory now (no gradient) and return a
        memory with nothing waiting: what `generate` reads."""
        self.check_memory(memory, memory.batch_size)
        states, _ = self._fit_waiting(memory, generator)
        return MemoryState(
            tuple(
                LayerState(
                    short_term=ShortTermState.empty(
                        memory.batch_size,
                        self.config.hidden_size,
                        lt.coefficients.device,
                        lt.coefficients.dtype,
                    ),
                    long_term=lt.detach(),
                )
                for lt in states
            ),
            memory.window,
            memory.source,
        )

    # ------------------------------------------------------------------ inputs
    @property
    def _position_limit(self) -> int | None:
        limit = getattr(self.config.text_config, "max_position_embeddings", None)
        return None if limit is None else int(limit)

    def _check_ids(self, name: str, ids: object, allow_ignore: bool) -> torch.Tensor:
        vocab = self.config.text_config.vocab_size
        ignore = IGNORE_INDEX if allow_ignore else None
        return check_token_ids(name, ids, vocab, self._param().device, ignore)

    def _check_mask(self, attention_mask: object, batch: int, length: int) -> torch.Tensor | None:
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
        valid = attention_mask[:, -length:].to(self._param().device) != 0  # [batch, T]
        return None if bool(valid.all()) else valid

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        memory: MemoryState | None = None,
        read_cache: tuple[PreparedMemory, ...] | None = None,
        labels: torch.Tensor | None = None,
        reset: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: object | None = None,
        use_cache: bool | None = None,
        generator: torch.Generator | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> InftyformerOutput:
        """input_ids [batch, T] (one segment; more than `segment_len` tokens are streamed
        through the memory in calls of one segment, `_stream`), memory from the previous call
        (None: empty), labels [batch, T] (shifted inside as in HF, −100 ignored), reset [batch]
        bool (rows whose document ended before this segment). `generator` seeds the sticky
        sampling in training."""
        if kwargs.get("inputs_embeds") is not None:
            raise ValueError("inputs_embeds is not supported: pass input_ids")
        if self.training and any(
            getattr(m, "gradient_checkpointing", False) for m in self.base.modules()
        ):
            raise ValueError(
                "gradient checkpointing is not supported with the long-term memory "
                "(the recomputed blocks would run without it)"
            )
        if not self._hooks:
            raise RuntimeError("this model was unwrapped: its hooks are gone")
        ids = self._check_ids("input_ids", input_ids, allow_ignore=False)
        batch, length = ids.shape
        if labels is not None:
            labels = self._check_ids("labels", labels, allow_ignore=True)
            if labels.shape != ids.shape:
                raise ValueError(
                    f"labels must have the shape of input_ids {tuple(ids.shape)}, "
                    f"got {tuple(labels.shape)}"
                )
        if length > self.config.segment_len:  # more than a segment: streamed, call by call
            return self._stream(
                ids, memory, labels, reset, attention_mask, position_ids, cache, use_cache,
                generator, logits_to_keep, kwargs,
            )  # fmt: skip
        self._check_positions(length, position_ids, cache or kwargs.get("past_key_values"))
        valid = self._check_mask(attention_mask, batch, length)
        if read_cache is None or reset is not None or not isinstance(memory, MemoryState):
            memory = self.prepare_memory(memory, batch, reset)
        elif memory.batch_size != batch or len(read_cache) != self.num_layers:
            raise ValueError("read_cache and memory must come from prepare_reads for this batch")
        # else: a generation step; generate() checked this memory once, it does not change
        past = 0 if cache is None else int(cache.get_seq_length())

        # 1. what the previous call stored enters the long-term memory, in this call's graph
        long_term, unused = self._fit_waiting(memory, generator)

        # the short-term window: the previous tokens, recomputed before this call's as context
        # (a call that continues a base cache has them in the cache already)
        inputs = WindowedInputs.build(
            memory.window, ids, valid, attention_mask, position_ids, past, self._position_limit
        )

        # 2. the base model, with the reads added by the hooks
        call = _Call(
            owner=self._owner,
            norms=self._blocks(self.adapter.attention_inputs),
            outputs=self._blocks(self.adapter.attention_outputs),
            layers=self.long_term,
            long_term=long_term,
            normed=[None] * self.num_layers,
            reads=[None] * self.num_layers,
            prepared=read_cache,
        )
        if self.config.memory_read == "heads":
            call.attentions = self._blocks(self.adapter.attentions)
            call.window_mass = WindowMass({id(m) for m in call.attentions})
        keep = logits_to_keep
        if inputs.context and isinstance(keep, torch.Tensor):
            keep = keep + inputs.context  # indices into this call's positions
        elif inputs.context and keep == 0:  # the window's positions are context only: their
            keep = inputs.ids.shape[1] - inputs.context  # logits are never computed
        token = _ACTIVE.set(call)
        mass = None if call.window_mass is None else recording(call.window_mass)
        try:
            base_out = self.base(
                input_ids=inputs.ids,
                attention_mask=inputs.attention_mask,
                position_ids=inputs.position_ids,
                cache=cache,
                use_cache=use_cache,
                logits_to_keep=keep,
                **kwargs,
            )
        finally:
            if mass is not None:
                stop_recording(mass)
            _ACTIVE.reset(token)
        if any(r is None for r in call.reads):
            missing = [self.memory_blocks[i] for i, r in enumerate(call.reads) if r is None]
            raise RuntimeError(f"the long-term memory of blocks {missing} was not read")

        # 3. the new memory: long-term after step 1 (+ sticky histogram); what left the window
        # waits (this segment, without a window), the window moves on. A call continuing a
        # cache (generation) writes nothing.
        if past:
            leaving, window = None, memory.window
        else:
            leaving, window = inputs.advance(self.config.window)
        layers = []
        for i, layer in enumerate(self.long_term):
            read = call.reads[i]
            lt = layer.memory.observe(long_term[i], read.mu, read.sigma_sq, check=False)
            if past:
                d = self.config.hidden_size
                h = call.normed[i]
                waiting = ShortTermState.empty(batch, d, h.device, h.dtype)
            else:
                waiting = ShortTermState(*pack(call.normed[i].detach(), leaving))
            layers.append(LayerState(short_term=waiting, long_term=lt.detach()))
        kl = torch.stack([r.kl for r in call.reads]).mean()
        memory_loss = self.config.kl_weight * kl
        for zero in unused:
            memory_loss = memory_loss + zero
        if self.config.memory_read == "heads":  # the reads' own output projections are unused
            for layer in self.long_term:
                out = layer.attention.out
                memory_loss = memory_loss + 0.0 * (out.weight.sum() + out.bias.sum())

        logits = base_out.logits
        output = InftyformerOutput(
            logits=logits,
            memory=MemoryState(tuple(layers), window, self.memory_source),
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

    def _stream(
        self, ids, memory, labels, reset, attention_mask, position_ids, cache, use_cache,
        generator, logits_to_keep, kwargs,
    ) -> InftyformerOutput:  # fmt: skip
        """`forward` on more than `segment_len` tokens: checked here, then streamed through
        the memory in calls of one segment each (`segments.stream_forward`), so that the
        positions never pass the base's and older text reaches later tokens through the memory.
        """
        batch, length = ids.shape
        seg = self.config.segment_len
        past = cache or kwargs.pop("past_key_values", None)
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
        valid = self._check_mask(attention_mask, batch, length)
        fields = stream_forward(
            self, ids, memory, labels, reset, valid, use_cache, logits_to_keep, generator,
            **kwargs,
        )  # fmt: skip
        return InftyformerOutput(**fields)

    def _check_positions(self, length: int, position_ids: object, cache: object) -> None:
        """Refuse a call reaching beyond the base's positions (max_position_embeddings), which
        would fail inside the base (an IndexError in GPT-2's position table) or run where it was
        never trained (explicit position_ids, or a call continuing a cache: a longer input
        without them is streamed, segment by segment, through the memory)."""
        limit = getattr(self.config.text_config, "max_position_embeddings", None)
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
                f"{self.config.segment_len}) with the memory carried between calls"
            )

    # ------------------------------------------------------------------ generation
    def generate(self, inputs: torch.Tensor | None = None, memory=None, reset=None, **kwargs):
        """HF `generate` reading `memory` (read-only: the waiting segment is fitted once, before
        the first step; nothing is written while generating). `reset` [batch] clears rows
        first. A prompt longer than a segment goes into the memory first, all but its last
        part (1 … segment_len tokens, the text generation continues; the same cut as
        `PretrainedMemoryLM.generate`), so that no step passes the base's positions; its
        max_length / min_length count the whole prompt, as HF's do. Returns what HF's generate
        returns, the whole prompt included (the memory is not advanced: run
        `model(ids, memory=memory)` to write the generated text into it)."""
        ids = inputs if inputs is not None else kwargs.pop("input_ids", None)
        if ids is None:
            raise ValueError("generate needs input_ids")
        ids = self._check_ids("input_ids", ids, allow_ignore=False)
        seg = self.config.segment_len
        cut = (ids.shape[1] - 1) // seg * seg
        head = ids[:, :cut]
        if cut:
            mask = kwargs.get("attention_mask")
            if mask is not None:
                if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != tuple(ids.shape):
                    raise ValueError(
                        f"attention_mask must have the shape of input_ids {tuple(ids.shape)}"
                    )
                kwargs["attention_mask"] = mask[:, cut:]
            with torch.no_grad():
                memory = self(
                    head,
                    memory=memory,
                    reset=reset,
                    attention_mask=None if mask is None else mask[:, :cut],
                    use_cache=False,
                ).memory
            reset, ids = None, ids[:, cut:]
            self._count_from_the_cut(kwargs, cut)
        if memory is not None or reset is not None:
            memory = self.consolidate(self.prepare_memory(memory, ids.shape[0], reset))
        if memory is None:
            memory = self.init_memory(ids.shape[0])
        memory = self._window_within_positions(memory, ids.shape[1], kwargs)
        cache = self.prepare_reads(memory)
        if kwargs.get("attention_mask") is None:  # ids without a mask are all tokens, no padding
            kwargs["attention_mask"] = torch.ones_like(ids)
        out = super().generate(ids, memory=memory, read_cache=cache, **kwargs)
        if not cut:
            return out
        sequences = out if isinstance(out, torch.Tensor) else out.sequences
        # beams / several sequences per prompt: each prompt's rows are together
        head = head.repeat_interleave(sequences.shape[0] // head.shape[0], dim=0)
        sequences = torch.cat([head.to(sequences.device), sequences], dim=1)
        if isinstance(out, torch.Tensor):
            return sequences
        out.sequences = sequences
        return out

    def _count_from_the_cut(self, options: dict, cut: int) -> None:
        """max_length / min_length (prompt + new tokens) counted from the part of the prompt
        generation continues, after `cut` tokens went into the memory."""
        config = options.get("generation_config") or self.generation_config
        if options.get("max_new_tokens", config.max_new_tokens) is None:
            high = options.get("max_length", config.max_length)
            if high is not None:
                options["max_length"] = high - cut
        if options.get("min_new_tokens", config.min_new_tokens) is None:
            low = options.get("min_length", config.min_length)
            if low:
                options["min_length"] = max(low - cut, 0)

    def _window_within_positions(self, memory: MemoryState, prompt: int, options) -> MemoryState:
        """The memory with its window shortened (oldest tokens first) so that the window, the
        prompt and the new tokens fit the base's positions."""
        window, limit = memory.window, self._position_limit
        if window is None or limit is None or not window.tokens.shape[1]:
            return memory
        config = options.get("generation_config") or self.generation_config
        new = options.get("max_new_tokens", config.max_new_tokens)
        if new is None:
            new = options.get("max_length", config.max_length) - prompt
        room = max(limit - prompt - int(new), 0)
        if window.tokens.shape[1] <= room:
            return memory
        width = window.tokens.shape[1]
        short = TokenWindow(window.tokens[:, width - room :], window.length.clamp(max=room))
        return MemoryState(memory.layers, short, memory.source)

    @torch.no_grad()
    def prepare_reads(self, memory: MemoryState) -> tuple[PreparedMemory, ...]:
        """Each layer's `LongTermAttention.prepare` of a memory with nothing waiting (what
        `generate` reads at every step): V = B W^V and the folded keys, computed once instead
        of per generated token."""
        if any(bool((layer.short_term.length > 0).any()) for layer in memory.layers):
            raise ValueError("prepare_reads needs a consolidated memory (nothing waiting)")
        dtype = self._param().dtype
        return tuple(
            layer.attention.prepare(state.long_term, dtype)
            for layer, state in zip(self.long_term, memory.layers, strict=True)
        )

    def _expand_inputs_for_generation(
        self, expand_size: int = 1, is_encoder_decoder: bool = False, input_ids=None, **kwargs
    ):
        """Beams and multiple return sequences: each row's memory is repeated for its copies."""
        memory = kwargs.pop("memory", None)
        cache = kwargs.pop("read_cache", None)
        input_ids, kwargs = super()._expand_inputs_for_generation(
            expand_size, is_encoder_decoder, input_ids, **kwargs
        )
        if memory is not None:
            kwargs["memory"] = memory.repeat_rows(expand_size)
        if cache is not None:
            kwargs["read_cache"] = tuple(p.repeat_interleave(expand_size) for p in cache)
        return input_ids, kwargs


def add_long_term_memory(base: PreTrainedModel, **settings) -> InftyformerForCausalLM:
    """Wrap a pretrained causal LM (GPT-2 or Llama family) with a long-term memory per block
    (or per block of `memory_layers`).

    `settings`: any `LongTermConfig` field (num_heads, num_basis, widths, ridge_lambda, tau,
    num_samples, edge_padding, conv_gate, sticky, sticky_bins, sigma_0, min_sigma_sq) plus
    segment_len, window (previous tokens each call attends to; None: one segment, 0: none),
    kl_weight and memory_layers (the blocks with a memory; None: every block). The base's
    weights are used as they are (not copied); right after wrapping, the logits equal the
    base's."""
    if not isinstance(base, PreTrainedModel):
        raise TypeError(f"base must be a transformers PreTrainedModel, got {type(base).__name__}")
    adapter_for(type(base).__name__)
    allowed = set(MEMORY_FIELDS) | set(MODEL_FIELDS)
    unknown = sorted(set(settings) - allowed)
    if unknown:
        raise ValueError(
            f"unknown long-term memory settings {unknown}; allowed: {sorted(allowed)} "
            "(dim and out_dim are the base's hidden size)"
        )
    if "segment_len" not in settings:  # room for the window (one segment unless set)
        limit = int(getattr(base.config, "max_position_embeddings", None) or 512)
        window = settings.get("window")
        room = limit if window == 0 else limit // 2 if window is None else limit - int(window)
        settings["segment_len"] = max(1, min(512, room))
    # the same config object as the base's: its attention implementation must not change
    config = InftyformerConfig(
        text_config=base.config,
        attn_implementation=base.config._attn_implementation,
        **settings,
    )
    model = InftyformerForCausalLM(config, base_model=base)
    p = next(base.parameters())
    return model.to(device=p.device, dtype=p.dtype)


AutoConfig.register(InftyformerConfig.model_type, InftyformerConfig, exist_ok=True)
AutoModelForCausalLM.register(InftyformerConfig, InftyformerForCausalLM, exist_ok=True)

__all__ = [
    "InftyformerForCausalLM",
    "InftyformerOutput",
    "LayerMemory",
    "add_long_term_memory",
]
