"""Retrieval of exact past blocks chosen by the current queries, on a pretrained rotary causal LM
(Llama family; ours, beside the paper's continuous memory; its cost:
`docs/results/benchmarks/retrieval_cost.md`).

Each call runs the base on its T ≤ L tokens only. In every block of the base, the call's queries
attend, in one scaled-dot-product attention with the call's own keys (causal), to a context of

    the stream's first S = sink_blocks · B tokens (the attention sink: where a pretrained model
        parks attention it does not need),
    R ≤ blocks · B tokens of past blocks, placed by the `layout` (from block `read_from` on;
        below it, none),
    the most recent W … W + B − 1 tokens (the short-term window),

packed in that order right before the call's tokens, which sit at positions P0 + t
(P0 = S + blocks · B + W + B − 1): each context token at P0 − (the context tokens from it on).
Keys are kept without their rotary positions and turned to these when read, so no position ever
passes P0 + L however long the stream, and while everything read is contiguous in the stream
(a stream shorter than the context) the distances are the true ones: the logits are the base's
on the whole stream. Nothing is recomputed: the window is the keys and values each token got
when it was read (a KV cache).

Which blocks (read time, by the query): at block `select_layer`, every call scores all the
stored tokens' keys against its own queries, q_t · R_Δ k_j / √d (the keys turned as if they sat
at position S: every block at one distance), scores each block by its `choice` (`scorers.py`:
the best match, "max", or the best attention weight, "attention") and reads the `blocks` best,
with the same choice in every block from there on, in the order its `layout` gives
(`layouts.py`). The stored keys of `select_layer` stay in memory for that (2 · H_kv · d bytes
per token); the blocks' keys and values of the retrieving layers are on disk (`store.py`).

One-token calls (decoding) run on a context turned once and queries that move on
(`decode.py`): the same scores without rebuilding the context each token.

State (`RetrievalState`): explicit, per batch row, passed in and returned; `reset` clears rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from .._checks import check_positive_int, check_token_ids
from ..hf.adapters import adapter_for
from ..native.model import token_losses
from ..native.streaming import check_sampling, sample_next
from . import state as states
from .attention import ATTENTION, CALL, Call, Chosen
from .config import RetrievalConfig
from .continuous import ContinuousConfig, ContinuousMemory
from .decode import DecodeRun
from .scorers import ScoredChoice, block_scores, choose
from .state import RetrievalState, held, unturn, written


@dataclass
class RetrievalOutput:
    """A call's output, as the model contract's `LMOutput` (`model_kinds.py`)."""

    logits: torch.Tensor  # [batch, T', V]: the last T' = logits_to_keep tokens' (0: all)
    state: RetrievalState
    loss: torch.Tensor | None = None  # scalar: the mean NLL over targets ≠ −100
    lm_loss: torch.Tensor | None = None  # the same (the retrieval adds no auxiliary term)
    token_loss: torch.Tensor | None = None  # [batch, T]: NLL per token, 0 where ignored
    aux: dict = field(default_factory=dict)


class RetrievalLM(nn.Module):
    """A rotary causal LM reading exact past blocks chosen by its queries (module doc)."""

    def __init__(
        self,
        base: PreTrainedModel,
        config: RetrievalConfig | None = None,
        preset: str | None = None,
        *,
        memory: ContinuousConfig | None = None,
        **settings,
    ):
        """`config`, or a preset of the retrieval kind (`inftyformer presets`), with `settings`
        on top: ``RetrievalLM(base, preset="retrieval", store_dir="/tmp/blocks")``. `memory`:
        the ∞-former's continuous memory of what leaves the window, beside the blocks
        (`continuous.py`; its weights to train, the base frozen)."""
        super().__init__()
        if config is None:
            config = RetrievalConfig.of(preset, **settings)
        elif preset is not None:
            raise ValueError("give a config or a preset, not both")
        else:
            config = config.replace(**settings)
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
        limit = getattr(text, "max_position_embeddings", None)
        self.anchor = config.context  # the call's first token sits at P0 + at
        if limit is not None and config.context + config.segment_len > int(limit):
            raise ValueError(
                f"the context ({config.context} positions) and a segment ({config.segment_len}) "
                f"pass the base's {limit} positions: fewer blocks, a shorter window or segment"
            )
        first = select if config.read_from is None else min(config.read_from, select)
        self.read_from = first
        self.retrieving = list(range(first, self.num_layers)) if config.blocks else []
        # where a question chooses (`QuestionChoice.question_layer`): its keys read from the store
        layer = getattr(config.choice, "question_layer", lambda n, s: s)(self.num_layers, select)
        if self.retrieving and layer not in self.retrieving:
            last = self.num_layers - 1
            raise ValueError(f"question_select_layer ({layer}) must be a block that retrieves: "
                             f"from read_from ({first}) to the base's last ({last})")  # fmt: skip
        self.question_layer = layer
        self._layer_of = {id(m): i for i, m in enumerate(self.attentions)}
        base.set_attn_implementation(ATTENTION)
        if memory is not None and not isinstance(memory, ContinuousConfig):
            raise TypeError(f"memory must be a ContinuousConfig or None, got {memory!r:.80}")
        self.memory = None if memory is None else ContinuousMemory(base, memory)

    def _param(self) -> torch.Tensor:
        return next(self.base.parameters())

    # ------------------------------------------------------------------ state
    def init_state(
        self, batch_size: int, device: torch.device | str | None = None
    ) -> RetrievalState:
        """An empty state of `batch_size` rows (on the base's device, or `device`), recording
        this model's settings."""
        check_positive_int("batch_size", batch_size)
        return states.new_state(self, batch_size, device)

    # ------------------------------------------------------------------ one call
    def forward(
        self,
        input_ids: torch.Tensor,
        state: RetrievalState | None = None,
        targets: torch.Tensor | None = None,
        reset: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        *,
        reselect: bool = False,
        keep_choice: bool = False,
        logits_to_keep: int = 0,
    ) -> RetrievalOutput:
        """input_ids [batch, T] of any length (streamed in calls of at most segment_len), as the
        model contract's call (`model_kinds.LanguageModel`): targets [batch, T] aligned with
        them give the loss (every token's logits are then kept); reset [batch] bool clears
        rows first; `generator` is unused (the retrieval draws nothing).

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
        if targets is not None:
            check_targets(targets, ids)
            logits_to_keep = 0  # the loss needs every token's logits
        L, n, logits, kl = self.config.segment_len, ids.shape[1], [], []
        keep_from = n - logits_to_keep if logits_to_keep else 0  # the first token with logits
        for start in (starts := range(0, n, L)):
            last = reselect and start == starts[-1]
            chunk = ids[:, start : start + L]
            keep = max(0, start + chunk.shape[1] - max(keep_from, start))  # of this call's
            out, state, read_kl = self._call(chunk, state, reselect=last, hold=keep_choice,
                                             keep=keep)  # fmt: skip
            logits.append(out)
            kl += [] if read_kl is None else [read_kl]
        logits = torch.cat(logits, 1)
        # the continuous reads' variance KL toward σ₀, summed over blocks, averaged over calls
        aux = {"kl": torch.stack(kl).mean()} if kl else {}
        if targets is None:
            return RetrievalOutput(logits, state, aux=aux)
        token_loss, lm_loss = token_losses(logits, targets.to(logits.device))
        return RetrievalOutput(logits, state, lm_loss, lm_loss, token_loss, aux)

    def _call(
        self,
        ids: torch.Tensor,
        state: RetrievalState,
        reselect: bool = False,
        hold: bool = False,
        keep: int | None = None,
    ) -> tuple[torch.Tensor, RetrievalState, torch.Tensor | None]:
        """One call of T ≤ segment_len tokens: the logits of its last `keep` (None: all), the
        state after it and, with a continuous memory, its reads' KL (`continuous.py`)."""
        if self.memory is None:
            return (*self._base_call(ids, state, reselect, hold, keep), None)
        before = state
        long_term = self.memory.fitted(state.continuous)  # what left the window, fitted
        with self.memory.reading(long_term) as read:  # every pass reads the signal
            logits, state = self._base_call(ids, state, reselect, hold, keep)
        continuous = self.memory.written(before.continuous, long_term, read, before.window_len,
                                         state.window_len)  # fmt: skip
        return logits, replace(state, continuous=continuous), self.memory.kl(read)

    def _base_call(self, ids, state, reselect, hold, keep):
        """`_call`'s passes of the base and the retrieval's state after them."""
        b, T = ids.shape
        run, at = self._run(state) if T == 1 and not reselect else (None, 0)
        once = False  # whether the call reads its first pass's choice in every block
        first = self.anchor + at
        positions = torch.arange(first, first + T, device=ids.device).expand(b, -1)
        probe = self._param().new_zeros(1, 1, self.head_dim)
        cos, sin = self.rotary(probe, positions)
        cut = getattr(self.config.choice, "question_window", None)
        if reselect and not hold and cut is not None:  # the question reads few recent tokens
            # of a stream longer than what it reads; one held whole (nothing stored) stays so
            whole = self.config.window + self.config.block_size  # a limit that cuts nothing
            state = states.shrink_window(self, state, torch.where(state.blocks > 0, cut, whole))
        if reselect and not hold and self.read_from < self.select_layer and self.config.blocks:
            chooser = self._choose(ids, positions, state, cos, sin)
            if once := self._question_after_stream:  # then the question's few
                state = replace(state, selected=chooser.selected, chosen=chooser.selected_valid)
                chooser = self._choose(ids, positions, state, cos, sin, question=True)
            state = replace(state, selected=chooser.selected, chosen=chooser.selected_valid)
        call = Call(self, state, self._layer_of, cos, sin, hold=hold, at=at, run=run,
                    question_call=reselect)  # fmt: skip
        if once and chooser.selected is not None:  # the question's choice, in every block
            call.selected, call.selected_valid = chooser.selected, chooser.selected_valid
            call.question, call.chosen_first = chooser.question, True
        token = CALL.set(call)
        wanted = T if keep is None else keep
        try:  # logits_to_keep = 0 is all of them for the base: ask for one and drop it
            out = self.base(input_ids=ids, position_ids=positions, use_cache=False,
                            logits_to_keep=max(wanted, 1))  # fmt: skip
        finally:
            CALL.reset(token)
        state = written(self, call, T)
        if run is not None:
            run.used = at + 1
        state = replace(state, decode=None if run is None else (run, at + 1))
        return out.logits[:, out.logits.shape[1] - wanted :], state

    def _choose(self, ids, positions, state, cos, sin, question: bool = False) -> Call:
        """A first pass of a reselect call that only chooses, up to `select_layer`, its lower
        blocks reading the state's choice: a question's choice (`question`), or as a stream's
        call would (`ScoredChoice.for_call`) when the question's choice is made after it."""
        question = question or not self._question_after_stream
        chooser = Call(self, state, self._layer_of, cos, sin, stop_after_select=True,
                       question_call=question)  # fmt: skip
        token = CALL.set(chooser)
        try:
            self.base(input_ids=ids, position_ids=positions, use_cache=False)
        except Chosen:
            pass
        finally:
            CALL.reset(token)
        return chooser

    @property
    def _question_after_stream(self) -> bool:
        """Whether a question chooses after a pass that chose as a stream (a choice strategy
        of a plugin may not say: then it chooses as it always did)."""
        return bool(getattr(self.config.choice, "question_after_stream", False))

    def _run(self, state: RetrievalState) -> tuple[DecodeRun, int]:
        """The run of one-token calls `state` extends, and its place in it; a new run when
        the state's cannot be extended (`retrieval_decode`)."""
        if state.decode is not None:
            run, at = state.decode
            if run.continues(state, at):
                return run, at
        return DecodeRun(DecodeRun.counters(state), self.config.segment_len), 0

    def layout_angles(self, key: torch.Tensor, valid: torch.Tensor, at: int = 0):
        """The rotary angles [b, P0, d] of the context slots of a call whose first token sits
        at A = anchor + at; `valid` [b, P0]: slot j at A − (the valid slots from j on)."""
        return self.rotary(key, self.slot_positions(valid, at))

    def slot_positions(self, valid: torch.Tensor, at: int = 0) -> torch.Tensor:
        """The positions [b, P0] of `layout_angles`."""
        A = self.anchor + at
        after = valid.flip(1).cumsum(1).flip(1)  # [b, P0]
        return (A - after).clamp(min=0)

    # ------------------------------------------------------------------ the context of a layer
    def context(self, call: Call, layer: int, query: torch.Tensor):
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
        return torch.cat(parts_k, 2), torch.cat(parts_v, 2), valid

    def choice(self, call: Call, layer: int, query: torch.Tensor, choose: bool = True):
        """The blocks `layer` reads in this call: ids [b, k], which are valid [b, k] and
        whether it reads any; at the block where the call chooses (`Call.choosing_layer`:
        `select_layer` or a question's own) it chooses them first (`choose`)."""
        s, R = call.state, self.config.blocks * self.config.block_size
        at = call.choosing_layer
        if choose and layer == at and R and not (call.hold or call.chosen_first):
            call.question = self.at_context_end(query, call.at)
            call.selected, call.selected_valid = self.select(s, call.question, call.question_call)
        ids, chosen = (
            (call.selected, call.selected_valid) if layer >= at and not call.hold
            else (s.selected, s.chosen)
        )  # fmt: skip
        reads = bool(R and layer >= self.read_from and ids is not None and ids.shape[1])
        return ids, chosen, reads

    def at_context_end(self, query: torch.Tensor, at: int = 0) -> torch.Tensor:
        """The queries [b, H, T, d] of a call whose first token sits at anchor + at, turned
        back to P0 + t (P0 = `context`): every choice scores the stored keys (turned to the
        sink's end S) at the distances P0 − S + t, wherever the call's token sits (a run's later
        token at P0 + at)."""
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
    def select(self, state: RetrievalState, query: torch.Tensor, question: bool = False):
        """The stored blocks the call's queries [b, H, T, d] (turned to P0 + t) match best by
        the choice the call makes (a question's or a stream's, `ScoredChoice.for_call`): ids
        [b, k] in the order the layout reads them (`layouts.py`) and which are valid [b, k]."""
        c = self.config
        choice = c.choice.for_call(question)
        b, n = query.shape[0], state.block_ids.shape[1]
        k, dev = min(choice.blocks, n), query.device
        if k == 0:
            return (torch.zeros(b, 0, dtype=torch.int64, device=dev),
                    torch.zeros(b, 0, dtype=torch.bool, device=dev))  # fmt: skip
        stored = held(state, dev)  # [b, n]
        keys = self.question_keys(state) if question else state.keys
        score = block_scores(self.choosing(query, choice), keys, stored, self.kv_heads,
                             c.block_size, choice)  # fmt: skip
        layout = c.choice.layout_for(question, c.layout)
        order = choose(score, stored, k, choice.neighbours, layout)  # [b, k]
        valid = torch.gather(stored, 1, order)  # a row with fewer blocks: the rest unread
        ids = torch.gather(state.block_ids.to(dev), 1, order)
        return torch.where(valid, ids, 0), valid

    def question_keys(self, state: RetrievalState) -> tuple[torch.Tensor, ...]:
        """The stored tokens' keys at the block where a question chooses, turned to position S
        as `state.keys` are (which they are when that block is `select_layer`): read from the
        store in chunks [b, ≤ CHUNK_BLOCKS · B, H_kv, d] of the store's dtype, for one call."""
        if self.question_layer == self.select_layer:
            return state.keys
        return states.stored_keys(self, state, self.question_layer)

    @torch.no_grad()
    def block_scores(
        self, state: RetrievalState, query: torch.Tensor, choice: ScoredChoice | None = None
    ) -> torch.Tensor:
        """Every stored block's score [b, n] under the call's queries [b, H, T, d] (turned to
        P0 + t) by `choice` (default: the config's; `scorers.py`), −inf where a row holds no
        block: what `select` ranks."""
        stored = held(state, query.device)
        choice = choice or self.config.choice
        return block_scores(self.choosing(query, choice), state.keys, stored, self.kv_heads,
                            self.config.block_size, choice)  # fmt: skip

    def choosing(self, query: torch.Tensor, choice: ScoredChoice) -> torch.Tensor:
        """The call's last `select_queries` queries [b, H, k, d] (0: all)."""
        return query[:, :, -choice.select_queries :]  # -0: all of them

    # ------------------------------------------------------------------ the model contract
    def push(self, tokens: torch.Tensor, state: RetrievalState | None = None) -> RetrievalState:
        """The state after streaming tokens [batch, T] of any length (no logits kept)."""
        return self(tokens, state, logits_to_keep=1).state

    def param_groups(self, lr: float, weight_decay: float) -> list[dict]:
        if self.memory is not None:  # the continuous memory's weights only: the base is not trained
            return [{"params": list(self.memory.parameters()), "lr": lr,
                     "weight_decay": weight_decay}]  # fmt: skip
        raise ValueError(
            "the retrieval is training-free: it has no weights of its own to train (read a "
            "document with `inftyformer ask`, or train a memory with --preset adapter)"
        )

    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        state: RetrievalState | None = None,
        generator: torch.Generator | None = None,
        end_ids: Sequence[int] = (),
        with_state: bool = True,
        *,
        keep_choice: bool | None = None,
        streamer: Any = None,
    ) -> tuple[torch.Tensor, RetrievalState | None]:
        """Continue `prompt` [batch, T] (the model contract's generate): it is read first
        (streamed; its last call chooses its blocks first, `reselect`), then one call per new
        token; greedy at temperature 0, else sampling with top-k / nucleus top-p from
        `generator`. Stops once every row has written one of `end_ids` (a row that ended is
        padded with its first). keep_choice: the new tokens read the blocks the prompt's last
        call chose (None: as the config's `answer_choice` says). `streamer`: a transformers
        streamer (`put` each new token [batch], `end` at the end). Returns the new tokens
        [batch, ≤ max_new_tokens] and the state after them (None without `with_state`)."""
        check_positive_int("max_new_tokens", max_new_tokens, minimum=0)
        check_sampling(temperature, top_k, top_p)
        ends = torch.tensor(list(end_ids), dtype=torch.long)
        if keep_choice is None:  # as the config says
            keep_choice = self.config.answer_choice == "question"
        out = self(prompt, state, reselect=True, logits_to_keep=1)
        logits, state = out.logits[:, -1], out.state
        new, done = [], torch.zeros(prompt.shape[0], dtype=torch.bool)
        for step in range(max_new_tokens):
            token = sample_next(logits, temperature, top_k, top_p, generator).cpu()  # [batch]
            if len(ends):
                token = torch.where(done, ends[0], token)
                done |= torch.isin(token, ends)
            new.append(token)
            if streamer is not None:
                streamer.put(token)
            if bool(done.all()) or step == max_new_tokens - 1 and not with_state:
                break
            out = self(token[:, None].to(prompt.device), state, keep_choice=keep_choice)
            logits, state = out.logits[:, -1], out.state
        if streamer is not None:
            streamer.end()
        tokens = torch.stack(new, 1) if new else prompt.new_zeros(prompt.shape[0], 0).cpu()
        if with_state and new and bool(done.all()):  # the last token read into the state too
            state = self(tokens[:, -1:].to(prompt.device), state, keep_choice=keep_choice).state
        return tokens.to(prompt.device), state if with_state else None


def check_targets(targets: torch.Tensor, ids: torch.Tensor) -> None:
    """targets [batch, T] int64 aligned with input_ids (−100: not scored)."""
    if not isinstance(targets, torch.Tensor) or targets.dtype != torch.long:
        raise TypeError(f"targets must be an int64 tensor, got {targets!r:.80}")
    if targets.shape != ids.shape:
        raise ValueError(f"targets {tuple(targets.shape)} must match input_ids {tuple(ids.shape)}")


__all__ = ["RetrievalLM", "RetrievalOutput", "RetrievalState", "check_targets"]
