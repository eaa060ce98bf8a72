"""`model(input_ids)` on more than a segment streams it through the memory by itself: one long
call equals the explicit calls segment by segment (logits, loss, memory, gradients), also past
the base's positions (the tiny models have 64, the inputs 100 tokens); a call of one segment is
unchanged; padding on either side gives what the row alone gives; the calls follow the model's
segment_len; bad inputs are named."""

import math

import pytest
import torch
import torch.nn.functional as F
from tiny_hf import MEMORY, L, V, tiny_memory_model, with_settings

from inftyformer.hf import add_long_term_memory, stream_loss

T = 100  # tokens per row: more than the base's 64 positions, 12 segments of 8 and 4


def tokens(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def explicit(model, ids, state=None, scored=None, **options):
    """The calls segment by segment, as a user would write them; `scored` [batch, T]: the
    positions whose reads' KL each call counts (its slice, `kl_weights`)."""
    outs = []
    for start in range(0, ids.shape[1], L):
        weights = {} if scored is None else {"kl_weights": scored[:, start : start + L]}
        outs.append(model(ids[:, start : start + L], state=state, **weights, **options))
        state = outs[-1].state
    return outs


def scored_positions(labels):
    """Position t predicts labels[t + 1] (HF's shift): the positions a loss scores."""
    return torch.cat([labels[:, 1:] != -100, torch.zeros_like(labels[:, :1], dtype=bool)], 1)


def by_scored(calls, scored, field: str):
    """A field of the calls (a mean over each call's scored positions), weighed by how many
    each scores: the mean over every scored position of the input (`kl_term.py`)."""
    counts = torch.stack([scored[:, s : s + L].sum() for s in range(0, scored.shape[1], L)])
    weights = counts.double() / counts.sum()
    return sum(getattr(c, field) * float(w) for c, w in zip(calls, weights, strict=True))


def same_memory(a, b) -> bool:
    left, right = a.tensors(), b.tensors()
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


def base_calls(model) -> list[tuple[int, int]]:
    """(tokens, last position + 1) of every call of the base model from now on."""
    seen = []

    def record(module, args, kwargs):
        ids, positions = kwargs["input_ids"], kwargs["position_ids"]
        end = ids.shape[1] if positions is None else int(positions.max()) + 1
        seen.append((ids.shape[1], end))

    model.base.register_forward_pre_hook(record, with_kwargs=True)
    return seen


@torch.no_grad()
@pytest.mark.parametrize("window", [None, 0])
def test_a_long_call_equals_the_calls_segment_by_segment(arch, window):
    model = tiny_memory_model(arch, window=window)
    ids = tokens(2, T)
    labels = ids.clone()
    labels[0, 10:20] = -100
    start = model(tokens(2, L, 1)).state  # also from a memory with something in it
    seen = base_calls(model)
    out = model(ids, state=start, labels=labels)
    # every base call: at most one segment after the window, within the 64 positions
    width = model.config.adapter.window
    assert len(seen) == 13 and max(n for n, _ in seen) == L + width
    assert max(end for _, end in seen) <= 64
    scored = scored_positions(labels)
    calls = explicit(model, ids, state=start, scored=scored)
    logits = torch.cat([c.logits for c in calls], dim=1)
    assert out.logits.shape == (2, T, V)
    assert torch.equal(out.logits, logits)  # the same calls: bit for bit
    assert same_memory(out.state, calls[-1].state)
    # the loss: one call's definition over the whole input (labels shifted inside, across the
    # segment boundaries too), plus the calls' memory losses weighed by their scored positions
    want = F.cross_entropy(
        logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1), ignore_index=-100
    )
    assert torch.allclose(out.lm_loss, want, atol=1e-6)
    memory_loss = by_scored(calls, scored, "memory_loss")
    assert torch.allclose(out.memory_loss, memory_loss) and out.memory_loss > 0
    assert torch.allclose(out.loss, want + memory_loss, atol=1e-6)
    assert torch.allclose(out.kl, by_scored(calls, scored, "kl"))
    assert out.token_loss.shape == (2, T - 1) and bool((out.token_loss[0, 9:19] == 0).all())
    # the memory is used: the same last segment after another beginning is predicted otherwise
    other = ids.clone()
    other[:, : T - 2 * L] = tokens(2, T - 2 * L, 2)
    assert (model(other, state=start).logits[:, -L:] - out.logits[:, -L:]).abs().max() > 1e-3


@torch.no_grad()
def test_a_call_of_one_segment_is_one_call_as_before(arch):
    """Up to segment_len tokens: one base call, the output of the single-call path; one token
    more: two calls."""
    model = tiny_memory_model(arch)
    memory = model(tokens(2, L, 1)).state
    seen = base_calls(model)
    ids = tokens(2, L + 1)
    out = model(ids[:, :L], state=memory, labels=ids[:, :L])
    assert seen == [(2 * L, 2 * L)]
    assert out.token_loss.shape == (2, L - 1)  # as before: the shift inside one call
    longer = model(ids, state=memory, labels=ids)
    assert seen[1:] == [(2 * L, 2 * L), (L + 1, L + 1)]
    assert torch.equal(longer.logits[:, :L], out.logits)
    assert longer.token_loss.shape == (2, L)  # the boundary's prediction counts too
    assert torch.equal(longer.token_loss[:, : L - 1], out.token_loss)


@pytest.mark.parametrize("window", [None, 0])
def test_gradients_through_a_long_call_equal_the_explicit_calls(arch, window):
    """Training through the streamed call: the same gradients as the explicit calls' loss built
    by hand (memory detached between the calls, as always); a frozen base gets none."""
    model = tiny_memory_model(arch, window=window).train()
    model.freeze_base()
    ids = tokens(2, 4 * L + 3)
    model(ids, labels=ids).loss.backward()
    streamed = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    scored = scored_positions(ids)
    calls = explicit(model, ids, scored=scored)
    logits = torch.cat([c.logits for c in calls], dim=1)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    (loss + by_scored(calls, scored, "memory_loss")).backward()
    by_hand = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert streamed.keys() == by_hand.keys() == {n for n, _ in model.long_term.named_parameters(
        prefix="long_term")}  # fmt: skip
    for name, grad in streamed.items():
        assert torch.allclose(grad, by_hand[name], atol=1e-6, rtol=1e-4), name
    assert model.long_term[0].attention.query.weight.grad.abs().sum() > 0
    if window == 0:  # the fit of the segment before runs inside each call's graph
        assert model.long_term[0].memory.gate.weight.grad.abs().sum() > 0


@torch.no_grad()
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("window", [None, 0])
def test_a_padded_row_gives_what_the_row_alone_gives(arch, side, window):
    """Row 1 holds 27 tokens in 44 columns, padded on the right or on the left: its logits at
    its tokens, its loss and what its memory gives the next call are those of its 27 tokens
    alone (each row's tokens are streamed from its first one)."""
    model = tiny_memory_model(arch, window=window)
    ids = tokens(2, 44)
    mask = torch.ones_like(ids)
    where = slice(27, None) if side == "right" else slice(None, 44 - 27)
    mask[1, where] = 0
    labels = ids.masked_fill(mask == 0, -100)
    out = model(ids, attention_mask=mask, labels=labels)
    own = ids[1:2][mask[1:2] == 1][None]
    alone = model(own, labels=own)
    assert torch.allclose(out.logits[1][mask[1] == 1], alone.logits[0], atol=1e-5)
    kept = (mask[1, 1:] == 1) & (mask[1, :-1] == 1)  # position t and its label t + 1 are tokens
    assert torch.allclose(out.token_loss[1][kept], alone.token_loss[0], atol=1e-5)
    assert torch.allclose(out.logits[0], model(ids[:1]).logits[0], atol=1e-5)  # row 0: no padding
    later = tokens(2, L, 3)
    assert torch.allclose(
        model(later, state=out.state).logits[1],
        model(later[1:2], state=alone.state).logits[0],
        atol=1e-5,
    )


@torch.no_grad()
def test_cache_and_logits_to_keep_on_a_long_call(arch):
    """use_cache: the cache of the last call (the base's keys and values over the window and the
    last segment, as that call alone returns it); use_cache=False: none. logits_to_keep=k: the
    last k positions' logits."""
    model = tiny_memory_model(arch)
    ids = tokens(2, T)
    out = model(ids, use_cache=True)
    last = explicit(model, ids, use_cache=True)[-1]
    assert out.cache.get_seq_length() == last.cache.get_seq_length() == L + T % L
    for ours, theirs in zip(out.cache.layers, last.cache.layers, strict=True):
        assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)
    assert model(ids, use_cache=False).cache is None
    kept = model(ids, logits_to_keep=3).logits
    assert kept.shape == (2, 3, V) and torch.equal(kept, out.logits[:, -3:])


@torch.no_grad()
@pytest.mark.parametrize("side", ["none", "left"])
def test_logits_to_keep_computes_only_the_kept_places_logits(arch, side):
    """logits_to_keep=k on a long call: the last k columns' logits as the call keeping all gives
    them (a left-padded row's too, its tokens streamed from its first one), and every call before
    the first kept place asks the base for one position's logits, not segment × vocabulary."""
    model = tiny_memory_model(arch)
    ids = tokens(2, T)
    mask = torch.ones(2, T, dtype=torch.long)
    if side == "left":
        mask[1, :30] = 0  # row 1: 70 tokens, streamed at places 0 … 69
    every = model(ids, attention_mask=mask).logits
    asked = []
    model.base.register_forward_pre_hook(
        lambda module, args, kwargs: asked.append(kwargs["logits_to_keep"]), with_kwargs=True
    )
    for k in (1, 5, 13):
        asked.clear()
        kept = model(ids, attention_mask=mask, logits_to_keep=k).logits
        assert kept.shape == (2, k, V)
        torch.testing.assert_close(kept, every[:, -k:], rtol=0, atol=1e-5)
        first = (T if side == "none" else 70) - k  # the first stream place kept
        assert asked[: first // L] == [1] * (first // L) and max(asked) < 2 * L


@torch.no_grad()
def recorded_widths(model) -> list[int]:
    """The number of tokens of each call of `model` (its input [batch, T]), as they happen."""
    widths: list[int] = []
    model.register_forward_pre_hook(lambda _, args: widths.append(args[0].shape[1]))
    return widths


def test_streams_follow_the_model_segment_len(arch):
    """The segment loop has no length of its own: a model whose adapter says another segment_len
    (same weights) is called in that many tokens, by `stream_loss` and by a long `model(ids)`;
    a stream may still ask for its own calls (checked like the configs check it)."""
    ids = tokens(1, 30)
    for model, length in (
        (tiny_memory_model(arch), L),
        (with_settings(tiny_memory_model(arch), segment_len=12), 12),
    ):
        assert model.config.adapter.segment_len == length
        widths = recorded_widths(model)
        with torch.no_grad():
            assert stream_loss(model, ids[:, :-1], ids[:, 1:]).segments == math.ceil(29 / length)
            assert widths == [length] * (29 // length) + [29 % length]
            widths.clear()
            model(ids)  # the call itself, then its calls of one segment each
            assert widths == [30] + [length] * (30 // length) + [30 % length]
            assert stream_loss(model, ids, segment_len=5).segments == 6
    with pytest.raises(ValueError, match="segment_len must be >= 1, got 0"):
        stream_loss(model, ids, segment_len=0)


def test_bad_long_inputs_give_clear_errors(arch):
    model = tiny_memory_model(arch)
    ids = tokens(2, T)
    cache = model(ids[:, :L], use_cache=True).cache
    cases = [
        (dict(position_ids=torch.arange(T)[None]), "position_ids are not supported on inputs"),
        (dict(cache=cache), "a call continuing a key/value cache takes at most segment_len=8"),
        (dict(logits_to_keep=torch.tensor([1])), "logits_to_keep must be an int >= 0"),
        (dict(labels=ids[:, :-1]), "labels must have the shape of input_ids"),
        (dict(labels=ids + V), r"labels must be in \[0, 61\)"),
        (dict(attention_mask=torch.ones(2, T - 1)), r"attention_mask must have shape \(2, >= 100"),
        (dict(attention_mask=torch.ones(2, 1, T, T)), "4-D masks are not supported"),
        (dict(state=model(ids[:1, :L]).state), "state has batch size 1"),
        (dict(reset=torch.tensor([1, 0])), "reset must be a bool"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            model(ids, **kwargs)


@torch.no_grad()
def test_a_pipeline_generates_from_a_prompt_longer_than_the_positions(tmp_path):
    """HF's text-generation pipeline on a prompt of more than 64 tokens (the base alone fails
    with an IndexError): the continuation `model.generate` gives, the prompt streamed first."""
    from tiny_pretrained import write_tiny_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    folder = write_tiny_model(tmp_path / "base", "gpt2", max_positions=64)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = add_long_term_memory(AutoModelForCausalLM.from_pretrained(folder), **MEMORY).eval()
    torch.manual_seed(0)
    for layer in model.long_term:  # reads that change the logits (they start at zero)
        layer.attention.out.weight.normal_(0.0, 0.3)
    text = "the memory of a long book, said the signal " * 12
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert ids.shape[1] > 64
    pipe = pipeline("text-generation", model=model, tokenizer=tokenizer)
    got = pipe(text, max_new_tokens=5, do_sample=False, return_full_text=False)
    new = model.generate(ids, max_new_tokens=5, do_sample=False)[0, ids.shape[1] :]
    assert got[0]["generated_text"] == tokenizer.decode(new)
