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
1. The inputs that left the window enter each block's long-term memory at the START of this
   call, inside this call's graph (`memory.py`).
2. The base model runs unchanged. In block i, two forward hooks (`hooks.py`, on the modules
   `adapters.py` names):
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
3. The new memory is returned, detached: the long-term states, the window moved on, the inputs
   that left it waiting for the next call (`memory.py`).

At initialisation the read's output projection is zero (weight and bias), so the logits equal
the base model's exactly (`tests/hf`); W^Q, W^K, W^V ~ N(0, initializer_range²) (`init_weights.py`).

The model's jobs, one module each (none imports this one; they are handed the model):

    forward_pass.py one call: steps 0–3 on one segment, or a longer input streamed
    hooks.py        the two hooks and the call-scoped context they read
    memory.py       an empty memory, a memory handed in, steps 1 and 3
    validation.py   what a call is handed, checked at the boundary
    generation.py   `generate` reading the memory, beams
    init_weights.py how the memory's weights start, whether loaded ones fit

and the pieces it is built of: `layer_memory.py` (one block's memory and its read, `LayerMemory`)
and `output.py` (what a call returns, `InftyformerOutput`); both are importable from here too.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GenerationMixin,
    PreTrainedModel,
)

from ..core.density import PreparedMemory
from ..native.state import MemoryState
from ..presets import preset_settings
from ..pretrained_config import AdapterConfig
from . import forward_pass, generation, hooks, init_weights, validation
from . import memory as memories
from .adapters import BlockAdapter, adapter_for
from .config import InftyformerConfig
from .head_read import ATTENTION
from .layer_memory import LayerMemory
from .output import InftyformerOutput


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
        self.state_record = memories.record(self)  # what its states record of the memory
        designs: dict = {}  # the layers' bases are equal: one cache of design matrices G
        self.long_term = nn.ModuleList(LayerMemory(lt_config, designs) for _ in self.memory_blocks)
        self._owner = hooks.new_owner()  # a base wrapped twice: only the caller's hooks act
        # what every call wires the same way, found once: the modules each memory block's hooks
        # sit on and, for the heads read, its attention modules and rotary embedding
        a = config.adapter
        self._norms = self._blocks(self.adapter.attention_inputs)
        self._outputs = self._blocks(self.adapter.attention_outputs)
        self._attentions = self._blocks(self.adapter.attentions) if a.heads_read else None
        self._rotary = None
        if a.positions != "window":  # each place at its own position
            self._rotary = self.adapter.rotary_embedding(base_model)
        self._salient = a.salience[0]  # the call's surprisal is wanted
        self._hooks = hooks.attach(self._owner, self._norms, self._outputs)
        if a.heads_read:  # the base's heads read the memory (head_read.py)
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
        """`PreTrainedModel.from_pretrained`, refusing weights that do not fit the config: a tensor
        missing from the files (e.g. the memory's, or a layer after the layer count in config.json
        was raised) would otherwise be initialised at random without a word, and an unexpected one
        (the layer count lowered) dropped (`init_weights.check_loaded`). An adapter folder
        (`save_pretrained(..., adapter_only=True)`) loads on top of its base, from the folder it
        names or from `base_model=DIR`, checked by its weights hash (`saved_adapter.py`)."""
        from .saved_adapter import check_memory_blocks, is_adapter, load_adapter

        where = args[0] if args else kwargs.get("pretrained_model_name_or_path", "")
        if is_adapter(where):  # an adapter folder: its base from the reference (base_model=)
            kwargs.pop("pretrained_model_name_or_path", None)
            return load_adapter(where, add_long_term_memory, **kwargs)
        want_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        init_weights.check_loaded(where, model, info)
        check_memory_blocks(where, model)
        return (model, info) if want_info else model

    def _init_weights(self, module: nn.Module) -> None:
        """Only the memory's modules, by role (`init_weights.init_weights`): the base keeps its own
        (pretrained) weights."""
        init_weights.init_weights(self, module)

    def save_pretrained(
        self, save_directory, *args, adapter_only: bool = False, base_model=None, **kwargs
    ):
        """`PreTrainedModel.save_pretrained`; with `adapter_only`, an adapter folder instead:
        the config and the memory's weights, plus the base's folder (`base_model`, default: the
        one it was loaded from) and weights hash, for a base that did not train
        (`saved_adapter.py`). Either folder also gets the loader module that lets Hugging Face
        tools load it with `trust_remote_code=True` without importing inftyformer first
        (`remote_code.py`). A folder of another model (a base's) is refused, and the files of
        an earlier save of the other kind are removed (`saved_adapter.save`)."""
        from .saved_adapter import save

        whole = super().save_pretrained
        return save(self, save_directory, whole, adapter_only, base_model, *args, **kwargs)

    def unwrap(self) -> PreTrainedModel:
        """Remove the hooks from the base model and return it (as it was before wrapping; this
        model must not be called afterwards)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        if self.config.adapter.heads_read:
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

    def init_state(self, batch_size: int, device=None) -> MemoryState:
        """An empty memory state for `batch_size` parallel streams."""
        return memories.init_state(self, batch_size, device)

    @property
    def state_source(self) -> str:
        """The provenance stamped on this model's memory states: the base it stores the hidden
        states of. A state stamped by another base (e.g. a Llama memory given to a GPT-2 model
        of the same shapes) is refused by `check_state`."""
        return memories.source(self)

    def check_state(self, state: object, batch_size: int) -> MemoryState:
        """A clear ValueError when `state` does not fit this model and a batch of
        `batch_size` rows."""
        return validation.check_state(self, state, batch_size)

    def prepare_state(
        self, state: MemoryState | None, batch_size: int, reset: torch.Tensor | None = None
    ) -> MemoryState:
        """Check `state` (None: empty) and clear the rows flagged by `reset` [batch] bool."""
        return memories.prepare_state(self, state, batch_size, reset)

    def consolidate(
        self, state: MemoryState, generator: torch.Generator | None = None
    ) -> MemoryState:
        """Fit the waiting segment into the long-term memory now (no gradient) and return a
        state with nothing waiting: what `generate` reads."""
        return memories.consolidate(self, state, generator)

    def _check_ids(self, name: str, ids: object, allow_ignore: bool) -> torch.Tensor:
        return validation.check_ids(self.config, name, ids, self._param().device, allow_ignore)

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        state: MemoryState | None = None,
        read_cache: tuple[PreparedMemory, ...] | None = None,
        labels: torch.Tensor | None = None,
        reset: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: object | None = None,
        use_cache: bool | None = None,
        generator: torch.Generator | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        kl_weights: torch.Tensor | None = None,
        **kwargs,
    ) -> InftyformerOutput:
        """input_ids [batch, T] (one segment: `forward_pass.segment_forward`; more than
        `segment_len` tokens are streamed through the memory in calls of one segment:
        `forward_pass.long_forward`), the memory state from the previous call (None: empty),
        labels [batch, T] (shifted inside as in HF, −100 ignored), reset [batch] bool (rows whose
        document ended before this segment). `generator` seeds the sticky sampling in training.
        `kl_weights` [batch, T] bool: the positions whose reads' KL the loss counts (default:
        those the labels score; `memories.kl_loss`)."""
        validation.check_call(self, kwargs)
        ids = self._check_ids("input_ids", input_ids, allow_ignore=False)
        if labels is not None:
            labels = self._check_ids("labels", labels, allow_ignore=True)
            validation.check_labels(labels, ids)
        options = dict(
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
            generator=generator,
            logits_to_keep=logits_to_keep,
            kl_weights=kl_weights,
        )
        if ids.shape[1] > self.config.adapter.segment_len:  # more than a segment: streamed
            return forward_pass.long_forward(self, ids, state, labels, reset, **options, **kwargs)
        return forward_pass.segment_forward(
            self, ids, state, labels, reset, read_cache=read_cache, **options, **kwargs
        )

    # ------------------------------------------------------------------ generation
    def generate(self, inputs: torch.Tensor | None = None, state=None, reset=None, **kwargs):
        """HF `generate` reading the memory `state` (read-only: the waiting segment is fitted once,
        before the first step; nothing is written while generating). `reset` [batch] clears rows
        first. A prompt longer than a segment goes into the memory first, all but its last part (1 …
        segment_len tokens, the text generation continues; the same cut as
        `PretrainedMemoryLM.generate`), so that no step passes the base's positions; its max_length
        / min_length count the whole prompt, as HF's do. Returns what HF's generate returns, the
        whole prompt included (the memory is not advanced: run `model(ids, state=state)` to write
        the generated text into it)."""
        return generation.generate(self, super().generate, inputs, state, reset, **kwargs)

    def prepare_reads(self, state: MemoryState) -> tuple[PreparedMemory, ...]:
        """Each layer's `LongTermAttention.prepare` of a state with nothing waiting (what
        `generate` reads at every step): V = B W^V and the folded keys, computed once instead
        of per generated token."""
        return generation.prepare_reads(self, state)

    def _expand_inputs_for_generation(
        self, expand_size: int = 1, is_encoder_decoder: bool = False, input_ids=None, **kwargs
    ):
        """Beams and multiple return sequences: each row's state is repeated for its copies."""
        expand = super()._expand_inputs_for_generation
        return generation.expand_inputs(expand, expand_size, is_encoder_decoder, input_ids, kwargs)


def add_long_term_memory(
    base: PreTrainedModel, preset: str | None = None, **settings
) -> InftyformerForCausalLM:
    """Wrap a pretrained causal LM (GPT-2 or Llama family) with a long-term memory per block
    (or per block of `memory_layers`).

    `settings`: any `AdapterConfig` setting by its flat name: the memory's (num_basis, density,
    squeeze, tau, keep_first, …), the read's (memory_read, memory_positions, token_mass),
    segment_len, window and memory_layers; `preset`: a pretrained preset's settings
    (`inftyformer.presets`, e.g. "salient-places") under them. The base's weights are used as they
    are (not copied); right after wrapping, the logits equal the base's (the added read)."""
    if not isinstance(base, PreTrainedModel):
        raise TypeError(f"base must be a transformers PreTrainedModel, got {type(base).__name__}")
    adapter_for(type(base).__name__)
    if preset is not None:
        blocks = len(adapter_for(type(base).__name__).block_list(base))
        settings = {**preset_settings(preset, "pretrained", blocks), **settings}
    allowed = {*AdapterConfig.setting_types(), "adapter"}  # or a whole AdapterConfig
    unknown = sorted(set(settings) - allowed)
    if unknown:
        raise ValueError(
            f"unknown long-term memory settings {unknown}; allowed: {sorted(allowed)} "
            "(dim and out_dim are the base's hidden size)"
        )
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
