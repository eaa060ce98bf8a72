"""Settings written flat: a config whose fields include strategies (`seams.Strategy`) also takes
the strategies' own settings by their flat names, as the command line writes them
(`--set keep_first=64`), and reads them back the same way (``config.tau`` is
``config.squeeze.tau``). Each flat name goes to the strategy that owns it (`seams.build`); a name
whose strategy was not chosen is refused, naming the strategies that own it.

    @takes_flat_settings("density", "squeeze")
    @dataclass(frozen=True)
    class Config:
        density: Strategy = field(default_factory=PaperDensity)
        ...
        def __getattr__(self, name):
            return flat_setting(self, name, ("density", "squeeze"))
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any

from .seams import Strategy, build, kinds, owners, setting_names


def takes_flat_settings(*seams: str) -> Callable[[type], type]:
    """Class decorator, over @dataclass: the constructor (hence `dataclasses.replace`) also
    takes the settings of the strategies at `seams` (fields of those names) by their flat names,
    and a strategy by its kind's name or as a dict (JSON)."""

    def decorate(cls: type) -> type:
        init = cls.__init__
        defaults = {seam: next(f for f in fields(cls) if f.name == seam) for seam in seams}

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **settings: Any) -> None:
            for seam in seams:
                names = setting_names(seam)
                flat = {k: settings.pop(k) for k in list(settings) if k in names}
                chosen = settings.get(seam)
                if seam in settings and chosen is None:  # not "keep the default": say so
                    raise TypeError(f"{seam} must be a {seam} strategy or one of {kinds(seam)}, "
                                    "got None")  # fmt: skip
                if flat or not isinstance(chosen, Strategy | None):
                    default = defaults[seam].default_factory()
                    settings[seam] = build(seam, chosen, default, flat)
            init(self, *args, **settings)

        cls.__init__ = __init__
        return cls

    return decorate


def flat_setting(config: Any, name: str, seams: Sequence[str]) -> Any:
    """The setting `name` of one of `config`'s strategies at `seams` (what a config's
    `__getattr__` answers for a name that is not a field); an AttributeError naming the
    strategies that own it when the chosen one does not."""
    for seam in seams:
        strategy = config.__dict__.get(seam)
        if strategy is None or name.startswith("_"):
            continue
        if hasattr(type(strategy), name) or name in strategy.settings():
            return getattr(strategy, name)
        if name in setting_names(seam):
            which = " or ".join(repr(k) for k in owners(seam, name))
            raise AttributeError(
                f"{name} is a setting of {seam} {which}; this config's {seam} is {strategy.kind!r}"
            )
    raise AttributeError(f"{type(config).__name__!r} object has no attribute {name!r}")


def flat_dict(config: Any, skip: Sequence[str] = ()) -> dict[str, Any]:
    """Every setting of `config` (a dataclass) flat, but those in `skip`: each strategy's kind
    by its field's name and its settings beside it (what `type(config)(**flat)` takes back)."""
    out: dict[str, Any] = {}
    for f in fields(config):
        if f.name in skip:
            continue
        value = getattr(config, f.name)
        if isinstance(value, Strategy):
            out[f.name] = value.kind
            out.update(value.settings())
        else:
            out[f.name] = value
    return out


__all__ = ["flat_dict", "flat_setting", "takes_flat_settings"]
