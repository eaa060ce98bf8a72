"""Every registered model kind implements the model contract
(`inftyformer.model_kinds.LanguageModel`), with the same signatures, and the tasks, the trainer
and the command line call only the contract: no type tests on a model, no reaching inside a
wrapper."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch

from inftyformer.model_kinds import MODEL_KINDS, LanguageModel, ModelKind, build_model, unwrap
from inftyformer.native.model_config import ModelConfig

SRC = Path(__file__).resolve().parents[2] / "src" / "inftyformer"
METHODS = ["forward", "init_state", "push", "generate", "param_groups"]


def contract_signature(name: str) -> list[str]:
    member = "__call__" if name == "forward" else name
    return list(inspect.signature(getattr(LanguageModel, member)).parameters)


@pytest.mark.parametrize("kind", sorted(MODEL_KINDS))
def test_every_kind_implements_the_contract(kind):
    pytest.importorskip("transformers")
    cls = MODEL_KINDS[kind].model_class()
    for name in METHODS:
        params = inspect.signature(getattr(cls, name)).parameters
        wanted = contract_signature(name)
        assert list(params)[: len(wanted)] == wanted, f"{cls.__name__}.{name}"
        extra = list(params.values())[len(wanted) :]  # a kind's own options, with defaults
        assert all(p.default is not inspect.Parameter.empty for p in extra), (
            f"{cls.__name__}.{name}"
        )
    config = MODEL_KINDS[kind].config
    assert callable(getattr(config, "describe", None)) and hasattr(config, "from_dict")


def test_a_native_model_through_the_contract():
    config = ModelConfig.preset("cpu-small", model_type="infty", vocab_size=32, n_layers=1,
                                d_model=32, n_heads=2, d_ff=32, segment_len=8, mem_len=8,
                                num_basis=8, num_samples=8)  # fmt: skip
    model: LanguageModel = build_model(config).eval()
    tokens = torch.randint(0, 32, (2, 20), generator=torch.Generator().manual_seed(0))
    state = model.push(tokens[:, :12], model.init_state(2))
    new, after = model.generate(tokens[:, 12:], 3, temperature=0.0, state=state)
    assert new.shape == (2, 3) and after.batch_size == 2
    # the same tokens by forward calls: greedy decoding reads the same memory
    out = model(tokens[:, 12:20], state=state)
    assert torch.equal(new[:, 0], out.logits[:, -1].argmax(-1))
    assert unwrap(model) is model
    assert config.describe() == "infty"
    groups = model.param_groups(1e-3, 0.1)
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


def test_registering_a_kind_twice_is_refused():
    from inftyformer.model_kinds import register_model_kind

    with pytest.raises(ValueError, match="already registered"):
        register_model_kind(
            ModelKind("native", ModelConfig, "inftyformer.native.model:MemoryLM", ())
        )


def test_callers_use_only_the_contract():
    callers = [SRC / "cli.py", *(SRC / "commands").glob("*.py"), *(SRC / "tasks").glob("*.py"),
               *(SRC / "training").glob("*.py")]  # fmt: skip
    found = []
    for path in callers:
        text = path.read_text(encoding="utf-8")
        for pattern in (r"hasattr\((raw|model)", r"getattr\((raw|model)\b", r"\bmodel\.lm\b",
                        r"getattr\(model_c(onfi)?g"):  # fmt: skip
            found += [f"{path.name}: {m.group(0)}" for m in re.finditer(pattern, text)]
    assert found == []


def test_one_list_of_the_memory_settings_that_may_change():
    """Every kind lets the long-term memory's changeable settings change, and only settings its
    config has; they are settings of the memory (flat names of its strategies included), the
    paper's listed by the core and each strategy's by the strategy that owns it."""
    from inftyformer.core.config import CHANGEABLE_SETTINGS, LongTermConfig, changeable_settings
    from inftyformer.core.seams import REGISTRY
    from inftyformer.model_kinds import changeable_settings as kind_changeable

    memory_settings = changeable_settings()
    assert set(memory_settings) <= set(LongTermConfig.user_settings())
    assert set(CHANGEABLE_SETTINGS) <= set(memory_settings)
    # the core's list names none of the strategies' settings: each strategy lists its own
    for seam in ("density", "squeeze"):
        for cls in REGISTRY[seam].values():
            assert not set(cls.changeable) & set(CHANGEABLE_SETTINGS), cls.kind
            assert set(cls.changeable) <= set(memory_settings), cls.kind
    assert {"tau", "num_samples", "sharpness", "keep_first"} <= set(memory_settings)
    assert not {"sigma_init", "num_basis", "widths", "density"} & set(memory_settings)
    for kind in MODEL_KINDS.values():
        names = set(kind.config.setting_types())
        allowed = kind.changeable()
        assert set(memory_settings) <= set(allowed) <= names, kind.name
        memory = [name for name in allowed if name in LongTermConfig.user_settings()]
        assert memory == list(memory_settings), kind.name  # the list, not a copy of it
    config = ModelConfig(vocab_size=8)
    assert kind_changeable(config) == MODEL_KINDS["native"].changeable()
    assert "num_basis" not in kind_changeable(config)  # it shapes the weights
    assert "token_mass" not in kind_changeable(config)  # the pretrained read's
    assert "token_mass" in MODEL_KINDS["pretrained"].changeable()
    with pytest.raises(ValueError, match="num_basis"):
        config.with_memory_settings({"num_basis": 64})
