"""The state of a retrieval memory (`retrieval.py`) and how one call of the base writes it: the
window moves on, its oldest whole blocks fill the sink and then go to the store
(`retrieval/store.py`),
and the call's choice of blocks is carried to the next call."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace

import torch
import torch.nn.functional as F

from .._checks import check_row_mask
from ..hf.head_read import rotate_half
from .continuous import ContinuousState
from .store import BlockStore, narrowed, store_dtype

CHUNK_BLOCKS = 64  # stored blocks per chunk of the in-memory keys (4,096 tokens in blocks of 64)


def turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, H, T, d] turned by the rotary angles of its positions (cos, sin [b, T, d])."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def unturn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The inverse of `turn`: x before its rotary positions."""
    return x * cos[:, None] - rotate_half(x) * sin[:, None]


@dataclass(frozen=True)
class StateRecord:
    """The settings that give a state's numbers their meaning, recorded when it is made: the
    base's blocks (L), key/value heads and head width, the block size B, the window W, the
    sink's blocks, the choosing block, the first block that reads a choice and the blocks
    that retrieve. A model with another value of any of them refuses the state."""

    block_size: int
    window: int
    sink_blocks: int
    select_layer: int
    read_from: int
    num_layers: int
    kv_heads: int
    head_dim: int
    retrieving: tuple[int, ...]
    memory_blocks: tuple[int, ...] = ()  # the blocks with a continuous memory (none: none)

    @classmethod
    def of(cls, model) -> StateRecord:
        c, memory = model.config, model.memory
        return cls(
            c.block_size, c.window, c.sink_blocks, model.select_layer, model.read_from,
            model.num_layers, model.kv_heads, model.head_dim, tuple(model.retrieving),
            () if memory is None else tuple(memory.blocks),
        )  # fmt: skip


def new_state(model, batch_size: int, device: torch.device | str | None = None) -> RetrievalState:
    """An empty state of `batch_size` rows for `model` (`RetrievalLM.init_state`; on the base's
    device, or `device`), its settings recorded and its blocks stored in the dtype the base's
    dtype calls for."""
    c, p = model.config, next(model.base.parameters())
    L, H, d, B = model.num_layers, model.kv_heads, model.head_dim, c.block_size
    where = p.device if device is None else torch.device(device)
    zeros = lambda *shape, **kw: torch.zeros(*shape, device=where, **kw)  # noqa: E731
    window = (L, batch_size, H, c.window + B - 1, d)
    sink = (L, batch_size, H, c.sink_blocks * B, d)
    count = dict(dtype=torch.int64)
    return RetrievalState(
        window_k=zeros(*window, dtype=p.dtype), window_v=zeros(*window, dtype=p.dtype),
        window_len=zeros(batch_size, **count),
        sink_k=zeros(*sink, dtype=p.dtype), sink_v=zeros(*sink, dtype=p.dtype),
        sink_len=zeros(batch_size, **count),
        block_ids=zeros(batch_size, 0, **count), blocks=zeros(batch_size, **count),
        keys=(), selected=zeros(batch_size, 0, **count),
        chosen=zeros(batch_size, 0, dtype=torch.bool),
        tokens=zeros(batch_size, **count),
        store=BlockStore(model.retrieving, H, B, d, c.store_dir, store_dtype(p.dtype)),
        record=StateRecord.of(model),
        continuous=None if model.memory is None
        else model.memory.init_state(batch_size, c.window + B - 1, where, p.dtype),
    )  # fmt: skip


def prepare_state(model, state, batch: int, reset) -> RetrievalState:
    """The state a call of `model` on `batch` rows reads: `state` (None: a new one) checked to
    be the model's and of `batch` rows, the rows `reset` flags cleared."""
    if state is None:
        state = model.init_state(batch)
    elif not isinstance(state, RetrievalState):
        raise TypeError(f"state must be a RetrievalState or None, got {type(state).__name__}")
    if state.record is None:
        raise ValueError("state records no settings: make states with the model's init_state")
    own = StateRecord.of(model)
    if state.record != own:
        theirs, ours = asdict(state.record), asdict(own)
        diff = "; ".join(
            f"{k}: the state's {theirs[k]}, the model's {ours[k]}" for k in ours
            if theirs[k] != ours[k]
        )  # fmt: skip
        raise ValueError(f"state was made by a retrieval model of other settings ({diff})")
    if state.batch_size != batch:
        raise ValueError(f"state has {state.batch_size} rows, input_ids {batch}")
    return state if reset is None else state.reset(reset)


@dataclass
class RetrievalState:
    """The memory of a batch of streams (L = the base's blocks, H_kv key/value heads, d).

    window_k, window_v  [L, b, H_kv, W + B − 1, d]  the recent tokens' keys (before rotary)
                        and values, right-aligned; window_len [b] how many are valid
    sink_k, sink_v      [L, b, H_kv, S, d]  the stream's first S tokens; sink_len [b]
    block_ids           [b, n] int64  each row's stored blocks (ids in `store`), oldest first;
                        blocks [b] how many are valid
    keys                chunks [b, ≤ CHUNK_BLOCKS · B, H_kv, d] in the store's dtype
                        (`store_dtype`), together [b, n · B,
                        H_kv, d]: the stored tokens' keys at `select_layer`, turned to position
                        S (what a call's queries score); a store copies only the chunks it
                        writes to, so storing a block costs the same however long the stream
    selected, chosen    [b, k] int64 / bool  the blocks the last call chose and which are valid
                        (what the next call's blocks below `select_layer` read)
    question            [b, H, T, d]  the queries that chose them (at P0 + t; None: no
                        choice yet): a held answer whose window let a block go to the store
                        chooses again with them, so that the block stays readable
    tokens              [b] int64  tokens read since the row's reset
    store               the blocks' keys and values (shared by a state and those made from
                        it: select_rows, reset, the next call's)
    record              the settings it was made with (`StateRecord`: a model of others
                        refuses it)
    decode              the run of one-token calls this state extends and its place in it
                        (`retrieval_decode`: derived, dropped by select_rows)
    continuous          the continuous memory of what left the window (`continuous.py`;
                        None: the model has none)
    """

    window_k: torch.Tensor
    window_v: torch.Tensor
    window_len: torch.Tensor
    sink_k: torch.Tensor
    sink_v: torch.Tensor
    sink_len: torch.Tensor
    block_ids: torch.Tensor
    blocks: torch.Tensor
    keys: tuple[torch.Tensor, ...]
    selected: torch.Tensor
    chosen: torch.Tensor
    tokens: torch.Tensor
    store: BlockStore = field(repr=False)
    record: StateRecord | None = field(default=None, repr=False, compare=False)
    decode: tuple | None = field(default=None, repr=False, compare=False)
    question: torch.Tensor | None = field(default=None, repr=False, compare=False)
    continuous: ContinuousState | None = field(default=None, repr=False, compare=False)

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    def reset(self, rows: torch.Tensor) -> RetrievalState:
        """Clear the rows flagged by the bool mask `rows` [batch] (their document ended)."""
        keep = ~check_row_mask("reset", rows, self.batch_size).to(self.tokens.device)
        return replace(
            self,
            window_len=self.window_len * keep,
            sink_len=self.sink_len * keep,
            blocks=self.blocks * keep,
            chosen=self.chosen & keep[:, None],
            tokens=self.tokens * keep,
            continuous=None if self.continuous is None else self.continuous.reset(~keep),
        )  # a run of one-token calls goes on for the other rows: a reset row's counters end it

    def select_rows(self, rows: list[int]) -> RetrievalState:
        """The state of the batch rows `rows` only, in that order (the store is shared)."""
        if list(rows) == list(range(self.batch_size)):
            return self
        at = torch.tensor(rows, device=self.tokens.device)
        per_layer = ("window_k", "window_v", "sink_k", "sink_v")  # [L, b, …]
        changes = {name: getattr(self, name)[:, at] for name in per_layer}
        changes["keys"] = tuple(chunk[at] for chunk in self.keys)
        for f in fields(self):  # the others are batch first
            skip = f.name in per_layer or f.name in ("keys", "store", "decode", "record",
                                                     "continuous")  # fmt: skip
            if not skip and getattr(self, f.name) is not None:
                changes[f.name] = getattr(self, f.name)[at]
        if self.continuous is not None:
            changes["continuous"] = self.continuous.select_rows(at)
        return replace(self, **changes, decode=None)


@torch.no_grad()
def written(model, call, T: int) -> RetrievalState:
    """The window moves on; its oldest whole blocks go to the sink (the stream's first S
    tokens), then to the store."""
    c, s = model.config, call.state
    B, W, L = c.block_size, c.window, model.num_layers
    new_k = torch.stack([call.new_k[i] for i in range(L)])  # [L, b, H, T, d]
    new_v = torch.stack([call.new_v[i] for i in range(L)])
    length = s.window_len + T  # [b]
    moved = (length - W).clamp(min=0) // B  # whole blocks that leave  [b]
    if call.run is not None and not bool(moved.any()):  # a run's token: written in place
        wk, wv = call.run.moved_window(s, new_k, new_v, call.at)
        Wc = s.window_k.shape[3]
        return replace(s, window_k=wk, window_v=wv, window_len=length.clamp(max=Wc),
                       tokens=s.tokens + T, **_carried(call))  # fmt: skip
    wk = torch.cat([s.window_k, new_k.to(s.window_k.dtype)], 3)  # right-aligned
    wv = torch.cat([s.window_v, new_v.to(s.window_v.dtype)], 3)
    new = replace(s, **_moved_on(model, s, wk, wv, length, W), **_carried(call))
    # an answer reads the choice its question made (a held answer, or the question's own call
    # when its answer reads its choice): blocks that left the window since were stored after
    # that choice, so the question's queries choose again among every stored block, and none
    # is lost between window and choice
    answered = call.hold or (call.question_call and c.answer_choice == "question")
    stored = not torch.equal(new.blocks, s.blocks)
    if answered and new.question is not None and c.blocks and stored:
        selected, chosen = model.select(new, new.question, question=True)
        new = replace(new, selected=selected, chosen=chosen)
    return new


@torch.no_grad()
def shrink_window(model, state: RetrievalState, keep: int | torch.Tensor) -> RetrievalState:
    """The state with each row's window cut to its last `keep` … `keep` + B − 1 tokens (an int,
    or each row's [b]): the
    oldest whole blocks go on to the sink, then to the store, as when the window moves on
    (`written`), where a question's choice reads them (`QuestionChoice.question_window`).
    Nothing is lost or recomputed: the blocks hold the keys and values the window held."""
    s = state
    new = replace(s, **_moved_on(model, s, s.window_k, s.window_v, s.window_len, keep))
    return replace(new, decode=None)  # a run of one-token calls read the old window


def _moved_on(model, s, wk, wv, length, limit: int | torch.Tensor) -> dict:
    """The window [L, b, H, width, d] right-aligned holding `length` [b] valid tokens, its
    oldest whole blocks past `limit` tokens moved to the sink, then to the store: the
    state's fields that change (the window cut to the state's width, the sink, the store's
    records, the tokens read: +T when `wk` holds T tokens more than the state's window)."""
    c = model.config
    B, S = c.block_size, c.sink_blocks * c.block_size
    L, b, dev = model.num_layers, s.batch_size, s.window_len.device
    moved = (length - limit).clamp(min=0) // B  # whole blocks that leave  [b]
    width, Wc = wk.shape[3], s.window_k.shape[3]
    start = width - length  # each row's oldest valid slot
    M = int(moved.max())
    sink_k, sink_v, sink_len = s.sink_k, s.sink_v, s.sink_len
    block_ids, blocks, keys = s.block_ids, s.blocks, s.keys
    if M:
        m = torch.arange(M, device=dev)
        slot = start[:, None, None] + m[None, :, None] * B + torch.arange(B, device=dev)
        gather = slot.clamp(max=width - 1).reshape(1, b, 1, M * B, 1)
        gather = gather.expand(L, b, wk.shape[2], M * B, wk.shape[4])
        out_k = torch.gather(wk, 3, gather).view(L, b, -1, M, B, wk.shape[4])
        out_v = torch.gather(wv, 3, gather).view(L, b, -1, M, B, wk.shape[4])
        real = m[None, :] < moved[:, None]  # [b, M]
        to_sink = real & (sink_len[:, None] // B + m[None, :] < c.sink_blocks)
        to_store = real & ~to_sink
        if S:  # blocks that fill the sink, in order
            sink_k, sink_v, sink_len = _fill_sink(model, s, out_k, out_v, to_sink)
        if bool(to_store.any()):
            block_ids, blocks, keys = _store(model, s, out_k, out_v, to_store)
    keep = (length - moved * B).clamp(max=width)
    return dict(
        window_k=wk[:, :, :, -Wc:], window_v=wv[:, :, :, -Wc:],
        window_len=keep.clamp(max=Wc),
        sink_k=sink_k, sink_v=sink_v, sink_len=sink_len,
        block_ids=block_ids, blocks=blocks, keys=keys, tokens=s.tokens + (width - Wc),
    )  # fmt: skip


def _carried(call) -> dict[str, torch.Tensor]:
    """The call's choice, for the next call's blocks below `select_layer`, and the queries
    that made it (a held call carries the state's)."""
    s = call.state
    if call.hold:
        return dict(selected=s.selected, chosen=s.chosen, question=s.question)
    if call.selected is None:  # nothing stored yet: nothing chosen
        return dict(selected=s.selected[:, :0], chosen=s.chosen[:, :0], question=None)
    return dict(selected=call.selected, chosen=call.selected_valid, question=call.question)


def _fill_sink(model, s, out_k, out_v, to_sink):
    B = model.config.block_size
    sink_k, sink_v = s.sink_k.clone(), s.sink_v.clone()
    first = s.sink_len // B  # each row's next sink block
    for row, m in to_sink.nonzero().tolist():  # at most sink_blocks per row, ever
        at = int(first[row]) + m  # the sink takes a row's first moved blocks
        sink_k[:, row, :, at * B : (at + 1) * B] = out_k[:, row, :, m]
        sink_v[:, row, :, at * B : (at + 1) * B] = out_v[:, row, :, m]
    return sink_k, sink_v, s.sink_len + to_sink.sum(1) * B


def held(state: RetrievalState, device: torch.device) -> torch.Tensor:
    """Which of the state's block slots [b, n] a row holds (a row may hold fewer than n)."""
    n = state.block_ids.shape[1]
    return torch.arange(n, device=device) < state.blocks[:, None].to(device)


def _store(model, s, out_k, out_v, to_store):
    """Write the blocks leaving for the store (all rows at once) and record them."""
    rows, ms = to_store.nonzero(as_tuple=True)  # row-major: each row's blocks in order
    if model.retrieving:
        pairs = {
            layer: torch.stack([out_k[layer, rows, :, ms], out_v[layer, rows, :, ms]], 1)
            for layer in model.retrieving
        }  # [n, 2, H, B, d]
        ids = s.store.append(pairs).to(s.blocks.device)
    else:
        ids = torch.full(rows.shape, -1, dtype=torch.int64, device=s.blocks.device)
    per_row = to_store.sum(1)  # [b]
    n = int((s.blocks + per_row).max())
    block_ids = F.pad(s.block_ids, (0, n - s.block_ids.shape[1]), value=-1)
    rank = s.blocks[rows] + (torch.cumsum(to_store, 1) - 1)[rows, ms]
    block_ids = block_ids.index_put((rows, rank), ids)
    # the select layer's keys, turned to position S (every stored block at one distance)
    B = model.config.block_size
    keys = s.keys
    if model.retrieving:
        k = out_k[model.select_layer, rows, :, ms]  # [n', H, B, d]
        k = turned_to_sink(model, k).transpose(1, 2)  # [n', B, H, d] in the store's dtype
        k = narrowed(k, s.store.dtype, f"layer {model.select_layer}'s keys")
        at = rank[:, None] * B + torch.arange(B, device=k.device)  # [n', B]
        place = (rows[:, None].expand_as(at), at)
        keys = put_keys(keys, s.batch_size, n * B, CHUNK_BLOCKS * B, place, k)
    return block_ids, s.blocks + per_row, keys


@torch.no_grad()
def stored_keys(model, state: RetrievalState, layer: int) -> tuple[torch.Tensor, ...]:
    """The stored tokens' keys at block `layer` of the base, turned to position S as
    `state.keys` are at `select_layer`: read from the store (a slot a row does not hold reads
    the store's first block, never scored: `held`), in chunks [b, ≤ CHUNK_BLOCKS · B, H_kv,
    d] of the store's dtype."""
    dev = state.window_k.device
    at_sink = sink_angles(model, dev)  # once for every chunk
    chunks = []
    for ids in state.block_ids.clamp(min=0).split(CHUNK_BLOCKS, 1):  # [b, m]
        k = state.store.read(layer, ids, keys_only=True).to(dev)  # [b, m, H, B, d]
        k = turned_to_sink(model, k.float(), at_sink).transpose(2, 3)  # [b, m, B, H, d]
        chunks.append(k.flatten(1, 2).to(state.store.dtype))  # [b, m·B, H, d]
    return tuple(chunks)


def sink_angles(model, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [1, B, d] (float32) of the base's rotary at position S, the sink's end."""
    B, S = model.config.block_size, model.config.sink_blocks * model.config.block_size
    probe = torch.zeros(1, 1, model.head_dim, device=device)
    return model.rotary(probe, torch.full((1, B), S, device=device))


def turned_to_sink(
    model, k: torch.Tensor, angles: tuple[torch.Tensor, torch.Tensor] | None = None
) -> torch.Tensor:
    """Blocks' keys [..., B, d] (before rotary) turned to position S, the sink's end: every
    stored block at one distance from a call's queries, as choices score them (`angles`:
    `sink_angles`, when the caller turns many)."""
    cos, sin = angles if angles is not None else sink_angles(model, k.device)
    return turn(k, cos.to(k.dtype), sin.to(k.dtype))


def put_keys(
    chunks: tuple[torch.Tensor, ...], batch: int, length: int, chunk: int,
    place: tuple[torch.Tensor, torch.Tensor], k: torch.Tensor,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """The keys `chunks` (each [batch, ≤ chunk, H, d]) grown to `length` tokens in chunks of
    `chunk`, with k [*at.shape, H, d] written at the token places `place` = (rows, at): new
    tensors for the chunks written to or grown, the others shared with `chunks` (a state is
    never changed in place)."""
    rows, at = place
    out, fresh = list(chunks), set()

    def room(tokens: int) -> torch.Tensor:  # a chunk of `tokens`, made at the chunk's full size
        # (every chunk tensor one size, however full: the allocator reuses their holes
        # instead of growing the heap by a slightly larger tensor at each store)
        return k.new_zeros(batch, chunk, *k.shape[-2:])[:, :tokens]

    if length > sum(c.shape[1] for c in chunks):  # the partial last chunk and new ones
        grow = len(out) - 1 if out and out[-1].shape[1] < chunk else len(out)
        tail = [room(min(chunk, length - a)) for a in range(grow * chunk, length, chunk)]
        if grow < len(out):
            tail[0][:, : out[grow].shape[1]] = out[grow]
        out[grow:] = tail
        fresh = set(range(grow, len(out)))
    index = at // chunk  # each place's chunk
    for j in index.unique().tolist():  # the few chunks a store writes to
        if j not in fresh:
            out[j] = room(out[j].shape[1]).copy_(out[j])
        here = index == j
        out[j].index_put_((rows[here], at[here] - j * chunk), k[here])
    return tuple(out)


__all__ = [
    "CHUNK_BLOCKS",
    "held",
    "new_state",
    "prepare_state",
    "RetrievalState",
    "StateRecord",
    "put_keys",
    "stored_keys",
    "turned_to_sink",
    "turn",
    "unturn",
    "written",
]
