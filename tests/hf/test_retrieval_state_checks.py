"""A retrieval state belongs to the model that made it and to its batch
(`inftyformer.retrieval.state`): a reset mask is one bool per row (an int mask was read as its
bitwise complement), and a model whose settings give the state's numbers another meaning
refuses it, naming the setting and both values."""

import dataclasses
import re

import pytest
import torch
from tiny_hf import V, forty_token_retrieval, tiny_base

from inftyformer.retrieval.model import RetrievalLM

SMALL = dict(block_size=4, blocks=2, sink_blocks=1, window=8, segment_len=8)


def tokens(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def retrieval(layers: int = 2, **settings) -> RetrievalLM:
    base = tiny_base("llama", max_position_embeddings=512, num_hidden_layers=layers)
    if settings.get("choice") == "none":  # a baseline: no block, none of a choice's settings
        sink_and_window = {k: v for k, v in SMALL.items() if k != "blocks"}
        return RetrievalLM(base, **sink_and_window, **settings).eval()
    return RetrievalLM(base, **{**SMALL, **settings}).eval()


# ---------------------------------------------------------------- reset masks
@torch.no_grad()
def test_an_int_reset_mask_is_refused_and_a_list_of_bools_taken():
    """`~` of an int tensor is its bitwise complement: torch.tensor([1, 0]) cleared no row and
    made both rows' token counts negative."""
    model = retrieval()
    state = model(tokens(2, 24)).state
    with pytest.raises(
        TypeError, match=r"reset must be a bool mask \[batch\], got dtype torch.int64"
    ):
        state.reset(torch.tensor([1, 0]))
    with pytest.raises(TypeError, match="reset must be a bool mask"):
        model(tokens(2, 4), state, reset=torch.tensor([1, 0]))
    with pytest.raises(TypeError, match="reset must be a bool mask"):
        state.reset([1, 0])
    cleared = state.reset([True, False])
    assert cleared.tokens.tolist() == [0, 24] and cleared.blocks.tolist() == [0, 3]
    assert torch.equal(state.reset(torch.tensor([True, False])).tokens, cleared.tokens)
    state.store.close()


@pytest.mark.parametrize(
    "mask", [torch.tensor([True]), torch.tensor([True, False, True]), torch.tensor(True),
             torch.ones(2, 1, dtype=torch.bool), [True]],
)  # fmt: skip
def test_a_reset_mask_of_another_shape_is_refused_naming_the_batch(mask):
    state = retrieval().init_state(2)
    with pytest.raises(
        ValueError, match=r"reset must have shape \(2,\): one flag per row of the batch of 2"
    ):
        state.reset(mask)
    state.store.close()


def test_the_native_state_takes_the_same_masks():
    from inftyformer.native.model import MemoryLM, ModelConfig

    state = MemoryLM(ModelConfig(vocab_size=V, d_model=16, n_heads=2, n_layers=1)).init_state(2)
    with pytest.raises(TypeError, match="reset must be a bool mask"):
        state.reset(torch.tensor([1, 0]))
    with pytest.raises(ValueError, match=r"reset must have shape \(2,\)"):
        state.reset(torch.tensor(True))
    assert state.reset([False, False]) is state


# ---------------------------------------------------------------- states of another model
@torch.no_grad()
@pytest.mark.parametrize(
    "make, other, setting, values",
    [
        (dict(layers=4, select_layer=1), dict(layers=4, select_layer=3), "select_layer", (1, 3)),
        (dict(window=8), dict(window=16), "window", (8, 16)),
        (dict(block_size=4), dict(block_size=2), "block_size", (4, 2)),
        (dict(sink_blocks=1), dict(sink_blocks=2), "sink_blocks", (1, 2)),
        (dict(layers=4, select_layer=3, read_from=3), dict(layers=4, select_layer=3, read_from=1),
         "read_from", (3, 1)),
        (dict(layers=2), dict(layers=3), "num_layers", (2, 3)),
        (dict(read_from=None), dict(choice="none"), "retrieving", ((1,), ())),
    ],
)  # fmt: skip
def test_a_state_of_other_settings_is_refused_naming_them(make, other, setting, values):
    """Before, a state made with select_layer 1 was read by a select_layer 3 model (logits off
    by 0.159), a window-8 state by a window-16 model."""
    state = retrieval(**make)(tokens(1, 40)).state
    model = retrieval(**other)
    theirs, ours = values
    message = re.escape(f"{setting}: the state's {theirs}, the model's {ours}")
    with pytest.raises(
        ValueError, match=f"state was made by a retrieval model of other settings.*{message}"
    ):
        model(tokens(1, 4, seed=1), state)
    state.store.close()


@torch.no_grad()
def test_a_models_own_states_pass_and_a_state_without_a_record_is_refused():
    model, ids, state = forty_token_retrieval()
    assert state.record.select_layer == model.select_layer and state.record.window == 16
    kept = model(ids[:, :8], state.reset(torch.tensor([False]))).state  # reset keeps the record
    assert kept.record == state.record == state.select_rows([0]).record
    with pytest.raises(ValueError, match="make states with the model's init_state"):
        model(ids[:, :8], dataclasses.replace(state, record=None))
    with pytest.raises(TypeError, match="state must be a RetrievalState or None, got dict"):
        model(ids[:, :8], {"tokens": 0})
    with pytest.raises(ValueError, match="state has 1 rows, input_ids 2"):
        model(ids[:, :8].expand(2, -1), state)
    state.store.close()
