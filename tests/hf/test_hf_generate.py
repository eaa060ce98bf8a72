"""`generate` reads the memory (read-only): greedy decoding equals recomputation with the same
memory; beams repeat each row's memory, never share one; a prompt longer than a segment goes
into the memory first.

The recomputation reference runs the text so far in one call, as generation's cache holds it:
past a segment, `model(ids)` would stream it, so the reference is the same weights with a longer
segment_len (`with_settings`)."""

import pytest
import torch
from tiny_hf import L, V, tiny_memory_model, with_settings

from inftyformer.native.state import TokenWindow

PROMPT, NEW = 5, 6


def stream(model, batch: int, seed: int = 0):
    ids = torch.randint(1, V, (batch, 2 * 8), generator=torch.Generator().manual_seed(seed))
    memory = model(ids[:, :8]).state
    return model(ids[:, 8:], state=memory).state  # the second segment is still waiting


@torch.no_grad()
def test_greedy_generate_equals_step_by_step_recomputation(arch):
    model = tiny_memory_model(arch)
    memory = stream(model, 2)
    prompt = torch.randint(1, V, (2, PROMPT), generator=torch.Generator().manual_seed(7))
    greedy = dict(
        max_new_tokens=NEW, do_sample=False, return_dict_in_generate=True, output_logits=True
    )
    out = model.generate(prompt, state=memory, **greedy)
    one_call = with_settings(model, segment_len=PROMPT + NEW)
    ids, scores = prompt, []
    for _ in range(NEW):  # from scratch each step: the whole text so far, the same memory
        logits = one_call(ids, state=memory).logits[:, -1]
        scores.append(logits)
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out.sequences, ids)
    for got, want in zip(out.logits, scores, strict=True):
        assert torch.allclose(got, want, atol=1e-5)
    # the memory is used: without it the first step's logits differ
    alone = model.generate(prompt, **greedy)
    assert (alone.logits[0] - out.logits[0]).abs().max() > 1e-3


@torch.no_grad()
def test_beam_search_reads_each_rows_own_memory(arch):
    """Beams of a batch give what each row gives on its own: its memory was repeated for its
    beams, not shared across rows."""
    model = tiny_memory_model(arch)
    memory = stream(model, 2)
    prompt = torch.randint(1, V, (2, PROMPT), generator=torch.Generator().manual_seed(8))
    beams = dict(max_new_tokens=4, do_sample=False, num_beams=3, num_return_sequences=2)
    both = model.generate(prompt, state=memory, **beams)
    assert both.shape == (4, PROMPT + 4)
    for row in range(2):
        row_memory = memory.repeat_rows(1)
        row_memory = type(memory).from_tensors(
            {k: v[row : row + 1] for k, v in row_memory.tensors().items()}, len(memory.layers)
        )
        alone = model.generate(prompt[row : row + 1], state=row_memory, **beams)
        assert torch.equal(both[2 * row : 2 * row + 2], alone)


def test_repeat_rows_repeats_each_row_in_place():
    model = tiny_memory_model("gpt2")
    memory = stream(model, 2)
    repeated = memory.repeat_rows(3)
    assert repeated.batch_size == 6
    coefficients = repeated.layers[1].long_term.coefficients
    assert torch.equal(
        coefficients[3:6], memory.layers[1].long_term.coefficients[1:2].expand(3, -1, -1)
    )


@torch.no_grad()
def test_generate_shortens_the_window_to_the_base_positions(arch):
    """64 positions: a window of 8, a prompt of 6 and 54 new tokens would need 68, so the window
    keeps its last 4 tokens; greedy generation equals recomputation with that window."""
    model = tiny_memory_model(arch)
    memory = stream(model, 2)
    prompt = torch.randint(1, V, (2, 6), generator=torch.Generator().manual_seed(9))
    out = model.generate(prompt, state=memory, max_new_tokens=54, do_sample=False)
    short = model.consolidate(memory)
    short.window = TokenWindow(short.window.tokens[:, -4:], torch.tensor([4, 4]))
    one_call = with_settings(model, segment_len=60, window=4)
    ids = prompt
    for _ in range(54):
        step = one_call(ids, state=short).logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, step], dim=1)
    assert torch.equal(out, ids)


@torch.no_grad()
@pytest.mark.parametrize("window", [None, 0])
def test_a_long_prompt_goes_into_the_memory_first(arch, window):
    """A prompt of 100 tokens (more than the base's 64 positions): generate equals streaming all
    but its last part (4 tokens: 100 = 12·8 + 4) into the memory, then generating from that part
    with the memory; the returned sequences hold the whole prompt. max_length counts the whole
    prompt, as HF's does; beams and several sequences per prompt get the prompt too; the head's
    calls compute no logits beyond one position each."""
    model = tiny_memory_model(arch, window=window)
    memory = stream(model, 2)
    prompt = torch.randint(1, V, (2, 100), generator=torch.Generator().manual_seed(10))
    greedy = dict(do_sample=False, return_dict_in_generate=True, output_logits=True)
    out = model.generate(prompt, state=memory, max_new_tokens=NEW, **greedy)
    streamed = model(prompt[:, :96], state=memory).state
    explicit = model.generate(prompt[:, 96:], state=streamed, max_new_tokens=NEW, **greedy)
    assert out.sequences.shape == (2, 100 + NEW)
    assert torch.equal(out.sequences[:, :100], prompt)
    assert torch.equal(out.sequences[:, 96:], explicit.sequences)
    for got, want in zip(out.logits, explicit.logits, strict=True):
        assert torch.equal(got, want)
    # what was streamed matters: the same last part after another beginning differs
    other = prompt.clone()
    other[:, :90] = torch.randint(1, V, (2, 90), generator=torch.Generator().manual_seed(11))
    changed = model.generate(other, state=memory, max_new_tokens=NEW, **greedy)
    assert (changed.logits[0] - out.logits[0]).abs().max() > 1e-3
    # a prompt of exactly one segment is not cut: the same as before
    assert torch.equal(
        model.generate(prompt[:, :L], state=memory, max_new_tokens=NEW, do_sample=False),
        model.generate(prompt[:, :L], state=model.consolidate(memory), max_new_tokens=NEW,
                       do_sample=False),
    )  # fmt: skip
    assert model.generate(prompt, max_length=103, do_sample=False).shape == (2, 103)
    beams = model.generate(prompt, num_beams=2, num_return_sequences=2, max_new_tokens=3)
    assert beams.shape == (4, 103) and torch.equal(beams[:, :100], prompt.repeat_interleave(2, 0))
    with pytest.raises(ValueError, match="attention_mask must have the shape of input_ids"):
        model.generate(prompt, attention_mask=torch.ones(2, 99, dtype=torch.long))
    # the 12 calls streaming the prompt's head ask the base for one position's logits each
    asked = []
    model.base.register_forward_pre_hook(
        lambda module, args, kwargs: asked.append(kwargs["logits_to_keep"]), with_kwargs=True
    )
    model.generate(prompt, state=memory, max_new_tokens=1, do_sample=False)
    assert asked[:12] == [1] * 12


@torch.no_grad()
def test_a_long_padded_prompt_streams_the_valid_tokens(arch):
    """Left padding (as batched generation pads): the prompt is cut by columns (here after 24),
    and a row's valid tokens before the cut are streamed from its first one. With one segment
    of padding, the padded row streams the same two segments as its 22 tokens alone (cut after
    16) and continues from the same 6 tokens, so it generates the same."""
    model = tiny_memory_model(arch)
    prompt = torch.randint(1, V, (2, 30), generator=torch.Generator().manual_seed(12))
    mask = torch.ones_like(prompt)
    mask[1, :L] = 0
    padded = model.generate(prompt, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    alone = model.generate(prompt[1:2, L:], max_new_tokens=NEW, do_sample=False)
    assert torch.equal(padded[1, L:], alone[0])
