"""The long-term memory's settings are one `LongTermConfig` (the paper's settings plus a density
and a squeeze strategy), nested in the native and the pretrained model's configs and taken,
written and read by their flat names too: the constructor, `replace`, `--set` and saved runs."""

from __future__ import annotations

import dataclasses
import json

import pytest

from inftyformer.core.config import LongTermConfig
from inftyformer.core.density import PaperDensity
from inftyformer.core.squeeze import FixedSqueeze
from inftyformer.extensions.densities import MixtureDensity, NormalizedDensity
from inftyformer.extensions.squeezes import ByLengthSqueeze, FillSqueeze
from inftyformer.native.model_config import NATIVE_LONG_TERM, ModelConfig
from inftyformer.pretrained_config import PRETRAINED_LONG_TERM

FLAT = {
    "vocab_size": 22, "model_type": "infty", "d_model": 32, "n_layers": 2, "n_heads": 2,
    "d_ff": 64, "dropout": 0.1, "attention_dropout": 0.0, "layer_norm_eps": 1e-05,
    "tie_embeddings": True, "segment_len": 32, "mem_len": 32, "compression_rate": 4,
    "compressed_len": 8, "reconstruction_weight": 1.0, "use_long_term": True, "num_basis": 16,
    "widths": [0.01, 0.05], "ridge_lambda": 0.5, "tau": 0.5, "num_samples": 24, "sticky": True,
    "sticky_bins": 64, "kl_weight": 1e-05, "sigma_0": 0.1, "min_sigma_sq": 0.0001,
    "conv_gate": False, "edge_padding": True, "density": "normalized", "sigma_init": 0.2,
    "squeeze": "fixed",
}  # fmt: skip
MEMORY = LongTermConfig(
    num_basis=16, ridge_lambda=0.5, kl_weight=1e-5, sigma_0=0.1, conv_gate=False,
    density=NormalizedDensity(sigma_init=0.2),
    squeeze=FixedSqueeze(tau=0.5, num_samples=24, sticky=True, sticky_bins=64),
)  # fmt: skip


def test_the_flat_settings_resolve_into_the_strategies():
    typed = LongTermConfig(
        num_basis=64, widths=(0.0003,), edge_padding=False,
        density=MixtureDensity(sharpness=2.0),
        squeeze=FillSqueeze(keep_first=4, keep_last=8),
    )  # fmt: skip
    flat = LongTermConfig(
        num_basis=64, widths=(0.0003,), edge_padding=False, density="mixture", sharpness=2.0,
        squeeze="fill", keep_first=4, keep_last=8,
    )  # fmt: skip
    assert typed == flat
    assert flat.keep_first == 4 and flat.squeeze.keep_first == 4 and flat.sharpness == 2.0
    assert LongTermConfig(**flat.settings()) == flat  # flat, written and read back
    assert LongTermConfig.from_dict(json.loads(json.dumps(flat.to_dict()))) == flat  # nested JSON
    assert flat.to_dict()["squeeze"] == {
        "kind": "fill", "keep_first": 4, "keep_last": 8, "keep_salient": 0, "salient_before": 0,
    }  # fmt: skip
    # the core's defaults are the paper's
    assert LongTermConfig().density == PaperDensity() and LongTermConfig().squeeze.tau == 0.75


@pytest.mark.parametrize(
    "settings, owner",
    [
        (dict(keep_first=64), "squeeze 'fill'"),  # the paper's squeeze keeps no places
        (dict(squeeze="fill", density="mixture", tau=0.5), "squeeze 'fixed' or 'by_length'"),
        (dict(sharpness=2.0), "density 'content' or 'mixture'"),
        (dict(density="normalized", sink_edge=0.1), "density 'content' or 'mixture'"),
    ],
)
def test_a_setting_of_a_strategy_not_chosen_is_refused_by_its_owner(settings, owner):
    with pytest.raises(ValueError, match=owner):
        LongTermConfig(**settings)


def test_reading_a_setting_of_a_strategy_not_chosen_names_its_owner():
    with pytest.raises(AttributeError, match="keep_first is a setting of squeeze 'fill'"):
        LongTermConfig().keep_first  # noqa: B018
    assert getattr(LongTermConfig(), "keep_first", None) is None


def test_the_strategies_check_what_they_need_of_each_other():
    with pytest.raises(ValueError, match="density that reads places"):
        LongTermConfig(squeeze="fill", density="normalized")
    with pytest.raises(ValueError, match="leave one of the K"):
        LongTermConfig(num_basis=8, widths=(0.01,), density="mixture", squeeze="fill",
                       keep_first=4, keep_last=4)  # fmt: skip
    with pytest.raises(ValueError, match="needs keep_salient"):
        FillSqueeze(salient_before=2)
    with pytest.raises(ValueError, match="density must be one of"):
        LongTermConfig(density="gaussian")
    with pytest.raises(TypeError, match="density must be a density strategy"):
        LongTermConfig(density=FixedSqueeze())


def test_switching_a_strategy_by_name_keeps_only_what_the_new_one_has():
    config = LongTermConfig(tau=0.5, num_samples=64)
    by_length = dataclasses.replace(config, squeeze="by_length", tau=0.9)
    assert by_length.squeeze == ByLengthSqueeze(tau=0.9)  # a new strategy: its defaults
    kept = dataclasses.replace(config, tau=0.25)  # a setting of the one in place: kept
    assert kept.squeeze == FixedSqueeze(tau=0.25, num_samples=64)


def test_a_native_config_takes_and_writes_the_memory_flat():
    config = ModelConfig.from_dict(FLAT)
    assert config.long_term == MEMORY
    assert config.long_term.dim is None and config.long_term.num_heads is None  # the model's
    written = config.to_dict()
    assert "long_term" not in written and written == {**FLAT}
    assert ModelConfig.from_dict(written) == config
    nested = {k: v for k, v in FLAT.items() if k in ModelConfig.__dataclass_fields__}
    nested["long_term"] = MEMORY.to_dict()
    for decided in ("dim", "num_heads", "out_dim", "query_projection", "segment_len"):
        del nested["long_term"][decided]
    assert ModelConfig.from_dict(nested) == config
    for bad, name in (({"num_base": 8}, "num_base"), ({"long_term": {"dim": 8}}, "dim")):
        with pytest.raises(ValueError, match=name):
            ModelConfig.from_dict({**FLAT, **bad})


def test_the_memory_settings_go_by_their_own_names():
    config = ModelConfig(vocab_size=8, num_basis=64, tau=0.5)
    assert config.long_term == dataclasses.replace(NATIVE_LONG_TERM, num_basis=64, tau=0.5)
    assert config.num_basis == 64 and config.tau == config.long_term.tau == 0.5
    assert config.replace(sticky=True).long_term.squeeze.sticky
    assert dataclasses.replace(config, sticky=True) == config.replace(sticky=True)
    given = LongTermConfig(num_basis=32, num_samples=32)
    assert ModelConfig(vocab_size=8, long_term=given, tau=0.5).long_term == dataclasses.replace(
        given, tau=0.5
    )
    assert ModelConfig.preset("cpu-small", tau=0.5).long_term.tau == 0.5
    with pytest.raises(AttributeError, match="num_heads"):
        config.num_heads  # noqa: B018  (the model's n_heads, not a setting)
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
    with pytest.raises(ValueError, match="keep_first is a setting of squeeze 'fill'"):
        build_configs(
            "sorting", model="infty", preset=None, settings=["keep_first=4"], options={},
            task_options={}, resume=False,
        )  # fmt: skip


def test_the_pretrained_configs_nest_one_adapter(tmp_path):
    pytest.importorskip("transformers")
    from tiny_pretrained import write_tiny_model

    from inftyformer.hf.config import InftyformerConfig
    from inftyformer.pretrained_config import AdapterConfig, HeadsRead, PretrainedMemoryConfig

    base = str(write_tiny_model(tmp_path / "base", max_positions=64))
    config = PretrainedMemoryConfig(base_model=base)
    assert config.long_term == PRETRAINED_LONG_TERM
    # one rule for the segment and the window: 256 within the base's positions (half of 64)
    assert (config.segment_len, config.window) == (32, 32)
    hf = InftyformerConfig(
        text_config={"model_type": "gpt2", "n_layer": 1, "n_embd": 16, "n_head": 2}
    )
    assert hf.adapter.long_term == dataclasses.replace(PRETRAINED_LONG_TERM, num_heads=2)
    assert (hf.adapter.segment_len, hf.adapter.window) == (256, 256)  # GPT-2's 1,024 positions
    changed = PretrainedMemoryConfig(
        base_model=base, density="content", sharpness=4.0, memory_read="heads", token_mass=True,
        squeeze="by_length",
    )  # fmt: skip
    assert changed.adapter.memory_read == HeadsRead(token_mass=True)
    assert changed.long_term.sharpness == 4.0 and changed.sharpness == 4.0
    saved = changed.to_dict()
    assert saved["density"] == "content" and saved["memory_read"] == "heads"
    assert "long_term" not in saved and "adapter" not in saved
    assert PretrainedMemoryConfig.from_dict(saved) == changed
    with pytest.raises(ValueError, match="memory_positions is a setting of memory_read 'heads'"):
        PretrainedMemoryConfig(base_model=base, memory_positions="ranks")
    # config.json nests the adapter as JSON
    text = {"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 16,
            "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 32,
            "max_position_embeddings": 64, "vocab_size": 50}  # fmt: skip
    hf = InftyformerConfig(text_config=text, adapter=changed.adapter)
    data = json.loads(hf.to_json_string())
    assert data["adapter"]["memory_read"] == {"kind": "heads", "memory_positions": "window",
                                              "token_mass": True}  # fmt: skip
    assert data["adapter"]["long_term"]["density"]["kind"] == "content"
    again = InftyformerConfig.from_dict(data)
    assert again.adapter == hf.adapter and isinstance(again.adapter, AdapterConfig)
