"""`generate` reads the memory (read-only): greedy decoding equals recomputation with the same
memory; beams repeat each row's memory, never share one."""

import torch
from tiny_hf import V, tiny_memory_model

PROMPT, NEW = 5, 6


def stream(model, batch: int, seed: int = 0):
    ids = torch.randint(1, V, (batch, 2 * 8), generator=torch.Generator().manual_seed(seed))
    memory = model(ids[:, :8]).memory
    return model(ids[:, 8:], memory=memory).memory  # the second segment is still waiting


@torch.no_grad()
def test_greedy_generate_equals_step_by_step_recomputation(arch):
    model = tiny_memory_model(arch)
    memory = stream(model, 2)
    prompt = torch.randint(1, V, (2, PROMPT), generator=torch.Generator().manual_seed(7))
    greedy = dict(
        max_new_tokens=NEW, do_sample=False, return_dict_in_generate=True, output_logits=True
    )
    out = model.generate(prompt, memory=memory, **greedy)
    ids, scores = prompt, []
    for _ in range(NEW):  # from scratch each step: the whole text so far, the same memory
        logits = model(ids, memory=memory).logits[:, -1]
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
    both = model.generate(prompt, memory=memory, **beams)
    assert both.shape == (4, PROMPT + 4)
    for row in range(2):
        row_memory = memory.repeat_rows(1)
        row_memory = type(memory).from_tensors(
            {k: v[row : row + 1] for k, v in row_memory.tensors().items()}, len(memory.layers)
        )
        alone = model.generate(prompt[row : row + 1], memory=row_memory, **beams)
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
    """64 positions: a window of 8, a prompt of 50 and 10 new tokens would need 68, so the window
    keeps its last 4 tokens; greedy generation equals recomputation with that window."""
    model = tiny_memory_model(arch)
    memory = stream(model, 2)
    prompt = torch.randint(1, V, (2, 50), generator=torch.Generator().manual_seed(9))
    out = model.generate(prompt, memory=memory, max_new_tokens=10, do_sample=False)
    short = model.consolidate(memory)
    short.window.tokens, short.window.length = short.window.tokens[:, -4:], torch.tensor([4, 4])
    ids = prompt
    for _ in range(10):
        step = model(ids, memory=short).logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, step], dim=1)
    assert torch.equal(out, ids)
