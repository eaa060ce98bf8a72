"""Streaming and generation: per-token losses do not depend on how a stream is cut into calls
(as long as no call crosses a block boundary), and greedy generation with a carried memory equals
a from-scratch block-wise recomputation over the same tokens."""

from __future__ import annotations

import pytest
import torch
from tiny_models import MODEL_TYPES, C, V, tiny

from inftyformer.native.model import MemoryLM
from inftyformer.native.streaming import (
    block_phase,
    cut_points,
    generate,
    push,
    sample_next,
    stream_loss,
)


def build(model_type: str, **kw) -> MemoryLM:
    torch.manual_seed(0)
    return MemoryLM(tiny(model_type, **kw)).eval()


def stream(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def blockwise_logits(model: MemoryLM, tokens: torch.Tensor) -> torch.Tensor:
    """From scratch: one call per block of C (the last one shorter). [batch, T, V]"""
    state, logits = None, []
    for start in range(0, tokens.shape[1], C):
        out = model(tokens[:, start : start + C], state)
        state = out.state
        logits.append(out.logits)
    return torch.cat(logits, 1)


def test_cut_points_never_cross_a_block_boundary():
    assert cut_points(20, 8, 8, 0) == [(0, 8), (8, 16), (16, 20)]
    assert cut_points(20, 8, 8, 5) == [(0, 3), (3, 11), (11, 19), (19, 20)]
    assert cut_points(10, 3, 8, 0) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert cut_points(10, 4, 8, None) == [(0, 4), (4, 8), (8, 10)]


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_stream_loss_equals_segments_fed_by_hand(model_type):
    model = build(model_type)
    tokens = stream(2, 45)
    targets = stream(2, 45, seed=2)
    targets[1, 7:19] = -100
    token_loss, state = stream_loss(model, tokens, targets)
    by_hand, hand_state = [], None
    for start in range(0, 45, C):
        out = model(tokens[:, start : start + C], hand_state, targets=targets[:, start : start + C])
        by_hand.append(out.token_loss)
        hand_state = out.state
    assert token_loss.shape == (2, 45)
    assert torch.equal(token_loss, torch.cat(by_hand, 1))
    assert bool((token_loss[1, 7:19] == 0).all())
    assert torch.equal(state.layers[-1].short_term.memory, hand_state.layers[-1].short_term.memory)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_stream_loss_does_not_depend_on_how_blocks_are_split(model_type):
    """Smaller calls, or a stream resumed mid-block from a carried state, give the losses of the
    block-wise forward: a query always sees its block's start-of-block memory."""
    model = build(model_type)
    tokens, targets = stream(2, 45), stream(2, 45, seed=2)
    whole, _ = stream_loss(model, tokens, targets)
    small, _ = stream_loss(model, tokens, targets, segment_len=3)
    first, state = stream_loss(model, tokens[:, :13], targets[:, :13])
    assert block_phase(model, state) == 5
    rest, _ = stream_loss(model, tokens[:, 13:], targets[:, 13:], state=state)
    assert torch.allclose(small, whole, atol=1e-5)
    assert torch.allclose(torch.cat([first, rest], 1), whole, atol=1e-5)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_greedy_generation_with_carried_state_equals_recomputation(model_type):
    """Decoding one token per call with the memory as cache gives the tokens (and logits) of
    recomputing the block-wise forward from scratch over document + prompt + generated tokens,
    across block boundaries where states leave the short-term memory."""
    model = build(model_type)
    document, prompt = stream(2, 21, seed=3), stream(2, 6, seed=4)
    _, state = push(model, document)  # a carried state, mid-block
    new, final = generate(model, prompt, 14, temperature=0.0, state=state)
    assert new.shape == (2, 14)
    full = torch.cat([document, prompt, new], 1)
    reference = blockwise_logits(model, full)  # [2, 41, V]
    start = document.shape[1] + prompt.shape[1]
    predicted = reference[:, start - 1 : -1].argmax(-1)  # what each step should produce
    assert torch.equal(predicted, new)
    # the returned state has seen every token: continuing from it matches the recomputation
    nxt = stream(2, 3, seed=5)
    cont = model(nxt, final).logits
    assert torch.allclose(
        cont, blockwise_logits(model, torch.cat([full, nxt], 1))[:, -3:], atol=1e-5
    )


def test_generation_from_a_fresh_stream_and_sampling_options():
    model = build("infty")
    prompt = stream(3, 11)
    greedy, _ = generate(model, prompt, 9, temperature=0.0)
    top1, _ = generate(model, prompt, 9, temperature=1.0, top_k=1)
    assert torch.equal(greedy, top1)
    nucleus, _ = generate(model, prompt, 9, temperature=0.7, top_p=1e-6)
    assert torch.equal(greedy, nucleus)
    a, _ = generate(model, prompt, 9, generator=torch.Generator().manual_seed(7))
    b, _ = generate(model, prompt, 9, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b) and a.shape == (3, 9) and int(a.max()) < V
    none, state = generate(model, prompt, 0)
    assert none.shape == (3, 0) and state.batch_size == 3


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"temperature": float("nan")}, "temperature must be a finite number >= 0"),
        ({"temperature": -1.0}, "temperature must be a finite number >= 0"),
        ({"temperature": True}, "temperature must be a number"),
        ({"top_k": 0}, "top_k must be >= 1"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": float("nan")}, r"top_p must be in \(0, 1\]"),
    ],
)
def test_generate_refuses_sampling_options_it_cannot_use(options, error):
    """One check of the sampling options (`check_sampling`), for the models' generate and the
    command line (which names its options: test_cli_errors)."""
    with pytest.raises(ValueError, match=error):
        generate(build("xl"), stream(1, 5), 2, **options)


def test_sample_next_respects_top_k_and_top_p():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]]).repeat(500, 1)
    g = torch.Generator().manual_seed(0)
    assert set(sample_next(logits, 1.0, top_k=2, generator=g).tolist()) == {2, 3}
    # softmax ≈ [.03, .09, .24, .64]: the nucleus of mass 0.8 is {3, 2}
    assert set(sample_next(logits, 1.0, top_p=0.8, generator=g).tolist()) == {2, 3}
    assert set(sample_next(logits, 1.0, generator=g).tolist()) == {0, 1, 2, 3}


def test_block_phase_unknown_when_rows_differ():
    model = build("xl")
    _, state = push(model, stream(2, 11))
    assert block_phase(model, state) == 3
    state = state.reset(torch.tensor([True, False]))
    assert block_phase(model, state) is None
    assert block_phase(build("compressive", compression_rate=3), None) == 0


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda m, t: stream_loss(m, t, t[:, :3]), "targets"),
        (lambda m, t: stream_loss(m, t, t, segment_len=9), "segment_len"),
        (lambda m, t: stream_loss(m, t[0], t[0]), "shape"),
        (lambda m, t: generate(m, t, 3, temperature=-1.0), "temperature"),
        (lambda m, t: generate(m, t, 3, top_p=0.0), "top_p"),
        (lambda m, t: generate(m, t, -1), "max_new_tokens"),
        (lambda m, t: generate(m, t[:, :0], 3), "T >= 1"),
        (lambda m, t: generate(m, t + V, 3), "tokens must be in"),
    ],
)
def test_streaming_bad_inputs(call, match):
    model = build("xl")
    with pytest.raises(ValueError, match=match):
        call(model, stream(2, 10))
