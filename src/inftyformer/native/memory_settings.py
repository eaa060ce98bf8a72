"""How a model's config nests the long-term memory's settings (`WithLongTerm`): the native
`ModelConfig` and the pretrained `PretrainedMemoryConfig` hold a `LongTermConfig` as `long_term`,
and also take and name its settings flat, as the command line (`--set num_basis=256`) and every
saved run name them."""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import fields, replace
from typing import Any, ClassVar

from .. import extensions  # noqa: F401  (registers our strategies: their settings are names here)
from .._checks import check_range
from ..core.config import DERIVED_SETTINGS, LongTermConfig


class WithLongTerm:
    """A model's config with the long-term memory's settings nested as `long_term` (a
    `LongTermConfig` without what the model decides: `MODEL_DECIDES`, filled in by the model's
    `long_term_config()`); a frozen dataclass decorated with `takes_long_term_settings`.

    The memory's settings also go by their own names, flat: the constructor and `replace` take
    them (on top of `long_term`), `to_dict` writes them (the chosen strategies' only),
    `from_dict` reads them (or a nested "long_term"), and `config.num_basis` reads
    `config.long_term.num_basis`."""

    long_term: LongTermConfig
    MODEL_DECIDES: ClassVar[tuple[str, ...]] = DERIVED_SETTINGS

    @classmethod
    def long_term_names(cls) -> tuple[str, ...]:
        """The memory's settings a user may set, by name (every strategy's)."""
        return tuple(n for n in LongTermConfig.user_settings() if n not in cls.MODEL_DECIDES)

    @classmethod
    def setting_types(cls) -> dict[str, Any]:
        """Every setting, flat (the memory's by their names), and its type."""
        own = typing.get_type_hints(cls)
        out = {f.name: own[f.name] for f in fields(cls) if f.init and f.name != "long_term"}
        memory = LongTermConfig.user_settings()
        return {**out, **{name: memory[name] for name in cls.long_term_names()}}

    def replace(self, **changes: Any) -> Any:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Every setting, flat (JSON: tuples as lists); of the memory, the chosen strategies'."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        del own["long_term"]
        memory = self.long_term.settings()
        flat = {**own, **{k: v for k, v in memory.items() if k not in self.MODEL_DECIDES}}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in flat.items()}

    @classmethod
    def _from_saved(cls, data: dict[str, Any], defaults: dict[str, Any]) -> Any:
        """A saved config: flat, or with the memory's settings nested under "long_term";
        `defaults` for settings a saved config may lack."""
        data = dict(data)
        nested = data.pop("long_term", None) or {}
        if not isinstance(nested, dict):
            raise ValueError(f"long_term must be a dict of settings, got {type(nested).__name__}")
        unset = {f.name: f.default for f in fields(LongTermConfig)}
        for name in cls.MODEL_DECIDES:  # written unset by `LongTermConfig.to_dict`, or refused
            if name in nested and nested.pop(name) != unset[name]:
                raise ValueError(f"long_term.{name} is the model's: leave it unset")
        data = {**nested, **data}
        unknown = sorted(set(data) - set(cls.setting_types()))
        if unknown:
            raise ValueError(f"unknown {cls.__name__} fields {unknown}")
        return cls(**{**defaults, **data})

    def _check_long_term(self) -> None:
        """`long_term` is a LongTermConfig whose model-decided settings are left to the model;
        a model's floor of σ² is at most 1."""
        lt = self.long_term
        if not isinstance(lt, LongTermConfig):
            raise TypeError(f"long_term must be a LongTermConfig, got {type(lt).__name__}")
        unset = {f.name: f.default for f in fields(LongTermConfig)}
        for name in self.MODEL_DECIDES:
            if getattr(lt, name) != unset[name]:
                raise ValueError(f"long_term.{name} is the model's: leave it unset")
        check_range("min_sigma_sq", lt.min_sigma_sq, 0.0, 1.0, low_open=True)

    def __getattr__(self, name: str) -> Any:  # only when `name` is not an attribute
        if name in type(self).long_term_names() and "long_term" in self.__dict__:
            return getattr(self.long_term, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def takes_long_term_settings(cls: type) -> type:
    """Class decorator, over @dataclass, of a `WithLongTerm` config: its constructor (hence
    `dataclasses.replace`) also takes the memory's settings by their own names and applies them
    to `long_term` (given, or the class's default)."""
    init = cls.__init__
    default = next(f.default for f in fields(cls) if f.name == "long_term")

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **settings: Any) -> None:
        names = set(cls.long_term_names())
        memory = {k: settings.pop(k) for k in list(settings) if k in names}
        if memory:
            settings["long_term"] = replace(settings.get("long_term", default), **memory)
        init(self, *args, **settings)

    cls.__init__ = __init__
    return cls


__all__ = ["WithLongTerm", "takes_long_term_settings"]
