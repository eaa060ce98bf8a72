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
