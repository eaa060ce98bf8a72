"""The choice a call makes (`retrieval/scorers.py`, choice "question"): a call that knows what
it is, a stream's or a question's."""

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
