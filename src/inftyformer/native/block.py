"""One pre-LayerNorm transformer block with whichever memories the config selects
(README, "Where each idea lives").

For a call with layer inputs x [batch, L, d] and the layer's state:

1. ∞-former only: the states that left the short-term memory (the oldest whole blocks of C
   states beyond m, `ShortTermMemory.flush`; block semantics in `short_term_memory.py`) are
   kept in the short-term state until the start of the next call. Only then do they enter the
   long-term memory (`LongTermMemory.update`: first fit or squeeze-resample-refit), detached and
   normalised by a LayerNorm without parameters, INSIDE that call's forward: the CNN gate and the
   fit are in the graph of the step whose queries read them. (Updating at the end of the
   previous call would leave the gate without gradient: the memory is detached between calls.)
2. Self-attention of LN(x) over LN([compressed ; short-term ; x]) with relative positions;
   ∞-former: + the continuous read of the long-term memory with the same queries W_q LN(x)
   (no relative terms), added to the attention output before the residual:
       a = W_o Attn_rel(q, [mem ; x]) + LTM(q)
       x ← x + Dropout(a)
       x ← x + Dropout(FFN(LN(x))),  FFN = W_2 Dropout(GELU(W_1 ·))
3. x (the layer inputs, detached) is appended to the short-term memory.
4. XL / vanilla: the states that leave now are dropped. Compressive: they are compressed c:1 and
   appended to the compressed slots (detached), and the attention-reconstruction loss is
   computed for them with this call's h (Rae et al.): it trains only the Conv1d.

Every parameter takes part in the graph of every training call (parameters of a memory that had
nothing to do this call are added as 0·Σp), so DistributedDataParallel needs no
`find_unused_parameters`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .. import ragged
from .._checks import STATE_MAGNITUDE, ValueChecks
from .._init import init_projection
from ..core.attention import LongTermAttention
from ..core.memory import LongTermMemory, LongTermUpdate
from ..core.state import LongTermState
from .compressive_memory import CompressiveMemory, CompressiveState
from .kl_term import token_kl
from .model_config import ModelConfig
from .relative_attention import RelativeMultiHeadAttention
from .short_term_memory import ShortTermMemory, ShortTermState
from .state import LayerState


@dataclass
class LayerTrace:
    """What a layer's memories did during one call, for inspection (`inftyformer.inspection`);
    returned only when asked (`MemoryLM.forward(..., return_trace=True)`), detached.

    mu, sigma_sq     [batch, H, L]   the long-term reads' densities 𝒩(μ, σ²) (∞-former)
    read_empty       bool [batch]    rows whose long-term memory was empty when read (their
                                     read is exactly 0, whatever μ, σ² say)
    updates          long-term updates of the call, in order: (record, rows) with rows the bool
                     [batch] mask of the rows it applied to (`LongTermUpdate`)
    compressed_from  [batch, F, d]   states compressed this call, left-aligned (compressive)
    compressed_count [batch]         how many of them are valid per row
    compressed       [batch, F/c, d] the slots made from them, left-aligned
    """

    mu: torch.Tensor | None = None
    sigma_sq: torch.Tensor | None = None
    read_empty: torch.Tensor | None = None
    updates: list[tuple[LongTermUpdate, torch.Tensor]] = field(default_factory=list)
    compressed_from: torch.Tensor | None = None
    compressed_count: torch.Tensor | None = None
    compressed: torch.Tensor | None = None


@dataclass
class BlockOutput:
    hidden: torch.Tensor  # [batch, L, d]
    state: LayerState  # not detached: the long-term coefficients carry this call's graph
    kl: torch.Tensor | None  # [batch, L] the KL of each token's read (∞-former; `kl_term.py`)
    reconstruction: torch.Tensor | None  # scalar (compressive)
    unused: torch.Tensor | None  # 0·Σp over parameters that had nothing to do (DDP)
    trace: LayerTrace | None = None  # with `return_trace=True`


class MemoryBlock(nn.Module):
    def __init__(self, config: ModelConfig, designs: dict | None = None) -> None:
        """`designs`: the long-term memory's design matrices, shared with the model's other
        blocks (`RidgeRegression`); the block keeps its own when None."""
        super().__init__()
        d = config.d_model
        self.config = config
        self.norm_attention = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.attention = RelativeMultiHeadAttention(d, config.n_heads, config.attention_dropout)
        self.norm_ff = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.ff_in = nn.Linear(d, config.d_ff)  # W_1
        self.ff_out = nn.Linear(config.d_ff, d)  # W_2
        self.dropout = nn.Dropout(config.dropout)
        unit = config.compression_rate if config.has_compressive else 1
        self.short_term = ShortTermMemory(config.mem_len, config.segment_len, unit)
        self.compressive = (
            CompressiveMemory(d, config.compression_rate, config.compressed_len)
            if config.has_compressive
            else None
        )
        self.long_term_memory: LongTermMemory | None = None
        self.long_term_attention: LongTermAttention | None = None
        if config.has_long_term:
            lt_config = config.long_term_config()
            self.long_term_memory = LongTermMemory(lt_config, designs)
            # one ψ per layer: the attention reads the signal with the memory's own basis
            self.long_term_attention = LongTermAttention(lt_config, self.long_term_memory.basis)

    def reset_parameters(self, std: float) -> None:
        """By role: unit LayerNorms; the attention and FFN projections and the long-term
        attention's projections ~ N(0, std²) with zero biases. The compressive memory's Conv1d,
        the long-term memory's CNN gate and the density heads w_μ, w_σ keep PyTorch's default
        initialisation; the relative-attention biases u, v are drawn by the model (after every
        block, so that the seeded draws keep their order)."""
        self.norm_attention.reset_parameters()
        self.norm_ff.reset_parameters()
        self.attention.reset_projections(std)
        init_projection(self.ff_in, std)
        init_projection(self.ff_out, std)
        if self.long_term_attention is not None:
            self.long_term_attention.reset_projections(std)

    # ------------------------------------------------------------------ state
    def init_state(self, batch_size: int, device=None, dtype=torch.float32) -> LayerState:
        d = self.config.d_model
        return LayerState(
            short_term=self.short_term.init_state(batch_size, d, device, dtype),
            compressed=None
            if self.compressive is None
            else self.compressive.init_state(batch_size, d, device, dtype),
            long_term=None
            if self.long_term_memory is None
            else self.long_term_memory.init_state(batch_size, device, dtype),
        )

    def check_state(
        self,
        state: LayerState,
        batch: int,
        name: str,
        dtypes: tuple[torch.dtype, ...] | None = None,
        values: ValueChecks | None = None,
    ) -> None:
        """Validate a layer state for this block: its parts match the model type (provenance:
        no short-term memory beyond what this model keeps, no compressed or long-term part the
        model lacks), shapes, dtypes (floating tensors of one of `dtypes`), and, in `values` or
        here, the values (see the state classes' `check`)."""
        c, d = self.config, self.config.d_model
        if not isinstance(state, LayerState):
            raise TypeError(f"{name} must be a LayerState, got {type(state).__name__}")
        for part, cls in (("short_term", ShortTermState), ("compressed", CompressiveState)):
            value = getattr(state, part)
            if not isinstance(value, cls) and not (part == "compressed" and value is None):
                raise TypeError(
                    f"{name}.{part} must be a {cls.__name__}, got {type(value).__name__}"
                )
        # what the state holds must be what this model type keeps (provenance) ...
        if (state.compressed is None) != (self.compressive is None):
            raise ValueError(
                f"{name}.compressed must be {'absent' if self.compressive is None else 'present'}"
                f" for model_type {c.model_type!r}"
            )
        if (state.long_term is None) != (self.long_term_memory is None):
            raise ValueError(
                f"{name}.long_term must be "
                f"{'absent' if self.long_term_memory is None else 'present'} for model_type "
                f"{c.model_type!r}" + ("" if c.use_long_term else " with use_long_term=False")
            )
        if self.long_term_memory is not None and not isinstance(state.long_term, LongTermState):
            raise TypeError(
                f"{name}.long_term must be a LongTermState, got {type(state.long_term).__name__}"
            )
        # ... and no more of it than this model keeps (e.g. no XL memory in a transformer)
        own = values is None
        values = ValueChecks() if own else values
        state.short_term.check(f"{name}.short_term", batch, d, c.max_short_term_len, dtypes, values)
        if state.compressed is not None:
            state.compressed.check(f"{name}.compressed", batch, d, c.compressed_len, dtypes, values)
        if state.long_term is not None:
            state.long_term.check(
                self.long_term_memory.config, f"{name}.long_term", dtypes, values, STATE_MAGNITUDE
            )
            if state.long_term.batch_size != batch:
                raise ValueError(
                    f"{name}.long_term has batch size {state.long_term.batch_size}, "
                    f"expected {batch}"
                )
        if own:
            values.run()

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        x: torch.Tensor,
        state: LayerState,
        generator: torch.Generator | None = None,
        return_trace: bool = False,
    ) -> BlockOutput:
        """x [batch, L, d] → BlockOutput (hidden [batch, L, d] and the new layer state; with
        `return_trace`, also what the memories did: `LayerTrace`)."""
        unused: list[nn.Parameter] = []
        trace = LayerTrace() if return_trace else None

        # 1. ∞-former: the states that left the short-term memory enter the long-term memory
        # at the start of the call, inside this step's graph
        short, long_term = state.short_term, state.long_term
        if self.long_term_memory is not None:
            short, leaving, count = self.short_term.flush(short)  # [batch, F, d], [batch]
            if bool((count > 0).any()):
                long_term = self._update_long_term(long_term, leaving, count, generator, trace)
            else:
                unused += list(self.long_term_memory.parameters())

        # 2. attention over [compressed ; short-term ; segment]
        compressed = state.compressed
        if compressed is not None:
            memory, memory_length = ragged.concat(
                compressed.memory, compressed.length, short.memory, short.length
            )
        else:
            memory, memory_length = short.memory, short.length
        h = self.norm_attention(x)  # [batch, L, d]
        memory_normed = self.norm_attention(memory) if memory.shape[1] else memory  # [batch, W, d]
        attended, query = self.attention(h, memory_normed, memory_length)  # [batch, L, d] × 2
        kl = None
        if self.long_term_attention is not None:
            # continuous read with the same queries W_q LN(x)
            read = self.long_term_attention(query, long_term)
            attended = attended + read.context  # added to self-attention's, before the residual
            sigma_0 = self.long_term_attention.config.sigma_0
            kl = token_kl(read.sigma_sq, sigma_0, ~long_term.empty)  # [batch, L]
            # sticky memories: where these queries attended steers the next resampling
            long_term = self.long_term_memory._observe(long_term, read.mu, read.sigma_sq)
            if trace is not None:
                trace.mu, trace.sigma_sq = read.mu.detach(), read.sigma_sq.detach()
                trace.read_empty = long_term.empty
        hidden = x + self.dropout(attended)
        ff = self.ff_out(self.dropout(F.gelu(self.ff_in(self.norm_ff(hidden)))))
        hidden = hidden + self.dropout(ff)

        # 3. this call's layer inputs join the short-term memory
        short = self.short_term.append(short, x)

        # 4. XL / vanilla / compressive: what leaves now is dropped or compressed right away
        reconstruction = None
        if self.long_term_memory is None:
            short, leaving, count = self.short_term.flush(short)
            if self.compressive is not None:
                if bool((count > 0).any()):
                    slots, slot_count = self.compressive.compress(leaving, count)  # f_c(old)
                    reconstruction = self.compressive.reconstruction_loss(
                        self._content_attention_detached, x, leaving, count, slots, slot_count
                    )
                    compressed = self.compressive.append(compressed, slots, slot_count)
                    if trace is not None:
                        trace.compressed_from, trace.compressed_count = leaving.detach(), count
                        trace.compressed = slots.detach()
                else:
                    reconstruction = x.new_zeros(())
                    unused += list(self.compressive.parameters())
        zero = None
        if unused and torch.is_grad_enabled():
            zero = torch.stack([p.sum() for p in unused]).sum() * 0.0
        return BlockOutput(
            hidden=hidden,
            state=LayerState(short, compressed, long_term),
            kl=kl,
            reconstruction=reconstruction,
            unused=zero,
            trace=trace,
        )

    # ------------------------------------------------------------------ helpers
    def _content_attention_detached(
        self, h: torch.Tensor, keys: torch.Tensor, key_valid: torch.Tensor
    ) -> torch.Tensor:
        """The layer's content attention over LN(keys) with LN and attention weights detached."""
        weight, bias = self.norm_attention.weight.detach(), self.norm_attention.bias.detach()
        shape, eps = (self.config.d_model,), self.config.layer_norm_eps
        return self.attention.content_attention(
            F.layer_norm(h, shape, weight, bias, eps),
            F.layer_norm(keys, shape, weight, bias, eps),
            key_valid,
        )

    def _update_long_term(
        self,
        long_term: LongTermState,
        leaving: torch.Tensor,
        count: torch.Tensor,
        generator: torch.Generator | None,
        trace: LayerTrace | None = None,
    ) -> LongTermState:
        """Fit the leaving states, block by block of C, into the rows that have them (and
        record each update in `trace` when given)."""
        assert self.long_term_memory is not None
        C = self.short_term.block_len
        for j in range(leaving.shape[1] // C):  # at most a couple of blocks
            rows = count > j * C  # [batch]
            # parameter-free LayerNorm: the stored signal has a fixed scale, and the detached
            # input needs no gradient (the CNN gate's weights get theirs all the same)
            chunk = F.layer_norm(
                leaving[:, j * C : (j + 1) * C],
                (self.config.d_model,),
                eps=self.config.layer_norm_eps,
            )  # [batch, C, d]
            updated, record = self.long_term_memory._update(long_term, chunk, generator)
            if trace is not None:
                trace.updates.append((record.detach(), rows))
            # rows in another phase keep their memory
            long_term = updated if bool(rows.all()) else updated.select(rows, long_term)
        return long_term


__all__ = ["BlockOutput", "LayerTrace", "MemoryBlock"]
