"""The pretrained model's old names of its memory state, kept for code written before the state
was called `state` here as on the native models (`models.LanguageModel`): `init_memory`, the
`memory=` argument of `forward` and `generate`, and `InftyformerOutput.memory`. Each works as
before and warns (DeprecationWarning) with the new name."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any


def _warn(old: str, new: str, stacklevel: int) -> None:
    warnings.warn(
        f"{old} is deprecated: use {new} (the same MemoryState)",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


def renamed(old: str, new: str, target: Callable) -> Callable:
    """`target` under its old name `old`, warning on each call."""

    def alias(*args: Any, **kwargs: Any) -> Any:
        _warn(old, new, 2)
        return target(*args, **kwargs)

    alias.__doc__ = f"Deprecated: {new}."
    return alias


def renamed_argument(kwargs: dict[str, Any], old: str, new: str, value: Any) -> Any:
    """The value of argument `new`, or of `old` popped from `kwargs` (warning)."""
    if old not in kwargs:
        return value
    _warn(f"{old}=", f"{new}=", 3)
    if value is not None:
        raise TypeError(f"got both {old}= and {new}=: pass {new}= only")
    return kwargs.pop(old)


__all__ = ["renamed", "renamed_argument"]
