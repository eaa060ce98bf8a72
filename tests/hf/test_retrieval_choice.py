"""The choice a call makes (`retrieval/scorers.py`, choice "question"): a call that knows what
it is, a stream's or a question's."""

import dataclasses

import pytest
import torch
from test_retrieval import model, tokens

from inftyformer.retrieval.config import RetrievalConfig


@torch.no_grad()
def test_a_question_call_chooses_as_a_question_and_a_stream_call_as_a_stream():
    """choice "question": a stream's call reads the `blocks` best by their best q · k, the
    prompt's last call (reselect) the `question_blocks` best by attention weight from its last
    `select_queries` queries with their neighbours; the same state and queries each way."""
    settings = dict(block_size=4, sink_blocks=1, window=8, segment_len=8)
    m = model(**settings, choice="question", blocks=3, question_blocks=2, question_neighbours=1,
              select_queries=3)  # fmt: skip
    by_max = model(**settings, choice="max", blocks=3)
    by_attention = model(**settings, choice="attention", blocks=2, neighbours=1, select_queries=3)
    state = m(tokens(batch=2, length=64)).state
    query = torch.randn(2, m.base.config.num_attention_heads, 5, m.head_dim)
    assert torch.equal(m.select(state, query)[0], by_max.select(state, query)[0])
    assert torch.equal(m.select(state, query, True)[0], by_attention.select(state, query)[0])
    assert not torch.equal(m.select(state, query)[0][:, :2], m.select(state, query, True)[0])
    out = m(tokens(batch=2, length=8, seed=4), state, reselect=True)
    assert out.state.selected.shape[1] == 2  # the question's choice, carried to the answer
    with pytest.raises(ValueError, match="question_blocks .* must be at most blocks"):
        RetrievalConfig(choice="question", blocks=2, question_blocks=4)
    state.store.close()


@torch.no_grad()
def test_blocks_that_leave_the_window_during_the_question_are_chosen_by_its_answer():
    """answer_choice="question": the blocks that left the window during the question's own
    call were stored after it chose, so the answer read neither them nor their window (logits
    off the base's by 0.019 where all that was read is the whole stream). Chosen again with
    the question's queries, the answer reads the base's logits (to the stored blocks' float16)."""
    from tiny_hf import tiny_base

    ids = tokens(length=41, seed=3)
    full = tiny_base("llama", max_position_embeddings=512)(ids).logits
    m = model(block_size=4, sink_blocks=1, window=8, segment_len=8, blocks=16, read_from=0,
              answer_choice="question")  # fmt: skip
    state = m(ids[:, :32]).state
    asked = m(ids[:, 32:40], state, reselect=True)
    answer = m(ids[:, 40:41], asked.state, keep_choice=True)
    assert int(asked.state.blocks[0]) > int(state.blocks[0])  # the question stored blocks
    torch.testing.assert_close(answer.logits, full[:, 40:41], rtol=0, atol=5e-3)


@torch.no_grad()
def test_a_shortlist_keeps_the_attention_weight_of_the_blocks_of_best_q_k_only():
    """By hand: each block's best log attention weight over the store, then −inf outside the
    `shortlist` blocks whose best q · k is highest; 0 is no shortlist."""
    from inftyformer.retrieval.scorers import attention_score

    g = torch.Generator().manual_seed(5)
    n, B, H, G, T, d = 12, 4, 2, 3, 5, 8
    keys = torch.randn(2, n * B, H, d, generator=g)
    q = torch.randn(2, H, G, T, d, generator=g)
    stored = torch.ones(2, n, dtype=torch.bool)
    whole = attention_score(q, keys, stored, B)
    got = attention_score(q, keys, stored, B, shortlist=3)
    for row in range(2):
        s = torch.einsum("hgtd,nhd->hgtn", q[row], keys[row])
        best = s.unflatten(-1, (n, B)).amax(-1).amax((0, 1, 2))  # "max"
        weight = s.log_softmax(-1).unflatten(-1, (n, B)).amax(-1).amax((0, 1, 2))
        kept = best.topk(3).indices
        torch.testing.assert_close(got[row, kept], weight[kept], rtol=0, atol=1e-4)
        assert torch.isinf(got[row][~torch.isin(torch.arange(n), kept)]).all()
    torch.testing.assert_close(whole, attention_score(q, keys, stored, B, shortlist=0))


@torch.no_grad()
def test_a_block_that_wins_on_weight_alone_is_not_read_by_a_shortlisted_question():
    """A heading some head pays its weight from any query (a weak match where nothing else
    draws that head) against the asked block, matched strongly by another head but beside an
    alike block: by attention weight the heading wins; shortlisted by q · k, the asked block.
    A question's call of choice "question" has no shortlist unless given one."""
    m = model(block_size=4, blocks=1, sink_blocks=0, window=4, segment_len=4)
    H, d = m.kv_heads, m.head_dim
    keys = torch.zeros(1, 12, H, d)
    a, b = torch.eye(d)[0], torch.eye(d)[1]
    keys[0, 1, 0] = 5.0 * a  # block 0: the heading, head 0's only match
    keys[0, 5, H - 1], keys[0, 9, H - 1] = 9.0 * b, 8.0 * b  # block 1 asked, block 2 alike
    state = dataclasses.replace(
        m.init_state(1), keys=keys.half(), block_ids=torch.tensor([[7, 8, 9]]),
        blocks=torch.tensor([3]),
    )  # fmt: skip
    query = torch.zeros(1, m.base.config.num_attention_heads, 1, d)
    query[0, 0, 0] = a * d**0.5
    query[0, -1, 0] = b * d**0.5
    settings = dict(block_size=4, blocks=1, sink_blocks=0, window=4, segment_len=4)
    by_weight = model(**settings, choice="attention")
    assert by_weight.select(state, query)[0].tolist() == [[7]]
    assert model(**settings, choice="attention", shortlist=2).select(state, query)[0].tolist() == [
        [8]
    ]
    # a question's call of choice "question" ranks by weight among all blocks unless told
    asked = dict(settings, choice="question", question_blocks=1, question_neighbours=0)
    assert model(**asked).select(state, query, True)[0].tolist() == [[7]]
    assert model(**asked, question_shortlist=2).select(state, query, True)[0].tolist() == [[8]]
    with pytest.raises(ValueError, match=r"shortlist \(1\) must be 0 or at least blocks \(2\)"):
        RetrievalConfig(choice="attention", blocks=2, shortlist=1)
    with pytest.raises(ValueError, match="question_shortlist"):
        RetrievalConfig(choice="question", question_blocks=2, question_shortlist=1)
    state.store.close()


@torch.no_grad()
def test_a_question_chooses_after_a_pass_that_read_the_streams_choice():
    """choice "question", a reselect call: a first pass chooses as a stream's call would
    (the `blocks` best by q · k), a second, whose lower blocks read those, chooses the
    question's few, and the call then reads them in every block without choosing again.
    The packed choice ("max") keeps its one first pass and chooses again at `select_layer`."""
    settings = dict(block_size=4, sink_blocks=1, window=8, segment_len=8)
    calls = {}
    for kind, extra in (("question", dict(question_blocks=2, question_neighbours=1)),
                        ("max", {})):  # fmt: skip
        m = model(**settings, choice=kind, blocks=3, select_queries=3, read_from=0, **extra)
        state = m(tokens(batch=2, length=64)).state
        made, select = [], m.select

        def recording(s, query, question=False, select=select, made=made):
            chosen = select(s, query, question)
            made.append((question, s.blocks.clone(), chosen[0]))
            return chosen

        m.select = recording
        out = m(tokens(batch=2, length=8, seed=4), state, reselect=True)
        calls[kind] = [(q, ids.shape[1]) for q, _, ids in made]
        if kind == "question":
            assert torch.equal(out.state.selected, made[-1][2])  # what the answer reads
        state.store.close()
    # a stream's 3 blocks, then the question's 2; a re-choice only if the call stored blocks
    assert calls["question"][:2] == [(False, 3), (True, 2)]
    assert all(q for q, _ in calls["question"][2:])
    assert calls["max"][:2] == [(True, 3), (True, 3)]


@torch.no_grad()
def test_a_stream_reads_the_same_under_the_question_choice_as_under_max():
    """Only a question's call (reselect) chooses otherwise: a stream read under choice
    "question" gives the logits and choices of choice "max" with the same blocks, exactly
    (its perplexity is the packed preset's)."""
    settings = dict(block_size=4, sink_blocks=1, window=8, segment_len=8, blocks=3, read_from=0)
    ids = tokens(batch=2, length=72, seed=6)
    question = model(**settings, choice="question", question_blocks=2)
    packed = model(**settings, choice="max")
    a, b = question(ids), packed(ids)
    assert torch.equal(a.logits, b.logits)
    assert torch.equal(a.state.selected, b.state.selected)
    asked = question(ids[:, :8], a.state, reselect=True)
    assert asked.state.selected.shape[1] == 2  # the question's few, not the stream's 3
    for out in (a, b):
        out.state.store.close()


@torch.no_grad()
def test_shrink_window_stores_the_oldest_whole_blocks_and_keeps_the_rest():
    """By hand, rows of two window lengths: cut to `keep`, each row keeps its last keep … keep
    + B − 1 tokens; the whole blocks before them go to the store as the window held them
    (keys and values of every retrieving layer), and the tokens read do not change."""
    from inftyformer.retrieval.state import shrink_window

    B, keep = 4, 5
    m = model(block_size=B, sink_blocks=1, window=16, segment_len=8, blocks=3, read_from=0)
    state = m(tokens(batch=2, length=40)).state
    state = m(tokens(batch=2, length=3, seed=2), state).state
    state = state.reset(torch.tensor([False, True]))
    state = m(tokens(batch=2, length=30, seed=3), state).state
    before = [int(n) for n in state.window_len]
    cut = shrink_window(m, state, keep)
    Wc = state.window_k.shape[3]
    for row, length in enumerate(before):
        moved = (length - keep) // B
        kept = length - moved * B
        assert int(cut.window_len[row]) == kept and keep <= kept < keep + B
        assert int(cut.blocks[row]) == int(state.blocks[row]) + moved
        recent = slice(Wc - kept, Wc)
        assert torch.equal(cut.window_k[:, row, :, recent], state.window_k[:, row, :, recent])
        new_ids = cut.block_ids[row, int(state.blocks[row]) : int(cut.blocks[row])]
        stored = cut.store.read(m.retrieving[-1], new_ids[None].cpu())[0]  # [moved, 2, H, B, d]
        for j in range(moved):
            start = Wc - length + j * B
            window = state.window_v[m.retrieving[-1], row, :, start : start + B]
            torch.testing.assert_close(stored[j, 1], window.to(stored.dtype), rtol=0, atol=0)
    assert torch.equal(cut.tokens, state.tokens)
    assert len({int(n) for n in before}) == 2  # the rows did differ
    state.store.close()


@torch.no_grad()
def test_a_question_chooses_after_its_window_is_cut_and_a_stream_is_not_cut():
    """choice "question" with `question_window`: the question's call is the call of the same
    model without the cut on the cut state (the cut comes before the choice); a stream's call
    and a window shorter than the cut are left as they are."""
    from inftyformer.retrieval.state import shrink_window

    settings = dict(block_size=4, sink_blocks=1, window=16, segment_len=8, blocks=3,
                    read_from=0, choice="question", question_blocks=2)  # fmt: skip
    cut, whole = model(**settings, question_window=4), model(**settings, question_window=None)
    state = whole(tokens(batch=2, length=48, seed=6)).state
    asked = tokens(batch=2, length=8, seed=7)
    a = cut(asked, state, reselect=True)
    b = whole(asked, shrink_window(whole, state, 4), reselect=True)
    c = whole(asked, state, reselect=True)
    torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=0)
    assert torch.equal(a.state.selected, b.state.selected)
    assert not torch.equal(a.logits, c.logits)  # the cut is read
    assert torch.equal(cut(asked, state).logits, whole(asked, state).logits)  # a stream's call
    wide = model(**settings, question_window=64)
    torch.testing.assert_close(wide(asked, state, reselect=True).logits, c.logits, rtol=0, atol=0)
    for bad, error in ((-1, ValueError), (True, TypeError), (2.5, TypeError)):
        with pytest.raises(error, match="question_window"):
            RetrievalConfig(choice="question", question_window=bad)
    state.store.close()


@torch.no_grad()
def test_a_question_on_a_stream_held_whole_reads_it_all_as_the_base():
    """No block stored yet (the sink and the window hold the stream): the question's window is
    not cut, and it reads the base's own logits on the whole stream; with a block stored, it
    is. The default choice reads 4 blocks a question (at most `blocks`) and chooses at three
    fifths of the base's blocks, not below the first block that retrieves."""
    from tiny_hf import tiny_base

    from inftyformer.retrieval.scorers import QuestionChoice

    ids = tokens(length=28, seed=8)
    full = tiny_base("llama", max_position_embeddings=512)(ids).logits
    settings = dict(block_size=4, sink_blocks=1, window=16, segment_len=8, blocks=2, read_from=0)
    m = model(**settings, choice="question", question_window=4)
    state = m(ids[:, :20]).state
    assert state.blocks.tolist() == [0, 0]  # 4 in the sink, 16 in the window
    asked = m(ids[:, 20:28], state, reselect=True)
    torch.testing.assert_close(asked.logits, full[:, 20:28], rtol=0, atol=2e-5)
    longer = m(tokens(length=40, seed=8)).state
    assert int(longer.blocks[0]) > 0
    cut = m(ids[:, 20:28], longer, reselect=True)
    whole = model(**settings, choice="question", question_window=None)
    assert not torch.equal(cut.logits, whole(ids[:, 20:28], longer, reselect=True).logits)
    assert RetrievalConfig().choice == QuestionChoice(read_from=0)
    assert (QuestionChoice().question_reads, QuestionChoice(blocks=2).question_reads) == (4, 2)
    assert QuestionChoice(read_from=3, select_layer=3).question_layer(4, 3) == 3  # not 2
    assert QuestionChoice(read_from=0).question_layer(30, 15) == 18
    longer.store.close()
    state.store.close()


@torch.no_grad()
def test_a_questions_blocks_sit_by_its_layout_and_a_streams_by_the_configs():
    """question_layout "nearest": the question's leads by rising score, the best last (next to
    the window), each with its neighbour after it; "stream": the same blocks in stream order;
    a stream's call keeps the config's layout either way."""
    settings = dict(block_size=4, sink_blocks=1, window=8, segment_len=8, blocks=4,
                    choice="question", question_blocks=4, question_neighbours=1)  # fmt: skip
    near, plain = model(**settings), model(**settings, question_layout="stream")
    state = near(tokens(batch=2, length=96)).state
    query = torch.randn(2, near.base.config.num_attention_heads, 5, near.head_dim)
    a, b = near.select(state, query, True)[0], plain.select(state, query, True)[0]
    assert torch.equal(a.sort(1).values, b.sort(1).values) and torch.equal(b, b.sort(1).values)
    score = near.block_scores(state, query, near.config.choice.for_call(True))
    for row in range(2):
        ids, best = state.block_ids[row].tolist(), int(score[row].argmax())
        assert a[row].tolist()[-2:] == ids[best : best + 2]  # the best lead last, then its next
    assert torch.equal(near.select(state, query)[0], plain.select(state, query)[0])
    with pytest.raises(ValueError, match="question_layout must be one of"):
        RetrievalConfig(choice="question", question_layout="middle")
    state.store.close()


@torch.no_grad()
def test_a_question_chooses_at_its_own_block_with_that_blocks_stored_keys():
    """`question_select_layer`: the question's queries of that block score the stored keys of
    that block, read from the store. A model whose stream chooses at block 1 and whose question
    chooses at block 0 answers as the model that chooses at block 0 throughout, where their
    streams read alike (one call: nothing stored to choose before it ends); choosing at
    block 1 differs. A block that does not retrieve is refused."""
    from inftyformer.retrieval.state import stored_keys

    settings = dict(block_size=4, sink_blocks=1, window=8, segment_len=40, blocks=16,
                    read_from=0, choice="question", question_blocks=2,
                    question_neighbours=0)  # fmt: skip
    own = model(**settings, question_select_layer=0)  # the stream chooses at block 1
    low = model(**settings, select_layer=0, question_select_layer=0)
    mid = model(**settings, question_select_layer=1)
    assert (own.select_layer, own.question_layer, mid.question_layer) == (1, 0, 1)
    ids, asked = tokens(batch=2, length=40, seed=8), tokens(batch=2, length=8, seed=9)
    a, b = own(ids), low(ids)
    torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=0)  # the streams read alike
    assert int(a.state.blocks.min()) > 2  # more stored than the question reads
    # the keys read back for the question are the stream's own at that block (float16)
    for layer, state in ((0, b.state), (1, a.state)):
        read = torch.cat(stored_keys(own, state, layer), 1)
        torch.testing.assert_close(read, torch.cat(state.keys, 1), rtol=0, atol=2e-3)
    # rows holding different blocks (one reset mid-stream): each row's own, where it holds them
    ragged = own(ids[:, :24], a.state.reset(torch.tensor([False, True]))).state
    held_tokens = torch.arange(ragged.block_ids.shape[1]) < ragged.blocks[:, None]
    held_tokens = held_tokens.repeat_interleave(4, 1)  # [b, n·B]
    assert int(ragged.blocks[0]) != int(ragged.blocks[1])
    read = torch.cat(stored_keys(own, ragged, 1), 1)[held_tokens]
    torch.testing.assert_close(read, torch.cat(ragged.keys, 1)[held_tokens], rtol=0, atol=2e-3)
    x, y = own(asked, a.state, reselect=True), low(asked, b.state, reselect=True)
    z = mid(asked, a.state, reselect=True)
    assert torch.equal(x.state.selected, y.state.selected)
    torch.testing.assert_close(x.logits, y.logits, rtol=0, atol=1e-5)
    assert not torch.equal(x.state.selected, z.state.selected)  # block 1 chooses otherwise
    # no first pass (read_from at select_layer): the call itself chooses at the question's
    # block, with that block's queries, as a model whose select_layer it is
    late = model(**settings, select_layer=0, question_select_layer=1)
    one = model(**{**settings, "read_from": 1}, select_layer=1, question_select_layer=1)
    c, d = late(ids), one(ids)
    u, v = late(asked, c.state, reselect=True), one(asked, d.state, reselect=True)
    assert torch.equal(u.state.selected, v.state.selected)
    torch.testing.assert_close(u.logits, v.logits, rtol=0, atol=1e-5)
    for bad in (dict(question_select_layer=2), dict(read_from=1, question_select_layer=0)):
        with pytest.raises(ValueError, match="question_select_layer"):
            model(**{**settings, **bad})
    with pytest.raises(ValueError, match="question_select_layer"):
        RetrievalConfig(choice="question", question_select_layer=-1)
    for out in (a, b, c, d):
        out.state.store.close()
