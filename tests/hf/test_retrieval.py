"""Retrieval of exact past blocks (`inftyformer.retrieval.model`): while everything read is the
whole stream the logits are the base's on it, in calls of any length; the blocks read are those
the queries match; rows reset alone; the store holds the blocks on disk."""

import dataclasses

import pytest
import torch
from tiny_hf import V, tiny_base

from inftyformer.retrieval import state as retrieval_state
from inftyformer.retrieval.config import RetrievalConfig
from inftyformer.retrieval.model import RetrievalLM
from inftyformer.retrieval.scorers import (
    AttentionChoice,
    MaxChoice,
    attention_score,
    block_scores,
)

POSITIONS = 512


def model(**settings) -> RetrievalLM:
    """The packed choice ("max": every call chooses as a stream's) unless a preset, a config
    or another choice is given: the default's question is test_retrieval_choice's."""
    base = tiny_base("llama", max_position_embeddings=POSITIONS)
    if "preset" not in settings and "config" not in settings:
        settings.setdefault("choice", "max")
    return RetrievalLM(base, **settings).eval()


def tokens(batch: int = 2, length: int = 40, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, V, (batch, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
@pytest.mark.parametrize("segment_len", [1, 7, 16])
def test_a_window_holding_the_stream_reads_as_the_full_context(segment_len):
    """A KV cache of the window, the call's tokens at P0 + t: the base's logits on the whole
    stream, whatever the calls' length."""
    ids = tokens()
    full = tiny_base("llama", max_position_embeddings=POSITIONS)(ids).logits
    m = model(block_size=8, choice="none", sink_blocks=0, window=64, segment_len=segment_len)
    torch.testing.assert_close(m(ids).logits, full, rtol=0, atol=2e-5)


@torch.no_grad()
def test_sink_blocks_and_window_together_read_as_the_full_context_while_they_hold_it():
    """40 tokens in blocks of 8: the first block in the sink, two stored blocks (both read:
    `blocks` = 2), the last 16 in the window; packed without gaps they are the whole stream at
    its true distances, so the logits are the base's (to the float16 of the stored blocks)."""
    ids = tokens()
    full = tiny_base("llama", max_position_embeddings=POSITIONS)(ids).logits
    m = model(block_size=8, blocks=2, sink_blocks=1, window=16, segment_len=8, select_layer=0)
    out = m(ids)
    s = out.state
    assert s.sink_len.tolist() == [8, 8] and s.blocks.tolist() == [2, 2]
    assert s.window_len.tolist() == [16, 16] and s.tokens.tolist() == [40, 40]
    torch.testing.assert_close(out.logits, full, rtol=0, atol=1e-4)
    # below the select layer nothing is retrieved: the first block reads only sink and window
    later = model(block_size=8, blocks=2, sink_blocks=1, window=16, segment_len=8)
    assert (later(ids).logits[:, 32:] - full[:, 32:]).abs().max() > 1e-3


@torch.no_grad()
def test_blocks_below_the_select_layer_read_the_last_choice_or_a_reselected_one():
    """read_from = 0 with selection at block 1: the blocks below read what the previous call
    chose, so a call after a new block was stored reads it only from block 1 (not the full
    context: tokens 32-39 read no stored block in block 0, their choice came before any); with
    `reselect` on every call each chooses first and every block reads its choice: the full
    context again (the stored blocks all chosen)."""
    ids = tokens(length=48)
    full = tiny_base("llama", max_position_embeddings=POSITIONS)(ids).logits
    settings = dict(block_size=8, blocks=2, sink_blocks=1, window=16, segment_len=8)
    m = model(**settings, select_layer=1, read_from=0)
    assert m.retrieving == [0, 1]
    lagged = m(ids)
    assert (lagged.logits[:, 32:] - full[:, 32:]).abs().max() > 1e-3
    torch.testing.assert_close(lagged.logits[:, :32], full[:, :32], rtol=0, atol=1e-4)
    state, logits = None, []
    for start in range(0, 48, 8):
        out = m(ids[:, start : start + 8], state=state, reselect=True)
        state = out.state
        logits.append(out.logits)
    torch.testing.assert_close(torch.cat(logits, 1), full, rtol=0, atol=1e-4)
    assert state.selected.shape == (2, 2) and state.chosen.all()
    # keep_choice: the state's choice read in every block, nothing chosen anew: both stored
    # blocks held as chosen after 40 tokens read as the full context
    head = None
    for start in range(0, 40, 8):
        head = m(ids[:, start : start + 8], state=head, reselect=True).state
    held = dataclasses.replace(
        head, selected=head.block_ids[:, :2], chosen=torch.ones(2, 2).bool(), question=None
    )  # a choice by hand: no queries chose it
    out = m(ids[:, 40:], state=held, keep_choice=True)
    torch.testing.assert_close(out.logits, full[:, 40:], rtol=0, atol=1e-4)
    assert torch.equal(out.state.selected, held.selected)
    lagged = m(ids[:, 40:], state=head, keep_choice=True)  # the last call's choice: one block
    assert (lagged.logits - full[:, 40:]).abs().max() > 1e-3
    assert not state.reset(torch.tensor([True, False])).chosen[0].any()  # a reset row forgets


@torch.no_grad()
def test_a_held_answer_keeps_reading_the_block_its_window_lets_go():
    """An answer held to its question's choice (keep_choice) whose window lets its oldest block
    go to the store: the question's queries choose again over the grown store, so the block is
    read as a chosen one. Blocks of 8, a sink of 8, a window of 16 (23 slots), one block read:
    after a 31-token prompt nothing is stored yet; the answer's first token moves tokens 8-15 to
    the store, and its second token reads sink, that block and the window, the whole stream:
    the base's logits. Without the new choice (no question kept) that block is read nowhere."""
    ids = tokens(length=33)
    full = tiny_base("llama", max_position_embeddings=POSITIONS)(ids).logits
    m = model(block_size=8, blocks=1, sink_blocks=1, window=16, segment_len=8, select_layer=0)
    asked = m(ids[:, :31], reselect=True)
    assert asked.state.blocks.tolist() == [0, 0] and asked.state.question is not None
    first = m(ids[:, 31:32], state=asked.state, keep_choice=True)
    assert first.state.blocks.tolist() == [1, 1]
    assert torch.equal(first.state.selected, first.state.block_ids[:, :1])
    assert first.state.chosen.all() and first.state.question is asked.state.question
    second = m(ids[:, 32:33], state=first.state, keep_choice=True)
    torch.testing.assert_close(second.logits[:, 0], full[:, 32], rtol=0, atol=1e-4)
    forgot = m(ids[:, 31:32], state=dataclasses.replace(asked.state, question=None),
               keep_choice=True).state  # fmt: skip
    assert forgot.selected.shape == (2, 0)  # the question's empty choice, held
    lost = m(ids[:, 32:33], state=forgot, keep_choice=True).logits[:, 0]
    assert (lost - full[:, 32]).abs().max() > 1e-3
    rows = first.state.select_rows([1])  # the kept question follows its rows
    assert torch.equal(rows.question, first.state.question[1:])


@torch.no_grad()
def test_the_blocks_read_are_those_the_queries_match():
    """Three stored blocks; a query along a key of block 1 (and nothing else) selects it; with
    two to read, the two best in stream order; a row with fewer blocks reads only those."""
    m = model(block_size=4, blocks=1, sink_blocks=0, window=4, segment_len=4)
    state = m.init_state(2)
    H, d = m.kv_heads, m.head_dim
    keys = torch.randn(2, 12, H, d, generator=torch.Generator().manual_seed(0)) * 0.1
    keys[:, 6, 0] = 5.0 * torch.nn.functional.normalize(torch.ones(d), dim=0)
    state = dataclasses.replace(
        state, keys=keys.half(), block_ids=torch.tensor([[7, 8, 9], [7, 8, 9]]),
        blocks=torch.tensor([3, 1]),
    )  # fmt: skip
    query = torch.zeros(2, m.base.config.num_attention_heads, 3, d)
    query[:, 0, 1] = torch.nn.functional.normalize(torch.ones(d), dim=0)
    ids, valid = m.select(state, query)
    assert ids[0].tolist() == [8] and valid.tolist() == [[True], [True]]
    assert ids[1].tolist() == [7]  # row 1 holds one block: it is read
    two = RetrievalLM.__new__(RetrievalLM)
    two.__dict__.update(m.__dict__)
    two.config = m.config.replace(blocks=2)
    ids, valid = two.select(state, query)
    assert 8 in ids[0].tolist() and ids[0].tolist() == sorted(ids[0].tolist())  # in order
    assert valid[0].all()
    assert valid[1].tolist() == [True, False]
    # with a neighbour each: the best block and the one after it, whatever that one scores
    two.config = m.config.replace(blocks=2, neighbours=1)
    keys[:, 0, 0] = 4.0 * torch.nn.functional.normalize(torch.ones(d), dim=0)  # second best
    two_state = dataclasses.replace(state, keys=keys.half())
    ids, valid = two.select(two_state, query)
    assert ids[0].tolist() == [8, 9] and valid[0].all()
    assert ids[1].tolist()[:1] == [7] and valid[1].tolist() == [True, False]


@torch.no_grad()
def test_a_reset_row_reads_as_a_new_stream():
    ids = tokens(length=48)
    m = model(block_size=8, blocks=2, sink_blocks=1, window=8, segment_len=8)
    state = m(ids[:, :32]).state
    out = m(ids[:, 32:], state=state, reset=torch.tensor([False, True]))
    alone = model(block_size=8, blocks=2, sink_blocks=1, window=8, segment_len=8)(ids[1:, 32:])
    torch.testing.assert_close(out.logits[1:], alone.logits, rtol=0, atol=2e-5)
    assert out.state.tokens.tolist() == [48, 16]


@torch.no_grad()
def test_the_blocks_go_to_disk_and_the_memory_holds_only_their_scoring_keys():
    m = model(block_size=8, blocks=2, sink_blocks=1, window=8, segment_len=16)
    s = m(tokens(length=96)).state
    # 96 tokens: 8 in the sink, 8–15 in the window, the rest stored in blocks of 8
    assert s.blocks.tolist() == [10, 10] and s.store.count == 20
    layers = len(m.retrieving)
    assert s.store.disk_bytes() == 20 * layers * 2 * m.kv_heads * 8 * m.head_dim * 2
    keys = torch.cat(s.keys, 1)
    assert keys.shape == (2, 80, m.kv_heads, m.head_dim) and keys.dtype == torch.float16
    folder = s.store.folder
    assert folder.is_dir()
    s.store.close()
    assert not folder.exists()


def test_settings_that_cannot_work_are_refused_by_name():
    from tiny_hf import tiny_base as make

    with pytest.raises(ValueError, match="rotary positions"):
        RetrievalLM(make("gpt2"))
    with pytest.raises(ValueError, match="pass the base's 512 positions"):
        model(window=400, blocks=4, block_size=32)
    with pytest.raises(ValueError, match="choice must be one of"):
        RetrievalConfig(choice="sum")
    with pytest.raises(ValueError, match="layout must be one of"):
        RetrievalConfig(layout="exact")
    with pytest.raises(ValueError, match="select_layer must be below"):
        model(select_layer=2)
    with pytest.raises(ValueError, match="input_ids"):
        model(window=8, blocks=2, block_size=8, segment_len=8)(torch.tensor([[V + 5]]))


@torch.no_grad()
def test_greedy_generation_is_the_argmax_of_the_calls_it_makes():
    """Generation reads the prompt, then one call per token: each new token is the argmax of
    a separate forward over the same calls."""
    ids = tokens(length=20)
    settings = dict(block_size=4, blocks=2, sink_blocks=1, window=4, segment_len=8)
    new, _ = model(**settings).generate(ids, max_new_tokens=5, temperature=0)
    m = model(**settings)
    out = m(ids)
    state = out.state
    logits = out.logits[:, -1]
    for step in range(5):
        token = logits.argmax(-1, keepdim=True)
        assert torch.equal(token, new[:, step : step + 1])
        out = m(token, state=state)
        logits, state = out.logits[:, -1], out.state


def test_a_preset_of_the_retrieval_kind_with_settings_on_top():
    m = model(preset="streaming", window=32, block_size=8)
    assert (m.config.blocks, m.config.sink_blocks, m.config.window) == (0, 1, 32)
    with pytest.raises(ValueError, match="unknown retrieval preset 'adapter'"):
        model(preset="adapter")
    with pytest.raises(ValueError, match="a config or a preset"):
        model(config=RetrievalConfig(), preset="retrieval")


@torch.no_grad()
def test_logits_to_keep_gives_the_last_tokens_logits_only():
    """A long stream's logits are its length × the vocabulary: keep the last few (equal to the
    same tokens' logits of a run that keeps all), across call boundaries."""
    ids = tokens(length=40)
    m = model(block_size=8, blocks=2, sink_blocks=1, window=16, segment_len=8)
    every = m(ids).logits
    for keep in (1, 5, 8, 13, 40):
        last = m(ids, logits_to_keep=keep).logits
        assert last.shape == (2, keep, V)
        torch.testing.assert_close(last, every[:, -keep:], rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="logits_to_keep must be ≥ 0"):
        m(ids, logits_to_keep=-1)
    with pytest.raises(TypeError, match="logits_to_keep must be an int"):
        m(ids, logits_to_keep=2.0)


@torch.no_grad()
def test_put_keys_writes_as_one_tensor_would_and_copies_only_the_chunks_it_touches():
    g = torch.Generator().manual_seed(0)
    dense = torch.randn(2, 20, 3, 4, generator=g)
    chunks = tuple(dense.split(8, 1))  # 8 + 8 + 4 tokens
    rows = torch.tensor([[0, 0], [1, 1]])
    at = torch.tensor([[18, 19], [22, 23]])  # the partial last chunk, then past it
    k = torch.randn(2, 2, 3, 4, generator=g)
    got = retrieval_state.put_keys(chunks, 2, 24, 8, (rows, at), k)
    want = torch.nn.functional.pad(dense, (0, 0, 0, 0, 0, 4)).index_put((rows, at), k)
    assert [c.shape[1] for c in got] == [8, 8, 8]
    assert torch.equal(torch.cat(got, 1), want)
    assert got[0] is chunks[0] and got[1] is chunks[1]  # untouched: shared, not copied
    assert torch.equal(torch.cat(chunks, 1), dense)  # the old state's keys unchanged
    again = retrieval_state.put_keys(got, 2, 24, 8, (rows, at - 16), -k)  # back at the start
    assert again[1] is got[1] and again[2] is got[2]  # only the first chunk copied
    assert torch.equal(torch.cat(again, 1), want.index_put((rows, at - 16), -k))


@torch.no_grad()
def test_put_keys_makes_every_chunk_at_its_full_size():
    """A partial chunk, grown or copied, is a view of a tensor of the chunk's full size: one
    size of tensor however full, so the allocator reuses their holes store after store."""
    full = 8 * 3 * 4 * 2  # a chunk's 8 tokens of [3, 4] float16, per row
    k = torch.ones(1, 2, 3, 4, dtype=torch.float16)
    rows, at = torch.zeros(1, 2, dtype=torch.long), torch.tensor([[0, 1]])
    one = retrieval_state.put_keys((), 1, 2, 8, (rows, at), k)  # 2 tokens
    two = retrieval_state.put_keys(one, 1, 4, 8, (rows, at + 2), 2 * k)  # grown to 4
    three = retrieval_state.put_keys(two, 1, 4, 8, (rows, at), 3 * k)  # copied, not grown
    for keys, tokens in ((one, 2), (two, 4), (three, 4)):
        assert keys[0].shape[1] == tokens and keys[0].untyped_storage().nbytes() == full
    assert three[0][0, :, 0, 0].tolist() == [3, 3, 2, 2]
    assert two[0][0, :, 0, 0].tolist() == [1, 1, 2, 2]  # the older state unchanged


@torch.no_grad()
def test_block_scores_by_hand_over_chunks_of_unequal_sizes():
    """Choice "max": a block's best q · k / √d over queries, heads and its tokens. The keys in
    chunks of 3 and 1 blocks (parts of unequal sizes through one buffer), row 1 holding 3 of
    the 4 blocks."""
    g = torch.Generator().manual_seed(5)
    b, Hkv, G, T, d, B = 2, 2, 3, 5, 8, 4
    query = torch.randn(b, Hkv * G, T, d, generator=g)
    keys = torch.randn(b, 4 * B, Hkv, d, generator=g).half()
    stored = torch.tensor([[True] * 4, [True] * 3 + [False]])
    got = block_scores(query, keys.split([3 * B, B], 1), stored, Hkv, B, MaxChoice())
    q = query.view(b, Hkv, G, T, d)
    s = torch.einsum("bhgtd,bnhd->bhgtn", q, keys.float()) / d**0.5  # [b, Hkv, G, T, 4B]
    token = s.amax((1, 2, 3))  # [b, 4B]
    want = token.unflatten(-1, (4, B)).amax(-1)  # each block's best token  [b, 4]
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(got[1, :3], want[1, :3], rtol=0, atol=1e-5)
    assert got[1, 3] == -float("inf")


@torch.no_grad()
def test_keys_in_small_chunks_read_as_keys_in_one(monkeypatch):
    """The in-memory keys split into chunks of 2 blocks (many chunks, blocks stored across
    their edges, a row reset to rank 0) give the logits of chunks larger than the stream."""
    ids = tokens(length=120)
    settings = dict(block_size=4, blocks=3, sink_blocks=1, window=8, segment_len=12)
    reset = torch.tensor([False, True])

    def run() -> tuple[torch.Tensor, tuple]:
        m = model(**settings)
        state = m(ids[:, :72]).state
        out = m(ids[:, 72:], state=state, reset=reset)
        return torch.cat([m(ids[:, :72]).logits, out.logits], 1), out.state.keys

    whole, keys = run()
    monkeypatch.setattr(retrieval_state, "CHUNK_BLOCKS", 2)
    chunked, small = run()
    assert len(keys) == 1 and len(small) > 4 and all(c.shape[1] <= 8 for c in small)
    torch.testing.assert_close(chunked, whole, rtol=0, atol=0)


def test_the_state_of_some_rows_reads_as_those_rows_streamed_alone():
    ids = tokens(length=48)
    m = model(block_size=8, blocks=2, sink_blocks=1, window=16, segment_len=8)
    both = m(ids[:, :40]).state
    alone = m(ids[1:, :40]).state
    picked = both.select_rows([1])
    assert picked.batch_size == 1 and both.select_rows([0, 1]) is both
    torch.testing.assert_close(
        m(ids[1:, 40:], state=picked).logits, m(ids[1:, 40:], state=alone).logits, rtol=0, atol=1e-5
    )


@torch.no_grad()
@pytest.mark.parametrize(
    "settings",
    [
        dict(block_size=4, blocks=2, sink_blocks=1, window=8, segment_len=16, read_from=None),
        dict(block_size=4, blocks=3, sink_blocks=2, window=8, segment_len=6, read_from=0,
             select_layer=1),
    ],
)  # fmt: skip
def test_one_token_calls_in_a_run_read_as_calls_that_rebuild_their_context(settings):
    """One-token calls keep the context turned once and move their queries (retrieval_decode):
    through blocks leaving the window, the sink filling, choices changing, a run cut short by
    segment_len, a state continued twice and a row reset, the logits are those of calls that
    rebuild the context each time (the run dropped before each call)."""
    m = model(**settings)
    ids = tokens(length=90)
    cached = m(ids[:, :10]).state
    fresh, longest = cached, 0
    for t in range(10, 90):
        if t == 50:  # a state continued twice: the second continuation starts its own run
            other = m(ids[:, t : t + 1], cached)
            again = m(ids[:, t : t + 1], dataclasses.replace(cached, decode=None))
            torch.testing.assert_close(other.logits, again.logits, rtol=0, atol=1e-5)
        reset = torch.tensor([t == 70, False])  # a document ends in row 0
        a = m(ids[:, t : t + 1], cached, reset=reset)
        b = m(ids[:, t : t + 1], dataclasses.replace(fresh, decode=None), reset=reset)
        torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=1e-5)
        cached, fresh = a.state, b.state
        longest = max(longest, cached.decode[1])
    # the same memory (block ids differ: both wrote to one store, in turns)
    for name in ("window_k", "window_v", "window_len", "sink_k", "keys", "blocks", "chosen"):
        torch.testing.assert_close(getattr(cached, name), getattr(fresh, name), rtol=0, atol=1e-5)
    assert longest >= 4  # calls did run on a kept context
    assert cached.select_rows([1]).decode is None


@torch.no_grad()
def test_a_questions_first_pass_scores_the_blocks_as_its_later_choice_does(monkeypatch):
    """`reselect`: a first pass chooses for the blocks below `select_layer`, then the call's
    own pass chooses again at it. With the blocks below reading the same choice in both (all
    stored blocks, held as chosen), both passes see the same hidden states, so they must score
    with the same queries (turned back to P0 + t), whatever the layout the call reads."""
    ids = tokens(length=48)
    m = model(block_size=8, blocks=2, sink_blocks=1, window=16, segment_len=8,
              select_layer=1, read_from=0)  # fmt: skip
    state = m(ids[:, :40]).state
    assert state.blocks.tolist() == [2, 2]
    chosen = torch.ones(2, 2, dtype=torch.bool)
    held = dataclasses.replace(state, selected=state.block_ids[:, :2], chosen=chosen)
    queries = []
    original = RetrievalLM.select

    def record(self, s, query, question=False):
        queries.append(query.clone())
        return original(self, s, query, question)

    monkeypatch.setattr(RetrievalLM, "select", record)
    m(ids[:, 40:], held, reselect=True)
    assert len(queries) == 2  # the first pass's, then the call's own
    torch.testing.assert_close(queries[0], queries[1], rtol=0, atol=1e-5)
    state.store.close()


def scored_state(m: RetrievalLM, block_ids: list[int], strong: dict[int, float]):
    """One row's state holding blocks `block_ids` of 4 tokens (small random keys; at token t
    of `strong`, kv head 0, a unit key scaled by strong[t]) and a query along that unit key."""
    state = m.init_state(1)
    H, d, n = m.kv_heads, m.head_dim, 4 * len(block_ids)
    keys = torch.randn(1, n, H, d, generator=torch.Generator().manual_seed(0)) * 0.1
    unit = torch.nn.functional.normalize(torch.ones(d), dim=0)
    for t, scale in strong.items():
        keys[:, t, 0] = scale * unit
    state = dataclasses.replace(state, keys=keys.half(), block_ids=torch.tensor([block_ids]),
                                blocks=torch.tensor([len(block_ids)]))  # fmt: skip
    query = torch.zeros(1, m.base.config.num_attention_heads, 3, d)
    query[:, 0, 1] = unit
    return state, query


@torch.no_grad()
def test_the_nearest_layout_reads_the_best_block_last():
    """Two stored blocks chosen of three: in stream order [8, 9]; by score the best (block 8)
    is read last, nearest the window: [9, 8]; a whole stream reads the same blocks either way,
    only their places differ."""
    m = model(block_size=4, blocks=2, sink_blocks=0, window=4, segment_len=4)
    state, query = scored_state(m, [7, 8, 9], {6: 5.0, 9: 4.0})  # block 1 best, block 2 second
    assert m.select(state, query)[0].tolist() == [[8, 9]]
    by_score = model(block_size=4, blocks=2, sink_blocks=0, window=4, segment_len=4,
                     layout="nearest")  # fmt: skip
    assert by_score.select(state, query)[0].tolist() == [[9, 8]]
    ids = tokens(length=48)
    stream, scored = m(ids), by_score(ids)
    assert torch.equal(stream.state.selected.sort(1).values, scored.state.selected.sort(1).values)
    assert (stream.logits[:, -4:] - scored.logits[:, -4:]).abs().max() > 1e-4
    with pytest.raises(ValueError, match="layout 'nearest' orders the chosen blocks"):
        RetrievalConfig(layout="nearest", choice="none")


@torch.no_grad()
def test_attention_score_is_each_blocks_best_softmax_weight_over_the_store():
    """choice "attention" by hand: each query and head's softmax over every stored token (rows'
    unstored blocks left out), a block's score the log of its best weight; the store read in
    parts of 4,096 tokens gives the one-pass result."""
    m = model(block_size=64, blocks=2, sink_blocks=0, window=4, segment_len=4, choice="attention")
    H, d, G = m.kv_heads, m.head_dim, m.base.config.num_attention_heads // m.kv_heads
    g = torch.Generator().manual_seed(3)
    n, T = 80, 2  # 5,120 stored tokens: two parts
    keys = torch.randn(2, n * 64, H, d, generator=g)
    q = torch.randn(2, H, G, T, d, generator=g)
    stored = torch.arange(n) < torch.tensor([[n], [50]])  # row 1 holds 50 blocks
    got = attention_score(q, keys, stored, 64)
    for row, count in ((0, n), (1, 50)):
        s = torch.einsum("hgtd,nhd->hgtn", q[row], keys[row, : count * 64])
        weight = s.log_softmax(-1).unflatten(-1, (count, 64)).amax(-1).amax((0, 1, 2))
        torch.testing.assert_close(got[row, :count], weight, rtol=0, atol=1e-4)
    assert torch.isinf(got[1, 50:]).all()


@torch.no_grad()
def test_attention_score_prefers_the_block_one_query_matches_alone():
    """One query matches blocks 0 and 2 alike and strongly, another block 1 alone and less:
    "max" reads the strong pair's first, "attention" the block matched alone."""
    m = model(block_size=4, blocks=1, sink_blocks=0, window=4, segment_len=4)
    state = m.init_state(1)
    H, d = m.kv_heads, m.head_dim
    keys = torch.zeros(1, 12, H, d)
    a, b = torch.eye(d)[0], torch.eye(d)[1]
    keys[0, 1, 0], keys[0, 9, 0] = 8.0 * a, 7.9 * a  # blocks 0 and 2: the shared word
    keys[0, 5, 0] = 6.0 * b  # block 1: the asked key
    state = dataclasses.replace(
        state, keys=keys.half(), block_ids=torch.tensor([[7, 8, 9]]), blocks=torch.tensor([3])
    )
    query = torch.zeros(1, m.base.config.num_attention_heads, 2, d)
    query[0, 0, 0], query[0, 0, 1] = a * d**0.5, b * d**0.5  # scores 8 and 6 after the scale
    assert m.select(state, query)[0].tolist() == [[7]]
    attention = model(block_size=4, blocks=1, sink_blocks=0, window=4, segment_len=4,
                      choice="attention")  # fmt: skip
    assert attention.select(state, query)[0].tolist() == [[8]]


@torch.no_grad()
def test_the_nearest_layout_reads_a_best_block_and_its_neighbour_last_in_stream_order():
    """Four stored blocks, three read, one neighbour each: the best block (8) brings the one
    after it (9, whatever it scores), the next best (10) fills the rest. By rising score the
    pair is read last, the best block before its neighbour as in the stream: [10, 8, 9]."""
    m = model(block_size=4, blocks=3, sink_blocks=0, window=4, segment_len=4, neighbours=1,
              layout="nearest")  # fmt: skip
    state, query = scored_state(m, [7, 8, 9, 10], {6: 5.0, 13: 4.0})  # block 1, then block 3
    assert m.select(state, query)[0].tolist() == [[10, 8, 9]]
    stream = model(block_size=4, blocks=3, sink_blocks=0, window=4, segment_len=4, neighbours=1)
    assert stream.select(state, query)[0].tolist() == [[8, 9, 10]]


@torch.no_grad()
@pytest.mark.parametrize("choice", ["max", "attention"])
def test_select_reads_the_best_blocks_by_block_scores(choice):
    """What `select` reads is the top `blocks` of `block_scores` under the config's score (a
    real state: 12 blocks stored of 4 tokens, random queries)."""
    m = model(block_size=4, blocks=3, sink_blocks=1, window=8, segment_len=8, choice=choice)
    state = m(tokens(batch=2, length=64)).state
    query = torch.randn(2, m.base.config.num_attention_heads, 5, m.head_dim)
    scores = m.block_scores(state, query)  # [2, n]
    ids, valid = m.select(state, query)
    for row in range(2):
        best = scores[row].topk(3).indices
        assert sorted(ids[row].tolist()) == sorted(state.block_ids[row, best].tolist())
        assert valid[row].all()
    other = AttentionChoice() if choice == "max" else MaxChoice()
    assert not torch.equal(m.block_scores(state, query, other), scores)
    state.store.close()
