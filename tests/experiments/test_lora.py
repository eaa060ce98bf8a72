"""experiments/_lora.py: low-rank adapters hooked on a base's linear layers: the base's own
outputs at the start and once taken off, W x + (α/r) B A x by hand in between."""

import pytest
import torch
from _lora import LoRA, LoRAConfig, lora_of
from torch import nn


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.q_proj, self.v_proj, self.o_proj = nn.Linear(6, 4), nn.Linear(6, 5), nn.Linear(5, 6)

    def forward(self, x):
        return self.o_proj(self.v_proj(x)) + self.q_proj(x).sum(-1, keepdim=True)


def test_the_adapters_start_as_the_base_add_their_low_rank_term_and_come_off():
    model, x = Tiny(), torch.randn(2, 3, 6)
    before = model(x)
    lora = LoRA(model, LoRAConfig(rank=2, alpha=3.0))
    assert sorted(lora.a) == ["q_proj", "v_proj"]  # the targets only, o_proj left as it is
    torch.testing.assert_close(model(x), before, rtol=0, atol=0)  # B = 0: the base's outputs
    with torch.no_grad():
        for key in lora.b:
            lora.b[key].normal_()
    v = model.v_proj.weight
    by_hand = x @ v.T + model.v_proj.bias + 1.5 * (x @ lora.a["v_proj"].T) @ lora.b["v_proj"].T
    q = model.q_proj(x)  # hooked: the adapted query projection
    q_hand = x @ model.q_proj.weight.T + model.q_proj.bias
    q_hand = q_hand + 1.5 * (x @ lora.a["q_proj"].T) @ lora.b["q_proj"].T
    torch.testing.assert_close(model.v_proj(x), by_hand)
    torch.testing.assert_close(q, q_hand)
    # trained: gradients reach A and B, none the base's frozen weights need
    model.requires_grad_(False)
    model(x).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in lora.parameters())
    lora.remove()
    torch.testing.assert_close(model(x), before, rtol=0, atol=0)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="rank must be an int"):
        LoRAConfig(rank=0)
    with pytest.raises(ValueError, match="alpha must be > 0"):
        LoRAConfig(alpha=0.0)
    with pytest.raises(ValueError, match="no linear layer named k_proj"):
        LoRA(Tiny(), LoRAConfig(targets=("k_proj",)))
    assert lora_of(Tiny(), {"layers": []}) is None  # a run without adapters
    lora = lora_of(Tiny(), {"lora_rank": 3, "lora_alpha": 6.0, "lora_targets": ["o_proj"]})
    assert list(lora.a) == ["o_proj"] and lora.scale == 2.0
