"""The retrieval's settings (`inftyformer.retrieval.config`): two strategies behind seams of
their own (the choice of blocks, their layout), each validating its own settings; a setting of
a strategy that was not chosen cannot be written, flat or typed."""

from __future__ import annotations

import json

import pytest

from inftyformer.retrieval.config import RetrievalConfig
from inftyformer.retrieval.layouts import NearestLayout, StreamLayout
from inftyformer.retrieval.scorers import AttentionChoice, MaxChoice, NoChoice


def test_flat_and_typed_settings_give_the_same_config():
    flat = RetrievalConfig(choice="attention", blocks=2, neighbours=1, layout="nearest")
    typed = RetrievalConfig(choice=AttentionChoice(blocks=2, neighbours=1), layout=NearestLayout())
    assert flat == typed
    assert (flat.blocks, flat.neighbours, flat.choice.kind) == (2, 1, "attention")
    assert RetrievalConfig(**flat.settings()) == flat
    assert RetrievalConfig.from_dict(json.loads(json.dumps(flat.to_dict()))) == flat


def test_a_setting_of_a_choice_not_made_cannot_be_written():
    with pytest.raises(ValueError, match="blocks is a setting of choice 'max' or 'attention'"):
        RetrievalConfig(choice="none", blocks=4)
    with pytest.raises(ValueError, match="select_queries is a setting of choice"):
        RetrievalConfig(choice=NoChoice(), select_queries=32)
    with pytest.raises(ValueError, match="layout 'nearest' orders the chosen blocks"):
        RetrievalConfig(choice="none", layout="nearest")
    with pytest.raises(ValueError, match="choice='none'"):
        RetrievalConfig(blocks=0)  # the way to read no block is named
    with pytest.raises(ValueError, match="layout 'stream' has no settings"):
        RetrievalConfig(layout={"kind": "stream", "order": "score"})
    # a baseline reads as reading nothing, without a setting to write
    none = RetrievalConfig(choice="none", window=2048, sink_blocks=0)
    assert (none.blocks, none.context) == (0, 2048 + 63)
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        _ = none.nonsense


def test_each_strategy_checks_its_own_settings():
    for bad, error in (
        (dict(blocks=-1), ValueError),
        (dict(neighbours=-2), ValueError),
        (dict(select_layer="3"), TypeError),
        (dict(answer_choice="mine"), ValueError),
    ):
        with pytest.raises(error):
            MaxChoice(**bad)
    with pytest.raises(ValueError, match="choice must be one of"):
        RetrievalConfig(choice="mean")  # the experiment-only score left the product
    with pytest.raises(TypeError, match="store_dir must be a path"):
        RetrievalConfig(store_dir=3)
    assert isinstance(RetrievalConfig().layout, StreamLayout)


def test_a_strategy_given_as_none_is_refused_not_kept():
    """choice=None used to keep the preset's choice when flat settings came with it (the
    command line's `--set choice=none` read "none" as None: the default's blocks, silently)."""
    with pytest.raises(TypeError, match=r"choice must be .*'none'.*got None"):
        RetrievalConfig.of("retrieval", choice=None, window=448)
    with pytest.raises(TypeError, match="layout must be"):
        RetrievalConfig(layout=None)
    no_blocks = RetrievalConfig.of("retrieval", choice="none", window=448)
    assert isinstance(no_blocks.choice, NoChoice) and no_blocks.blocks == 0


def test_the_command_lines_settings_keep_a_kind_named_none():
    from inftyformer.commands.ask import parse_settings

    settings = parse_settings(["choice=none", "store_dir=none", "window=448", "layout=stream"])
    assert settings == {"choice": "none", "store_dir": None, "window": 448, "layout": "stream"}
    assert RetrievalConfig.of("retrieval", **settings).blocks == 0
