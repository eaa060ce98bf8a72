"""The lean next-token loss (`hf/loss.py`): the values of `token_losses`, the gradient of autograd
through the output head, and `PretrainedMemoryLM` training with it on a frozen base."""

import pytest
import torch
from tiny_hf import L, V, tiny_memory_model
from tiny_pretrained import write_tiny_model

from inftyformer.hf.loss import HeadInputs, lean_head, lean_token_losses
from inftyformer.hf.pretrained_lm import PretrainedMemoryLM
from inftyformer.model_kinds import PretrainedMemoryConfig
from inftyformer.native.model import IGNORE_INDEX, token_losses


def _through_lean(tensor: torch.Tensor) -> bool:
    """Whether `tensor`'s graph goes through the lean loss."""
    seen, todo = set(), [tensor.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if "LeanNLL" in type(fn).__name__:
            return True
        todo.extend(f for f, _ in fn.next_functions)
    return False


def _head_case(seed: int = 0, batch: int = 3, length: int = 7, d: int = 16, vocab: int = 97):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, length, d, generator=g, requires_grad=True)
    weight = torch.randn(vocab, d, generator=g) * 0.5
    bias = torch.randn(vocab, generator=g)
    targets = torch.randint(0, vocab, (batch, length), generator=g)
    targets[0, 2] = targets[2, 6] = IGNORE_INDEX
    return hidden, weight, bias, targets


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("chunk_elements", [1, 97 * 2, 97 * 5, 1 << 22])
def test_values_and_gradient_equal_autograd_through_the_head(chunk_elements, with_bias):
    hidden, weight, bias, targets = _head_case()
    bias = bias if with_bias else None
    ref_tokens, ref_loss = token_losses(torch.nn.functional.linear(hidden, weight, bias), targets)
    ref_grad = torch.autograd.grad(ref_loss * 1.7, hidden)[0]

    tokens, loss = lean_token_losses(hidden, weight, bias, targets, chunk_elements)
    torch.testing.assert_close(tokens, ref_tokens, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    assert float(tokens[0, 2].detach()) == 0.0 and float(tokens[2, 6].detach()) == 0.0
    grad = torch.autograd.grad(loss * 1.7, hidden)[0]
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-6)
    assert grad[0, 2].abs().max() == 0  # an ignored target sends nothing back
    with torch.no_grad():  # evaluation: the values, nothing kept for a backward pass
        torch.testing.assert_close(
            lean_token_losses(hidden, weight, bias, targets, chunk_elements)[0],
            ref_tokens,
            rtol=1e-6,
            atol=1e-6,
        )


def test_any_weighting_of_the_token_losses_gets_its_gradient():
    hidden, weight, _, targets = _head_case(seed=3)
    weights = torch.rand(targets.shape, generator=torch.Generator().manual_seed(4))
    ref = torch.autograd.grad((token_losses(hidden @ weight.T, targets)[0] * weights).sum(), hidden)
    tokens, _ = lean_token_losses(hidden, weight, None, targets, 97 * 2)
    grad = torch.autograd.grad((tokens * weights).sum(), hidden)
    torch.testing.assert_close(grad[0], ref[0], rtol=1e-5, atol=1e-6)


def test_refuses_mismatched_inputs_and_a_head_that_trains():
    hidden, weight, bias, targets = _head_case()
    with pytest.raises(ValueError, match=r"hidden must be \[batch, L, d\]"):
        lean_token_losses(hidden[0], weight, None, targets)
    with pytest.raises(ValueError, match=r"hidden must be \[batch, L, d\]"):
        lean_token_losses(hidden, weight, None, targets[:, :-1])
    with pytest.raises(ValueError, match=r"the head's \[V, d\]"):
        lean_token_losses(hidden, weight[:, :-1], None, targets)
    with pytest.raises(ValueError, match=r"must be \[V\]"):
        lean_token_losses(hidden, weight, bias[:-1], targets)
    with pytest.raises(ValueError, match="freeze them"):
        lean_token_losses(hidden, weight.clone().requires_grad_(), None, targets)
    with pytest.raises(ValueError, match="freeze them"):
        lean_token_losses(hidden, weight, bias.clone().requires_grad_(), targets)


def test_head_inputs_records_only_inside_its_block_and_for_its_head(arch):
    model = tiny_memory_model(arch)
    head = model.get_output_embeddings()
    HeadInputs.attach(head)
    HeadInputs.attach(head)  # once only
    assert len(head._forward_pre_hooks) == 1
    ids = torch.randint(0, V, (2, L), generator=torch.Generator().manual_seed(0))
    other = HeadInputs(torch.nn.Linear(2, 2))
    with torch.no_grad(), HeadInputs(head) as seen, other:
        model(ids)
    assert seen.inputs == [] and other.inputs == []  # the inner block is another head's
    with torch.no_grad(), HeadInputs(head) as seen:
        out = model(ids)
    assert len(seen.inputs) == 1
    torch.testing.assert_close(head(seen.inputs[0]), out.logits, rtol=0, atol=0)
    with torch.no_grad(), HeadInputs(head, skip=True) as skipped:
        empty = model(ids)
    assert empty.logits.shape == (2, 0, V)  # the head computed nothing
    torch.testing.assert_close(skipped.inputs[0], seen.inputs[0], rtol=0, atol=0)
    with torch.no_grad():
        model(ids)  # outside: nothing recorded
    assert len(seen.inputs) == 1


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def base_dir(request, tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("lean") / "base", request.param)


def _pretrained(base_dir, freeze: bool) -> PretrainedMemoryLM:
    config = PretrainedMemoryConfig(
        base_model=str(base_dir), freeze_base=freeze, segment_len=8, num_basis=8, num_samples=8
    )
    torch.manual_seed(0)
    model = PretrainedMemoryLM(config).train()
    with torch.no_grad():  # reads that change the logits, so that the memory gets gradient
        for layer in model.lm.long_term:
            layer.attention.out.weight.normal_(0, 0.3)
    return model


def test_pretrained_frozen_base_trains_through_the_lean_loss_as_through_the_logits(base_dir):
    model = _pretrained(base_dir, freeze=True)
    assert lean_head(model.lm, model._architecture) is model.lm.get_output_embeddings()
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (2, 4 * 8 + 1), generator=torch.Generator().manual_seed(1))
    ids[1, 20] = IGNORE_INDEX
    params = list(model.lm.memory_parameters())
    state, moved = None, 0
    for start in range(0, 32, 8):
        tokens, targets = ids[:, start : start + 8].clamp(min=0), ids[:, start + 1 : start + 9]
        out = model(tokens, state=state, targets=targets)
        assert _through_lean(out.loss) and out._logits is None  # no logits made yet
        ref_tokens, ref_loss = token_losses(out.logits, targets)
        torch.testing.assert_close(out.token_loss, ref_tokens, rtol=1e-6, atol=1e-6)
        grads = torch.autograd.grad(out.loss, params, retain_graph=True, allow_unused=True)
        ref = torch.autograd.grad(ref_loss + (out.loss - out.lm_loss), params, allow_unused=True)
        for g, r in zip(grads, ref, strict=True):
            if r is None:
                assert g is None or g.abs().max() == 0
            else:
                # two float32 summation orders: agree to 1e-5 of the gradient's own scale
                scale = float(r.abs().max())
                torch.testing.assert_close(g, r, rtol=1e-5, atol=max(1e-6, 2e-5 * scale))
        moved += any(r is not None and r.abs().max() > 0 for r in ref)
        state = out.state
    assert moved == 2  # from the third segment on, a memory is read (the window before it)


def test_pretrained_logits_on_first_use_are_the_heads(base_dir):
    model = _pretrained(base_dir, freeze=True).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 17), generator=torch.Generator())
    state = model.push(ids[:, :8])
    out = model(ids[:, 8:16], state=state, targets=ids[:, 9:17])
    assert out._logits is None
    plain = model(ids[:, 8:16], state=state)  # without targets: the head computes them
    assert plain.logits.shape == (2, 8, model.config.vocab_size)
    torch.testing.assert_close(out.logits, plain.logits, rtol=0, atol=0)
    assert out.logits is out.logits  # computed once
    torch.testing.assert_close(out.token_loss, token_losses(plain.logits, ids[:, 9:17])[0],
                               rtol=1e-6, atol=1e-6)  # fmt: skip
    out.logits = None  # a caller may drop them
    assert out.logits is None


def test_pretrained_base_that_trains_keeps_the_loss_through_the_logits(base_dir):
    model = _pretrained(base_dir, freeze=False)
    assert lean_head(model.lm, model._architecture) is None
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (2, 9), generator=torch.Generator().manual_seed(2))
    out = model(ids[:, :8], targets=ids[:, 1:])
    assert out.token_loss.grad_fn is not None and not _through_lean(out.loss)
    out.loss.backward()
    assert model.lm.get_output_embeddings().weight.grad is not None
