"""Memory on a subset of the base's blocks (`memory_layers`): the same model as memory on every
block with the others silent, fewer parameters, save/load, and clear errors."""

import pytest
import torch
from tiny_hf import MEMORY, L, V, tiny_base, tiny_memory_model
from transformers import AutoModelForCausalLM

from inftyformer.hf import InftyformerForCausalLM, add_long_term_memory


def tokens(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def stream(model, ids):
    memory, logits = None, []
    for start in range(0, ids.shape[1], L):
        out = model(ids[:, start : start + L], state=memory)
        logits.append(out.logits)
        memory = out.state
    return torch.cat(logits, 1), memory


@torch.no_grad()
def test_memory_on_one_block_equals_every_block_with_the_others_silent(arch):
    full = tiny_memory_model(arch, seed=3)  # both blocks read, with nonzero output weights
    full.long_term[0].attention.out.weight.zero_()  # block 0's read adds nothing
    sub = add_long_term_memory(tiny_base(arch, seed=3), memory_layers=[1], **MEMORY).eval()
    assert len(sub.long_term) == 1 and sub.memory_blocks == [1]
    sub.long_term[0].load_state_dict(full.long_term[1].state_dict())
    ids = tokens(2, 4 * L)
    expected, _ = stream(full, ids)
    got, memory = stream(sub, ids)
    assert len(memory.layers) == 1
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    base = tiny_base(arch, seed=3)
    assert not torch.allclose(got[:, 3 * L :], base(ids[:, 3 * L :]).logits, atol=1e-3)


def test_a_subset_trains_fewer_parameters_and_saves_its_blocks(arch, tmp_path):
    full = tiny_memory_model(arch)
    sub = add_long_term_memory(tiny_base(arch), memory_layers=[1], **MEMORY)
    count = lambda m: sum(p.numel() for p in m.memory_parameters())  # noqa: E731
    assert 2 * count(sub) == count(full)
    sub.save_pretrained(tmp_path / "model")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()
    assert isinstance(loaded, InftyformerForCausalLM) and loaded.memory_blocks == [1]
    ids = tokens(2, 2 * L)
    with torch.no_grad():
        torch.testing.assert_close(stream(loaded, ids)[0], stream(sub.eval(), ids)[0])
    # a memory made with another set of blocks is refused by its layer count
    _, memory = stream(full.eval(), ids)
    with pytest.raises(ValueError, match="state has 2 layers, the model has 1"):
        loaded(ids[:, :L], state=memory)


@pytest.mark.parametrize(
    ("layers", "message"),
    [
        ([2], "base has 2 blocks"),
        ([1, 1], "holds a block twice"),
        ([], "non-empty list"),
        ([-1], r"ints >= 0"),
        ("1", "non-empty list"),
        ([True], r"ints >= 0"),
    ],
)
def test_bad_memory_layers_are_refused_by_name(layers, message):
    with pytest.raises(ValueError, match=f"memory_layers.*{message}|{message}.*memory_layers"):
        add_long_term_memory(tiny_base("gpt2"), memory_layers=layers, **MEMORY)


def test_the_run_config_checks_memory_layers_against_the_base(tmp_path):
    from tiny_pretrained import write_tiny_model

    from inftyformer.model_kinds import PretrainedMemoryConfig

    path = str(write_tiny_model(tmp_path / "llama", "llama"))
    config = PretrainedMemoryConfig(base_model=path, memory_layers=[1, 0])
    assert config.memory_layers == (0, 1)
    again = PretrainedMemoryConfig.from_dict(config.to_dict())
    assert again == config
    with pytest.raises(ValueError, match="memory_layers holds block 5"):
        PretrainedMemoryConfig(base_model=path, memory_layers=(5,))
