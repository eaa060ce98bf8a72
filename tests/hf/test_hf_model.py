"""The long-term memory added to tiny random GPT-2 / Llama models: parity at initialisation,
what the memory carries, resets, padding, labels, gradients, save/load."""

import pytest
import torch
import torch.nn.functional as F
from tiny_hf import ARCHITECTURES, MEMORY, L, V, tiny_base, tiny_memory_model
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    OPTConfig,
    OPTForCausalLM,
)

from inftyformer import MemoryState, load_state, save_state
from inftyformer.hf import (
    InftyformerConfig,
    InftyformerForCausalLM,
    add_long_term_memory,
    stream_loss,
    supported_architectures,
)
from inftyformer.native.state import TokenWindow


def tokens(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, V, (batch, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
@pytest.mark.parametrize("window", [None, 0])
def test_logits_equal_the_base_at_initialisation(arch, window):
    """The read's output projection starts at zero: exactly the base's logits (max |Δ| = 0),
    also once the memory holds earlier segments. With the window (default: one segment) the
    base's logits of segment k given segment k − 1 before it; with window=0 of segment k alone."""
    base = tiny_base(arch)
    ids = tokens(3, 4 * L)
    model = add_long_term_memory(
        base, num_basis=16, num_samples=16, segment_len=L, window=window
    ).eval()
    assert model.config.adapter.window == (L if window is None else 0)
    back = model.config.adapter.window
    memory = None
    for i in range(0, 4 * L, L):
        want = base(ids[:, max(i - back, 0) : i + L]).logits[:, -L:]
        out = model(ids[:, i : i + L], state=memory)
        assert (out.logits - want).abs().max().item() == 0.0
        memory = out.state
    assert not bool(memory.layers[0].long_term.empty.any())
    if window is None:
        assert torch.equal(memory.window.tokens, ids[:, -L:])  # the last segment, for the next
        assert memory.layers[0].short_term.length.tolist() == [L] * 3  # the one before, waiting
    else:
        assert memory.window is None


@torch.no_grad()
def test_the_window_is_exact_context_and_the_memory_holds_what_left_it(arch):
    """With nonzero reads: segment 2 reads an empty memory (segment 1 is in its window, not in
    the memory), so its logits are the base's given segment 1; segment 1 enters the memory at
    the call of segment 3, and from then on changes what is predicted."""
    model = tiny_memory_model(arch)
    base = model.base
    ids = tokens(2, 3 * L)
    first = model(ids[:, :L])
    second = model(ids[:, L : 2 * L], state=first.state)
    assert torch.allclose(second.logits, base(ids[:, : 2 * L]).logits[:, L:], atol=1e-6)
    assert bool(second.state.layers[0].long_term.empty.all())
    third = model(ids[:, 2 * L :], state=second.state)
    alone = base(ids[:, L:]).logits[:, L:]  # segment 3 given segment 2: no memory read
    assert (third.logits - alone).abs().max() > 1e-3
    assert not bool(third.state.layers[0].long_term.empty.any())
    # what waits is segment 1's normalised input, computed as the window of the second call
    other = tokens(2, L, 7)
    swapped = model(ids[:, L : 2 * L], state=model(other).state).state
    assert not torch.equal(
        swapped.layers[0].short_term.memory, second.state.layers[0].short_term.memory
    )
    assert torch.equal(swapped.window.tokens, second.state.window.tokens)


@torch.no_grad()
def test_window_positions_stay_within_the_base(arch):
    """Each call runs the base on the window and at most one segment (a longer input is
    streamed: `test_hf_long_inputs.py`), so W + L within the positions is all it takes."""
    model = tiny_memory_model(arch)
    memory = model(tokens(2, L)).state
    seen = []
    model.base.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(int(kwargs["position_ids"].max()) + 1),
        with_kwargs=True,
    )
    assert model(tokens(2, 64 - L + 1), state=memory).logits.shape[1] == 64 - L + 1
    assert seen == [2 * L] * 7 + [L + 1]
    # defaults: one segment each, within the positions; explicit settings are checked
    default = add_long_term_memory(tiny_base(arch))
    assert (default.config.adapter.segment_len, default.config.adapter.window) == (32, 32)
    assert add_long_term_memory(tiny_base(arch), segment_len=64).config.adapter.window == 0
    assert add_long_term_memory(tiny_base(arch), window=0).config.adapter.segment_len == 64
    with pytest.raises(ValueError, match=r"window \+ segment_len must be at most 64"):
        add_long_term_memory(tiny_base(arch), segment_len=32, window=40)
    with pytest.raises(ValueError, match="window must be >= 0"):
        add_long_term_memory(tiny_base(arch), segment_len=32, window=-1)


@torch.no_grad()
def test_an_old_segment_reaches_a_later_one_only_through_the_memory(arch):
    model = tiny_memory_model(arch)
    first_a, first_b, later = tokens(2, L, 1), tokens(2, L, 2), tokens(2, L, 3)
    mem_a = model(first_a).state
    mem_b = model(first_b).state
    read_a = model(later, state=mem_a).logits
    read_b = model(later, state=mem_b).logits
    fresh = model(later).logits
    assert (read_a - read_b).abs().max() > 1e-3  # the old content changes what is predicted
    assert (read_a - fresh).abs().max() > 1e-3
    # the same old content, however it reached the memory, gives the same prediction
    assert torch.allclose(model(later, state=mem_a).logits, read_a, atol=0, rtol=0)
    # content two segments back is still there (fitted into the continuous signal)
    two_back = model(tokens(2, L, 4), state=mem_a).state
    two_back_b = model(tokens(2, L, 4), state=mem_b).state
    assert (
        model(later, state=two_back).logits - model(later, state=two_back_b).logits
    ).abs().max() > 1e-4


@torch.no_grad()
def test_reset_rows_equal_a_fresh_stream(arch):
    model = tiny_memory_model(arch)
    ids = tokens(3, 3 * L)
    memory = model(ids[:, :L]).state
    memory = model(ids[:, L : 2 * L], state=memory).state
    reset = torch.tensor([False, True, False])
    out = model(ids[:, 2 * L :], state=memory, reset=reset)
    fresh = model(ids[1:2, 2 * L :])
    kept = model(ids[:, 2 * L :], state=memory)
    assert torch.allclose(out.logits[1], fresh.logits[0], atol=1e-5)
    assert torch.allclose(out.logits[[0, 2]], kept.logits[[0, 2]], atol=1e-6)
    assert not torch.allclose(out.logits[1], kept.logits[1], atol=1e-3)
    # the next call continues row 1 from its new document only
    nxt = tokens(3, L, 9)
    assert torch.allclose(
        model(nxt, state=out.state).logits[1],
        model(nxt[1:2], state=fresh.state).logits[0],
        atol=1e-5,
    )
    # reset=all starts new streams, even with another batch size
    assert model(ids[:2, :L], state=memory, reset=torch.ones(2, dtype=torch.bool)).state


@torch.no_grad()
@pytest.mark.parametrize("window", [None, 0])
def test_padding_stores_only_the_valid_positions(arch, window):
    """A right-padded row leaves the same memory (window, waiting inputs) as the same row
    without padding."""
    model = tiny_memory_model(arch, window=window)
    ids = tokens(2, L)
    mask = torch.ones(2, L, dtype=torch.long)
    mask[1, 5:] = 0
    padded = model(ids, attention_mask=mask).state
    short = model(ids[1:2, :5]).state
    held = padded.layers[0].short_term if window == 0 else padded.window
    assert held.length.tolist() == [L, 5]
    later = tokens(2, L, 5)
    after = model(later, state=padded)
    assert torch.allclose(after.logits[1], model(later[1:2], state=short).logits[0], atol=1e-5)
    # and the call after that (the padded row's first segment now in the long-term memory)
    last = tokens(2, L, 6)
    assert torch.allclose(
        model(last, state=after.state).logits[1],
        model(last[1:2], state=model(later[1:2], state=short).state).logits[0],
        atol=1e-5,
    )


def test_labels_are_shifted_and_minus_100_ignored(arch):
    model = tiny_memory_model(arch)
    ids = tokens(2, L)
    labels = ids.clone()
    labels[0, 3] = -100
    out = model(ids, labels=labels)
    logits = out.logits[:, :-1].reshape(-1, V)
    expected = F.cross_entropy(logits, labels[:, 1:].reshape(-1), ignore_index=-100)
    assert torch.allclose(out.lm_loss, expected, atol=1e-6)
    assert torch.allclose(out.loss, out.lm_loss + out.memory_loss)
    assert out.token_loss.shape == (2, L - 1) and out.token_loss[0, 2] == 0


def test_frozen_base_gets_no_gradient_and_every_memory_parameter_does(arch):
    model = tiny_memory_model(arch).train()
    model.freeze_base()
    assert all(not p.requires_grad for p in model.base_parameters())
    n_memory = sum(p.numel() for p in model.memory_parameters())
    assert n_memory > 0 and n_memory + sum(p.numel() for p in model.base_parameters()) == sum(
        p.numel() for p in model.parameters()
    )
    ids = tokens(2, 3 * L)
    first = model(ids[:, :L], labels=ids[:, :L])  # empty memory: nothing to fit, nothing read
    first.loss.backward()
    assert all(p.grad is not None for p in model.memory_parameters())  # DDP: all in the graph
    model.zero_grad(set_to_none=True)
    second = model(ids[:, L : 2 * L], state=first.state)  # segment 1 is its window
    third = model(ids[:, 2 * L :], state=second.state, labels=ids[:, 2 * L :])
    third.loss.backward()
    assert all(p.grad is None for p in model.base_parameters())
    gate = model.long_term[0].memory.gate.weight.grad
    assert gate is not None and gate.abs().sum() > 0  # the fit happens inside this call's graph
    assert model.long_term[0].attention.query.weight.grad.abs().sum() > 0


def test_stream_loss_carries_the_memory_across_segments(arch):
    model = tiny_memory_model(arch)
    doc = tokens(2, 3 * L + 4)
    with torch.no_grad():
        result = stream_loss(model, doc[:, :-1], doc[:, 1:])
        memory, manual = None, []
        for start in range(0, doc.shape[1] - 1, L):
            out = model(doc[:, start : min(start + L, doc.shape[1] - 1)], state=memory)
            target = doc[:, start + 1 : start + 1 + out.logits.shape[1]]
            manual.append(F.cross_entropy(out.logits.transpose(1, 2), target, reduction="none"))
            memory = out.state
    assert result.segments == 4 and result.token_loss.shape == (2, 3 * L + 3)
    assert torch.allclose(result.token_loss, torch.cat(manual, 1), atol=1e-6)


def test_save_pretrained_round_trip_gives_identical_logits(arch, tmp_path):
    model = tiny_memory_model(arch, sticky=True)
    ids = tokens(2, 2 * L)
    with torch.no_grad():
        memory = model(ids[:, :L]).state
        expected = model(ids[:, L:], state=memory).logits
    model.save_pretrained(tmp_path / "model")
    files = {p.name for p in (tmp_path / "model").iterdir()}
    assert "model.safetensors" in files and not any(f.endswith(".bin") for f in files)
    assert isinstance(AutoConfig.from_pretrained(tmp_path / "model"), InftyformerConfig)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()
    assert isinstance(loaded, InftyformerForCausalLM) and loaded.config.adapter.sticky
    # the memory state saves and loads like the core's (safetensors), its window too
    save_state(tmp_path / "memory.safetensors", memory)
    memory = load_state(tmp_path / "memory.safetensors")
    assert torch.equal(memory.window.tokens, ids[:, :L])
    with torch.no_grad():
        assert torch.equal(loaded(ids[:, L:], state=memory).logits, expected)


def test_a_memory_that_does_not_fit_the_window_is_refused():
    with_window, without = tiny_memory_model("gpt2"), tiny_memory_model("gpt2", window=0)
    ids = tokens(2, L)
    with pytest.raises(ValueError, match="state has no token window"):
        with_window(ids, state=without(ids).state)
    with pytest.raises(ValueError, match="state has a token window"):
        without(ids, state=with_window(ids).state)
    memory = with_window(ids).state
    cases = [
        (TokenWindow(ids[:1], memory.window.length[:1]), "window.tokens must have shape"),
        (TokenWindow(tokens(2, L + 1), memory.window.length), "more than this model's window"),
        (TokenWindow(ids + V, memory.window.length), r"window.tokens must be in \[0, 61\)"),
        (TokenWindow(ids, memory.window.length + 1), r"window.length must be in \[0, 8\]"),
        (TokenWindow(ids.float(), memory.window.length), "window.tokens must have dtype"),
    ]
    for window, message in cases:
        with pytest.raises((TypeError, ValueError), match=message):
            with_window(ids, state=MemoryState(memory.layers, window))


def test_unsupported_architecture_is_refused_with_the_supported_list():
    opt = OPTForCausalLM(
        OPTConfig(
            vocab_size=V, hidden_size=16, num_hidden_layers=1, ffn_dim=32, num_attention_heads=2
        )
    )
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*LlamaForCausalLM"):
        add_long_term_memory(opt)
    with pytest.raises(ValueError, match="supported architectures"):
        InftyformerConfig(text_config=opt.config)
    assert supported_architectures() == ("GPT2LMHeadModel", "LlamaForCausalLM")


@torch.no_grad()
def test_bad_inputs_give_clear_errors():
    model = tiny_memory_model("gpt2")
    ids = tokens(2, L)
    memory = model(ids).state
    cases = [
        (dict(input_ids=ids[0]), "input_ids must have shape"),
        (dict(input_ids=ids.float()), "integer ids"),
        (dict(input_ids=ids + V), r"input_ids must be in \[0, 61\)"),
        (dict(input_ids=ids, labels=ids[:, :-1]), "labels must have the shape"),
        (dict(input_ids=ids[:1], state=memory), "state has batch size 2"),
        (dict(input_ids=ids, state="memory"), "state must be a MemoryState"),
        (dict(input_ids=ids, reset=torch.tensor([1, 0])), "reset must be a bool"),
        (dict(input_ids=ids, attention_mask=torch.ones(2, L - 1)), "attention_mask must have"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            model(**kwargs)
    with pytest.raises(ValueError, match="state has 1 layers, the model has 2"):
        model(ids, state=MemoryState(memory.layers[:1]))
    wider = add_long_term_memory(
        GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=16, n_layer=2, n_head=2)), **MEMORY
    )
    with pytest.raises(ValueError, match="short_term.memory must have shape"):
        wider(ids, state=memory)
    with pytest.raises(ValueError, match="unknown long-term memory settings"):
        add_long_term_memory(tiny_base("gpt2"), dim=8)
    with pytest.raises(ValueError, match="segment_len must be in"):
        add_long_term_memory(tiny_base("gpt2"), segment_len=65)
    with pytest.raises(ValueError, match="num_basis"):
        add_long_term_memory(tiny_base("gpt2"), num_basis=15)


@torch.no_grad()
def test_a_base_wrapped_twice_reads_once():
    base = tiny_base("gpt2")
    first = add_long_term_memory(base, num_basis=16, num_samples=16, segment_len=L)
    second = tiny_memory_model("gpt2")  # same seed: the same base weights, active reads
    twice = add_long_term_memory(first.unwrap(), num_basis=16, num_samples=16, segment_len=L)
    twice.load_state_dict(second.state_dict())
    ids = tokens(2, L)
    memory = second(ids).state
    assert torch.equal(twice(ids, state=memory).logits, second(ids, state=memory).logits)
    with pytest.raises(RuntimeError, match="unwrapped"):
        first(ids)
    # wrapping without unwrapping: only the calling model's hooks act
    again = add_long_term_memory(twice.base, num_basis=16, num_samples=16, segment_len=L)
    again.load_state_dict(second.state_dict())
    assert torch.equal(again(ids, state=memory).logits, second(ids, state=memory).logits)


def test_tiny_model_directories_load_like_real_ones(tmp_path):
    from tiny_pretrained import CHATML, write_tiny_model
    from transformers import AutoModelForCausalLM

    from inftyformer.data import load_tokenizer

    for arch in ARCHITECTURES:
        path = write_tiny_model(tmp_path / arch, arch, chat=True)
        model = AutoModelForCausalLM.from_pretrained(path)
        tokenizer = load_tokenizer(str(path))
        assert model.config.vocab_size == tokenizer.vocab_size
        assert (path / "chat_template.jinja").read_text() == CHATML
        assert tokenizer.decode(tokenizer.encode("the signal")) == "the signal"
    again = write_tiny_model(tmp_path / "again", "llama", chat=True)
    a = AutoModelForCausalLM.from_pretrained(again).state_dict()
    b = AutoModelForCausalLM.from_pretrained(tmp_path / "llama").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # seeded
    with pytest.raises(ValueError, match="arch must be one of gpt2, llama"):
        write_tiny_model(tmp_path / "x", "mamba")


def test_inspection_refuses_a_pretrained_model_by_name(tmp_path):
    from tiny_pretrained import write_tiny_model

    from inftyformer.inspection import record_stream
    from inftyformer.model_kinds import PretrainedMemoryConfig, build_model

    base = write_tiny_model(tmp_path / "base")
    model = build_model(PretrainedMemoryConfig(base_model=str(base), segment_len=16,
                                               num_basis=8, num_samples=8))  # fmt: skip
    with pytest.raises(TypeError, match="pretrained model's memory"):
        record_stream(model, torch.zeros(1, 32, dtype=torch.long))
