"""Streaming LM evaluation: every token scored once, perplexity and bits/byte by hand."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from inftyformer.data import ByteTokenizer, TokenizedCorpus, load_tokenizer, tokenize_documents
from inftyformer.data.corpus import token_byte_lengths, truncate_documents, with_bos
from inftyformer.integrations.lm_eval import LMEvalConfig, evaluate_lm
from inftyformer.native.model_config import ModelConfig


class PositionBigram(nn.Module):
    """A bigram table plus a term that grows with the position in the document, so a state that
    is not carried (or not reset at document starts) changes the loss. State: tokens seen [B]."""

    def __init__(self, vocab: int, segment_len: int, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table = nn.Parameter(torch.randn(vocab, vocab, generator=g))
        self.config = SimpleNamespace(segment_len=segment_len, vocab_size=vocab)
        self.calls = 0

    def init_state(self, batch: int, device: torch.device) -> torch.Tensor:
        return torch.zeros(batch, dtype=torch.long, device=device)

    def forward(self, tokens, state=None, reset=None):
        self.calls += 1
        seen = torch.where(reset, 0, state)  # [B]
        pos = seen[:, None] + torch.arange(tokens.shape[1])[None, :]  # [B, L]
        logits = self.table[tokens].clone()  # [B, L, V]
        logits[..., 0] += 0.01 * pos
        return SimpleNamespace(logits=logits, state=seen + tokens.shape[1])

    def reference_nll(self, doc: np.ndarray, bos: int) -> np.ndarray:
        """Per-token NLL of one whole document, computed directly."""
        inputs = torch.as_tensor(np.concatenate([[bos], doc[:-1]]))
        logits = self.table[inputs].clone()
        logits[:, 0] += 0.01 * torch.arange(len(doc))
        logp = torch.log_softmax(logits.double(), -1)
        return -logp[torch.arange(len(doc)), torch.as_tensor(doc)].detach().numpy()


def toy_corpus(lengths=(37, 5, 1, 90, 0, 12), vocab=11, seed=0) -> TokenizedCorpus:
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, vocab - 1, size=n) for n in lengths]
    return TokenizedCorpus.from_documents(
        docs, vocab_size=vocab, eos_id=vocab - 1, doc_bytes=[2 * n + 1 for n in lengths]
    )


def test_with_bos_prefixes_nonempty_documents():
    corpus = toy_corpus()
    bos = with_bos(corpus)
    assert bos.num_docs == corpus.num_docs
    for i in range(corpus.num_docs):
        doc = corpus.document(i)
        new = bos.document(i)
        if doc.size == 0:
            assert new.size == 0
        else:
            assert new[0] == corpus.eos_id and np.array_equal(new[1:], doc)
    assert np.array_equal(bos.doc_bytes, corpus.doc_bytes)


@pytest.mark.parametrize("batch_size, segment_len", [(1, 7), (3, 8), (4, 64)])
def test_every_token_scored_once_and_loss_matches_direct_computation(batch_size, segment_len):
    corpus = toy_corpus()
    model = PositionBigram(corpus.vocab_size, segment_len)
    result = evaluate_lm(model, corpus, LMEvalConfig(batch_size=batch_size))
    assert result.complete
    assert result.num_tokens == corpus.num_tokens
    assert result.doc_tokens == corpus.doc_lengths.tolist()
    per_doc = [
        model.reference_nll(corpus.document(i), corpus.eos_id)
        for i in range(corpus.num_docs)
        if corpus.doc_lengths[i] > 0
    ]
    all_nll = np.concatenate(per_doc)
    assert result.nll_sum == pytest.approx(all_nll.sum(), rel=1e-5)
    assert result.perplexity == pytest.approx(math.exp(all_nll.mean()), rel=1e-5)
    expected_docs = [float(x.sum()) for x in per_doc]
    got_docs = [v for v, n in zip(result.doc_nll, result.doc_tokens, strict=True) if n > 0]
    assert got_docs == pytest.approx(expected_docs, rel=1e-5)
    assert result.bits_per_byte == pytest.approx(
        all_nll.sum() / math.log(2) / corpus.total_bytes, rel=1e-5
    )


def test_position_ranges_total_the_reference_loss_by_position():
    corpus = toy_corpus()
    model = PositionBigram(corpus.vocab_size, 5)
    edges = (3, 10)
    result = evaluate_lm(model, corpus, LMEvalConfig(batch_size=3, position_edges=edges))
    nll = [model.reference_nll(corpus.document(i), corpus.eos_id)
           for i in range(corpus.num_docs) if corpus.doc_lengths[i] > 0]  # fmt: skip
    by_range = [(0, 3), (3, 10), (10, None)]
    for got, (start, stop) in zip(result.ranges, by_range, strict=True):
        expected = [x[start:stop] for x in nll]
        assert (got.start, got.stop) == (start, stop)
        assert got.tokens == sum(len(x) for x in expected)
        assert got.nll_sum == pytest.approx(sum(float(x.sum()) for x in expected), rel=1e-5)
    with pytest.raises(ValueError, match="position_edges"):
        LMEvalConfig(position_edges=(10, 3))


def test_without_bos_the_first_token_of_each_document_is_not_scored():
    corpus = toy_corpus()
    model = PositionBigram(corpus.vocab_size, 8)
    result = evaluate_lm(model, corpus, LMEvalConfig(batch_size=2, bos=False))
    nonempty = int((corpus.doc_lengths > 0).sum())
    assert result.num_tokens == corpus.num_tokens - nonempty


def test_per_position_loss_buckets_by_position_in_document():
    corpus = toy_corpus()
    model = PositionBigram(corpus.vocab_size, 8)
    k = 2
    result = evaluate_lm(model, corpus, LMEvalConfig(batch_size=3, buckets_per_octave=k))
    pos = result.position
    assert sum(pos.count) == corpus.num_tokens
    # recompute the buckets directly
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    for i in range(corpus.num_docs):
        doc = corpus.document(i)
        if doc.size == 0:
            continue
        nll = model.reference_nll(doc, corpus.eos_id)
        for p, v in enumerate(nll):
            b = math.floor(k * math.log2(p + 1) + 1e-9)
            sums[b] = sums.get(b, 0.0) + float(v)
            counts[b] = counts.get(b, 0) + 1
    buckets = sorted(counts)
    assert pos.count == [counts[b] for b in buckets]
    assert pos.mean_loss == pytest.approx([sums[b] / counts[b] for b in buckets], rel=1e-5)
    for start, stop, b in zip(pos.start, pos.stop, buckets, strict=True):
        assert start < stop
        assert all(math.floor(k * math.log2(p + 1) + 1e-9) == b for p in range(start, stop))
    assert pos.start[0] == 0 and pos.stop == sorted(pos.stop)


def test_bits_per_byte_by_hand_on_a_tiny_text_corpus():
    """A uniform model over the 257 byte ids: every token costs ln 257 nats."""
    tok = ByteTokenizer()
    texts = ["héllo wörld", "ab", "∞-former"]
    corpus = tokenize_documents(texts, ["a", "b", "c"], tok)
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    assert corpus.total_bytes == n_bytes == corpus.num_tokens

    class Uniform(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(()))
            self.config = SimpleNamespace(segment_len=4, vocab_size=257)

        def init_state(self, batch, device):
            return None

        def forward(self, tokens, state=None, reset=None):
            return SimpleNamespace(logits=torch.zeros(*tokens.shape, 257) + self.w, state=None)

    result = evaluate_lm(Uniform(), corpus, LMEvalConfig(batch_size=2))
    assert result.num_tokens == n_bytes
    assert result.perplexity == pytest.approx(257.0, rel=1e-6)
    assert result.bits_per_byte == pytest.approx(math.log2(257), rel=1e-6)
    assert result.bits_per_token == pytest.approx(math.log2(257), rel=1e-6)


def test_bits_per_byte_with_multibyte_tokens():
    """2 tokens over 7 bytes, a uniform model over 4 ids: bpb = 2·log2(4) / 7."""
    corpus = TokenizedCorpus.from_documents([[1, 2]], vocab_size=4, eos_id=3, doc_bytes=[7])

    class Uniform4(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(()))
            self.config = SimpleNamespace(segment_len=8, vocab_size=4)

        def init_state(self, batch, device):
            return None

        def forward(self, tokens, state=None, reset=None):
            return SimpleNamespace(logits=torch.zeros(*tokens.shape, 4), state=None)

    result = evaluate_lm(Uniform4(), corpus)
    assert result.bits_per_byte == pytest.approx(2 * 2 / 7)
    assert result.perplexity == pytest.approx(4.0)


def test_max_steps_gives_a_partial_pass():
    corpus = toy_corpus()
    model = PositionBigram(corpus.vocab_size, 4)
    result = evaluate_lm(model, corpus, LMEvalConfig(batch_size=2, max_steps=3))
    assert not result.complete and model.calls == 3
    assert 0 < result.num_tokens <= 2 * 4 * 3
    assert math.isnan(result.bits_per_byte)


def test_truncate_documents_keeps_prefixes_and_counts_bytes_exactly():
    tok = ByteTokenizer()
    texts = ["ééé abc", "xy", "∞∞∞∞"]
    corpus = tokenize_documents(texts, ["a", "b", "c"], tok)
    cut = truncate_documents(corpus, max_tokens=4, max_docs=2, token_bytes=token_byte_lengths(tok))
    assert cut.num_docs == 2
    assert cut.document(0).tolist() == corpus.document(0)[:4].tolist()
    assert cut.doc_bytes.tolist() == [4, 2]
    with pytest.raises(ValueError, match="token_bytes"):
        truncate_documents(corpus, max_tokens=4)


def test_gpt2_token_byte_lengths_add_up_to_the_text_bytes(shared_data):
    tok = load_tokenizer("gpt2", shared_data)
    lengths = token_byte_lengths(tok)
    text = "Naïve café — “quoted” ∞-former, 12345 tokens.\n\n  Indented line."
    ids = tok.encode(text)
    assert int(lengths[ids].sum()) == len(text.encode("utf-8"))
    assert lengths[tok.eos_id] == 0


def test_memory_settings_only_change_what_leaves_the_weights_alone():
    cfg = ModelConfig.preset("cpu-small", model_type="infty", vocab_size=257)
    longer = cfg.with_memory_settings({"mem_len": 512, "num_samples": 256})
    assert longer.mem_len == 512 and longer.num_samples == 256 and longer.d_model == cfg.d_model
    assert cfg.with_memory_settings(None) is cfg
    with pytest.raises(ValueError, match="num_basis"):
        cfg.with_memory_settings({"num_basis": 256})
    with pytest.raises(ValueError, match="mem_len"):
        cfg.replace(model_type="transformer", mem_len=0).with_memory_settings({"mem_len": 64})
