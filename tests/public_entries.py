"""The checked public entry points below the model boundary, and a way to make a test fail when
the library calls one of them inside a step (where its inputs were already checked)."""

from __future__ import annotations

import importlib
import sys

import pytest

from inftyformer.core.attention import LongTermAttention
from inftyformer.core.basis import GaussianBasis
from inftyformer.core.memory import LongTermMemory

PUBLIC_CHECKED = [
    (LongTermMemory, "update"),
    (LongTermMemory, "update_traced"),
    (LongTermMemory, "observe"),
    (LongTermMemory, "sample_positions"),
    (LongTermMemory, "signal"),
    (LongTermAttention, "attend"),
    (GaussianBasis, "forward"),
    ("inftyformer.core.ridge", "fit_coefficients"),
    ("inftyformer.core.ridge", "evaluate_signal"),
    ("inftyformer.core.continuous_softmax", "continuous_softmax"),
    ("inftyformer.core.continuous_softmax", "variance_kl"),
]


def refuse_public_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each checked entry raises AssertionError while `monkeypatch` is active."""

    def called(name):
        def fail(*args, **kwargs):
            raise AssertionError(f"{name} (a checked public entry) was called inside a step")

        return fail

    for owner, name in PUBLIC_CHECKED:
        if isinstance(owner, type):
            monkeypatch.setattr(owner, name, called(name))
            continue
        # a function: wherever the library holds it (a module that imported it by name too)
        original = getattr(importlib.import_module(owner), name)
        for module_name, module in list(sys.modules.items()):
            if module_name.split(".")[0] == "inftyformer" and module is not None:
                if getattr(module, name, None) is original:
                    monkeypatch.setattr(module, name, called(name))
