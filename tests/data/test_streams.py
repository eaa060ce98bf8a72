"""Document streams: no mixing without reset, exact once-only scoring, determinism, resume."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from inftyformer.data import (
    DocumentStreams,
    StreamBatch,
    TokenizedCorpus,
    load_corpus,
    load_tokenizer,
)
from inftyformer.native.model import IGNORE_INDEX

EOS = 99  # documents only use ids < EOS, so padding is recognisable in the inputs


def _corpus(seed: int = 0, num_docs: int = 13) -> TokenizedCorpus:
    rng = np.random.default_rng(seed)
    lengths = [1, 8, 9, 0, 17, 3, 40, 2, 8, 25, 5, 16, 11][:num_docs]  # 0 = empty, skipped
    docs = [rng.integers(0, EOS, size=n).tolist() for n in lengths]
    return TokenizedCorpus.from_documents(docs, vocab_size=EOS + 1, eos_id=EOS)


def _collect(stream: DocumentStreams, limit: int = 10_000) -> list[StreamBatch]:
    out = []
    for batch in stream:
        out.append(batch)
        assert len(out) < limit
    return out


def _per_row_documents(batches: list[StreamBatch]) -> tuple[list[list[int]], list[list[int]]]:
    """Rebuild documents (inputs) and their targets from what each row saw, using only `reset`."""
    docs, targets = [], []
    rows = batches[0].inputs.shape[0]
    for row in range(rows):
        current: list[int] | None = None
        current_targets: list[int] = []
        for b in batches:
            if bool(b.reset[row]):
                if current is not None:
                    docs.append(current)
                    targets.append(current_targets)
                current, current_targets = [], []
            ids = [t for t in b.inputs[row].tolist() if t != EOS]
            tgt = [t for t in b.targets[row].tolist() if t != IGNORE_INDEX]
            if current is None:
                assert not ids and not tgt, "tokens before any reset"
                continue
            current.extend(ids)
            current_targets.extend(tgt)
        if current is not None:
            docs.append(current)
            targets.append(current_targets)
    return docs, targets


@pytest.mark.parametrize(("batch_size", "segment_len"), [(1, 4), (3, 8), (4, 5), (20, 16)])
@pytest.mark.parametrize("shuffle", [False, True])
def test_eval_pass_streams_every_document_once(
    batch_size: int, segment_len: int, shuffle: bool
) -> None:
    corpus = _corpus()
    stream = DocumentStreams(corpus, batch_size, segment_len, seed=3, shuffle=shuffle, loop=False)
    batches = _collect(stream)
    assert (
        len(batches)
        == DocumentStreams(corpus, batch_size, segment_len, 3, shuffle, False).total_steps()
    )
    docs, targets = _per_row_documents(batches)
    expected = [
        corpus.document(i).tolist() for i in range(corpus.num_docs) if corpus.doc_lengths[i]
    ]
    # content-based: each row's stretch between resets is exactly one whole corpus document
    assert sorted(docs) == sorted(expected)
    # each document's targets are its tokens after the first, each exactly once
    for doc, tgt in zip(docs, targets, strict=True):
        assert tgt == doc[1:]
    total = sum(b.num_targets for b in batches)
    assert total == sum(len(d) - 1 for d in expected)
    assert total == sum(int((b.targets != IGNORE_INDEX).sum()) for b in batches)


def test_targets_are_next_tokens_and_padding_is_ignored() -> None:
    corpus = _corpus()
    for b in DocumentStreams(corpus, 3, 8, seed=1, loop=False):
        assert b.inputs.shape == b.targets.shape == (3, 8)
        assert b.inputs.dtype == b.targets.dtype == torch.long and b.reset.dtype == torch.bool
        for row in range(3):
            doc_id = int(b.doc_ids[row])
            if doc_id < 0:  # idle row: all padding
                assert bool((b.inputs[row] == EOS).all()) and not bool(b.reset[row])
                assert bool((b.targets[row] == IGNORE_INDEX).all())
                continue
            doc = corpus.document(doc_id).tolist()
            pos = int(b.doc_pos[row])
            assert bool(b.reset[row]) == (pos == 0)
            n = min(8, len(doc) - pos)
            assert b.inputs[row, :n].tolist() == doc[pos : pos + n]
            assert b.targets[row].tolist() == (doc[pos + 1 : pos + 1 + 8] + [IGNORE_INDEX] * 8)[:8]
            assert bool(b.doc_end[row]) == (pos + n == len(doc))
            if n < 8:
                assert bool((b.inputs[row, n:] == EOS).all())


def test_rows_continue_their_document_across_steps() -> None:
    corpus = _corpus()
    stream = DocumentStreams(corpus, 2, 4, seed=0, loop=True)
    prev = next(stream).to("cpu")
    assert bool(prev.reset.all())
    for _ in range(60):
        b = next(stream)
        for row in range(2):
            if not bool(b.reset[row]):
                assert int(b.doc_ids[row]) == int(prev.doc_ids[row])
                assert int(b.doc_pos[row]) == int(prev.doc_pos[row]) + 4
            else:
                assert bool(prev.doc_end[row])
        prev = b


def test_loop_runs_through_several_epochs_deterministically() -> None:
    corpus = _corpus()
    a = [next(DocumentStreams(corpus, 2, 8, seed=5)) for _ in range(1)]
    s1, s2 = DocumentStreams(corpus, 2, 8, seed=5), DocumentStreams(corpus, 2, 8, seed=5)
    for _ in range(100):  # ~ 5 epochs
        x, y = next(s1), next(s2)
        assert torch.equal(x.inputs, y.inputs) and torch.equal(x.reset, y.reset)
    assert s1.epoch >= 3
    assert torch.equal(a[0].inputs, DocumentStreams(corpus, 2, 8, seed=5).__next__().inputs)
    assert not np.array_equal(s1.epoch_order(0), s1.epoch_order(1))  # reshuffled per epoch
    assert sorted(s1.epoch_order(1).tolist()) == sorted(s1.epoch_order(0).tolist())
    other = DocumentStreams(corpus, 2, 8, seed=6)
    assert not np.array_equal(other.epoch_order(0), s1.epoch_order(0))
    assert np.array_equal(
        DocumentStreams(corpus, 2, 8, seed=5, shuffle=False).epoch_order(0),
        np.flatnonzero(corpus.doc_lengths > 0),
    )


@pytest.mark.parametrize("loop", [True, False])
def test_exact_resume_mid_epoch(loop: bool) -> None:
    corpus = _corpus()
    stream = DocumentStreams(corpus, 2, 4, seed=2, loop=loop)
    for _ in range(7):
        next(stream)
    state = json.loads(json.dumps(stream.state_dict()))  # survives a JSON round trip
    expected = list(itertools.islice(stream, 12))
    resumed = DocumentStreams(corpus, 2, 4, seed=2, loop=loop)
    resumed.load_state_dict(state)
    got_all = list(itertools.islice(resumed, 12))
    assert len(got_all) == len(expected) == 12
    for want, got in zip(expected, got_all, strict=True):
        assert torch.equal(got.inputs, want.inputs) and torch.equal(got.targets, want.targets)
        assert torch.equal(got.reset, want.reset) and got.num_targets == want.num_targets
    assert resumed.state_dict() == stream.state_dict()


def test_load_state_dict_rejects_other_streams() -> None:
    corpus = _corpus()
    state = DocumentStreams(corpus, 3, 5, seed=2).state_dict()
    with pytest.raises(ValueError, match="seed"):
        DocumentStreams(corpus, 3, 5, seed=4).load_state_dict(state)
    with pytest.raises(ValueError, match="segment_len"):
        DocumentStreams(corpus, 3, 6, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="num_docs"):
        DocumentStreams(_corpus(num_docs=12), 3, 5, seed=2).load_state_dict(state)


def test_exhausted_eval_stream_stops_and_restarts() -> None:
    stream = DocumentStreams(_corpus(), 4, 8, seed=0, loop=False)
    first = _collect(stream)
    with pytest.raises(StopIteration):
        next(stream)
    stream.restart()
    again = _collect(stream)
    assert len(again) == len(first)
    assert all(torch.equal(a.inputs, b.inputs) for a, b in zip(first, again, strict=True))


def test_validation() -> None:
    corpus = _corpus()
    with pytest.raises(ValueError, match="batch_size"):
        DocumentStreams(corpus, 0, 8)
    with pytest.raises(ValueError, match="seed"):
        DocumentStreams(corpus, 2, 8, seed=-1)
    with pytest.raises(TypeError, match="loop"):
        DocumentStreams(corpus, 2, 8, loop=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="corpus"):
        DocumentStreams([[1, 2]], 2, 8)  # type: ignore[arg-type]
    empty = TokenizedCorpus.from_documents([[], []], vocab_size=10, eos_id=9)
    with pytest.raises(ValueError, match="non-empty"):
        DocumentStreams(empty, 2, 8)
    with pytest.raises(ValueError, match="loop=False"):
        DocumentStreams(corpus, 2, 8).total_steps()


def test_pg19_valid_eval_pass(shared_data: Path, tmp_path: Path) -> None:
    corpus = load_corpus(
        shared_data / "pg19-mini",
        "valid",
        load_tokenizer("bytes"),
        cache_dir=tmp_path,
        progress=False,
    )
    stream = DocumentStreams(corpus, 2, 8192, seed=0, shuffle=False, loop=False)
    total, steps = 0, 0
    for b in stream:
        total += b.num_targets
        steps += 1
    assert steps == stream.total_steps()
    assert total == corpus.num_tokens - corpus.num_docs  # every token but each first one
