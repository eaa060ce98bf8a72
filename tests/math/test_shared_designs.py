"""The layers of a model share one cache of design matrices G (their bases are equal), and a
shared cache never hands one setting's G to another."""

import torch
from tiny_models import tiny

from inftyformer import LongTermConfig, LongTermMemory
from inftyformer.native.model import MemoryLM


def test_memories_sharing_a_cache_compute_each_design_once():
    config = LongTermConfig(
        dim=4, num_heads=1, num_basis=16, widths=(0.05, 0.1), num_samples=16, conv_gate=False
    )
    designs: dict = {}
    first, second = LongTermMemory(config, designs), LongTermMemory(config, designs)
    x = torch.randn(2, 6, 4)
    a = first.update(first.update(first.init_state(2), x), x)
    size = len(designs)
    b = second.update(second.update(second.init_state(2), x), x)
    assert len(designs) == size > 0  # the second memory found every G in the cache
    alone = LongTermMemory(config)
    c = alone.update(alone.update(alone.init_state(2), x), x)
    assert torch.allclose(b.coefficients, c.coefficients) and torch.equal(
        a.coefficients, b.coefficients
    )
    other = LongTermMemory(LongTermConfig(**{**config.__dict__, "ridge_lambda": 0.1}), designs)
    d = other.update(other.update(other.init_state(2), x), x)
    assert len(designs) > size  # another λ: its own matrices
    assert not torch.allclose(d.coefficients, c.coefficients)


def test_a_model_shares_one_cache_across_its_blocks():
    model = MemoryLM(tiny("infty", n_layers=3))
    caches = {id(block.long_term_memory.ridge._cache) for block in model.blocks}
    assert len(caches) == 1
