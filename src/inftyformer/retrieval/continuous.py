"""The ∞-former's continuous memory of what leaves the retrieval's window (paper §3), beside the
exact blocks the queries choose: the gist of everything read, at N × e per memory block however
long the stream.

In each memory block i (every fourth from the middle by default) of a `RetrievalLM`:

    h_i = norm_i(x)                     the block's attention input, recorded per token
    X = the h_i of the tokens that left the window since the last fit   [L', e]
    B = G_Lᵀ X, or after a squeeze      the paper's ridge fit onto N Gaussian basis functions
        B = G_infᵀ [x̃(τ·j/M) ; X]       (eq. 9; the unbounded update, §3.3: `core.memory`)
    a_i = W_o Attn_retrieval(h_i) + W_out E_p[ψ(t)]ᵀ B W^V
                                        the continuous read (§3.2, `core.attention`) added to the
                                        attention's output, as the paper adds its read

The h_i of the window's tokens are kept beside the window's keys and values (`ContinuousState.
recent`, aligned with the retrieval's window); the tokens the window lets go (to the sink or the
store) wait and enter the memory at the start of the next call, inside that call's graph, so
that the CNN gate is trained by the loss that reads it. The read's output projection starts at
zero: an untrained memory leaves the retrieval's logits exactly as they were.

The hooks are the pretrained adapter's (`hf/hooks.py`): one call-scoped context, no state in a
module. This module holds the memory's parameters only; the state is `ContinuousState`, a field
of the retrieval's state.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch
from torch import nn

from ..core.config import LongTermConfig
from ..core.squeeze import FixedSqueeze
from ..core.state import LongTermState
from ..hf import hooks
from ..hf.adapters import adapter_for
from ..hf.layer_memory import LayerMemory
from ..presets import every_fourth_from_the_middle
from ..pretrained_config import PRETRAINED_LONG_TERM

# the pretrained adapter's memory (`adapter` preset): N = M = 256 of its widths (0.005, 0.01),
# λ = ½, standardised scores, the paper's squeeze into [0, ½]
HYBRID_LONG_TERM = replace(
    PRETRAINED_LONG_TERM, num_basis=256, squeeze=FixedSqueeze(tau=0.5, num_samples=256)
)


@dataclass(frozen=True)
class ContinuousConfig:
    """The continuous memory beside the retrieval: its `long_term` settings (its size, e and
    the heads, are the base's) and the blocks that hold one (`layers`; None: every fourth
    from the middle)."""

    long_term: LongTermConfig = HYBRID_LONG_TERM
    layers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.long_term, LongTermConfig):
            raise TypeError(f"long_term must be a LongTermConfig, got {self.long_term!r:.80}")
        for name in ("dim", "num_heads", "out_dim", "segment_len"):
            if getattr(self.long_term, name) is not None:
                raise ValueError(f"long_term.{name} is the base's: leave it unset")
        if self.layers is not None:
            layers = tuple(self.layers)
            bad = [i for i in layers if isinstance(i, bool) or not isinstance(i, int) or i < 0]
            if not layers or bad or len(set(layers)) != len(layers):
                raise ValueError(f"layers must be distinct block indices ≥ 0, got {self.layers}")
            object.__setattr__(self, "layers", tuple(sorted(layers)))


@dataclass
class ContinuousState:
    """The continuous memory of a batch of streams (m memory blocks, e the base's width).

    long_term     per memory block, its signal (`core.state.LongTermState`)
    recent        [m, b, Wc, e]  the h_i of the retrieval window's tokens, right-aligned as its
                  keys are (the retrieval state's `window_len` valid)
    waiting       [m, b, n, e]  the h_i of the tokens that left the window in the last call,
                  right-aligned; waiting_len [b] how many are valid
    """

    long_term: tuple[LongTermState, ...]
    recent: torch.Tensor
    waiting: torch.Tensor
    waiting_len: torch.Tensor

    def reset(self, rows: torch.Tensor) -> ContinuousState:
        """Clear the rows flagged by the bool mask `rows` [batch] (checked by the caller)."""
        keep = ~rows.to(self.waiting_len.device)
        return replace(
            self,
            long_term=tuple(s.reset(rows) for s in self.long_term),
            waiting_len=self.waiting_len * keep,
        )  # `recent` is read through the retrieval's window_len, cleared with it

    def select_rows(self, at: torch.Tensor) -> ContinuousState:
        """The rows `at` [k] only, in that order."""
        pick = lambda s: LongTermState.from_tensors({k: v[at] for k, v in s.tensors().items()})  # noqa: E731
        return ContinuousState(
            tuple(pick(s) for s in self.long_term), self.recent[:, at], self.waiting[:, at],
            self.waiting_len[at],
        )  # fmt: skip


class ContinuousMemory(nn.Module):
    """The memory blocks' `LayerMemory` (the paper's memory and its continuous read) and the
    hooks that record h_i and add the read in a base's blocks (module doc)."""

    def __init__(self, base: nn.Module, config: ContinuousConfig | None = None) -> None:
        super().__init__()
        config = config or ContinuousConfig()
        adapter = adapter_for(type(base).__name__)
        norms, outputs = adapter.attention_inputs(base), adapter.attention_outputs(base)
        n = len(norms)
        layers = config.layers if config.layers is not None else every_fourth_from_the_middle(n)
        if max(layers) >= n:
            raise ValueError(f"layers holds block {max(layers)}, but the base has {n} blocks")
        text = base.config
        e, heads = int(text.hidden_size), int(text.num_attention_heads)
        self.config, self.blocks, self.dim = config, layers, e
        lt = config.long_term.sized(dim=e, num_heads=heads, out_dim=e, query_projection=True)
        designs: dict = {}  # the design matrices, shared by the blocks' memories
        self.layers = nn.ModuleList(LayerMemory(lt, designs) for _ in layers)
        std = float(getattr(text, "initializer_range", 0.02))
        for layer in self.layers:
            layer.reset_parameters(std)  # the read's output projection zero: the base's logits
        self._owner = hooks.new_owner()
        self._norms = [norms[i] for i in layers]
        self._outputs = [outputs[i] for i in layers]
        self._handles = hooks.attach(self._owner, self._norms, self._outputs)

    # ---------------------------------------------------------------- state
    def init_state(
        self, batch_size: int, window_slots: int, device, dtype: torch.dtype
    ) -> ContinuousState:
        """An empty state of `batch_size` rows beside a retrieval window of `window_slots`."""
        m, e = len(self.layers), self.dim
        zeros = lambda *shape: torch.zeros(*shape, device=device, dtype=dtype)  # noqa: E731
        return ContinuousState(
            tuple(layer.memory.init_state(batch_size, device, dtype) for layer in self.layers),
            zeros(m, batch_size, window_slots, e), zeros(m, batch_size, 0, e),
            torch.zeros(batch_size, dtype=torch.int64, device=device),
        )  # fmt: skip

    def fitted(self, state: ContinuousState) -> list[LongTermState]:
        """Each block's signal after the waiting tokens entered it (in the caller's graph: the
        CNN gate is trained by what reads it); rows with nothing waiting are unchanged."""
        counts, width = state.waiting_len, state.waiting.shape[2]
        out = []
        for layer, long_term, waiting in zip(self.layers, state.long_term, state.waiting,
                                             strict=True):  # fmt: skip
            for n in counts.unique().tolist():
                if n == 0:
                    continue
                rows = counts == n  # [b]
                x = waiting[:, width - n :]  # the last n are valid  [b, n, e]
                updated = layer.memory._update(long_term, x, None)[0]
                long_term = updated if bool(rows.all()) else updated.select(rows, long_term)
            out.append(long_term)
        return out

    @contextlib.contextmanager
    def reading(self, long_term: list[LongTermState]) -> Iterator[hooks.Call]:
        """For the duration of the block, the memory blocks of the base record h_i and add the
        read of `long_term` to their attention's output."""
        m = len(self.layers)
        call = hooks.Call(
            owner=self._owner, norms=self._norms, outputs=self._outputs, layers=self.layers,
            long_term=long_term, normed=[None] * m, reads=[None] * m,
        )  # fmt: skip
        with hooks.active(call):
            yield call

    @torch.no_grad()
    def written(
        self,
        state: ContinuousState,
        long_term: list[LongTermState],
        call: hooks.Call,
        window_before: torch.Tensor,
        window_after: torch.Tensor,
    ) -> ContinuousState:
        """The state after a call of T tokens: the signals as fitted (detached), the call's h_i
        join the window's, and those the window let go wait for the next call. window_before,
        window_after [b]: the retrieval window's valid tokens before and after the call (its
        `written` moves the window; what it let go is read off, not worked out again)."""
        h = torch.stack([x.detach() for x in call.normed])  # [m, b, T, e]
        T = h.shape[2]
        every = torch.cat([state.recent, h.to(state.recent.dtype)], 2)  # right-aligned
        width, slots = every.shape[2], state.recent.shape[2]
        length = window_before + T  # [b]
        leaving = length - window_after  # [b]: to the sink or the store
        M = int(leaving.max())
        if M:  # row r's j-th waiting slot (right-aligned) is its token start_r + j − (M − n_r)
            j = torch.arange(M, device=every.device)
            slot = (width - length)[:, None] + j[None, :] - (M - leaving)[:, None]  # [b, M]
            index = slot.clamp(0, width - 1)[None, :, :, None].expand(h.shape[0], -1, -1,
                                                                       h.shape[3])  # fmt: skip
            waiting = torch.gather(every, 2, index)  # [m, b, M, e]
        else:
            waiting = every[:, :, :0]
        return ContinuousState(
            tuple(s.detach() for s in long_term), every[:, :, width - slots :], waiting, leaving
        )

    def kl(self, call: hooks.Call) -> torch.Tensor:
        """The reads' variance KL toward σ₀ (paper §3.4), summed over the memory blocks."""
        return sum(read.kl for read in call.reads if read is not None)


__all__ = ["HYBRID_LONG_TERM", "ContinuousConfig", "ContinuousMemory", "ContinuousState"]
