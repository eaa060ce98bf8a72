"""What a memory state records of the memory that made it (`MemoryState.memory`): the settings
that give its numbers their meaning, so that a model whose memory has other such settings
refuses the state instead of reading it with another meaning (e.g. a squeeze="fill" memory's
places read as a squeeze="by_length" signal). Computed in one place, `memory_record`, from a
memory's settings dict (a model config's `to_dict()`), so that the record follows the settings
by their names, however the configs that hold them are arranged."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .state import MemoryState

# The memory settings that give a state's numbers their meaning: the basis the long-term
# coefficients are over (N, the widths), where the signal holds which tokens (the squeeze) and
# which places hold single tokens, and how the salience it carries was computed. Settings that
# only change how a state is read or updated from now on (τ, λ, M, the density, the KL) are not
# here: a model with other such values reads the same numbers with the same meaning.
STATE_SETTINGS = (
    "num_basis",
    "widths",
    "squeeze",
    "keep_first",
    "keep_last",
    "keep_salient",
    "salient_before",
)


def memory_record(settings: Mapping[str, Any]) -> dict[str, Any]:
    """What a state records of the memory that made it: the `STATE_SETTINGS` of a memory's
    settings dict (a model config's `to_dict()`: the memory's settings by their flat names),
    as JSON values. The one place that says what a state's record holds."""
    record = {name: settings[name] for name in STATE_SETTINGS if name in settings}
    return json.loads(json.dumps(record))  # tuples as lists, as in a saved state


def check_memory_record(state: MemoryState, expected: dict[str, Any]) -> None:
    """A ValueError naming the settings when `state` was made by a memory whose
    `memory_record` is not `expected` (a state without a record, saved before records existed
    or built by hand, is not checked)."""
    found = state.memory
    if found is None or found == expected:
        return
    names = sorted(k for k in set(found) | set(expected) if found.get(k) != expected.get(k))
    shown = "; ".join(f"{k}: {found.get(k)!r} -> {expected.get(k)!r}" for k in names)
    raise ValueError(
        f"state was made by a memory with other settings ({shown}, state -> model): its "
        "numbers mean other places and tokens to this model; stream the text again with this "
        "model, or use the model that made the state"
    )


__all__ = ["STATE_SETTINGS", "check_memory_record", "memory_record"]
