"""Whole-document evaluation of real MemoryLMs agrees with independent per-document computations."""

import math

import numpy as np
import pytest
import torch
from tiny_models import tiny

from inftyformer.data import TokenizedCorpus
from inftyformer.integrations.lm_eval import LMEvalConfig, evaluate_lm
from inftyformer.native.model import MemoryLM
from inftyformer.native.streaming import stream_loss

VOCAB = 13


def tiny_model(model_type: str, seed: int = 0, **overrides) -> MemoryLM:
    """The shared tiny configuration, narrower still (d_model 16) with two basis widths."""
    settings = dict(d_model=16, d_ff=32, compressed_len=4, num_basis=8, num_samples=8,
                    widths=(0.05, 0.1))  # fmt: skip
    settings.update(overrides)
    torch.manual_seed(seed)
    return MemoryLM(tiny(model_type, vocab_size=VOCAB, **settings)).eval()


def corpus_of(lengths, seed=0) -> TokenizedCorpus:
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, VOCAB - 1, size=n) for n in lengths]
    return TokenizedCorpus.from_documents(docs, vocab_size=VOCAB, eos_id=VOCAB - 1)


def per_document_nll(model: MemoryLM, corpus: TokenizedCorpus) -> list[np.ndarray]:
    """Each document alone, from a fresh memory, through the model's own `stream_loss`."""
    out = []
    for i in range(corpus.num_docs):
        doc = torch.as_tensor(corpus.document(i))
        if doc.numel() == 0:
            continue
        inputs = torch.cat([torch.tensor([corpus.eos_id]), doc[:-1]])[None]
        with torch.no_grad():
            nll, _ = stream_loss(model, inputs, doc[None])
        out.append(nll[0].double().numpy())
    return out


@pytest.mark.parametrize(
    "model_type, extra",
    [
        ("transformer", {}),
        ("xl", {}),
        ("compressive", {}),
        ("infty", {}),
        ("infty", {"sticky": True}),
    ],
)
def test_streamed_evaluation_equals_per_document_stream_loss(model_type, extra):
    corpus = corpus_of([45, 7, 1, 30, 64])
    model = tiny_model(model_type, **extra)
    result = evaluate_lm(model, corpus, LMEvalConfig(batch_size=2))
    reference = per_document_nll(model, corpus)
    flat = np.concatenate(reference)
    assert result.num_tokens == corpus.num_tokens == flat.size
    assert result.doc_nll == pytest.approx([r.sum() for r in reference], rel=1e-4, abs=1e-4)
    assert result.perplexity == pytest.approx(math.exp(flat.mean()), rel=1e-4)


def test_memoryless_model_equals_a_plain_full_document_forward():
    corpus = corpus_of([20, 31, 5])
    model = tiny_model("transformer", segment_len=32)
    result = evaluate_lm(model, corpus, LMEvalConfig(batch_size=3))
    total, count = 0.0, 0
    for i in range(corpus.num_docs):
        doc = torch.as_tensor(corpus.document(i))
        inputs = torch.cat([torch.tensor([corpus.eos_id]), doc[:-1]])[None]
        with torch.no_grad():
            logits = model(inputs).logits[0]
        total += float(torch.nn.functional.cross_entropy(logits, doc, reduction="sum"))
        count += doc.numel()
    assert result.perplexity == pytest.approx(math.exp(total / count), rel=1e-5)


def test_row_count_does_not_change_the_result():
    corpus = corpus_of([33, 12, 50, 9])
    model = tiny_model("infty")
    one = evaluate_lm(model, corpus, LMEvalConfig(batch_size=1))
    four = evaluate_lm(model, corpus, LMEvalConfig(batch_size=4))
    assert one.nll_sum == pytest.approx(four.nll_sum, rel=1e-5)
    assert one.position.count == four.position.count


def test_eval_overrides_keep_the_weights_and_change_the_memory():
    corpus = corpus_of([70, 40])
    model = tiny_model("xl")
    cfg = model.config.with_memory_settings({"mem_len": 32})
    longer = MemoryLM(cfg).eval()
    longer.load_state_dict(model.state_dict(), strict=True)
    base = evaluate_lm(model, corpus, LMEvalConfig(batch_size=2))
    more = evaluate_lm(longer, corpus, LMEvalConfig(batch_size=2))
    assert base.num_tokens == more.num_tokens
    assert base.nll_sum != pytest.approx(more.nll_sum, rel=1e-6)  # it sees more context


def test_evaluation_leaves_training_mode_and_weights_alone():
    corpus = corpus_of([20])
    model = tiny_model("infty").train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    evaluate_lm(model, corpus)
    assert model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
