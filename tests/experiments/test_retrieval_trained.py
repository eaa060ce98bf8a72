"""experiments/retrieval_trained.py: its differentiable block score is the library's "attention"
score, the loss and rank by hand, facts passages hold four alike facts at the indices given,
RULER's needles are found by the prompt's offsets, and a quick run trains, saves a map the
library loads, renders its page and resumes from the features it kept."""

import json
import math

import numpy as np
import pytest
import retrieval_trained as rt
import torch

from inftyformer.retrieval.query_map import QueryMap
from inftyformer.retrieval.scorers import attention_score


def test_block_logits_are_the_librarys_attention_score():
    g = torch.Generator().manual_seed(0)
    H, Hkv, T, d, B, n = 6, 2, 5, 8, 4, 7
    query = torch.randn(H, T, d, generator=g)
    keys = torch.randn(n * B, Hkv, d, generator=g)
    scaled = query.view(1, Hkv, H // Hkv, T, d) / math.sqrt(d)
    want = attention_score(scaled, keys[None], torch.ones(1, n, dtype=torch.bool), B)[0]
    torch.testing.assert_close(rt.block_logits(query, keys, Hkv, B), want)


def test_the_loss_is_the_asked_blocks_share_and_the_rank_its_best_slot(monkeypatch):
    score = torch.tensor([0.0, 2.0, 1.0, 3.0])  # order: 3, 1, 2, 0
    monkeypatch.setattr(rt, "block_logits", lambda q, k, kv, b: score)
    sample = {"query": torch.zeros(1, 1, 2), "keys": None, "slots": [[1, 2], [3], None], "asked": 0}
    loss, rank, above = rt.loss_and_rank(None, sample, 1, 1)
    want = torch.logsumexp(score, 0) - torch.logsumexp(score[[1, 2]], 0)
    torch.testing.assert_close(loss, want)
    assert (rank, above) == (1, False)  # slot 1 ranks second, below the distractor's slot 3
    assert rt.loss_and_rank(None, {**sample, "asked": 1}, 1, 1)[1:] == (0, True)


def test_a_facts_passage_holds_four_alike_facts_at_the_indices_given():
    vocab = {}

    def encode(text: str) -> list[int]:  # one id per character: indices are easy to check
        return [vocab.setdefault(c, len(vocab)) for c in text]

    back = lambda ids: "".join({v: k for k, v in vocab.items()}[i] for i in ids)  # noqa: E731
    books = ["It was a dark and stormy night; the rain fell in torrents. " * 200]
    rng = np.random.default_rng(0)
    ids, keys, questions = rt.facts_passage(rng, encode, books, 2000)
    assert len(keys) == len(questions) == rt.FACTS
    text = back(ids)
    written = [back([ids[i] for i in k]) for k in keys]
    assert all(w.startswith(" ") and w[1:].isdigit() for w in written)  # " 4821"
    asked = [back(q) for q in questions]
    assert len(set(asked)) == rt.FACTS  # one wording, four different names or places
    for w in written:
        assert text.count(w.strip()) >= 1


def test_rulers_needles_are_found_by_the_prompts_offsets(tmp_path):
    from tiny_pretrained import write_tiny_model
    from transformers import AutoTokenizer

    words = "One of the special magic numbers for is: 0123456789 apple-pie tall-tree text"
    folder = write_tiny_model(tmp_path / "m", corpus=(words,) * 20)
    tok = AutoTokenizer.from_pretrained(str(folder))
    prompt = ("text text One of the special magic numbers for apple-pie is: 1234567. text "
              "One of the special magic numbers for tall-tree is: 7654321. text")  # fmt: skip
    ids = tok(prompt, add_special_tokens=False).input_ids
    needles = rt.ruler_needles(prompt, ids, tok)
    assert [n for n, _ in needles] == ["1234567", "7654321"]
    for number, at in needles:
        assert tok.decode([ids[i] for i in at]).strip() == number
    rows = [{"prompt": prompt, "input_ids": ids, "expected": ["7654321"]}]
    ((got_ids, slots, asked),) = rt.ruler_maker(rows, tok)(0)
    assert got_ids == ids and asked == 1 and slots == [at for _, at in needles]
    with pytest.raises(ValueError, match="not the tokenizer's"):
        rt.ruler_needles(prompt, ids[:-1], tok)


def test_a_quick_run_trains_saves_a_loadable_map_and_resumes(tmp_path):
    rt.main(["--quick", "--work", str(tmp_path), "--out", str(tmp_path)])
    data = json.loads((tmp_path / "retrieval_trained.json").read_text())
    valid = data["cells"]["valid"]
    assert valid["untrained"]["questions"] == valid["trained"]["questions"] > 0
    assert [h["epoch"] for h in data["history"]] == [0, 1]
    qmap = QueryMap.load(tmp_path / "query-map.safetensors")
    assert qmap.select_layer == data["setup"]["select_layer"]
    page = (tmp_path / "retrieval_trained.md").read_text()
    assert "| valid | trained |" in page and "| valid | untrained |" in page
    features = tmp_path / "features-train.pt"
    stamp = features.stat().st_mtime_ns
    rt.main(["--quick", "--work", str(tmp_path), "--out", str(tmp_path)])  # features kept
    assert features.stat().st_mtime_ns == stamp


def test_a_quick_run_into_docs_is_refused(capsys):
    with pytest.raises(SystemExit):
        rt.main(["--quick"])
    assert "--quick needs an --out of its own" in capsys.readouterr().err
