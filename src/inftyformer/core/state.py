"""The state of a long-term memory (`LongTermState`): what one batch of streams holds, passed in
and returned by `long_term_memory.LongTermMemory`, saveable and resettable per row."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from .._checks import ValueChecks, check_dtype, check_floating, check_row_mask, check_shape
from .config import LongTermConfig

# `LongTermState.stored` of a non-empty row in a state saved before states counted their tokens
UNKNOWN_STORED = 2**40


@dataclass
class LongTermState:
    """The long-term memory of a batch of parallel streams.

    coefficients    B [batch, N, e]      the signal x̄(t) = Bᵀ ψ(t) of each row
    attention_mass  [batch, bins]        histogram of where the queries attended since the last
                                         update (sticky memories); uniform when there was none
    observed        [batch]              queries behind `attention_mass` (its weight when the
                                         next call's histogram is averaged in)
    empty           bool [batch]         rows with nothing in memory (fresh stream or reset)
    stored          int64 [batch]        S: tokens fitted into the row since its reset (what
                                         `squeeze="by_length"` shares [0, 1] by)
    places          float64 [batch, P, 4]  keep_salient only (P = K; else P = 0): each place's
                                         record (`stream_places.pool_salient`: its span of
                                         token indices, how many tokens, their salience)
    """

    coefficients: torch.Tensor
    attention_mass: torch.Tensor
    observed: torch.Tensor
    empty: torch.Tensor
    stored: torch.Tensor | None = None
    places: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.stored is None and isinstance(self.empty, torch.Tensor):
            # not given (a state built by hand, or saved before states counted their tokens): a
            # row that holds something counts as long, τ at its cap under squeeze="by_length"
            self.stored = torch.where(self.empty, 0, UNKNOWN_STORED).to(self.empty.device)
        if self.places is None and isinstance(self.empty, torch.Tensor):
            # a memory without keep_salient: its places follow from `stored` (no records)
            batch = self.empty.shape[0] if self.empty.dim() else 0
            self.places = torch.zeros(batch, 0, 4, dtype=torch.float64, device=self.empty.device)
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"LongTermState.{f.name} must be a torch.Tensor, got {type(value).__name__}"
                )

    @property
    def batch_size(self) -> int:
        return self.coefficients.shape[0]

    def _map(self, fn) -> LongTermState:
        return LongTermState(*(fn(getattr(self, f.name)) for f in fields(self)))

    def detach(self) -> LongTermState:
        return self._map(lambda t: t.detach())

    def to(self, device: torch.device | str) -> LongTermState:
        return self._map(lambda t: t.to(device))

    def tensors(self) -> dict[str, torch.Tensor]:
        """Flat dict for saving (safetensors)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> LongTermState:
        # saved before states counted their tokens, or kept records: see __post_init__
        optional = ("stored", "places")
        missing = [f.name for f in fields(cls) if f.name not in tensors and f.name not in optional]
        if missing:
            raise ValueError(f"long-term state is missing tensors {missing}")
        return cls(**{f.name: tensors[f.name] for f in fields(cls) if f.name in tensors})

    def check(
        self,
        config: LongTermConfig,
        name: str = "state",
        dtypes: tuple[torch.dtype, ...] | None = None,
        values: ValueChecks | None = None,
        magnitude: float | None = None,
    ) -> None:
        """Validate this state for a memory of `config`: shapes, dtypes (the float fields share
        one floating dtype, one of `dtypes` when given; `empty` is bool), one device; then, in
        `values` (read by the caller with one synchronisation) or here, the values: finite
        coefficients (and within ±`magnitude` when given: a model's memory fits normalised
        vectors), `attention_mass` a histogram (≥ 0, rows summing to 1), `observed` ≥ 0."""
        c = config
        check_shape(f"{name}.coefficients", self.coefficients, (None, c.num_basis, c.dim))
        batch = self.batch_size
        for field in ("attention_mass", "observed", "empty", "stored", "places"):
            t = getattr(self, field)
            if t.dim() and t.shape[0] != batch:
                raise ValueError(
                    f"{name}.{field} has {t.shape[0]} rows, {name}.coefficients {batch}: the "
                    "fields of a state hold the same rows"
                )
        squeeze = getattr(c, "squeeze", None)  # None: a layout check without the settings
        bins = None if squeeze is None else squeeze.bins
        check_shape(f"{name}.attention_mass", self.attention_mass, (batch, bins))
        check_shape(f"{name}.observed", self.observed, (batch,))
        check_shape(f"{name}.empty", self.empty, (batch,))
        check_shape(f"{name}.stored", self.stored, (batch,))
        # the squeeze's records, one per place (none for most squeezes)
        records = None if squeeze is None else squeeze.records(c.num_basis // len(c.widths))
        check_shape(f"{name}.places", self.places, (batch, records, 4))
        records = self.places.shape[1]
        check_dtype(f"{name}.places", self.places, torch.float64)
        check_floating(f"{name}.coefficients", self.coefficients)
        dtype = self.coefficients.dtype
        if dtypes is not None:
            check_dtype(f"{name}.coefficients", self.coefficients, *dtypes)
        for field in ("attention_mass", "observed"):
            if getattr(self, field).dtype != dtype:
                raise TypeError(
                    f"{name}.{field} must have the dtype of {name}.coefficients ({dtype}), "
                    f"got {getattr(self, field).dtype}"
                )
        check_dtype(f"{name}.empty", self.empty, torch.bool)
        check_dtype(f"{name}.stored", self.stored, torch.int64)
        device = self.coefficients.device
        for f in fields(self):
            t = getattr(self, f.name)
            if t.device != device:
                raise ValueError(
                    f"{name}.{f.name} is on {t.device}, {name}.coefficients on {device}: "
                    "a state lives on one device"
                )
        own = values is None
        values = ValueChecks() if own else values
        if magnitude is None:
            values.finite(f"{name}.coefficients", self.coefficients)
        else:
            values.bounded(f"{name}.coefficients", self.coefficients, magnitude)
        mass = self.attention_mass.detach()
        values.require(
            (mass >= 0).all(-1) & ((mass.sum(-1) - 1).abs() <= 1e-3),
            f"{name}.attention_mass must be a histogram per row: finite, >= 0, summing to 1",
        )
        observed = self.observed.detach()
        values.require(
            (observed >= 0) & torch.isfinite(observed),
            f"{name}.observed must be finite and >= 0 (queries counted since the last update)",
        )
        values.require(
            self.stored >= 0, f"{name}.stored must be >= 0 (tokens fitted since the reset)"
        )
        if records:  # the records count the row's tokens, and none is negative
            tokens = self.places[..., 2]
            values.require(
                (tokens >= 0).all(-1)
                & ((tokens.sum(-1) - self.stored.double()).abs() <= 1e-6 * (self.stored + 1)),
                f"{name}.places must count each row's stored tokens (tokens >= 0, summing to "
                f"{name}.stored)",
            )
            # each filled place's span ends (token indices) lie within the stream
            ends, held = self.places[..., :2], (tokens > 0)[..., None]
            last = self.stored.double()[:, None, None] * (1 + 1e-9) + 1e-6  # (runs' rounding)
            values.require(
                ~held | ((ends >= -1e-6) & (ends <= last)),
                f"{name}.places must hold spans of token indices within the stream: lo and hi "
                f"in [0, {name}.stored] for each place that holds tokens",
            )
        if own:
            values.run()

    def select(self, rows: torch.Tensor, other: LongTermState) -> LongTermState:
        """Row-wise choice: this state where the bool mask `rows` [batch] is True, `other`
        elsewhere."""

        def pick(mine: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
            return torch.where(rows.view(-1, *([1] * (mine.dim() - 1))), mine, theirs)

        return LongTermState(
            *(pick(getattr(self, f.name), getattr(other, f.name)) for f in fields(self))
        )

    def reset(self, rows: torch.Tensor) -> LongTermState:
        """Clear the rows flagged in the boolean mask `rows` [batch] (their document ended)."""
        rows = check_row_mask("rows", rows, self.batch_size).to(self.coefficients.device)
        bins = self.attention_mass.shape[-1]
        cleared = LongTermState(
            coefficients=torch.zeros_like(self.coefficients),
            attention_mass=torch.full_like(self.attention_mass, 1.0 / bins),
            observed=torch.zeros_like(self.observed),
            empty=torch.ones_like(self.empty),
            stored=torch.zeros_like(self.stored),
            places=torch.zeros_like(self.places),
        )
        return cleared.select(rows, self)
