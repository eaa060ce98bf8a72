"""The pretrained adapter's density heads start where the config says: `sigma_init` (and the
floor of density="content") survive the model's weight initialisation and a save/load."""

import math

import pytest
import torch
from tiny_hf import MEMORY, tiny_base

from inftyformer.hf import InftyformerForCausalLM, add_long_term_memory


def _extra_sigma_sq(model) -> list[float]:
    return [
        torch.nn.functional.softplus(layer.attention.sigma_head.bias).item()
        for layer in model.long_term
    ]


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (dict(sigma_init=0.2), 0.04),
        (dict(density="content"), MEMORY.get("min_sigma_sq", 1e-4)),
        (dict(density="content", sigma_init=0.01), 1e-4),
    ],
)
def test_sigma_starts_where_the_config_puts_it(settings, expected, tmp_path):
    model = add_long_term_memory(tiny_base("gpt2"), **MEMORY, **settings)
    assert _extra_sigma_sq(model) == pytest.approx([expected] * len(model.long_term), rel=1e-4)
    model.save_pretrained(tmp_path / "m")
    loaded = InftyformerForCausalLM.from_pretrained(tmp_path / "m")
    assert _extra_sigma_sq(loaded) == pytest.approx(_extra_sigma_sq(model), rel=1e-6)


def test_the_default_keeps_pytorchs_initialisation():
    """No sigma_init, paper or normalized: softplus(b) with |b| ≤ 1/√N, σ² near ln 2."""
    model = add_long_term_memory(tiny_base("gpt2"), **MEMORY)
    bound = 1 / math.sqrt(MEMORY["num_basis"])
    for layer in model.long_term:
        assert abs(layer.attention.sigma_head.bias.item()) <= bound
