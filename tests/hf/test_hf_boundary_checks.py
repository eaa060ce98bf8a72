"""The pretrained model checks what a call is handed (hf/validation.py) and runs the memory's
reads and writes unchecked inside the call."""

from __future__ import annotations

import torch
from public_entries import refuse_public_calls
from tiny_hf import V, tiny_memory_model


def test_the_pretrained_step_calls_no_checked_entry_inside(monkeypatch):
    model = tiny_memory_model("gpt2", sticky=True).train()
    refuse_public_calls(monkeypatch)
    g = torch.Generator().manual_seed(0)
    memory = None
    for _ in range(3):
        ids = torch.randint(0, V, (2, 8), generator=g)
        out = model(input_ids=ids, labels=ids, state=memory)
        out.loss.backward()
        memory = out.state
