"""The trained map of the choosing queries (`inftyformer.retrieval.query_map`): the identity
reads as no
map; a map's blocks are those its mapped queries score best; it is saved and loaded whole, and a
file that is corrupt or made for another model is refused by name. `answer_choice="question"`
writes the answer with its question's blocks."""

import pytest
import torch
from tiny_hf import V, tiny_base

from inftyformer.retrieval.config import RetrievalConfig
from inftyformer.retrieval.model import RetrievalLM, held
from inftyformer.retrieval.query_map import QueryMap, QueryMapError
from inftyformer.retrieval.scorers import block_scores

SETTINGS = dict(block_size=4, blocks=2, sink_blocks=1, window=8, segment_len=8, read_from=0)


def model(**settings) -> RetrievalLM:
    base = tiny_base("llama", max_position_embeddings=512)
    return RetrievalLM(base, **{**SETTINGS, **settings}).eval()


def tokens(length: int = 64, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, V, (2, length), generator=torch.Generator().manual_seed(seed))


def shapes(m: RetrievalLM) -> tuple[int, int, int]:
    return m.base.config.num_attention_heads, m.head_dim, m.select_layer


def saved_map(m: RetrievalLM, path, scale: float = 0.0, seed: int = 0):
    """A map for `m`'s choosing block: the identity plus `scale` × a random matrix."""
    qmap = QueryMap(*shapes(m))
    with torch.no_grad():
        noise = torch.randn(qmap.weight.shape, generator=torch.Generator().manual_seed(seed))
        qmap.weight.add_(scale * noise)
    return qmap.save(path), qmap


@torch.no_grad()
def test_the_identity_map_reads_as_no_map(tmp_path):
    plain = model()
    path, _ = saved_map(plain, tmp_path / "eye.safetensors")
    mapped = model(query_map=str(path))
    a, b = plain(tokens()), mapped(tokens())
    torch.testing.assert_close(a.logits, b.logits)
    assert torch.equal(a.state.selected, b.state.selected)
    a.state.store.close(), b.state.store.close()


@torch.no_grad()
def test_a_map_scores_and_chooses_by_the_mapped_queries(tmp_path):
    """block_scores and select read W_h q_h: the scores equal those of the mapped queries
    by hand, and differ from the unmapped ones."""
    m = model()
    path, qmap = saved_map(m, tmp_path / "w.safetensors", scale=0.5)
    mapped = model(query_map=str(path))
    state = mapped(tokens()).state
    H, d, _ = shapes(m)
    query = torch.randn(2, H, 5, d, generator=torch.Generator().manual_seed(3))
    by_hand = torch.einsum("hed,bhtd->bhte", qmap.weight, query)  # W_h q_h
    stored = held(state, query.device)
    want = block_scores(by_hand, state.keys, stored, m.kv_heads, 4, "max")
    torch.testing.assert_close(mapped.block_scores(state, query), want)
    plain = block_scores(query, state.keys, stored, m.kv_heads, 4, "max")
    assert not torch.allclose(plain, want)
    ids, valid = mapped.select(state, query)
    for row in range(2):
        best = want[row].topk(2).indices
        assert sorted(ids[row].tolist()) == sorted(state.block_ids[row, best].tolist())
    state.store.close()


def test_a_map_is_saved_and_loaded_whole(tmp_path):
    m = model()
    path, qmap = saved_map(m, tmp_path / "w.safetensors", scale=0.1)
    back = QueryMap.load(path)
    assert torch.equal(back.weight, qmap.weight) and back.select_layer == m.select_layer
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]  # no temporary left
    with pytest.raises(ValueError, match=r"queries must be \[batch, 4, tokens, 8\]"):
        back(torch.zeros(1, 3, 2, 8))


def test_a_bad_map_file_is_refused_by_name(tmp_path):
    m = model()
    with pytest.raises(QueryMapError, match="no such file"):
        model(query_map=str(tmp_path / "missing.safetensors"))
    path, _ = saved_map(m, tmp_path / "w.safetensors")
    raw = path.read_bytes()
    for name, data in (("garbage", b"not a safetensors file"), ("cut", raw[: len(raw) // 2])):
        bad = tmp_path / f"{name}.safetensors"
        bad.write_bytes(data)
        with pytest.raises(QueryMapError, match="corrupt or not a query map"):
            model(query_map=str(bad))
    other = QueryMap(m.base.config.num_attention_heads, m.head_dim, m.select_layer + 1)
    other.save(tmp_path / "other.safetensors")
    with pytest.raises(QueryMapError, match=f"at block {m.select_layer + 1}, the model chooses"):
        model(query_map=str(tmp_path / "other.safetensors"))
    nan = QueryMap(*shapes(m))
    with torch.no_grad():
        nan.weight[0, 0, 0] = float("nan")
    nan.save(tmp_path / "nan.safetensors")
    with pytest.raises(QueryMapError, match="NaN or inf"):
        model(query_map=str(tmp_path / "nan.safetensors"))


def test_answer_choice_and_query_map_settings_are_checked():
    with pytest.raises(ValueError, match="answer_choice must be one of"):
        RetrievalConfig(answer_choice="mine")
    with pytest.raises(TypeError, match="query_map must be a path or None"):
        RetrievalConfig(query_map=3)


@torch.no_grad()
def test_answer_choice_question_writes_the_answer_with_the_questions_blocks():
    """generate's default follows the config: "question" is keep_choice=True, "own" False (an
    explicit keep_choice wins over the config)."""
    ids = tokens(length=48, seed=5)
    kept, _ = model(answer_choice="question").generate(ids, max_new_tokens=6)
    same, _ = model().generate(ids, max_new_tokens=6, keep_choice=True)
    own, _ = model().generate(ids, max_new_tokens=6)
    assert torch.equal(kept, same)
    assert torch.equal(model(answer_choice="question").generate(ids, 6, keep_choice=False)[0], own)


def test_the_picked_preset_reads_one_block_and_its_neighbour_beside_a_short_window():
    from inftyformer.presets import preset_settings

    c = RetrievalConfig(**preset_settings("retrieval-picked", "retrieval"))
    assert (c.blocks, c.neighbours, c.window, c.score) == (2, 1, 256, "attention")
    assert c.answer_choice == "question" and c.query_map is None and c.select_queries == 32
    assert (c.sink_blocks + c.blocks) * c.block_size + c.window == 448


@torch.no_grad()
def test_select_queries_chooses_by_the_calls_last_queries_only(tmp_path):
    """select_queries=k: the scores are those of the call's last k queries (mapped, when there is
    a map), so the passage's tail in the question's call has no say."""
    plain = model()
    state = plain(tokens()).state
    H, d, _ = shapes(plain)
    query = torch.randn(2, H, 6, d, generator=torch.Generator().manual_seed(4))
    last = model(select_queries=2)
    torch.testing.assert_close(
        last.block_scores(state, query), plain.block_scores(state, query[:, :, -2:])
    )  # fmt: skip
    assert not torch.allclose(last.block_scores(state, query), plain.block_scores(state, query))
    path, qmap = saved_map(plain, tmp_path / "w.safetensors", scale=0.5)
    both = model(select_queries=2, query_map=str(path))
    by_hand = torch.einsum("hed,bhtd->bhte", qmap.weight, query[:, :, -2:])
    torch.testing.assert_close(both.block_scores(state, query), plain.block_scores(state, by_hand))
    assert torch.equal(model(select_queries=99).block_scores(state, query),
                       plain.block_scores(state, query))  # fmt: skip  # more than the call: all
    with pytest.raises(ValueError, match="select_queries"):
        RetrievalConfig(select_queries=-1)
    state.store.close()
