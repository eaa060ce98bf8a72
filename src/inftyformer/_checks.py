"""Small argument checks shared by every layer: clear `ValueError`/`TypeError` messages that
name the argument and what was expected, instead of an obscure error from deep inside torch."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch


def check_tensor(name: str, x: object, ndim: int | None = None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    return x


def check_shape(name: str, x: torch.Tensor, expected: Sequence[int | None]) -> None:
    """`expected` holds one size per dimension; None matches any size."""
    check_tensor(name, x, len(expected))
    for got, want in zip(x.shape, expected, strict=True):
        if want is not None and got != want:
            shown = tuple("*" if w is None else w for w in expected)
            raise ValueError(f"{name} must have shape {shown}, got {tuple(x.shape)}")


def check_floating(name: str, x: torch.Tensor) -> None:
    """A floating-point tensor (integer or bool values would be cast silently and give wrong
    results, e.g. an integer μ rounds the basis)."""
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")


def check_dtype(name: str, x: torch.Tensor, *allowed: torch.dtype) -> None:
    if x.dtype not in allowed:
        want = " or ".join(str(d) for d in allowed)
        raise TypeError(f"{name} must have dtype {want}, got {x.dtype}")


class NonFiniteError(ValueError):
    """A tensor holds NaN or inf values (raised by the finiteness checks, so that a training loop
    can tell a diverging model from other bad input)."""


def check_finite(name: str, x: torch.Tensor) -> None:
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        raise NonFiniteError(f"{name} contains NaN or inf values")


def check_token_ids(
    name: str,
    ids: object,
    vocab_size: int,
    device: torch.device,
    ignore_index: int | None = None,
    values: ValueChecks | None = None,
) -> torch.Tensor:
    """Token ids [batch, length] (non-empty, integers in [0, vocab_size), or `ignore_index`
    where given) as int64 on `device`; a ValueError naming `name` and the bad values otherwise.
    `device` is the model's: a model on the `meta` device (parameters without data, e.g. built
    under `torch.device("meta")` and never loaded) is refused here, before any computation.
    The range is read here, or queued in `values` for the caller's one synchronisation."""
    if torch.device(device).type == "meta":
        raise ValueError(
            "the model is on the meta device: its parameters hold no data. Load its weights "
            "(e.g. load_state_dict(..., assign=True)) or build it on a real device (cpu, cuda)"
        )
    if not isinstance(ids, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(ids).__name__}")
    if ids.dim() != 2:
        raise ValueError(f"{name} must have shape [batch, length], got {tuple(ids.shape)}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer ids (torch.long), got dtype {ids.dtype}")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(ids.shape)}")
    ids = ids.to(device=device, dtype=torch.long)
    bad = (ids < 0) | (ids >= vocab_size)
    if ignore_index is not None:
        bad &= ids != ignore_index
    allowed = f"[0, {vocab_size})" + (f" or {ignore_index}" if ignore_index is not None else "")
    own = values is None
    values = ValueChecks() if own else values
    values.require(
        ~bad, lambda: f"{name} must be in {allowed}; found {ids[bad].unique()[:5].tolist()}"
    )
    if own:
        values.run()
    return ids


def check_row_mask(name: str, rows: object, batch_size: int) -> torch.Tensor:
    """A bool mask of the batch's rows [batch] (a tensor, or a list or tuple of bools) as a
    bool tensor. Integer or float flags are refused (TypeError: `~` of an int tensor is its
    bitwise complement, -1 and -2, not False and True), other shapes too (ValueError)."""
    if isinstance(rows, (list, tuple)):
        if not all(isinstance(r, bool) for r in rows):
            raise TypeError(
                f"{name} must be a bool mask [batch] (True: clear the row), got {rows!r}"
            )
        rows = torch.tensor(list(rows), dtype=torch.bool)
    if not isinstance(rows, torch.Tensor):
        raise TypeError(f"{name} must be a bool tensor [batch], got {type(rows).__name__}")
    if rows.dtype != torch.bool:
        raise TypeError(
            f"{name} must be a bool mask [batch], got dtype {rows.dtype}: give flags such as "
            "torch.tensor([True, False]) (an int tensor's 1 and 0 are not read as flags; "
            "convert it with .bool())"
        )
    if tuple(rows.shape) != (batch_size,):
        raise ValueError(
            f"{name} must have shape ({batch_size},): one flag per row of the batch of "
            f"{batch_size}, got shape {tuple(rows.shape)}"
        )
    return rows


def check_generator(generator: object) -> None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator or None, got {type(generator).__name__}"
        )


def check_positive_int(name: str, value: object, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_segment_len(value: object, model_segment_len: int | None = None) -> int:
    """`segment_len`, the tokens of one call: an int >= 1 and, given `model_segment_len`, at
    most the model's. The value is declared once per model kind, in its config (the native
    `ModelConfig`, the pretrained `AdapterConfig`, `RetrievalConfig`), each checking it here;
    everything else reads it from the model or config it is handed (a long-term memory's
    `LongTermConfig.sized`, the streaming helpers, the evaluation loop). A streaming helper
    asked for shorter calls than its model's checks the request here too (the cap)."""
    check_positive_int("segment_len", value)
    if model_segment_len is not None and value > model_segment_len:
        raise ValueError(f"segment_len {value} exceeds the model's segment_len {model_segment_len}")
    return value


def check_bool(name: str, value: object) -> None:
    """A real bool: strings such as 'false' or numbers such as 2 are refused, not read as truthy."""
    if not isinstance(value, bool):
        raise TypeError(
            f"{name} must be a bool (true or false), got {type(value).__name__} ({value!r})"
        )


def check_range(
    name: str,
    value: float,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    """A finite number in the given interval (NaN and ±inf are always refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} ({value!r})")
    bad = not math.isfinite(value)
    if low is not None:
        bad = bad or (value <= low if low_open else value < low)
    if high is not None:
        bad = bad or (value >= high if high_open else value > high)
    if bad:
        lo = "(-inf" if low is None else f"{'(' if low_open else '['}{low}"
        hi = "inf)" if high is None else f"{high}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be a finite number in {lo}, {hi}, got {value}")


# The largest magnitude a state's memories may hold. A model's states hold layer inputs (of order
# 1–1e3) or coefficients fitted to normalised vectors; beyond this, the LayerNorm over a stored
# state squares values past float32's range (d·x² > 3.4e38 for x ≳ 1.8e19/√d) and the model
# returns NaN. So larger values (e.g. a corrupted file) are refused like NaN.
STATE_MAGNITUDE = 1e15


def _extremes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) of a non-empty floating tensor, 0-d, NaN when it holds a NaN: one pass over x
    and no temporary of its size (a state's checks ran abs, a comparison and all over every
    tensor, several times the time of this reduction)."""
    return torch.aminmax(x.detach())


class ValueChecks:
    """Conditions on tensor values, read with ONE host synchronisation.

    Each `require` queues a reduction (a kernel, no synchronisation); `run` reads all of them at
    once and, only when one fails, looks again to raise the first failing condition's message.
    Validating a whole memory state therefore costs one synchronisation, however many tensors
    and layers it has.
    """

    def __init__(self) -> None:
        self._failed: list[torch.Tensor] = []
        self._errors: list[tuple[type[ValueError], str | Callable[[], str]]] = []

    def require(
        self,
        ok: torch.Tensor,
        message: str | Callable[[], str],
        error: type[ValueError] = ValueError,
    ) -> None:
        """`ok` (bool, any shape) must be True everywhere; else `error(message)` (a callable
        message is built only then, e.g. to name the bad values)."""
        if ok.numel():
            self._failed.append(~ok.all())
            self._errors.append((error, message))

    def finite(self, name: str, x: torch.Tensor) -> None:
        if x.is_floating_point() and x.numel():
            low, high = _extremes(x)
            self.require(
                torch.isfinite(low) & torch.isfinite(high),
                f"{name} contains NaN or inf values",
                NonFiniteError,
            )

    def bounded(self, name: str, x: torch.Tensor, bound: float) -> None:
        """Finite and |x| <= bound (NaN and ±inf fail the comparison too)."""
        if x.is_floating_point() and x.numel():
            low, high = _extremes(x)
            self.require(
                (low >= -bound) & (high <= bound),
                f"{name} contains NaN, inf or values beyond ±{bound:g}",
                NonFiniteError,
            )

    def run(self) -> None:
        if not self._failed:
            return
        device = self._failed[0].device
        failed = torch.stack([f.to(device) for f in self._failed])
        errors = self._errors
        self._failed, self._errors = [], []
        if bool(failed.any()):
            error, message = errors[int(failed.nonzero()[0, 0])]
            raise error(message() if callable(message) else message)


def check_memory_layers(layers: object, num_layers: int | None) -> list[int] | None:
    """`memory_layers` as a sorted list of distinct block indices in [0, num_layers), or None."""
    if layers is None:
        return None
    if isinstance(layers, (str, bytes)) or not isinstance(layers, (list, tuple)) or not layers:
        raise ValueError(
            f"memory_layers must be a non-empty list of block indices or None, got {layers!r}"
        )
    for i in layers:
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise ValueError(f"memory_layers must hold block indices (ints >= 0), got {layers!r}")
        if num_layers is not None and i >= num_layers:
            raise ValueError(
                f"memory_layers holds block {i}, but the base has {num_layers} blocks (0-based)"
            )
    if len(set(layers)) != len(layers):
        raise ValueError(f"memory_layers holds a block twice: {list(layers)}")
    return sorted(int(i) for i in layers)
