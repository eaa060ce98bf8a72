"""Named presets (`inftyformer.presets`): each builds a valid model of its kind, the measured
ones are the settings that were measured, and every door takes them the same way."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from inftyformer.cli import app
from inftyformer.core.density import PaperDensity
from inftyformer.native.model_config import ModelConfig
from inftyformer.presets import (
    PRESETS,
    every_fourth_from_the_middle,
    get_preset,
    preset_changes,
    preset_settings,
)


@pytest.mark.parametrize("name", [p.name for p in PRESETS.values() if p.kind == "native"])
def test_every_native_preset_is_a_valid_model(name):
    config = ModelConfig.preset(name, vocab_size=32)
    assert config.vocab_size == 32


def test_the_paper_preset_is_the_paper():
    config = ModelConfig.preset("paper")
    assert config.long_term.density == PaperDensity() and config.long_term.squeeze.kind == "fixed"
    assert (config.d_model, config.segment_len, config.num_basis, config.tau) == (
        300, 1024, 512, 0.75,
    )  # fmt: skip


def test_the_adapter_preset_places_its_memory_by_the_bases_depth():
    assert every_fourth_from_the_middle(30) == (15, 19, 23, 27)  # SmolLM2-135M, as measured
    assert every_fourth_from_the_middle(12) == (6, 10)  # GPT-2 small
    assert every_fourth_from_the_middle(2) == (1,)
    with pytest.raises(ValueError, match="by the base's depth"):
        preset_settings("adapter", "pretrained")


def test_the_salient_places_preset_and_the_passkey_rows_are_what_was_measured():
    """docs/results/passkey.json records each memory row's settings as they ran: the salient-places
    preset is row (xxiii)'s (window and segment 256, every block) and every row's
    preset-plus-overrides is its record (the fill rows without num_samples and τ, which that
    squeeze no longer takes: the code of the time required M = K and ignored τ)."""
    import json
    from pathlib import Path

    from _passkey_rows import MIXTURE

    path = Path(__file__).parents[2] / "docs" / "results" / "passkey.json"
    measured = json.loads(path.read_text())
    preset = preset_settings("salient-places", "pretrained")
    setup = measured["setup"]
    assert (preset["segment_len"], preset["window"]) == (setup["segment_len"], setup["window"])
    assert measured["rows"]["mixture-fill-ranks-before"]["memory_layers"] is None  # every block
    checked = 0
    for name, settings in MIXTURE.items():
        if "settings" not in measured["rows"].get(name, {}):
            continue
        record = {k: tuple(v) if isinstance(v, list) else v
                  for k, v in measured["rows"][name]["settings"].items()}  # fmt: skip
        if record.get("squeeze") == "fill":
            record.pop("num_samples"), record.pop("tau", None)
        assert {"sink_edge": 0.01, **settings} == record, name  # 0.01: --heads-sink-edge
        checked += 1
    assert checked >= 10
    assert MIXTURE["mixture-fill-ranks-before"] == {
        k: v for k, v in preset.items() if k not in ("segment_len", "window")
    }


def test_presets_are_refused_for_the_other_kind_by_name():
    with pytest.raises(ValueError, match="unknown pretrained preset 'paper'.*salient-places"):
        get_preset("paper", "pretrained")
    with pytest.raises(ValueError, match="unknown native preset 'salient-places'"):
        ModelConfig.preset("salient-places")
    with pytest.raises(ValueError, match="unknown pretrained preset 'retrieval'"):
        get_preset("retrieval", "pretrained")


def test_the_retrieval_presets_build_their_config_at_one_budget():
    from inftyformer.presets import READ_KINDS, retrieval_settings
    from inftyformer.retrieval.config import RetrievalConfig

    configs = {name: RetrievalConfig(**retrieval_settings(name))
               for name in ("retrieval", "streaming", "window")}  # fmt: skip
    # each reads 2,048 places at most: sink + blocks + window
    for config in configs.values():
        assert (config.sink_blocks + config.blocks) * config.block_size + config.window == 2048
    assert configs["retrieval"].read_from == 0 and configs["streaming"].blocks == 0
    # the default config is the default preset
    assert RetrievalConfig() == configs["retrieval"]
    # its question: 4 blocks (2 leads and their next), its last 256 tokens, the best last
    question = configs["retrieval"].choice
    assert (question.kind, question.question_window, question.question_layout) == (
        "question", 256, "nearest")  # fmt: skip
    # one retrieval preset does every job; the baselines a kind of their own
    kinds = {p.name: p.kind for p in PRESETS.values() if p.kind in READ_KINDS}
    assert [n for n, k in kinds.items() if k == "retrieval"] == ["retrieval"]
    assert kinds["streaming"] == kinds["window"] == "baseline"
    # a baseline reads no block: the choice's settings cannot be written on it
    with pytest.raises(ValueError, match="blocks is a setting of choice"):
        RetrievalConfig(**{**retrieval_settings("streaming"), "blocks": 4})
    # switching a preset's choice keeps the settings the new one shares
    switched = RetrievalConfig(**{**retrieval_settings("retrieval"), "choice": "attention"})
    assert (switched.choice.kind, switched.blocks, switched.read_from) == ("attention", 16, 0)


def test_a_preset_applied_to_a_trained_model_changes_what_differs():
    current = {"num_basis": 512, "widths": [0.005, 0.01], "tau": 0.5, "density": "paper"}
    changes = preset_changes("paper-gpt2", "pretrained", current)
    assert "num_basis" not in changes and "widths" not in changes and "tau" not in changes
    assert changes["memory_read"] == "added" and "density" not in changes


def test_every_door_takes_a_pretrained_preset(tmp_path):
    pytest.importorskip("transformers")
    from tiny_pretrained import write_tiny_model
    from transformers import AutoModelForCausalLM

    from inftyformer.configure import build_configs
    from inftyformer.hf import add_long_term_memory
    from inftyformer.pretrained_config import PretrainedMemoryConfig

    small = dict(num_basis=32, keep_first=2, keep_last=4, keep_salient=4, segment_len=8, window=8)
    base = str(write_tiny_model(tmp_path / "base", max_positions=64))
    model = add_long_term_memory(
        AutoModelForCausalLM.from_pretrained(base), preset="salient-places", **small
    )
    adapter = model.config.adapter
    assert adapter.memory_read.kind == "heads" and adapter.positions == "ranks"
    assert adapter.long_term.squeeze.salient_before == 2 and adapter.long_term.num_basis == 32
    config = PretrainedMemoryConfig(base_model=base, preset="salient-places", **small)
    assert config.adapter == adapter.replace(
        long_term=dataclasses.replace(adapter.long_term, num_heads=None)  # the model's: unset
    )
    # the command line: adapter by default (the tiny base's 2 blocks: the second), or --preset
    train, _, chosen = build_configs(
        "lm", model=None, preset=None, settings=[], options={}, task_options={}, resume=False,
        base_model=base,
    )  # fmt: skip
    assert chosen.memory_layers == (1,) and chosen.num_basis == 256
    _, _, chosen = build_configs(
        "lm", model=None, preset="paper-gpt2", settings=["num_basis=16", "num_samples=16"],
        options={}, task_options={}, resume=False, base_model=base,
    )  # fmt: skip
    assert chosen.memory_layers is None and chosen.density.kind == "paper"
    assert chosen.num_basis == 16  # --set on top of the preset
    with pytest.raises(ValueError, match="unknown pretrained preset 'cpu-small'"):
        build_configs(
            "lm", model=None, preset="cpu-small", settings=[], options={}, task_options={},
            resume=False, base_model=base,
        )  # fmt: skip


def test_the_presets_command_lists_each_with_one_line():
    result = CliRunner().invoke(app, ["presets"])
    assert result.exit_code == 0, result.output
    for preset in PRESETS.values():
        (line,) = [x for x in result.output.splitlines() if x.split()[0] == preset.name]
        assert preset.summary in line


def test_a_preset_whose_strategy_the_user_switches_drops_the_old_strategys_settings():
    """A preset's strategy settings fall back: another squeeze, density or read than the
    preset's gets none of those the new one lacks (τ and M of the fixed squeeze), and keeps
    those it shares (τ and M for by_length); a setting the user gives is still refused by name
    when it belongs to a strategy not chosen."""
    from inftyformer.configure import build_configs
    from inftyformer.core.config import LongTermConfig

    switched = ModelConfig.preset("paper", squeeze="fill", density="mixture", keep_first=4)
    assert switched.long_term.squeeze.kind == "fill" and switched.keep_first == 4
    assert switched.num_basis == 512  # the preset's own settings stay
    assert ModelConfig.preset("cpu-small", squeeze="fill", density="content").keep_first == 0
    shared = ModelConfig.preset("paper", squeeze="by_length", tau=0.5)
    assert (shared.squeeze.kind, shared.tau, shared.num_samples) == ("by_length", 0.5, 512)
    same = ModelConfig.preset("paper", squeeze="fixed")  # the preset's own kind: nothing drops
    assert (same.tau, same.num_samples) == (0.75, 512)
    assert type(same.to_dict()["tau"]) is float  # no mark reaches a config
    with pytest.raises(ValueError, match="tau is a setting of squeeze 'fixed'.*is 'fill'"):
        ModelConfig.preset("paper", squeeze="fill", density="mixture", tau=0.5)
    # the command line: --preset NAME --set squeeze=fill
    common = dict(model=None, options={}, task_options={}, resume=False)
    _, _, chosen = build_configs(
        "sorting", preset="cpu-small", settings=["squeeze=fill", "density=mixture"], **common
    )
    assert chosen.long_term.squeeze.kind == "fill" and chosen.long_term.density.kind == "mixture"
    with pytest.raises(ValueError, match="tau is a setting of squeeze"):
        build_configs(
            "sorting", preset="cpu-small", settings=["squeeze=fill", "density=mixture", "tau=0.5"],
            **common,
        )  # fmt: skip
    # evaluate/generate --preset: the preset's changes under the user's
    current = ModelConfig.preset("cpu-small").to_dict()
    changes = preset_changes("paper", "native", {**current, "tau": 0.5})
    assert changes["tau"] == 0.75
    memory = {k: v for k, v in changes.items() if k in LongTermConfig.user_settings()}
    user = {"squeeze": "fill", "density": "mixture"}
    assert LongTermConfig(**{**memory, **user}).squeeze.kind == "fill"


def test_a_pretrained_preset_whose_strategy_the_user_switches_builds(tmp_path):
    pytest.importorskip("transformers")
    from tiny_pretrained import write_tiny_model
    from transformers import AutoModelForCausalLM

    from inftyformer.configure import build_configs
    from inftyformer.hf import add_long_term_memory
    from inftyformer.pretrained_config import PretrainedMemoryConfig

    base = str(write_tiny_model(tmp_path / "base", max_positions=64))
    small = dict(num_basis=32, segment_len=8, window=8)
    fill = dict(small, squeeze="fill", density="mixture", keep_first=2)
    model = add_long_term_memory(
        AutoModelForCausalLM.from_pretrained(base), preset="adapter", **fill
    )
    assert model.config.adapter.long_term.squeeze.kind == "fill"
    config = PretrainedMemoryConfig(base_model=base, preset="paper-gpt2", **fill)
    assert config.long_term.squeeze.keep_first == 2 and config.memory_read.kind == "added"
    # every strategy switched away from salient-places': read, density and squeeze
    plain = dict(small, memory_read="added", density="normalized", squeeze="fixed")
    config = PretrainedMemoryConfig(base_model=base, preset="salient-places", **plain)
    assert config.memory_read.kind == "added" and config.long_term.squeeze.tau == 0.75
    with pytest.raises(ValueError, match="tau is a setting of squeeze"):
        add_long_term_memory(
            AutoModelForCausalLM.from_pretrained(base), preset="adapter", tau=0.5, **fill
        )
    with pytest.raises(ValueError, match="memory_positions is a setting of memory_read 'heads'"):
        PretrainedMemoryConfig(
            base_model=base, preset="salient-places", memory_positions="places", **plain
        )
    _, _, chosen = build_configs(
        "lm", model=None, preset="paper-gpt2", options={}, task_options={}, resume=False,
        settings=["num_basis=32", "squeeze=fill", "density=mixture"], base_model=base,
    )  # fmt: skip
    assert chosen.long_term.squeeze.kind == "fill"


def test_every_preset_gives_each_strategy_setting_with_its_strategy():
    """A preset's settings of a strategy come as fallbacks (so that switching the strategy drops
    them): each is given with its strategy, {"kind": …, its settings}, never loose."""
    from inftyformer.core import seams
    from inftyformer.presets import is_fallback, plain

    owned = {name for seam in seams.REGISTRY for name in seams.setting_names(seam)}
    for preset in PRESETS.values():
        flat = preset.settings_for(blocks=12, fallbacks=True)
        loose = sorted(k for k, v in flat.items() if k in owned and not is_fallback(v))
        assert loose == [], f"{preset.name}: give {loose} with their strategy"
        assert {k: plain(v) for k, v in flat.items()} == preset.settings_for(blocks=12)
    (tau,) = [v for k, v in preset_settings("paper", "native").items() if k == "tau"]
    assert is_fallback(tau) and tau == 0.75 and type(plain(tau)) is float
