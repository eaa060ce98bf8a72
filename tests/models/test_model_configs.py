"""The long-term memory's settings are one `LongTermConfig`, nested in the native and the
pretrained model's configs (`long_term`) and taken, written and read by their own flat names:
the constructor, `replace`, `--set`, and every config saved before the nesting."""

from __future__ import annotations

import dataclasses

import pytest

from inftyformer.config import NATIVE_LONG_TERM, ModelConfig
from inftyformer.core.config import GPT2_LONG_TERM, LongTermConfig

# ModelConfig.to_dict() as every checkpoint and run before the nesting wrote it
SAVED_FLAT = {
    "vocab_size": 22, "model_type": "infty", "d_model": 32, "n_layers": 2, "n_heads": 2,
    "d_ff": 64, "dropout": 0.1, "attention_dropout": 0.0, "layer_norm_eps": 1e-05,
    "tie_embeddings": True, "segment_len": 32, "mem_len": 32, "compression_rate": 4,
    "compressed_len": 8, "reconstruction_weight": 1.0, "use_long_term": True, "num_basis": 16,
    "widths": [0.01, 0.05], "ridge_lambda": 0.5, "tau": 0.5, "num_samples": 24, "sticky": True,
    "sticky_bins": 64, "kl_weight": 1e-05, "sigma_0": 0.1, "min_sigma_sq": 0.0001,
    "conv_gate": False, "edge_padding": True, "density": "normalized", "sigma_init": 0.2,
}  # fmt: skip
MEMORY = dict(
    num_basis=16, widths=(0.01, 0.05), ridge_lambda=0.5, tau=0.5, num_samples=24, sticky=True,
    sticky_bins=64, kl_weight=1e-5, sigma_0=0.1, conv_gate=False, sigma_init=0.2,
)  # fmt: skip


def test_a_flat_config_saved_before_the_nesting_loads_into_the_nested_one():
    config = ModelConfig.from_dict(SAVED_FLAT)
    assert config.long_term == LongTermConfig(**MEMORY)
    assert config.long_term.dim is None and config.long_term.num_heads is None  # the model's
    assert config.d_model == 32 and config.segment_len == 32
    # written flat again, the same names and values (plus the settings added since)
    written = config.to_dict()
    assert "long_term" not in written
    assert {k: written[k] for k in SAVED_FLAT} == SAVED_FLAT
    assert written["sharpness"] == 1.0 and written["sink_edge"] == 0.0
    assert ModelConfig.from_dict(written) == config
    # nested, as a user may write it, with the saved defaults for what it lacks
    nested = {k: v for k, v in SAVED_FLAT.items() if k not in MEMORY and k != "density"}
    nested["long_term"] = {k: list(v) if isinstance(v, tuple) else v for k, v in MEMORY.items()}
    assert ModelConfig.from_dict(nested) == dataclasses.replace(config, density="paper")
    for bad, name in (({"num_base": 8}, "num_base"), ({"long_term": {"dim": 8}}, "dim")):
        with pytest.raises(ValueError, match=name):
            ModelConfig.from_dict({**SAVED_FLAT, **bad})


def test_the_memory_settings_go_by_their_own_names():
    config = ModelConfig(vocab_size=8, num_basis=64, tau=0.5)
    assert config.long_term == dataclasses.replace(NATIVE_LONG_TERM, num_basis=64, tau=0.5)
    assert config.num_basis == 64 and config.tau == config.long_term.tau == 0.5
    assert config.replace(sticky=True).long_term.sticky
    assert dataclasses.replace(config, sticky=True) == config.replace(sticky=True)
    given = LongTermConfig(num_basis=32, num_samples=32)
    assert ModelConfig(vocab_size=8, long_term=given, tau=0.5).long_term == dataclasses.replace(
        given, tau=0.5
    )
    assert ModelConfig.preset("cpu-small", tau=0.5).long_term.tau == 0.5
    with pytest.raises(AttributeError, match="num_heads"):
        config.num_heads  # noqa: B018  (the model's n_heads, not a setting)
    # what the model decides is left to it: each layer's memory gets d_model, n_heads and L
    for decided in ("dim", "num_heads", "segment_len"):
        with pytest.raises(ValueError, match=f"long_term.{decided} is the model's"):
            ModelConfig(vocab_size=8, long_term=dataclasses.replace(given, **{decided: 8}))
    sized = ModelConfig(vocab_size=8, d_model=32, n_heads=4, segment_len=16).long_term_config()
    assert (sized.dim, sized.num_heads, sized.out_dim, sized.segment_len) == (32, 4, 32, 16)
    with pytest.raises(ValueError, match="needs dim and num_heads"):
        from inftyformer import LongTermMemory

        LongTermMemory(NATIVE_LONG_TERM)


def test_the_command_line_sets_the_nested_settings_by_name():
    from inftyformer.configure import build_configs

    _, _, model = build_configs(
        "sorting", model="infty", preset=None, settings=["num_basis=64", "model.tau=0.5"],
        options={}, task_options={}, resume=False,
    )  # fmt: skip
    assert model.long_term.num_basis == 64 and model.long_term.tau == 0.5
    with pytest.raises(ValueError, match="num_base"):
        build_configs(
            "sorting", model="infty", preset=None, settings=["num_base=64"], options={},
            task_options={}, resume=False,
        )  # fmt: skip


def test_the_pretrained_configs_share_the_papers_gpt2_memory(tmp_path):
    pytest.importorskip("transformers")
    from tiny_pretrained import write_tiny_model

    from inftyformer.hf.config import InftyformerConfig
    from inftyformer.models import PretrainedMemoryConfig

    base = str(write_tiny_model(tmp_path / "base"))
    config = PretrainedMemoryConfig(base_model=base)
    assert config.long_term == GPT2_LONG_TERM
    hf = InftyformerConfig(
        text_config={"model_type": "gpt2", "n_layer": 1, "n_embd": 16, "n_head": 2}
    )
    assert hf.long_term == dataclasses.replace(GPT2_LONG_TERM, num_heads=2)  # the base's heads
    changed = PretrainedMemoryConfig(base_model=base, density="content", sharpness=4.0)
    assert changed.long_term.sharpness == 4.0 and changed.adapter_settings()["sharpness"] == 4.0
    saved = changed.to_dict()
    assert saved["density"] == "content" and "long_term" not in saved
    assert PretrainedMemoryConfig.from_dict(saved) == changed
