"""The memory of a `MemoryLM`: explicit state, passed in and returned, never kept on modules.

    MemoryState.layers[i] = LayerState(
        short_term  ShortTermState    [batch, S, d] right-aligned + length [batch]
        compressed  CompressiveState  [batch, S_c, d] + length [batch]        ("compressive")
        long_term   LongTermState     B [batch, N, d], sticky histogram, empty ("infty")
    )
    MemoryState.window = TokenWindow  tokens [batch, W] right-aligned + length [batch], or None:
                                      the previous tokens a pretrained model's next call
                                      attends to again (`hf/model.py`, short-term window)

Rows of the batch are parallel streams; `reset(rows)` clears the rows whose document ended.
A state records, beside the model it comes from (`source`), the memory settings that give its
numbers their meaning (`memory`, `state_record.memory_record`: the basis, the squeeze, the
places kept whole); a model whose memory has other such settings refuses it.
`save_state`/`load_state` write one safetensors file whose metadata holds a JSON description of
the layout; the write is atomic (temporary file + `os.replace`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

import torch
from safetensors.torch import load_file, save_file

from .._checks import ValueChecks, check_row_mask, check_shape, check_tensor
from .._files import atomic_path
from ..core.state import LongTermState
from .compressive_memory import CompressiveState
from .short_term_memory import ShortTermState


class StateChecker(Protocol):
    """What `load_state` checks a state against: a model (`MemoryLM.check_state`, or a
    pretrained model's, which takes the batch size too)."""

    def check_state(self, state: MemoryState, batch_size: int) -> Any: ...


STATE_FORMAT = "inftyformer.MemoryState"
# 2: the sticky counter `observed` moved into the long-term state; 3: a squeeze's own records
# as `long_term.records.NAME` (the fill squeeze's were `long_term.places`, kept even when empty)
STATE_VERSION = 3
# the tensors of versions 1 and 2 that load under other names (`LayerState.from_tensors`)
LEGACY_TENSORS = ("observed", "long_term.places")


@dataclass
class TokenWindow:
    """tokens [batch, W] int64, right-aligned; length [batch]: how many are valid per row (0
    after a reset). The text a pretrained model recomputes as context before its next call.
    surprisal, salience [batch, W] float64 (keep_salient; zeros otherwise): −log p of each
    token when it was read, and its salience then (`places.salience`, over the surprisal
    of the tokens before it, which the window holds): what the next call's salience is computed
    from, and what the tokens leaving the window carry into the long-term memory."""

    tokens: torch.Tensor
    length: torch.Tensor
    surprisal: torch.Tensor | None = None
    salience: torch.Tensor | None = None

    def __post_init__(self) -> None:
        check_tensor("window.tokens", self.tokens, 2)
        check_tensor("window.length", self.length, 1)
        for name in ("surprisal", "salience"):
            if getattr(self, name) is None:
                zeros = torch.zeros(
                    self.tokens.shape, dtype=torch.float64, device=self.tokens.device
                )
                setattr(self, name, zeros)
            check_tensor(f"window.{name}", getattr(self, name), 2)

    @classmethod
    def empty(cls, batch_size: int, device=None) -> TokenWindow:
        return cls(
            torch.zeros(batch_size, 0, dtype=torch.long, device=device),
            torch.zeros(batch_size, dtype=torch.long, device=device),
        )

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    def detach(self) -> TokenWindow:
        return self

    def to(self, device: torch.device | str) -> TokenWindow:
        return TokenWindow(*(t.to(device) for t in self.tensors().values()))

    def reset(self, rows: torch.Tensor) -> TokenWindow:
        rows = rows.to(self.tokens.device)
        return TokenWindow(
            torch.where(rows[:, None], 0, self.tokens),
            torch.where(rows, 0, self.length),
            torch.where(rows[:, None], 0.0, self.surprisal),
            torch.where(rows[:, None], 0.0, self.salience),
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        return {
            "tokens": self.tokens,
            "length": self.length,
            "surprisal": self.surprisal,
            "salience": self.salience,
        }

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> TokenWindow:
        missing = [k for k in ("tokens", "length") if k not in tensors]
        if missing:
            raise ValueError(f"the token window is missing tensors {missing}")
        # surprisal, salience: saved before keep_salient (zeros)
        return cls(
            tensors["tokens"], tensors["length"], tensors.get("surprisal"), tensors.get("salience")
        )

    def check(self, batch: int, values: ValueChecks | None = None) -> None:
        """Shapes and dtypes (int64 tokens and lengths, one device); then, in `values` or here,
        lengths in [0, W] and tokens ≥ 0."""
        check_shape("window.tokens", self.tokens, (batch, None))
        check_shape("window.length", self.length, (batch,))
        for name in ("surprisal", "salience"):
            t = getattr(self, name)
            check_shape(f"window.{name}", t, tuple(self.tokens.shape))
            if t.dtype != torch.float64:
                raise TypeError(f"window.{name} must be float64, got {t.dtype}")
        for name, t in (("tokens", self.tokens), ("length", self.length)):
            if t.dtype != torch.long:
                raise TypeError(f"window.{name} must have dtype torch.int64, got {t.dtype}")
        if self.length.device != self.tokens.device:
            raise ValueError("window.length and window.tokens are on different devices")
        own = values is None
        values = ValueChecks() if own else values
        width = self.tokens.shape[1]
        values.require(
            (self.length >= 0) & (self.length <= width),
            f"window.length must be in [0, {width}] (the window's width)",
        )
        values.require(self.tokens >= 0, "window.tokens must be token ids (>= 0)")
        for name in ("surprisal", "salience"):  # −log p and means of it
            t = getattr(self, name)
            values.require(torch.isfinite(t) & (t >= 0), f"window.{name} must be finite and >= 0")
        if own:
            values.run()


@dataclass
class LayerState:
    short_term: ShortTermState
    compressed: CompressiveState | None = None
    long_term: LongTermState | None = None

    def _map(self, fn) -> LayerState:
        return LayerState(
            short_term=fn(self.short_term),
            compressed=None if self.compressed is None else fn(self.compressed),
            long_term=None if self.long_term is None else fn(self.long_term),
        )

    def detach(self) -> LayerState:
        return self._map(lambda s: s.detach())

    def to(self, device: torch.device | str) -> LayerState:
        return self._map(lambda s: s.to(device))

    def reset(self, rows: torch.Tensor) -> LayerState:
        return LayerState(
            short_term=self.short_term.reset(rows),
            compressed=None if self.compressed is None else self.compressed.reset(rows),
            long_term=None if self.long_term is None else self.long_term.reset(rows),
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {f"short_term.{k}": v for k, v in self.short_term.tensors().items()}
        if self.compressed is not None:
            out.update({f"compressed.{k}": v for k, v in self.compressed.tensors().items()})
        if self.long_term is not None:
            out.update({f"long_term.{k}": v for k, v in self.long_term.tensors().items()})
        return out

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> LayerState:
        def group(prefix: str) -> dict[str, torch.Tensor]:
            return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}

        short, comp, long = group("short_term."), group("compressed."), group("long_term.")
        if long and "observed" in tensors:  # version 1 kept the sticky counter beside long_term
            long.setdefault("observed", tensors["observed"])
        places = long.pop("places", None)  # versions 1–2: the fill squeeze's place records
        if places is not None and places.shape[1]:  # (a squeeze without records: [batch, 0, 4])
            long.setdefault("records.places", places)
        if not short:
            raise ValueError("layer state has no short_term tensors")
        return cls(
            short_term=ShortTermState.from_tensors(short),
            compressed=CompressiveState.from_tensors(comp) if comp else None,
            long_term=LongTermState.from_tensors(long) if long else None,
        )


@dataclass
class MemoryState:
    layers: tuple[LayerState, ...]
    window: TokenWindow | None = None
    # provenance: which kind of model made the state (e.g. the pretrained base it belongs to),
    # kept through detach/to/reset/repeat_rows and saved files; a model refuses another's state
    source: str | None = None
    # keep_salient: the salience of the tokens waiting for the long-term memory [batch, n]
    # float64, right-aligned as each layer's short_term (None: not computed)
    salience: torch.Tensor | None = None
    # the memory settings that give the numbers their meaning (`state_record.py`), kept like
    # `source`; None: not recorded (not checked)
    memory: dict[str, Any] | None = None
    # the model call that returned this very object (a number of the model's own), which takes
    # it back unchecked; any new state (replace, detach, to, reset, a file, by hand) has none
    issued_by: int | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.salience is not None:
            check_tensor("state.salience", self.salience, 2)
        if self.source is not None and not isinstance(self.source, str):
            raise TypeError(f"MemoryState.source must be a str or None, got {self.source!r}")
        if self.memory is not None and not isinstance(self.memory, dict):
            raise TypeError(f"MemoryState.memory must be a dict or None, got {self.memory!r}")
        if self.window is not None and not isinstance(self.window, TokenWindow):
            kind = type(self.window).__name__
            raise TypeError(f"MemoryState.window must be a TokenWindow or None, got {kind}")
        if not isinstance(self.layers, (tuple, list)):
            raise TypeError(
                "MemoryState.layers must be a tuple of LayerState, got "
                f"{type(self.layers).__name__}"
            )
        self.layers = tuple(self.layers)
        if not self.layers:
            raise ValueError("MemoryState needs at least one layer")
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, LayerState):
                raise TypeError(
                    f"MemoryState.layers[{i}] must be a LayerState, got {type(layer).__name__}"
                )
            if not isinstance(layer.short_term, ShortTermState):
                raise TypeError(
                    f"MemoryState.layers[{i}].short_term must be a ShortTermState, got "
                    f"{type(layer.short_term).__name__}"
                )

    @property
    def batch_size(self) -> int:
        check_tensor("state.layers[0].short_term.memory", self.layers[0].short_term.memory, 3)
        return self.layers[0].short_term.batch_size

    @property
    def device(self) -> torch.device:
        return self.layers[0].short_term.memory.device

    def detach(self) -> MemoryState:
        return MemoryState(
            tuple(layer.detach() for layer in self.layers),
            self.window,
            self.source,
            self.salience,
            self.memory,
        )

    def to(self, device: torch.device | str) -> MemoryState:
        window = None if self.window is None else self.window.to(device)
        salience = None if self.salience is None else self.salience.to(device)
        layers = tuple(layer.to(device) for layer in self.layers)
        return MemoryState(layers, window, self.source, salience, self.memory)

    def reset(self, rows: torch.Tensor) -> MemoryState:
        """Clear the rows flagged by the bool mask `rows` [batch] (their document ended)."""
        rows = check_row_mask("reset", rows, self.batch_size)
        if not bool(rows.any()):
            return self
        window = None if self.window is None else self.window.reset(rows)
        salience = self.salience
        if salience is not None:
            salience = torch.where(rows.to(salience.device)[:, None], 0.0, salience)
        layers = tuple(layer.reset(rows) for layer in self.layers)
        return MemoryState(layers, window, self.source, salience, self.memory)

    def repeat_rows(self, repeats: int) -> MemoryState:
        """Each row's memory `repeats` times in a row (row b → rows b·r … b·r + r − 1), e.g. one
        document's memory for several replies, or for each of a beam's sequences."""
        tensors = {k: v.repeat_interleave(repeats, dim=0) for k, v in self.tensors().items()}
        return MemoryState.from_tensors(tensors, len(self.layers), self.source, self.memory)

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {
            f"layers.{i}.{k}": v
            for i, layer in enumerate(self.layers)
            for k, v in layer.tensors().items()
        }
        if self.window is not None:
            out.update({f"window.{k}": v for k, v in self.window.tensors().items()})
        if self.salience is not None:
            out["salience"] = self.salience
        return out

    def check_layout(self, batch_size: int | None = None) -> None:
        """Check that the tensors fit together without a model: every part has the batch size
        (`batch_size` when given), [batch, S, d] memories with int64 lengths, a long-term part
        [batch, N, d] with its histogram, counter and bool `empty`, one width d, one floating
        dtype, one device, and valid values. (A model checks more: `MemoryLM.check_state`.)"""
        batch = self.batch_size if batch_size is None else batch_size
        values = ValueChecks()
        dims = set()
        for i, layer in enumerate(self.layers):
            name = f"layers[{i}]"
            for part in ("short_term", "compressed"):
                ragged = getattr(layer, part)
                if ragged is None:
                    continue
                check_tensor(f"{name}.{part}.memory", ragged.memory, 3)
                dims.add(ragged.memory.shape[-1])
                ragged.check(
                    f"{name}.{part}",
                    batch,
                    ragged.memory.shape[-1],
                    ragged.memory.shape[1],
                    values=values,
                )
            if layer.long_term is not None:
                lt = layer.long_term
                check_tensor(f"{name}.long_term.coefficients", lt.coefficients, 3)
                check_tensor(f"{name}.long_term.attention_mass", lt.attention_mass, 2)
                _, n, d = lt.coefficients.shape
                dims.add(d)
                if lt.batch_size != batch:
                    raise ValueError(
                        f"{name}.long_term has batch size {lt.batch_size}, expected {batch}"
                    )
                shape = SimpleNamespace(num_basis=n, dim=d)  # the layout, not a memory's settings
                lt.check(shape, f"{name}.long_term", values=values)
        if self.window is not None:
            self.window.check(batch, values)
        check_salience(self, batch, values)
        if len(dims) > 1:
            raise ValueError(f"the layers' tensors have different widths d: {sorted(dims)}")
        float64 = (
            "window.surprisal",
            "window.salience",
            "salience",
        )  # float64 records, whatever the memory's (and a squeeze's records, as it keeps them)
        floats = {
            t.dtype
            for k, t in self.tensors().items()
            if t.is_floating_point() and k not in float64 and ".long_term.records." not in k
        }
        if len(floats) > 1:
            raise TypeError(f"the state mixes floating dtypes {sorted(map(str, floats))}")
        devices = {t.device for t in self.tensors().values()}
        if len(devices) > 1:
            raise ValueError(
                f"the state's tensors are on several devices: {sorted(map(str, devices))}"
            )
        values.run()

    @classmethod
    def from_tensors(
        cls,
        tensors: dict[str, torch.Tensor],
        num_layers: int | None = None,
        source: str | None = None,
        memory: dict[str, Any] | None = None,
    ) -> MemoryState:
        """The inverse of `tensors()`; `num_layers` defaults to the layers the keys name."""
        if num_layers is None:
            indices = {int(k.split(".")[1]) for k in tensors if k.startswith("layers.")}
            num_layers = max(indices) + 1 if indices else 0
        layers = []
        for i in range(num_layers):
            prefix = f"layers.{i}."
            try:
                layers.append(
                    LayerState.from_tensors(
                        {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
                    )
                )
            except ValueError as err:
                raise ValueError(f"layers[{i}]: {err}") from None
        window = {k[len("window.") :]: v for k, v in tensors.items() if k.startswith("window.")}
        window = TokenWindow.from_tensors(window) if window else None
        return cls(tuple(layers), window, source, tensors.get("salience"), memory)


def check_salience(state: MemoryState, batch: int, values: ValueChecks) -> None:
    """`state.salience`, when there is one: float64 [batch, n] with n the width of what waits
    (each layer's short_term), finite and ≥ 0 (its values queued in `values`)."""
    salience = state.salience
    if salience is None:
        return
    width = state.layers[0].short_term.memory.shape[1]
    check_shape("state.salience", salience, (batch, width))
    if salience.dtype != torch.float64:
        raise TypeError(f"state.salience must be float64, got {salience.dtype}")
    values.require(
        torch.isfinite(salience) & (salience >= 0),
        "state.salience must be finite and >= 0 (the mean surprisal of bursts of tokens)",
    )


def save_state(path: str | os.PathLike, state: MemoryState) -> None:
    """Write `state` to one safetensors file (atomic: temporary file, then os.replace)."""
    if not isinstance(state, MemoryState):
        raise TypeError(f"state must be a MemoryState, got {type(state).__name__}")
    path = Path(path)
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.tensors().items()}
    meta = {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "num_layers": len(state.layers),
        "batch_size": state.batch_size,
    }
    if state.source is not None:
        meta["source"] = state.source
    if state.memory is not None:
        meta["memory"] = state.memory
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"inftyformer": json.dumps(meta)})


def load_state(
    path: str | os.PathLike,
    device: torch.device | str = "cpu",
    model: StateChecker | None = None,
) -> MemoryState:
    """Read a state written by `save_state`. Every problem is a ValueError (FileNotFoundError
    for a missing file) naming the file and what is wrong: not a safetensors file, metadata that
    is not the expected JSON, missing or unexpected tensors, tensors whose shapes or dtypes do
    not fit together. Given `model` (a `MemoryLM` or a pretrained model with memory), the state
    is also checked against it (`check_state`, for the state's batch size)."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"memory state file not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get("inftyformer")
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"{path} is not a safetensors file: {err}") from None
    if raw is None:
        raise ValueError(f"{path} is not an inftyformer memory state (no metadata)")
    try:
        meta = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: the state's metadata is not valid JSON ({err})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: the state's metadata must be a JSON object, got {raw[:60]!r}")
    if meta.get("format") != STATE_FORMAT or meta.get("version") not in (1, 2, STATE_VERSION):
        raise ValueError(
            f"{path}: unsupported state format {meta.get('format')!r} "
            f"version {meta.get('version')!r}"
        )
    for key in ("num_layers", "batch_size"):
        value = meta.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"{path}: the state's metadata needs {key} (a positive integer), got {value!r}"
            )
    try:
        tensors = load_file(str(path), device=str(device))
        source, memory = meta.get("source"), meta.get("memory")
        if source is not None and not isinstance(source, str):
            raise ValueError(f"the state's metadata has a source that is not a string: {source!r}")
        if memory is not None and not isinstance(memory, dict):
            raise ValueError(f"the state's metadata has a memory that is not an object: {memory!r}")
        state = MemoryState.from_tensors(tensors, meta["num_layers"], source, memory)
        expected = set(state.tensors())
        legacy = {f"layers.{i}.{k}" for i in range(meta["num_layers"]) for k in LEGACY_TENSORS}
        legacy = legacy if meta["version"] < STATE_VERSION else set()
        unexpected = sorted(set(tensors) - expected - legacy)
        if unexpected:
            raise ValueError(f"unexpected tensors {unexpected[:5]}")
        state.check_layout(meta["batch_size"])
        if model is not None:
            model.check_state(state, meta["batch_size"])
    except (SafetensorError, TypeError, ValueError) as err:
        raise type(err)(f"{path}: {err}") from None
    return state


__all__ = [
    "LayerState",
    "MemoryState",
    "TokenWindow",
    "check_salience",
    "load_state",
    "save_state",
]
