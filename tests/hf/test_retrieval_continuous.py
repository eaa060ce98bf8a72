"""The ∞-former's continuous memory beside the retrieval (`inftyformer.retrieval.continuous`):
untrained it changes nothing; what enters it is exactly what the window lets go, as the base
computed it; streaming in calls equals one call; rows reset alone; only its weights train."""

import dataclasses

import pytest
import torch
from tiny_hf import V, tiny_base

from inftyformer.core.config import LongTermConfig
from inftyformer.retrieval.continuous import ContinuousConfig
from inftyformer.retrieval.model import RetrievalLM
from inftyformer.retrieval.session import SessionInfo, save_session

POSITIONS = 512
# 40 tokens in blocks of 8: one in the sink, two stored and both read, the last 16 in the
# window; packed without gaps they are the whole stream (the base's logits, as test_retrieval)
WHOLE = dict(block_size=8, blocks=2, sink_blocks=1, window=16, segment_len=8, select_layer=0)


def base(seed: int = 0):
    return tiny_base("llama", seed, max_position_embeddings=POSITIONS, num_hidden_layers=4)


def hybrid(active: bool = True, layers=(1, 3), **settings) -> RetrievalLM:
    m = RetrievalLM(base(), memory=ContinuousConfig(layers=layers), **{**WHOLE, **settings})
    if active:  # the read's output projection starts at zero: give it weights
        g = torch.Generator().manual_seed(5)
        for layer in m.memory.layers:
            w = layer.attention.out.weight
            w.data = torch.randn(w.shape, generator=g) * 0.3
    return m.eval()


def tokens(batch: int = 2, length: int = 40, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, V, (batch, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_an_untrained_memory_leaves_the_retrievals_logits_exactly():
    ids = tokens(length=80)
    plain = RetrievalLM(base(), **WHOLE).eval()
    assert torch.equal(hybrid(active=False)(ids).logits, plain(ids).logits)
    # with weights, the read changes them once something left the window (the 16-token
    # window and the sink's 8 hold the first 24: nothing to read before)
    with_read = hybrid()(ids).logits
    assert torch.equal(with_read[:, :24], plain(ids).logits[:, :24])
    assert (with_read[:, 32:] - plain(ids).logits[:, 32:]).abs().max() > 1e-3


@torch.no_grad()
def test_what_enters_the_memory_is_what_the_window_let_go_as_the_base_computed_it():
    """While the retrieval reads the whole stream, each token's h_i is the base's own on the
    stream (its block's normalised attention input): the window's 16 are kept, the 8 that left
    in the last call wait, the 8 before them (plus the sink's) were fitted."""
    ids = tokens()
    m = hybrid(active=False)
    out = m(ids)
    recorded = {}  # block i's normalised attention input in the base on the whole stream
    plain = base()
    plain.load_state_dict(m.base.state_dict())
    plain.set_attn_implementation("sdpa")
    for i, block in enumerate(m.memory.blocks):
        plain.model.layers[block].input_layernorm.register_forward_hook(
            lambda mod, a, o, i=i: recorded.__setitem__(i, o)
        )
    plain(ids)
    s = out.state.continuous
    assert s.waiting_len.tolist() == [8, 8]
    assert [lt.stored.tolist() for lt in s.long_term] == [[16, 16], [16, 16]]
    for i in range(len(m.memory.blocks)):  # (the stored blocks are float16: 1e-4)
        torch.testing.assert_close(s.waiting[i], recorded[i][:, 16:24], rtol=0, atol=1e-4)
        torch.testing.assert_close(s.recent[i][:, -16:], recorded[i][:, 24:], rtol=0, atol=1e-4)


@torch.no_grad()
@pytest.mark.parametrize("cut", [8, 24, 56])  # at call boundaries (segment_len 8)
def test_streaming_in_two_calls_equals_one(cut):
    ids = tokens(length=96)
    m = hybrid(window=16, blocks=2, select_layer=1)
    whole = m(ids)
    first = m(ids[:, :cut])
    second = m(ids[:, cut:], first.state)
    torch.testing.assert_close(torch.cat([first.logits, second.logits], 1), whole.logits)
    for a, b in zip(whole.state.continuous.long_term, second.state.continuous.long_term,
                    strict=True):  # fmt: skip
        torch.testing.assert_close(a.coefficients, b.coefficients)


@torch.no_grad()
def test_a_reset_row_reads_as_a_fresh_stream_and_the_other_row_goes_on():
    m = hybrid()
    ids = tokens(length=64)
    state = m(ids).state
    more = tokens(length=48, seed=3)
    after = m(more, state, reset=torch.tensor([True, False]))
    fresh = m(more[:1])
    torch.testing.assert_close(after.logits[:1], fresh.logits)
    kept = m(more[1:], state.select_rows([1]))
    torch.testing.assert_close(after.logits[1:], kept.logits)
    assert bool(after.state.continuous.long_term[0].empty.any()) is False  # refilled since


def test_only_the_memory_trains_and_a_step_changes_what_it_reads():
    m = hybrid()
    m.base.requires_grad_(False)
    ids = tokens(length=64)
    state = m(ids[:, :32]).state
    out = m(ids[:, 32:], state, targets=ids[:, 32:])
    (out.loss + 1e-6 * out.aux["kl"]).backward()
    assert all(p.grad is None for p in m.base.parameters())
    grads = {n: p.grad for n, p in m.memory.named_parameters()}
    assert all(g is not None for g in grads.values()), [n for n, g in grads.items() if g is None]
    gate = [g for n, g in grads.items() if "gate" in n]
    assert gate and all(float(g.abs().sum()) > 0 for g in gate)  # the fit is in the graph
    (group,) = m.param_groups(1e-2, 0.0)
    torch.optim.SGD(group["params"], lr=1e-1).step()
    with torch.no_grad():
        assert (m(ids[:, 32:], state).logits - out.logits).abs().max() > 1e-4


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="layers holds block 9"):
        RetrievalLM(base(), memory=ContinuousConfig(layers=(9,)), **WHOLE)
    with pytest.raises(ValueError, match="distinct block indices"):
        ContinuousConfig(layers=(1, 1))
    with pytest.raises(ValueError, match="long_term.dim is the base's"):
        ContinuousConfig(long_term=LongTermConfig(dim=32))
    with pytest.raises(TypeError, match="memory must be a ContinuousConfig"):
        RetrievalLM(base(), memory={"layers": (1,)}, **WHOLE)


def test_a_state_without_the_memory_is_refused_and_a_session_does_not_drop_it(tmp_path):
    plain = RetrievalLM(base(), **WHOLE)
    m = hybrid()
    with pytest.raises(ValueError, match="memory_blocks"):
        m(tokens(), plain.init_state(2))
    state = m(tokens(batch=1)).state
    info = SessionInfo.__new__(SessionInfo)
    with pytest.raises(ValueError, match="continuous memory"):
        save_session(tmp_path / "s", state, info)


def test_the_config_holds_its_layers_sorted():
    assert ContinuousConfig(layers=(3, 1)).layers == (1, 3)
    assert dataclasses.replace(ContinuousConfig(), layers=None).layers is None


@torch.no_grad()
def test_generation_reads_the_memory_as_a_stream_of_one_token_calls_does():
    """Greedy tokens after a prompt: each new token read in a call of its own (the decode
    run's one-token calls) gives what a stream of the same tokens gives."""
    m = hybrid(window=16, blocks=2, select_layer=1)
    prompt = tokens(length=64)
    new, _ = m.generate(prompt, 6, temperature=0.0)
    stream = torch.cat([prompt, new], 1)
    logits = m(stream).logits[:, 63:-1]
    assert torch.equal(logits.argmax(-1), new)
