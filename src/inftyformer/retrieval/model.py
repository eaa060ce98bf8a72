"""Retrieval of exact past blocks chosen by the current queries, on a pretrained rotary causal LM
(Llama family; ours, beside the paper's continuous memory: `docs/retrieval_cost.md`).

Each call runs the base on its T ≤ L tokens only. In every block of the base, the call's queries
attend, in one scaled-dot-product attention with the call's own keys (causal), to a context of

    the stream's first S = sink_blocks · B tokens (the attention sink: where a pretrained model
        parks attention it does not need),
    R ≤ blocks · B tokens of past blocks, in stream order (from block `select_layer` on; below
        it, none),
    the most recent W … W + B − 1 tokens (the short-term window),

packed in that order right before the call's tokens, which sit at positions P0 + t
(P0 = S + blocks · B + W + B − 1): each context token at P0 − (the context tokens from it on).
Keys are kept without their rotary positions and turned to these when read, so no position ever
passes P0 + L however long the stream, and while everything read is contiguous in the stream
(a stream shorter than the context) the distances are the true ones: the logits are the base's
on the whole stream. Nothing is recomputed: the window is
the keys and values each token got when it was read (a KV cache).

Which blocks (read time, by the query): at block `select_layer`, every call scores all the
stored tokens' keys against its own queries, q_t · R_Δ k_j / √d (the keys turned as if they sat
at position S: every block at one distance), takes each block's best score over its tokens,
the call's queries and the heads ("max"; or the mean over queries of the best over tokens and
heads, "mean"; or the best attention weight a query and head gives one of its tokens attending
over all the stored tokens, "attention": a query matching many blocks alike counts less than one
matching a single block), and reads the `blocks` best, with the same choice in every block
from there on (in stream order; `order="score"`: the best last, nearest the window).
The stored keys of `select_layer` stay in memory for that (2 · H_kv · d bytes per token); the
blocks' keys and values of the retrieving layers are on disk (`retrieval/store.py`).

With `distances="true"` the call's tokens sit as far on as the base's positions allow and
every read slot keeps its distance in the stream where that fits (the packed layout closes the
gaps between a chosen block, the sink and the window; beyond the positions the oldest slots are
packed in order below the rest).

One-token calls (decoding) run on a context turned once and queries that move on
(`retrieval/decode.py`): the same scores without rebuilding the context each token.

State (`RetrievalState`): explicit, per batch row, passed in and returned; `reset` clears rows.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .._checks import check_token_ids
from ..hf.adapters import adapter_for
from . import state as states
from .config import RetrievalConfig
from .decode import DecodeRun
from .query_map import QueryMap
from .scorers import block_scores, choose
from .state import RetrievalState, held, stream_index, turn, unturn, written

ATTENTION = "inftyformer_retrieval"


@dataclass
class _Call:
    """What the attention function needs during one call of the base."""

    model: RetrievalLM
    state: RetrievalState
    layer_of: dict[int, int]  # id(attention module) → block index
    cos: torch.Tensor  # the call's rotary angles  [b, T, d]
    sin: torch.Tensor
    new_k: dict[int, torch.Tensor] = field(default_factory=dict)  # before rotary [b, Hkv, T, d]
    new_v: dict[int, torch.Tensor] = field(default_factory=dict)
    selected: torch.Tensor | None = None  # [b, blocks] ids of the blocks read
    selected_valid: torch.Tensor | None = None  # [b, blocks] bool
    question: torch.Tensor | None = None  # the queries that chose them, at P0 + t  [b, H, T, d]
    stop_after_select: bool = False  # a first pass that only chooses (`forward`'s reselect)
    hold: bool = False  # every block reads the state's choice; nothing chosen (`keep_choice`)
    layouts: dict = field(default_factory=dict)  # id(valid) → its angles and mask
    valids: dict = field(default_factory=dict)  # what a layer's valid slots depend on → them
    streams: dict = field(default_factory=dict)  # id(valid) → the slots' stream indices
    at: int = 0  # a one-token call's place in its run: its token sits at P0 + at
    run: DecodeRun | None = None  # the run of one-token calls this call extends


class _Chosen(Exception):
    """Ends a first pass once the call has chosen its blocks."""


_CALL: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "inftyformer_retrieval_call", default=None
)


def retrieval_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """The base's attention over [context; the call's tokens] (module doc): query [b, H, T, d]
    and key/value [b, H_kv, T, d] of the call's tokens, turned to their positions P0 + t."""
    call = _CALL.get()
    if call is None or id(module) not in call.layer_of:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    layer = call.layer_of[id(module)]
    if call.stop_after_select and layer == call.model.select_layer:
        # scored as `choice` scores: the queries turned back to P0 + t
        query = call.model.at_context_end(query, call.at)
        call.selected, call.selected_valid = call.model.select(call.state, query)
        raise _Chosen
    call.new_k[layer] = unturn(key, call.cos, call.sin)  # kept before rotary
    call.new_v[layer] = value
    if call.run is not None:  # one token of a run: the context turned once (retrieval_decode)
        out = call.run.attend(call, layer, query, key, value, scaling)
        if out is not None:
            return out, None
    ctx_k, ctx_v, valid = call.model.context(call, layer, query)  # [b, Hkv, P0, d], [b, P0]
    # the valid slots packed next to the call's first token (at P0 + at): slot j at
    # P0 + at − (valid slots from j on), so that what is read keeps its order without gaps
    # (the layers of a call share a few layouts: their angles and mask made once each)
    layout = call.layouts.get(id(valid))
    if layout is None:
        cos, sin = call.model.layout_angles(key, valid, call.at, call)
        T = query.shape[2]
        if T == 1 and bool(valid.all()):
            mask = None  # one query reading every slot: nothing to hide
        else:
            causal = torch.ones(T, T, dtype=torch.bool, device=query.device).tril()
            mask = torch.cat([valid[:, None, None, :].expand(-1, 1, T, -1),
                              causal.expand(valid.shape[0], 1, T, T)], -1)  # fmt: skip
        layout = call.layouts[id(valid)] = (cos, sin, mask, valid)  # valid kept: its id stays
    cos, sin, mask, _ = layout
    ctx_k = turn(ctx_k.to(key.dtype), cos, sin)
    out = F.scaled_dot_product_attention(
        query,
        torch.cat([ctx_k, key], 2),
        torch.cat([ctx_v.to(value.dtype), value], 2),
        attn_mask=mask,
        scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION, retrieval_attention)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)


@dataclass
class RetrievalOutput:
    logits: torch.Tensor  # [batch, T, V]
    state: RetrievalState


class RetrievalLM(nn.Module):
    """A rotary causal LM reading exact past blocks chosen by its queries (module doc)."""

    def __init__(
        self,
        base: PreTrainedModel,
        config: RetrievalConfig | None = None,
        preset: str | None = None,
        **settings,
    ):
        """`config`, or a preset of the retrieval kind (`inftyformer presets`), with `settings`
        on top: ``RetrievalLM(base, preset="retrieval", store_dir="/tmp/blocks")``."""
        super().__init__()
        if preset is not None:
            if config is not None:
                raise ValueError("give a config or a preset, not both")
            from ..presets import preset_settings

            config = RetrievalConfig(**preset_settings(preset, "retrieval"))
        config = (config or RetrievalConfig()).replace(**states.text_paths(settings))
        adapter = adapter_for(type(base).__name__)
        if not adapter.rotary:
            raise ValueError(
                f"retrieval turns stored keys to new positions: it needs rotary positions, and "
                f"{type(base).__name__} has absolute ones"
            )
        self.base, self.config = base, config
        self.attentions = adapter.attentions(base)
        self.rotary = adapter.rotary_embedding(base)
        text = base.config
        self.num_layers = len(self.attentions)
        self.kv_heads = int(getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
        self.head_dim = int(
            getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        )
        select = self.num_layers // 2 if config.select_layer is None else config.select_layer
        if select >= self.num_layers:
            raise ValueError(f"select_layer must be below the base's {self.num_layers} blocks")
        self.select_layer = select
        self.query_map = config.query_map and QueryMap.load_for(
            config.query_map, int(text.num_attention_heads), self.head_dim, select
        ).to(self._param().device)
        limit = getattr(text, "max_position_embeddings", None)
        if config.distances == "true" and limit is None:
            raise ValueError("distances='true' needs the base's max_position_embeddings")
        # the call's first token sits at P0 + at: right after the packed context, or as far on
        # as the base's positions allow when the read slots keep their true distances
        self.anchor = config.context if config.distances == "packed" else (
            int(limit or 0) - config.segment_len
        )  # fmt: skip
        if limit is not None and config.context + config.segment_len > int(limit):
            raise ValueError(
                f"the context ({config.context} positions) and a segment ({config.segment_len}) "
                f"pass the base's {limit} positions: fewer blocks, a shorter window or segment"
            )
        first = select if config.read_from is None else min(config.read_from, select)
        self.read_from = first
        self.retrieving = list(range(first, self.num_layers)) if config.blocks else []
        self._layer_of = {id(m): i for i, m in enumerate(self.attentions)}
        base.set_attn_implementation(ATTENTION)

    def _param(self) -> torch.Tensor:
        return next(self.base.parameters())

    # ------------------------------------------------------------------ state
    def init_state(self, batch_size: int) -> RetrievalState:
        """An empty state of `batch_size` rows, recording this model's settings."""
        return states.new_state(self, batch_size)

    # ------------------------------------------------------------------ one call
    def forward(
        self,
        input_ids: torch.Tensor,
        state: RetrievalState | None = None,
        reset: torch.Tensor | None = None,
        reselect: bool = False,
        keep_choice: bool = False,
        logits_to_keep: int = 0,
    ) -> RetrievalOutput:
        """input_ids [batch, T] of any length (streamed in calls of at most segment_len).

        reselect: the last call chooses its blocks with its own queries before any block reads
        them (a first pass of the blocks below `select_layer`; 1.5 calls' cost): for a question
        whose answer is read next. Otherwise the blocks below `select_layer` read what the
        previous call chose. keep_choice: every call reads, in every block, the blocks the
        state holds as chosen and chooses none (an answer read with its question's blocks;
        a block that leaves the window meanwhile joins the store the question chooses from
        again). logits_to_keep: the logits of the last so many tokens only (0: all; a long
        stream's logits are its length × the vocabulary, 12.9 GB at 64K tokens of SmolLM2)."""
        vocab = int(self.base.config.vocab_size)
        ids = check_token_ids("input_ids", input_ids, vocab, self._param().device)
        state = states.prepare_state(self, state, ids.shape[0], reset)  # checked; rows reset
        if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int):
            raise TypeError(f"logits_to_keep must be an int, got {logits_to_keep!r}")
        if logits_to_keep < 0:
            raise ValueError(f"logits_to_keep must be ≥ 0, got {logits_to_keep}")
        L, n, logits = self.config.segment_len, ids.shape[1], []
        keep_from = n - logits_to_keep if logits_to_keep else 0  # the first token with logits
        for start in (starts := range(0, n, L)):
            last = reselect and start == starts[-1]
            chunk = ids[:, start : start + L]
            keep = max(0, start + chunk.shape[1] - max(keep_from, start))  # of this call's
            out, state = self._call(chunk, state, reselect=last, hold=keep_choice, keep=keep)
            logits.append(out)
        return RetrievalOutput(torch.cat(logits, 1), state)

    def _call(
        self,
        ids: torch.Tensor,
        state: RetrievalState,
        reselect: bool = False,
        hold: bool = False,
        keep: int | None = None,
    ) -> tuple[torch.Tensor, object]:
        """One call of T ≤ segment_len tokens: the logits of its last `keep` (None: all)."""
        b, T = ids.shape
        run, at = self._run(state) if T == 1 and not reselect else (None, 0)
        first = self.anchor + at
        positions = torch.arange(first, first + T, device=ids.device).expand(b, -1)
        probe = self._param().new_zeros(1, 1, self.head_dim)
        cos, sin = self.rotary(probe, positions)
        if reselect and not hold and self.read_from < self.select_layer and self.config.blocks:
            first = _Call(self, state, self._layer_of, cos, sin, stop_after_select=True)
            token = _CALL.set(first)
            try:
                self.base(input_ids=ids, position_ids=positions, use_cache=False)
            except _Chosen:
                pass
            finally:
                _CALL.reset(token)
            state = replace(state, selected=first.selected, chosen=first.selected_valid)
        call = _Call(self, state, self._layer_of, cos, sin, hold=hold, at=at, run=run)
        token = _CALL.set(call)
        wanted = T if keep is None else keep
        try:  # logits_to_keep = 0 is all of them for the base: ask for one and drop it
            out = self.base(input_ids=ids, position_ids=positions, use_cache=False,
                            logits_to_keep=max(wanted, 1))  # fmt: skip
        finally:
            _CALL.reset(token)
        state = written(self, call, T)
        if run is not None:
            run.used = at + 1
        state = replace(state, decode=None if run is None else (run, at + 1))
        return out.logits[:, out.logits.shape[1] - wanted :], state

    def _run(self, state: RetrievalState) -> tuple[DecodeRun, int]:
        """The run of one-token calls `state` extends, and its place in it; a new run when
        the state's cannot be extended (`retrieval_decode`)."""
        if state.decode is not None:
            run, at = state.decode
            if run.continues(state, at):
                return run, at
        return DecodeRun(DecodeRun.counters(state), self.config.segment_len), 0

    def layout_angles(self, key: torch.Tensor, valid: torch.Tensor, at: int = 0, call=None):
        """The rotary angles [b, P0, d] of the context slots of a call whose first token sits
        at A = anchor + at; `valid` [b, P0]. Packed: slot j at A − (the valid slots from j on).
        True distances (`call` given): slot j at A − min(δ_j, A − older_j), δ_j its distance in
        the stream to the call's first token, older_j the valid slots before it: the stream's
        own distances while they fit the positions, the older ones packed, in order, beyond."""
        return self.rotary(key, self.slot_positions(valid, at, call))

    def slot_positions(self, valid: torch.Tensor, at: int = 0, call=None) -> torch.Tensor:
        """The positions [b, P0] of `layout_angles`."""
        A = self.anchor + at
        if self.config.distances == "packed":
            after = valid.flip(1).cumsum(1).flip(1)  # [b, P0]
            return (A - after).clamp(min=0)
        stream = call.streams[id(valid)]  # [b, P0] each slot's index in the stream
        delta = call.state.tokens[:, None].to(stream.device) - stream  # [b, P0] ≥ 1 if valid
        older = valid.cumsum(1) - valid.long()
        return (A - torch.minimum(delta, A - older)).clamp(min=0)

    # ------------------------------------------------------------------ the context of a layer
    def context(self, call: _Call, layer: int, query: torch.Tensor):
        """The context slots of `layer` for this call: keys before rotary and values
        [b, H_kv, P0, d], valid [b, P0] bool (module doc's layout)."""
        c, s = self.config, call.state
        B, S, R = c.block_size, c.sink_blocks * c.block_size, c.blocks * c.block_size
        b, dev = s.batch_size, query.device
        parts_k, parts_v = [s.sink_k[layer]], [s.sink_v[layer]]
        H, d = self.kv_heads, self.head_dim
        ids, chosen, reads = self.choice(call, layer, query)
        if reads:
            k, v = self.read_blocks(s, layer, ids)
            parts_k.append(k)
            parts_v.append(v)
        else:
            parts_k.append(s.window_k.new_zeros(b, H, R, d))
            parts_v.append(s.window_v.new_zeros(b, H, R, d))
        parts_k.append(s.window_k[layer])
        parts_v.append(s.window_v[layer])
        # the valid slots depend on which choice is read (or none): one tensor per choice
        source = id(chosen) if reads else None
        valid = call.valids.get(source)
        if valid is None:
            sink_valid = torch.arange(S, device=dev) < s.sink_len[:, None]
            Wc = s.window_k.shape[3]
            window_valid = torch.arange(Wc, device=dev) >= Wc - s.window_len[:, None]
            if reads:
                got = chosen.repeat_interleave(B, 1)  # [b, k·B]
                picked = F.pad(got, (R - got.shape[1], 0))
            else:
                picked = torch.zeros(b, R, dtype=torch.bool, device=dev)
            valid = call.valids[source] = torch.cat([sink_valid, picked, window_valid], 1)
            if c.distances == "true":
                call.streams[id(valid)] = stream_index(self, s, ids if reads else None, dev)
        return torch.cat(parts_k, 2), torch.cat(parts_v, 2), valid

    def choice(self, call: _Call, layer: int, query: torch.Tensor, choose: bool = True):
        """The blocks `layer` reads in this call: ids [b, k], which are valid [b, k] and
        whether it reads any; at `select_layer` the call chooses them first (`choose`)."""
        s, R = call.state, self.config.blocks * self.config.block_size
        if choose and layer == self.select_layer and R and not call.hold:
            call.question = self.at_context_end(query, call.at)
            call.selected, call.selected_valid = self.select(s, call.question)
        ids, chosen = (
            (call.selected, call.selected_valid) if layer >= self.select_layer and not call.hold
            else (s.selected, s.chosen)
        )  # fmt: skip
        reads = bool(R and layer >= self.read_from and ids is not None and ids.shape[1])
        return ids, chosen, reads

    def at_context_end(self, query: torch.Tensor, at: int = 0) -> torch.Tensor:
        """The queries [b, H, T, d] of a call whose first token sits at anchor + at, turned
        back to P0 + t (P0 = `context`): every choice scores the stored keys (turned to the
        sink's end S) at the distances P0 − S + t, whatever the layout the call reads — a run's
        later token, or the anchor past P0 of true distances."""
        shift = self.anchor - self.config.context + at
        if not shift:
            return query
        angle = torch.full((1, 1), shift, device=query.device)
        return unturn(query, *self.rotary(query.new_zeros(1, 1, self.head_dim), angle))

    def read_blocks(self, state: RetrievalState, layer: int, ids: torch.Tensor):
        """The keys (before rotary) and values of the blocks `ids` [b, k] at `layer`, right-
        aligned in the R = blocks · B slots that end next to the window: [b, H_kv, R, d]."""
        R = self.config.blocks * self.config.block_size
        b, H, d = state.batch_size, self.kv_heads, self.head_dim
        blocks = state.store.read(layer, ids.cpu()).to(ids.device, state.window_k.dtype)
        # [b, k, 2, H, B, d] → [b, H, k·B, d]
        k = blocks[:, :, 0].permute(0, 2, 1, 3, 4).reshape(b, H, -1, d)
        v = blocks[:, :, 1].permute(0, 2, 1, 3, 4).reshape(b, H, -1, d)
        pad = R - k.shape[2]
        return (F.pad(k, (0, 0, pad, 0)), F.pad(v, (0, 0, pad, 0))) if pad else (k, v)

    @torch.no_grad()
    def select(self, state: RetrievalState, query: torch.Tensor):
        """The `blocks` stored blocks the call's queries [b, H, T, d] (turned to P0 + t) match
        best (module doc): ids [b, k] in stream order (or by rising score, `order="score"`)
        and which are valid [b, k]."""
        c = self.config
        b, n = query.shape[0], state.block_ids.shape[1]
        k, dev = min(c.blocks, n), query.device
        if k == 0:
            return (torch.zeros(b, 0, dtype=torch.int64, device=dev),
                    torch.zeros(b, 0, dtype=torch.bool, device=dev))  # fmt: skip
        stored = held(state, dev)  # [b, n]
        score = block_scores(self.choosing(query), state.keys, stored, self.kv_heads,
                             c.block_size, c.score)  # fmt: skip
        order = choose(score, stored, k, c.neighbours, c.order == "score")  # [b, k]
        valid = torch.gather(stored, 1, order)  # a row with fewer blocks: the rest unread
        ids = torch.gather(state.block_ids.to(dev), 1, order)
        return torch.where(valid, ids, 0), valid

    @torch.no_grad()
    def block_scores(
        self, state: RetrievalState, query: torch.Tensor, score: str | None = None
    ) -> torch.Tensor:
        """Every stored block's score [b, n] under the call's queries [b, H, T, d] (turned to
        P0 + t) by `score` (default: the config's; module doc), −inf where a row holds no
        block: what `select` ranks."""
        stored = held(state, query.device)
        return block_scores(self.choosing(query), state.keys, stored, self.kv_heads,
                            self.config.block_size, score or self.config.score)  # fmt: skip

    def choosing(self, query: torch.Tensor) -> torch.Tensor:
        """The call's last `select_queries` queries [b, H, k, d] (0: all), `query_map`ped."""
        query = query[:, :, -self.config.select_queries :]  # -0: all of them
        return self.query_map(query) if self.query_map else query

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        state: RetrievalState | None = None,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
        keep_choice: bool | None = None,
    ) -> tuple[torch.Tensor, RetrievalState]:
        """Continue `prompt` [batch, T]: it is read first (streamed; its last call chooses its
        blocks first, `reselect`), then one call per new token; greedy at temperature 0.
        keep_choice: the new tokens read the blocks the prompt's last call chose (None: as the
        config's `answer_choice` says). Returns the new tokens [batch, n] and the state."""
        if keep_choice is None:  # as the config says
            keep_choice = self.config.answer_choice == "question"
        out = self(prompt, state, reselect=True, logits_to_keep=1)
        logits, state = out.logits[:, -1], out.state
        new = []
        for _ in range(max_new_tokens):
            if temperature > 0:
                probs = torch.softmax(logits.float() / temperature, -1)
                token = torch.multinomial(probs, 1, generator=generator)
            else:
                token = logits.argmax(-1, keepdim=True)
            new.append(token)
            out = self(token, state, keep_choice=keep_choice)
            logits, state = out.logits[:, -1], out.state
        return torch.cat(new, 1), state


__all__ = ["RetrievalLM", "RetrievalOutput", "RetrievalState", "retrieval_attention"]
