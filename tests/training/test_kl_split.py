"""The reads' KL weighs per scored token (`kl_term.py`), like the next-token NLL: one batch and
the same batch cut into micro-batches (each part's mean loss weighted by its share of the
scored tokens, as the trainer and DDP weigh them) give the same loss and gradients, also when
the parts hold rows whose memory is empty and rows that score different numbers of tokens. A
mean over each part's rows with memory (the KL before) did not."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny

from inftyformer import MemoryLM
from inftyformer.native.model import IGNORE_INDEX

RESET = torch.tensor([True, False, False, False])  # row 0's memory is empty in the last call
PARTS = (slice(0, 1), slice(1, 4))  # uneven parts: the empty row alone, then three rows


def batch(vocab: int, length: int, calls: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, vocab, (4, length * calls), generator=g)
    targets = torch.randint(1, vocab, (4, length), generator=g)
    targets[1, :3] = IGNORE_INDEX  # rows score 8, 5, 8 and 2 tokens
    targets[3, 2:] = IGNORE_INDEX
    return tokens, targets


def grads_one_batch_and_parts(model, step, tokens, targets, length):
    """(loss, gradients) of the whole batch and of its parts weighted by scored tokens."""
    state = None
    with torch.no_grad():  # memory in every row
        for start in range(0, tokens.shape[1] - length, length):
            state = model(tokens[:, start : start + length], state).state
    last = tokens[:, -length:]
    results = []
    for parts in ((slice(0, 4),), PARTS):
        model.zero_grad(set_to_none=True)
        total = float((targets != IGNORE_INDEX).sum())
        loss = 0.0
        for rows in parts:
            share = float((targets[rows] != IGNORE_INDEX).sum()) / total
            part_state = None if state is None else _rows(state, rows)
            out = step(model, last[rows], part_state, targets[rows], RESET[rows])
            (out.loss * share).backward()
            loss += float(out.loss.detach()) * share
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss, grads))
    return results


def _rows(state, rows):
    from inftyformer.native.state import MemoryState

    tensors = {k: v[rows] for k, v in state.tensors().items()}
    part = MemoryState.from_tensors(tensors, len(state.layers), state.source)
    part.memory = getattr(state, "memory", None)
    return part


def assert_same(results, kl_names):
    (loss, grads), (parts_loss, parts_grads) = results
    assert parts_loss == pytest.approx(loss, rel=1e-6)
    assert grads.keys() == parts_grads.keys()
    for name, grad in grads.items():  # to float32 round-off of each tensor's scale
        scale = float(grad.abs().max())
        assert float((parts_grads[name] - grad).abs().max()) <= 1e-5 * scale + 1e-12, name
    # the KL moves the gradients of the density heads: the comparison sees it
    assert any(float(grads[n].abs().sum()) > 0 for n in kl_names)


def test_a_native_batch_and_its_micro_batches_give_the_same_gradients():
    torch.manual_seed(0)
    model = MemoryLM(tiny("infty", kl_weight=1.0, dropout=0.0)).train()

    def step(model, tokens, state, targets, reset):
        return model(tokens, state, targets=targets, reset=reset)

    tokens, targets = batch(13, 8, 4)
    results = grads_one_batch_and_parts(model, step, tokens, targets, 8)
    names = [n for n in results[0][1] if "sigma_head" in n]
    assert_same(results, names)


def test_a_pretrained_batch_and_its_micro_batches_give_the_same_gradients():
    pytest.importorskip("transformers")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hf"))
    from tiny_hf import V, tiny_memory_model

    model = tiny_memory_model("llama", kl_weight=1.0).train()
    model.freeze_base()

    def step(model, tokens, state, targets, reset):
        # the training path's call: targets aligned with the tokens, the KL over the scored ones
        out = model(tokens, state=state, reset=reset, kl_weights=targets != IGNORE_INDEX)
        nll = torch.nn.functional.cross_entropy(
            out.logits.transpose(1, 2), targets, ignore_index=IGNORE_INDEX
        )
        out.loss = nll + out.memory_loss
        return out

    tokens, targets = batch(V, 8, 4)
    results = grads_one_batch_and_parts(model, step, tokens, targets, 8)
    names = [n for n in results[0][1] if "sigma_head" in n]
    assert_same(results, names)
