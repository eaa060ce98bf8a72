"""The pretrained model's settings, one description for every door (no transformers import):

    AdapterConfig           how the memory is added to a pretrained causal LM: the memory
                            (`long_term`, a `LongTermConfig`, nested), how a block uses its read
                            (`memory_read`, a strategy), the segment, the window and the blocks
    PretrainedMemoryConfig  a training run's model: the base's folder, what trains and at which
                            learning rates, and its `AdapterConfig` (nested)

The Hugging Face model's own config (`inftyformer.hf.InftyformerConfig`) nests the same
`AdapterConfig` beside the base's config, saved as JSON in config.json.

How a block uses its read is a seam of the pretrained model (`core/seams.py`):

    "added"   (the paper's §4.2) the read has its own W^Q, W^K, W^V and output projection and
              is added after the block's attention output, zero at initialisation
    "heads"   (ours) the base's own attention heads read the memory's places and merge the read
              into their softmax by attention mass (`hf/head_read.py`); `memory_positions`:
              where the places sit for a rotary base ("window": all just beyond the window;
              "places": each at its own stream position; "ranks": as the last K tokens before
              the window), `token_mass`: the memory's mass counts the tokens each place stands for

Every setting also goes by a flat name (`--set memory_read=heads --set num_basis=2048`), resolved
into the tree; a name whose strategy was not chosen is refused, naming its owner.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar

from . import extensions  # noqa: F401  (registers our strategies: their settings are names here)
from ._checks import (
    check_bool,
    check_memory_layers,
    check_positive_int,
    check_range,
    check_segment_len,
)
from .core import seams
from .core.config import DERIVED_SETTINGS, LongTermConfig, changeable_settings
from .core.seams import Strategy, build, owners, register, setting_names
from .core.squeeze import FixedSqueeze
from .extensions.densities import NormalizedDensity
from .presets import preset_settings

READ_SEAM = "memory_read"


# ---------------------------------------------------------------------- how a block reads
@register
@dataclass(frozen=True)
class AddedRead(Strategy):
    """The paper's read on a pretrained model (§4.2): own projections, added after the
    attention output projection, zero at initialisation."""

    seam: ClassVar[str] = READ_SEAM
    kind: ClassVar[str] = "added"
    heads: ClassVar[bool] = False


# where a heads read puts the memory's places for a rotary base (module doc)
MEMORY_POSITIONS = ("window", "places", "ranks")


@register
@dataclass(frozen=True)
class HeadsRead(Strategy):
    """The base's own heads read the memory's places and merge the read by attention mass."""

    seam: ClassVar[str] = READ_SEAM
    kind: ClassVar[str] = "heads"
    heads: ClassVar[bool] = True

    memory_positions: str = "window"  # where the places sit for the heads: window, places, ranks
    token_mass: bool = False  # a place's mass counts the tokens it stands for
    changeable: ClassVar[tuple[str, ...]] = ("token_mass",)

    def __post_init__(self) -> None:
        if self.memory_positions not in MEMORY_POSITIONS:
            raise ValueError(
                f"memory_positions must be one of {MEMORY_POSITIONS}, got {self.memory_positions!r}"
            )
        check_bool("token_mass", self.token_mass)

    def check(self, memory: LongTermConfig) -> None:
        """The heads read a density that reads places; positions other than "window" need
        places that know where their tokens lie; `token_mass` places of as many tokens each."""
        if not memory.density.discrete:
            raise ValueError(
                "memory_read='heads' reads with a density that reads places: set "
                f"density='mixture' or 'content' (got {memory.density.kind!r})"
            )
        if self.memory_positions != "window" and not memory.squeeze.ordered:
            raise ValueError(
                f"memory_positions={self.memory_positions!r} needs places that know where their "
                f"tokens lie (squeeze='fill'), got squeeze={memory.squeeze.kind!r}"
            )
        if self.token_mass and not memory.squeeze.even:
            raise ValueError(
                "token_mass counts the tokens each place stands for: it needs a squeeze under "
                "which every place stands for as many tokens ('by_length' or 'fill'), got "
                f"squeeze={memory.squeeze.kind!r}"
            )


# ---------------------------------------------------------------------- the adapter's settings
# the pretrained model's memory by default: the paper's GPT-2 memory (§4.2: N = 512, widths
# {0.005, 0.01}, λ = 0.5, τ = 0.5, M = 512) with standardised scores (`NormalizedDensity`)
PRETRAINED_LONG_TERM = LongTermConfig(
    num_basis=512,
    widths=(0.005, 0.01),
    ridge_lambda=0.5,
    density=NormalizedDensity(),
    squeeze=FixedSqueeze(tau=0.5, num_samples=512),
)
# the memory's settings a pretrained model decides: its size is the base's hidden size, and it
# has its own W^Q (num_heads may be set: None is the base's number of heads)
ADAPTER_DECIDES = DERIVED_SETTINGS


def _memory_names() -> dict[str, Any]:
    return {k: v for k, v in LongTermConfig.user_settings().items() if k not in ADAPTER_DECIDES}


def takes_adapter_settings(cls: type) -> type:
    """Class decorator, over @dataclass, of `AdapterConfig`: its constructor (hence
    `dataclasses.replace`) also takes the memory's settings and the read's by their flat names,
    and the read by its kind's name or as a dict (JSON)."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **settings: Any) -> None:
        memory = {k: settings.pop(k) for k in list(settings) if k in _memory_names()}
        long_term = settings.get("long_term", PRETRAINED_LONG_TERM)
        if isinstance(long_term, dict):  # JSON
            long_term = LongTermConfig(
                **{k: v for k, v in long_term.items() if k not in ADAPTER_DECIDES}
            )
        if memory or "long_term" in settings:
            settings["long_term"] = replace(long_term, **memory) if memory else long_term
        names = setting_names(READ_SEAM)
        flat = {k: settings.pop(k) for k in list(settings) if k in names}
        chosen = settings.get(READ_SEAM)
        if flat or not isinstance(chosen, Strategy | None):
            settings[READ_SEAM] = build(READ_SEAM, chosen, AddedRead(), flat)
        init(self, *args, **settings)

    cls.__init__ = __init__
    return cls


@takes_adapter_settings
@dataclass(frozen=True)
class AdapterConfig:
    """How the long-term memory is added to a pretrained causal LM (`inftyformer.hf`).

    long_term       the memory (`LongTermConfig`; its size is the base's hidden size, its
                    num_heads None: the base's)
    memory_read     how a block uses its read: `AddedRead` or `HeadsRead` (module doc)
    segment_len     L: tokens per call when a long document is streamed; None: 256, or as
                    many as the base's positions leave room for (`decide_lengths`)
    window          W: how many of the stream's previous tokens each call recomputes as context
                    before its own (the short-term window); the long-term memory holds what
                    left it. None: one segment, as far as the base's positions allow; 0: each
                    call attends within itself
    memory_layers   the blocks (0-based) that get a long-term memory; None: every block

    What depends on the base (its positions, heads and blocks) is checked where the base is
    known (`inftyformer.hf.InftyformerConfig`)."""

    long_term: LongTermConfig = PRETRAINED_LONG_TERM
    memory_read: Strategy = field(default_factory=AddedRead)
    segment_len: int | None = None  # None: `DEFAULT_SEGMENT_LEN` within the base's positions
    window: int | None = None
    memory_layers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        lt = self.long_term
        if not isinstance(lt, LongTermConfig):
            raise TypeError(f"long_term must be a LongTermConfig, got {type(lt).__name__}")
        unset = {f.name: f.default for f in fields(LongTermConfig)}
        for name in ADAPTER_DECIDES:
            if getattr(lt, name) != unset[name]:
                raise ValueError(f"long_term.{name} is the model's: leave it unset")
        check_range("min_sigma_sq", lt.min_sigma_sq, 0.0, 1.0, low_open=True)
        read = self.memory_read
        if not isinstance(read, Strategy) or read.seam != READ_SEAM:
            raise TypeError(f"memory_read must be a read strategy, got {read!r}")
        read.check(lt)
        if self.segment_len is not None:
            check_segment_len(self.segment_len)
        if self.window is not None:
            check_positive_int("window", self.window, minimum=0)
        if self.memory_layers is not None:
            layers = check_memory_layers(self.memory_layers, None)
            object.__setattr__(self, "memory_layers", tuple(layers))
        before = getattr(lt.squeeze, "salient_before", 0)
        if self.window is not None and before > self.window:
            raise ValueError(
                f"salient_before ({before}) must be at most the window ({self.window}): a "
                "token's salience looks that far ahead, at tokens that come after it while it "
                "is still in the window"
            )

    def __getattr__(self, name: str) -> Any:  # only when `name` is not a field
        """A setting of the memory or of the read by its flat name."""
        if name in setting_names(READ_SEAM) and READ_SEAM in self.__dict__:
            read = self.__dict__[READ_SEAM]
            if name in read.settings():
                return getattr(read, name)
            which = " or ".join(repr(k) for k in owners(READ_SEAM, name))
            raise AttributeError(
                f"{name} is a setting of memory_read {which}; this model's memory_read is "
                f"{read.kind!r}"
            )
        if name in _memory_names() and "long_term" in self.__dict__:
            return getattr(self.__dict__["long_term"], name)
        raise AttributeError(f"'AdapterConfig' object has no attribute {name!r}")

    def replace(self, **changes: Any) -> AdapterConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def setting_types(cls) -> dict[str, Any]:
        """Every setting a user sets, flat, and its type."""
        hints = typing.get_type_hints(cls)
        out = {f.name: hints[f.name] for f in fields(cls) if f.name != "long_term"}
        out[READ_SEAM] = str
        return {**out, **setting_names(READ_SEAM), **_memory_names()}

    def settings(self) -> dict[str, Any]:
        """Every setting, flat (the chosen strategies' only); JSON types."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "long_term":
                out.update({k: v for k, v in value.settings().items() if k not in ADAPTER_DECIDES})
            elif isinstance(value, Strategy):
                out[f.name] = value.kind
                out.update(value.settings())
            else:
                out[f.name] = value
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    def to_dict(self) -> dict[str, Any]:
        """JSON, nested: {"long_term": {…, "density": {"kind": …}, …}, "memory_read": {"kind":
        …}, "segment_len": …, …}."""
        lt = {k: v for k, v in self.long_term.to_dict().items() if k not in ADAPTER_DECIDES}
        out = {"long_term": lt, READ_SEAM: self.memory_read.to_dict()}
        for f in fields(self):
            if f.name not in out:
                value = getattr(self, f.name)
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AdapterConfig:
        """`to_dict`'s JSON, or the flat `settings`."""
        if not isinstance(data, dict):
            raise ValueError(f"the adapter's settings must be a dict, got {data!r}")
        unknown = sorted(set(data) - set(cls.setting_types()) - {"long_term"})
        if unknown:
            raise ValueError(f"unknown adapter settings {unknown}")
        return cls(**data)

    @property
    def heads_read(self) -> bool:
        """The base's own heads read the memory (`HeadsRead`)."""
        return self.memory_read.heads

    @property
    def positions(self) -> str:
        """Where a heads read puts the places (`MEMORY_POSITIONS`); "window" for an added read."""
        return getattr(self.memory_read, "memory_positions", "window")

    @property
    def salience(self) -> tuple[bool, int]:
        """Whether the memory keeps places by the tokens' salience (the model then computes its
        surprisal), and how many tokens before a burst count as salient too."""
        squeeze = self.long_term.squeeze
        return squeeze.wants_salience, getattr(squeeze, "salient_before", 0)


DEFAULT_SEGMENT_LEN = 256


def decide_lengths(adapter: AdapterConfig, limit: int | None) -> AdapterConfig:
    """The segment and the window for a base of `limit` positions (None: unbounded), one rule
    for every door: L = 256 unless set, at most what the positions leave beside the window (half
    of them when the window is one segment); W = one segment unless set, as far as the positions
    allow. Refuses W + L beyond the positions."""
    L, W = adapter.segment_len, adapter.window
    if L is None:
        room = DEFAULT_SEGMENT_LEN if limit is None else limit
        if limit is not None and W is None:
            room = limit // 2
        elif limit is not None:
            room = limit - W
        L = max(1, min(DEFAULT_SEGMENT_LEN, room))
    if limit is not None and L > limit:
        raise ValueError(
            f"segment_len must be in [1, {limit}] (the base's max_position_embeddings), got {L}"
        )
    if W is None:  # one segment, never positions past the base's
        W = L if limit is None else min(L, limit - L)
    if limit is not None and W + L > limit:
        raise ValueError(
            f"window + segment_len must be at most {limit} (the base's max_position_embeddings), "
            f"got {W} + {L}"
        )
    return replace(adapter, segment_len=L, window=W)


def base_blocks(base_model: object) -> int | None:
    """The number of blocks of the base in folder `base_model` (its config.json), or None."""
    if not isinstance(base_model, str):
        return None
    path = Path(base_model).expanduser() / "config.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    data = data.get("text_config", data)
    blocks = data.get("num_hidden_layers", data.get("n_layer"))
    return None if blocks is None else int(blocks)


def base_positions(config: dict[str, Any]) -> int | None:
    """A base's number of positions from its config.json's dict (None: not bounded)."""
    limit = config.get("max_position_embeddings", config.get("n_positions"))
    return None if limit is None else int(limit)


# ---------------------------------------------------------------------- a training run's model
def takes_nested_adapter(cls: type) -> type:
    """Class decorator, over @dataclass, of `PretrainedMemoryConfig`: its constructor also
    takes every `AdapterConfig` setting by its flat name and applies it to `adapter`."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **settings: Any) -> None:
        preset = settings.pop("preset", None)
        if preset is not None:  # the preset's settings for this base, under the given ones
            blocks = base_blocks(settings.get("base_model"))
            settings = {**preset_settings(preset, "pretrained", blocks), **settings}
        names = AdapterConfig.setting_types()
        flat = {k: settings.pop(k) for k in list(settings) if k in names or k == "long_term"}
        if flat:
            settings["adapter"] = replace(settings.get("adapter", AdapterConfig()), **flat)
        elif isinstance(settings.get("adapter"), dict):
            settings["adapter"] = AdapterConfig.from_dict(settings["adapter"])
        init(self, *args, **settings)

    cls.__init__ = __init__
    return cls


@takes_nested_adapter
@dataclass(frozen=True)
class PretrainedMemoryConfig:
    """A pretrained causal LM plus long-term memory, as a training run builds it (paper §4.2,
    GPT-2; `docs/hf.md`): the base's folder, what trains (`freeze_base`: the memory only) at
    which learning rates (the paper's split: the memory at `memory_lr` without weight decay, the
    base at the run's `lr`), and the adapter (`AdapterConfig`, nested; its settings also by
    their flat names: ``PretrainedMemoryConfig(base_model=DIR, num_basis=256)``,
    ``config.num_basis``; or a preset's, `inftyformer.presets`, under the given ones:
    ``PretrainedMemoryConfig(base_model=DIR, preset="salient-places", window=512)``)."""

    base_model: str  # directory of a Hugging Face causal LM (config.json, weights, tokenizer)
    memory: bool = True  # False: the base alone, for comparison (attends within its segment)
    freeze_base: bool = False  # train the memory only (an adapter on a frozen model)
    memory_lr: float = 2.5e-4  # learning rate of the memory's parameters (no weight decay)
    # the density heads w_μ, w_σ (None: memory_lr): at the paper's rate they barely move in a
    # short run (Adam moves a weight by about the learning rate per step), so reads stay flat
    density_lr: float | None = None  # learning rate of the density heads; None: memory_lr
    adapter: AdapterConfig = field(default_factory=AdapterConfig)
    vocab_size: int = 0  # read from the base's config.json

    def __post_init__(self) -> None:
        if not isinstance(self.base_model, str) or not self.base_model:
            raise ValueError(f"base_model must be a directory path, got {self.base_model!r}")
        config = Path(self.base_model).expanduser() / "config.json"
        if not config.is_file():
            raise FileNotFoundError(
                f"base_model {self.base_model} is not a Hugging Face model directory (no "
                "config.json); convert a GGUF file with `inftyformer convert-gguf`"
            )
        for name in ("memory", "freeze_base"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if not isinstance(self.adapter, AdapterConfig):
            raise TypeError(f"adapter must be an AdapterConfig, got {type(self.adapter).__name__}")
        check_range("memory_lr", self.memory_lr, 0.0, low_open=True)
        if self.density_lr is not None:
            check_range("density_lr", self.density_lr, 0.0, low_open=True)
        data = json.loads(config.read_text(encoding="utf-8"))
        data = data.get("text_config", data)  # a saved memory model nests the base's
        if self.adapter.memory_layers is not None:
            blocks = data.get("num_hidden_layers", data.get("n_layer"))
            check_memory_layers(self.adapter.memory_layers, blocks)
        if not self.vocab_size:
            object.__setattr__(self, "vocab_size", int(data["vocab_size"]))
        object.__setattr__(self, "adapter", decide_lengths(self.adapter, base_positions(data)))

    def __getattr__(self, name: str) -> Any:  # only when `name` is not a field
        if "adapter" in self.__dict__ and (
            name in AdapterConfig.setting_types() or name == "long_term"
        ):
            return getattr(self.__dict__["adapter"], name)
        raise AttributeError(f"'PretrainedMemoryConfig' object has no attribute {name!r}")

    @property
    def model_type(self) -> str:
        return "infty" if self.memory else "transformer"  # the memory it adds, or none

    def describe(self) -> str:
        return f"{Path(self.base_model).name} + {'long-term' if self.memory else 'no'} memory"

    def frozen_base(self) -> tuple[str, str] | None:
        """(directory, state-dict prefix) of the base when it is frozen: a checkpoint then
        refers to it instead of holding it (`inftyformer.base_weights`); None when it trains."""
        if self.freeze_base and self.memory:
            return self.base_model, "lm.base."
        return None

    def replace(self, **changes: Any) -> PretrainedMemoryConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def setting_types(cls) -> dict[str, Any]:
        """Every setting, flat (the adapter's by their names), and its type."""
        hints = typing.get_type_hints(cls)
        own = {f.name: hints[f.name] for f in fields(cls) if f.name != "adapter"}
        return {**own, **AdapterConfig.setting_types()}

    def to_dict(self) -> dict[str, Any]:
        """Every setting, flat (the chosen strategies' only)."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "adapter"}
        return {**own, **self.adapter.settings()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PretrainedMemoryConfig:
        """A saved config (`to_dict`, flat; or with the adapter nested)."""
        data = dict(data)
        unknown = sorted(set(data) - set(cls.setting_types()) - {"adapter", "long_term"})
        if unknown:
            raise ValueError(f"unknown PretrainedMemoryConfig fields {unknown}")
        return cls(**data)

    def with_memory_settings(self, overrides: dict[str, Any] | None = None) -> Any:
        """Other memory settings for evaluation (`pretrained_changeable()`); the fields that
        shape the weights or what trains stay."""
        if not overrides:
            return self
        allowed = pretrained_changeable()
        bad = sorted(set(overrides) - set(allowed))
        if bad:
            raise ValueError(
                f"cannot change {', '.join(bad)} of a trained pretrained model; allowed: "
                f"{', '.join(allowed)}"
            )
        return self.replace(**overrides)


# what a trained pretrained model may change, like ModelConfig's MEMORY_SETTINGS: not the base,
# N, the widths or the gate (they shape weights), nor whether the memory or the base trains;
# beside the long-term memory's and the read's (`pretrained_changeable`)
PRETRAINED_MEMORY_SETTINGS = ("segment_len", "window", "memory_lr", "density_lr")


def pretrained_changeable() -> tuple[str, ...]:
    """Every setting a trained pretrained model may change: `PRETRAINED_MEMORY_SETTINGS`, the
    long-term memory's (`core.config.changeable_settings`) and its read's
    (`Strategy.changeable` of the `memory_read` strategies)."""
    own = PRETRAINED_MEMORY_SETTINGS
    return (*own[:2], *changeable_settings(), *seams.changeable_settings(READ_SEAM), *own[2:])


__all__ = [
    "ADAPTER_DECIDES",
    "AddedRead",
    "AdapterConfig",
    "HeadsRead",
    "MEMORY_POSITIONS",
    "DEFAULT_SEGMENT_LEN",
    "PRETRAINED_LONG_TERM",
    "PRETRAINED_MEMORY_SETTINGS",
    "PretrainedMemoryConfig",
    "pretrained_changeable",
    "base_blocks",
    "base_positions",
    "decide_lengths",
]
