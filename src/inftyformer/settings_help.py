"""What `--set help` prints: each setting's type, default and one line of meaning, read from the
config classes themselves (a field's trailing comment, or the first line of a strategy's doc), so
the list cannot drift from the code.

    field_notes(cls)           {field: its trailing comment} in the class's source
    describe_settings(cls)     [(name, type, default, meaning)] of a config's flat settings
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from typing import Any

_FIELD = re.compile(r"^    (\w+)\s*:\s*[^#]*?#\s*(.+?)\s*$")


_BARE_FIELD = re.compile(r"^    (\w+)\s*:\s*[^#=]+(=.*)?$")
_DOC_ROW = re.compile(r"^\s{4}(\w+)\s{2,}(\S.*?)\s*$")


@functools.cache
def field_notes(cls: type) -> dict[str, str]:
    """One line of meaning per field of `cls` and its bases: the field line's trailing comment,
    else the first line of its row in the class doc ("    name    meaning")."""
    notes: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        names = {f.name for f in dataclasses.fields(klass)}
        for line in (klass.__doc__ or "").splitlines():
            match = _DOC_ROW.match(line)
            if match and match.group(1) in names:
                notes.setdefault(match.group(1), match.group(2))
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        above: list[str] = []  # the comment lines right above a field
        for line in source.splitlines():
            if line.startswith("    # "):
                above.append(line[6:].strip())
                continue
            match = _FIELD.match(line) or _BARE_FIELD.match(line)
            if match:
                note = match.group(2) if match.re is _FIELD else None
                if note is None or note.startswith(("fmt:", "noqa", "type:")):
                    note = " ".join(above)
                if note:
                    notes[match.group(1)] = note
            above = []
    return notes


def _owners(cls: type) -> list[type]:
    """The dataclasses a flat setting of `cls` may live in: itself, the configs nested in it
    (their settings go by their own names) and every registered strategy."""
    from .core import seams

    out, todo = [], [cls]
    while todo:
        klass = todo.pop(0)
        if klass in out or not dataclasses.is_dataclass(klass):
            continue
        out.append(klass)
        todo += [type(_default(f)) for f in dataclasses.fields(klass) if f.init]
    seams.discover()
    return out + [k for kinds in seams.REGISTRY.values() for k in kinds.values()]


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _type_name(t: Any) -> str:
    if isinstance(t, type):
        return t.__name__
    return str(t).replace("typing.", "")


def describe_settings(
    cls: type, skip: frozenset[str] = frozenset()
) -> list[tuple[str, str, str, str]]:
    """(name, type, default, meaning) of every flat setting of config class `cls`, by name. The
    default is the class's own (a model's memory: its default memory's chosen strategies; a
    setting of another strategy: that strategy's, named); a setting whose meaning the code does
    not state says so ("–")."""
    from .core import seams
    from .training.config import field_types

    types = field_types(cls)
    defaults: dict[str, str] = {}
    meanings = {seam: "one of " + ", ".join(seams.kinds(seam)) for seam in seams.SEAMS}
    for klass in _owners(cls):  # nested configs' defaults as the class holds them, flat
        if hasattr(klass, "seam"):
            break
        for f in dataclasses.fields(klass):
            nested = _default(f)
            if dataclasses.is_dataclass(nested) and hasattr(nested, "settings"):
                for name, value in nested.settings().items():
                    defaults.setdefault(name, repr(value))
    for owner in _owners(cls):
        if not dataclasses.is_dataclass(owner):
            continue
        notes, kind = field_notes(owner), getattr(owner, "kind", None)
        for f in dataclasses.fields(owner):
            if f.name not in types:
                continue
            if f.name not in defaults:
                default = repr(_default(f))
                if isinstance(kind, str) and owner is not cls:  # a strategy not chosen
                    default += f" ({owner.seam} {kind})"
                defaults[f.name] = default
            if notes.get(f.name):
                meanings.setdefault(f.name, notes[f.name])
    return [
        (name, _type_name(types[name]), defaults.get(name, "–"), meanings.get(name, "–"))
        for name in sorted(set(types) - skip)
    ]


def format_settings(cls: type, width: int = 100, skip: frozenset[str] = frozenset()) -> list[str]:
    """`describe_settings` as lines of at most `width`: "name: type = default", then the meaning
    wrapped below it."""
    import textwrap

    lines = []
    for name, kind, default, meaning in describe_settings(cls, skip):
        lines.append(f"    {name}: {kind} = {default}"[:width])
        lines += textwrap.wrap(meaning, width, initial_indent=" " * 8, subsequent_indent=" " * 8)
    return lines or ["    none"]


__all__ = ["describe_settings", "field_notes", "format_settings"]
