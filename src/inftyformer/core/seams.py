"""The seams of the long-term memory: where a choice the paper makes one way can be made another,
and the registry of the strategies that make it (`docs/ARCHITECTURE.md`).

    seam       protocol    the paper's (core)        chosen by
    density    `Density`   `density.PaperDensity`    how a query's scores s = K q / √d become the
                                                     density 𝒩(μ, σ²) it reads (§3.2)
    squeeze    `Squeeze`   `squeeze.FixedSqueeze`    how the old signal makes room for the new
                                                     segment, and which places are kept (§3.3)

A strategy is a frozen dataclass (`Strategy`) that names its seam and kind, validates its own
settings when built, checks once what it needs of the rest of the memory's settings (`check`:
a capability, never another strategy's name) and lists the settings a trained model may change
(`changeable`, gathered per seam by `changeable_settings`). Strategies register by kind
(`register`): the core's when their module is imported; any package's that declares a module in
the entry-point group "inftyformer.strategies" (as this library's pyproject.toml declares its
extensions) when a kind is first looked up (`discover`), so that the core names no strategy but
its own.

A memory's settings can then be written flat (`--set keep_first=64`): `build` resolves each flat
name to the strategy that owns it and refuses a name that belongs to a strategy that was not
chosen, naming its owner. A setting given as a fallback (`presets.fallback`: a preset's, under
the user's) is not refused: it goes to the chosen strategy when that has it and is dropped
otherwise, so that a user who chooses another strategy than a preset's gets none of the old
strategy's settings.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import sys
import typing
import warnings
from typing import Any, ClassVar, Protocol

import torch

from ..presets import is_fallback, plain

SEAMS = ("density", "squeeze")


class Strategy:
    """A choice behind one of the core's seams: a frozen dataclass whose class names its `seam`
    and its `kind` (the name a user gives). Its fields are its own settings."""

    seam: ClassVar[str]
    kind: ClassVar[str]
    # its settings a trained model may change (resume with other settings, evaluation): those
    # that change how the memory is updated or read, not what its weights learned
    changeable: ClassVar[tuple[str, ...]] = ()

    def settings(self) -> dict[str, Any]:
        """Its own settings, by name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def to_dict(self) -> dict[str, Any]:
        """JSON: {"kind": …, its settings} (tuples as lists)."""
        out = {"kind": self.kind}
        for name, value in self.settings().items():
            out[name] = list(value) if isinstance(value, tuple) else value
        return out

    def check(self, config: Any) -> None:
        """Refuse a memory (`config`: its `LongTermConfig`) this strategy cannot serve: what it
        needs of the paper's settings or of the other seam's strategy, as a capability."""

    def describe(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.settings().items())
        return f"{self.kind}({shown})"


REGISTRY: dict[str, dict[str, type[Strategy]]] = {seam: {} for seam in SEAMS}
ENTRY_POINTS = "inftyformer.strategies"
_discovered: list[bool] = []  # whether the installed packages' strategies were loaded
_loading: list[str] = []  # the plugin being imported: "entry point NAME (module MODULE)"
_brought_by: dict[type, str] = {}  # the strategies plugins registered: which plugin


def discover() -> None:
    """Import, once, the modules installed packages declare in the entry-point group
    "inftyformer.strategies" (they register their strategies when imported). A plugin that
    fails to import, or whose strategies cannot be registered, is skipped with a one-line
    warning naming it (the strategies of its module that failed are taken back); the core's
    strategies and the other plugins' load all the same."""
    if _discovered:
        return
    _discovered.append(True)  # (the core's own registered first: the package imports them)
    for entry in importlib.metadata.entry_points(group=ENTRY_POINTS):
        plugin = f"entry point {entry.name!r} (module {entry.value!r})"
        _loading.append(plugin)
        try:
            entry.load()
        except Exception as exc:  # a plugin's own failure, whatever it is: not ours to raise
            _take_back(plugin)
            message = " ".join(str(exc).split()) or "(no message)"
            warnings.warn(
                f"skipped the strategy plugin {plugin}: {type(exc).__name__}: {message}",
                RuntimeWarning,
                stacklevel=2,
            )
        finally:
            _loading.pop()


def _take_back(plugin: str) -> None:
    """Unregister what `plugin` registered from modules its failure left unimported (Python
    drops a module that failed from `sys.modules`; a module that did import keeps its)."""
    for kinds in REGISTRY.values():
        for kind, cls in list(kinds.items()):
            if _brought_by.get(cls) == plugin and cls.__module__ not in sys.modules:
                del kinds[kind]
                del _brought_by[cls]


def _origin(cls: object, plugin: str | None) -> str:
    """`cls` by its name, its module and the plugin that brought it (if one did)."""
    name = getattr(cls, "__qualname__", None) or repr(cls)
    where = f"{name} (module {getattr(cls, '__module__', '?')}"
    return where + (f", from the strategy plugin {plugin})" if plugin else ")")


def register(cls: type[Strategy]) -> type[Strategy]:
    """Class decorator: `cls` is chosen by its kind at its seam (a seam of the core's, or one a
    model adds, e.g. how a pretrained model uses its read). It must be a dataclass naming its
    seam and kind, and no other class may have that kind at that seam: the errors name the
    classes, their modules and the plugins that brought them."""
    plugin = _loading[-1] if _loading else None
    if not isinstance(cls, type) or not dataclasses.is_dataclass(cls):
        raise TypeError(f"a strategy must be a dataclass: {_origin(cls, plugin)} is not one")
    for attribute in ("seam", "kind"):
        if not isinstance(getattr(cls, attribute, None), str):
            raise TypeError(
                f"a strategy must name its {attribute}: {_origin(cls, plugin)} does not"
            )
    stray = sorted(set(cls.changeable) - {f.name for f in dataclasses.fields(cls)})
    if stray:
        raise TypeError(
            f"a strategy's changeable settings must be its own: {_origin(cls, plugin)} names "
            f"{stray}, which are not its fields"
        )
    kinds = REGISTRY.setdefault(cls.seam, {})
    there = kinds.get(cls.kind)
    if there is not None and there is not cls:
        raise ValueError(
            f"{cls.seam} {cls.kind!r} is already registered by "
            f"{_origin(there, _brought_by.get(there))}; {_origin(cls, plugin)} registers it "
            "again: one of the two must take another kind"
        )
    kinds[cls.kind] = cls
    if plugin is not None:
        _brought_by.setdefault(cls, plugin)
    return cls


def kinds(seam: str) -> tuple[str, ...]:
    discover()
    return tuple(REGISTRY.get(seam, {}))


def kinds_that(seam: str, capability: str) -> tuple[str, ...]:
    """The kinds at `seam` whose strategy declares `capability` (a class attribute that is
    true, e.g. a density that is `discrete`): what an error can offer instead of names."""
    discover()
    return tuple(k for k, cls in REGISTRY.get(seam, {}).items() if getattr(cls, capability, False))


def setting_names(seam: str) -> dict[str, type]:
    """Every flat setting of the strategies at `seam` and its type."""
    discover()
    out: dict[str, type] = {}
    for cls in REGISTRY.get(seam, {}).values():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            out.setdefault(f.name, hints[f.name])
    return out


def changeable_settings(seam: str) -> tuple[str, ...]:
    """Every flat setting of the strategies at `seam` that a trained model may change
    (`Strategy.changeable`), in the order the strategies registered."""
    discover()
    out: dict[str, None] = {}
    for cls in REGISTRY.get(seam, {}).values():
        out.update(dict.fromkeys(cls.changeable))
    return tuple(out)


def owners(seam: str, name: str) -> list[str]:
    """The kinds at `seam` that have a setting `name`."""
    discover()
    return [
        kind
        for kind, cls in REGISTRY.get(seam, {}).items()
        if name in {f.name for f in dataclasses.fields(cls)}
    ]


def lookup(seam: str, kind: object) -> type[Strategy]:
    discover()
    if not isinstance(kind, str) or kind not in REGISTRY.get(seam, {}):
        raise ValueError(f"{seam} must be one of {kinds(seam)}, got {kind!r}")
    return REGISTRY[seam][kind]


def build(seam: str, chosen: object, base: Strategy | None, flat: dict[str, Any]) -> Strategy:
    """The strategy at `seam` from what a user wrote: `chosen` a strategy, a kind's name, a dict
    {"kind": …, settings} (JSON) or None (keep `base`, the one in place); `flat` the flat
    settings given with it that belong to this seam. A setting the chosen kind does not have is
    refused, naming the kinds that have it, unless it is a fallback (then dropped)."""
    if isinstance(chosen, Strategy):
        if chosen.seam != seam:
            raise TypeError(f"{seam} must be a {seam} strategy, got {type(chosen).__name__}")
        cls, values = type(chosen), chosen.settings()
    elif isinstance(chosen, dict):
        data = dict(chosen)
        cls, values = lookup(seam, data.pop("kind", None)), data
    elif chosen is None:
        if base is None:
            raise ValueError(f"no {seam} chosen")
        cls, values = type(base), base.settings()
    else:
        cls, values = lookup(seam, chosen), {}
    own = {f.name for f in dataclasses.fields(cls)}
    for name, value in flat.items():
        if is_fallback(value):  # a preset's setting: its strategy's, or dropped
            if name in own:
                values[name] = plain(value)
            continue
        if name not in own:
            which = " or ".join(repr(k) for k in owners(seam, name))
            raise ValueError(
                f"{name} is a setting of {seam} {which}; this memory's {seam} is {cls.kind!r} "
                f"(set {seam}={owners(seam, name)[0]!r} to use it)"
            )
        values[name] = value
    unknown = sorted(set(values) - own)
    if unknown:
        raise ValueError(f"{seam} {cls.kind!r} has no settings {unknown}; it has {sorted(own)}")
    return cls(**values)


# ---------------------------------------------------------------------- the protocols
class Density(Protocol):
    """How a query's density over the memory's time axis is formed (paper §3.2) and read.

    prepare(attention, state, dtype) → a `density.PreparedMemory`: what every read of one memory
        state shares (computed once per state: values V, the keys or the folded heads)
    read(attention, q, prepared, with_mass) → a `density.DensityRead`: per head and query the
        read z = E_p[v(t)], μ, σ² and (a discrete density, `with_mass`) the log-mass
        log Σ_n exp(s_n) that a read merged into other attention needs; q [batch, H, Q, d]
        projected queries
    initial_sigma_sq(config) → σ² that w_σ's bias starts at, or None (PyTorch's initialisation)
    discrete: the density is a discrete attention over the basis centres (reads places, has a
        log-mass)"""

    kind: ClassVar[str]
    discrete: ClassVar[bool]

    def prepare(self, attention: Any, state: Any, dtype: torch.dtype) -> Any: ...

    def read(self, attention: Any, q: torch.Tensor, prepared: Any, with_mass: bool) -> Any: ...

    def initial_sigma_sq(self, config: Any) -> float | None: ...


class Squeeze(Protocol):
    """How the unbounded update (paper §3.3) makes room for new vectors, and which places of the
    signal it keeps.

    fit(memory, state, x, generator, salience) → (B [batch, N, e], samples, records): the new
        coefficients after fitting the (gated) new vectors x [batch, L, e] into `state`, where
        the old signal was read (for inspection) and the squeeze's own records of the stream
        after the update (`LongTermState.records`; the state's when it keeps none); `salience`
        [batch, L] are per-token scores a squeeze may keep places by (`wants_salience`)
    extent(stored, num_centers) → float64 [batch]: the stream lies on [0, e] of the signal
    initial_records(batch, num_centers, device) → {name: [batch, ...]}: the records it keeps
        in a state, as an empty memory holds them (zeros; {}: none)
    check_records(state, name, values) → queue in `values` what its records must satisfy
    resamples: the old signal is resampled between the centres (the update's gain applies)
    wants_salience: its update needs the new tokens' `salience`
    sticky: where past reads attended is recorded (sticky memories, §3.4)
    even: every place stands for as many tokens
    partial: the signal may hold the stream on part of [0, 1] only (its reads skip the rest)"""

    kind: ClassVar[str]
    resamples: ClassVar[bool]
    partial: ClassVar[bool]
    even: ClassVar[bool]
    wants_salience: bool

    def fit(
        self,
        memory: Any,
        state: Any,
        x: torch.Tensor,
        generator: torch.Generator | None,
        salience: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]: ...

    def extent(self, stored: torch.Tensor, num_centers: int) -> torch.Tensor: ...

    def initial_records(
        self, batch: int, num_centers: int, device: torch.device | str | None
    ) -> dict[str, torch.Tensor]: ...

    def check_records(self, state: Any, name: str, values: Any) -> None: ...


__all__ = [
    "Density",
    "REGISTRY",
    "SEAMS",
    "Squeeze",
    "Strategy",
    "build",
    "changeable_settings",
    "discover",
    "kinds",
    "kinds_that",
    "lookup",
    "owners",
    "register",
    "setting_names",
]
