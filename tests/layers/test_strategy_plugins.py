"""Strategy plugins (the entry-point group "inftyformer.strategies", `core.seams.discover`): a
plugin that fails is named and skipped, the others and the core's strategies load all the same;
a clash of kinds or a class that is no strategy names the classes, modules and plugins."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import sys
import textwrap
import warnings

import pytest

from inftyformer.core import seams

GOOD = """
    import dataclasses
    from inftyformer.core.density import PaperDensity
    from inftyformer.core.seams import register

    @register
    @dataclasses.dataclass(frozen=True)
    class PluginDensity(PaperDensity):
        kind = "plugin_test_density"
"""
BROKEN = """
    import dataclasses
    from inftyformer.core.density import PaperDensity
    from inftyformer.core.seams import register

    @register
    @dataclasses.dataclass(frozen=True)
    class HalfDensity(PaperDensity):
        kind = "plugin_test_half"

    raise RuntimeError("the plugin's own bug\\non two lines")
"""
CLASH = """
    import dataclasses
    from inftyformer.core.density import PaperDensity
    from inftyformer.core.seams import register

    @register
    @dataclasses.dataclass(frozen=True)
    class SecondPaper(PaperDensity):
        kind = "paper"
"""
NOT_A_DATACLASS = """
    from inftyformer.core.seams import register

    @register
    class LooseSqueeze:
        seam = "squeeze"
        kind = "plugin_test_loose"
"""


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """Install fake plugins (name → module source), listed before the real ones, and discover
    them afresh on a copy of the registry."""
    made: list[str] = []

    def install(**sources: str) -> None:
        entries = []
        for name, source in sources.items():
            module = f"fake_strategy_plugin_{name}"
            (tmp_path / f"{module}.py").write_text(textwrap.dedent(source), encoding="utf-8")
            made.append(module)
            entries.append(importlib.metadata.EntryPoint(name, module, seams.ENTRY_POINTS))
        real = list(importlib.metadata.entry_points(group=seams.ENTRY_POINTS))
        assert {e.name for e in real} >= {"extensions", "pretrained"}

        def entry_points(**kwargs):
            assert kwargs == {"group": seams.ENTRY_POINTS}
            return entries + real

        monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)

    monkeypatch.syspath_prepend(str(tmp_path))
    seams.kinds("density")  # the real plugins, once, before the registry is copied
    monkeypatch.setattr(seams, "REGISTRY", {s: dict(k) for s, k in seams.REGISTRY.items()})
    monkeypatch.setattr(
        seams, "_brought_by", dict(getattr(seams, "_brought_by", {})), raising=False
    )
    monkeypatch.setattr(seams, "_discovered", [])
    yield install
    for module in made:
        sys.modules.pop(module, None)


def discovered() -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seams.discover()
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def test_a_plugin_that_fails_to_import_is_named_and_skipped(plugins):
    plugins(broken=BROKEN, good=GOOD)
    messages = discovered()
    assert len(messages) == 1
    (message,) = messages
    assert "\n" not in message
    assert "'broken'" in message and "fake_strategy_plugin_broken" in message
    assert "RuntimeError: the plugin's own bug on two lines" in message
    # the core's strategies, the installed plugins' and the good fake plugin's are all there
    assert {"paper", "normalized", "content", "mixture", "plugin_test_density"} <= set(
        seams.kinds("density")
    )
    assert {"fixed", "by_length", "fill"} <= set(seams.kinds("squeeze"))
    assert seams.lookup("density", "plugin_test_density").__name__ == "PluginDensity"
    # what the broken module registered before it failed is taken back
    assert "plugin_test_half" not in seams.kinds("density")
    with pytest.raises(ValueError, match="density must be one of .*'paper'"):
        seams.lookup("density", "plugin_test_half")


def test_a_plugin_whose_kind_clashes_names_both_classes_and_the_plugin(plugins):
    plugins(clash=CLASH)
    (message,) = discovered()
    assert "'clash'" in message and "fake_strategy_plugin_clash" in message
    assert "PaperDensity (module inftyformer.core.density)" in message
    assert "SecondPaper (module fake_strategy_plugin_clash" in message
    assert seams.lookup("density", "paper").__name__ == "PaperDensity"


def test_a_plugin_registering_a_class_that_is_no_dataclass_is_named(plugins):
    plugins(loose=NOT_A_DATACLASS)
    (message,) = discovered()
    assert "TypeError" in message and "LooseSqueeze" in message and "'loose'" in message
    assert "plugin_test_loose" not in seams.kinds("squeeze")
    seams.setting_names("squeeze")  # every registered strategy is a dataclass


def test_register_itself_names_the_class_and_its_module(monkeypatch):
    from inftyformer.core.density import PaperDensity

    monkeypatch.setattr(seams, "REGISTRY", {s: dict(k) for s, k in seams.REGISTRY.items()})

    @dataclasses.dataclass(frozen=True)
    class Again(PaperDensity):
        kind = "paper"

    with pytest.raises(ValueError) as refused:
        seams.register(Again)
    assert "already registered by PaperDensity (module inftyformer.core.density)" in str(
        refused.value
    )
    assert f"Again (module {__name__})" in str(refused.value)

    class Loose:
        seam, kind = "squeeze", "loose"

    with pytest.raises(TypeError, match=r"must be a dataclass: .*Loose \(module .*test_strat"):
        seams.register(Loose)

    @dataclasses.dataclass(frozen=True)
    class Nameless:
        seam = "squeeze"

    with pytest.raises(TypeError, match="must name its kind: .*Nameless"):
        seams.register(Nameless)


def test_a_strategy_lists_its_own_changeable_settings(monkeypatch):
    """What a trained model may change is listed by the strategy that owns the settings (the
    core names none of ours), gathered per seam; a name that is not its setting is refused."""
    from inftyformer.core.config import CHANGEABLE_SETTINGS, changeable_settings
    from inftyformer.core.squeeze import FixedSqueeze

    monkeypatch.setattr(seams, "REGISTRY", {s: dict(k) for s, k in seams.REGISTRY.items()})
    assert "keep_first" not in CHANGEABLE_SETTINGS and "keep_first" in changeable_settings()

    @dataclasses.dataclass(frozen=True)
    class Wider(FixedSqueeze):
        kind = "plugin_test_wider"
        changeable = ("margin",)
        margin: int = 0

    seams.register(Wider)
    assert "margin" in seams.changeable_settings("squeeze")
    assert "margin" in changeable_settings()

    @dataclasses.dataclass(frozen=True)
    class Stray(FixedSqueeze):
        kind = "plugin_test_stray"
        changeable = ("tau", "nowhere")

    with pytest.raises(TypeError, match=r"Stray .*names \['nowhere'\], which are not its fields"):
        seams.register(Stray)
    assert "plugin_test_stray" not in seams.kinds("squeeze")
