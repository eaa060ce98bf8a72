"""The state of a long-term memory (`LongTermState`): what one batch of streams holds, passed in
and returned by `memory.LongTermMemory`, saveable and resettable per row."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

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
    stored          int64 [batch]        S: tokens fitted into the row since its reset (what a
                                         squeeze may share [0, 1] by)
    records         {name: [batch, ...]}  the squeeze's own records of the row's stream, as it
                                         defines them (`Squeeze.initial_records`; none for the
                                         paper's): kept, saved and reset (to zeros) with the rest
    """

    coefficients: torch.Tensor
    attention_mass: torch.Tensor
    observed: torch.Tensor
    empty: torch.Tensor
    stored: torch.Tensor | None = None
    records: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.stored is None and isinstance(self.empty, torch.Tensor):
            # not given (a state built by hand, or saved before states counted their tokens): a
            # row that holds something counts as long, τ at its cap under a squeeze by length
            self.stored = torch.where(self.empty, 0, UNKNOWN_STORED).to(self.empty.device)
        if self.records is None:
            self.records = {}
        for f in fields(self):
            if f.name != "records" and not isinstance(getattr(self, f.name), torch.Tensor):
                kind = type(getattr(self, f.name)).__name__
                raise TypeError(f"LongTermState.{f.name} must be a torch.Tensor, got {kind}")
        if not isinstance(self.records, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in self.records.items()
        ):
            raise TypeError(
                "LongTermState.records must be a dict of named tensors (the squeeze's records), "
                f"got {self.records!r:.80}"
            )

    @property
    def batch_size(self) -> int:
        return self.coefficients.shape[0]

    def _map(self, fn) -> LongTermState:
        records = {k: fn(v) for k, v in self.records.items()}
        return LongTermState(
            *(fn(getattr(self, f.name)) for f in fields(self) if f.name != "records"), records
        )

    def detach(self) -> LongTermState:
        return self._map(lambda t: t.detach())

    def to(self, device: torch.device | str) -> LongTermState:
        return self._map(lambda t: t.to(device))

    def tensors(self) -> dict[str, torch.Tensor]:
        """Flat dict for saving (safetensors): the fields, and each record as `records.NAME`."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "records"}
        out.update({f"records.{k}": v for k, v in self.records.items()})
        return out

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> LongTermState:
        """`tensors()`'s dict back (`stored` optional: states saved before it was counted)."""
        names = [f.name for f in fields(cls) if f.name != "records"]
        missing = [n for n in names if n not in tensors and n != "stored"]
        if missing:
            raise ValueError(f"long-term state is missing tensors {missing}")
        records = {k[len("records.") :]: v for k, v in tensors.items() if k.startswith("records.")}
        return cls(**{n: tensors[n] for n in names if n in tensors}, records=records)

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
        parts = {n: getattr(self, n) for n in ("attention_mass", "observed", "empty", "stored")}
        parts.update({f"records[{k!r}]": v for k, v in self.records.items()})
        for part, t in parts.items():
            if t.dim() and t.shape[0] != batch:
                raise ValueError(
                    f"{name}.{part} has {t.shape[0]} rows, {name}.coefficients {batch}: the "
                    "fields of a state hold the same rows"
                )
        squeeze = getattr(c, "squeeze", None)  # None: a layout check without the settings
        bins = None if squeeze is None else squeeze.bins
        check_shape(f"{name}.attention_mass", self.attention_mass, (batch, bins))
        check_shape(f"{name}.observed", self.observed, (batch,))
        check_shape(f"{name}.empty", self.empty, (batch,))
        check_shape(f"{name}.stored", self.stored, (batch,))
        if squeeze is not None:  # the squeeze's records, as it makes them for an empty memory
            self._check_records(squeeze, c.num_basis // len(c.widths), name)
        check_floating(f"{name}.coefficients", self.coefficients)
        dtype = self.coefficients.dtype
        if dtypes is not None:
            check_dtype(f"{name}.coefficients", self.coefficients, *dtypes)
        for part in ("attention_mass", "observed"):
            if getattr(self, part).dtype != dtype:
                raise TypeError(
                    f"{name}.{part} must have the dtype of {name}.coefficients ({dtype}), "
                    f"got {getattr(self, part).dtype}"
                )
        check_dtype(f"{name}.empty", self.empty, torch.bool)
        check_dtype(f"{name}.stored", self.stored, torch.int64)
        device = self.coefficients.device
        for part, t in parts.items():
            if t.device != device:
                raise ValueError(
                    f"{name}.{part} is on {t.device}, {name}.coefficients on {device}: "
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
        if squeeze is not None and self.records:
            squeeze.check_records(self, name, values)
        if own:
            values.run()

    def _check_records(self, squeeze, num_centers: int, name: str) -> None:
        """The records' names, shapes and dtypes are those the squeeze gives an empty memory."""
        wanted = squeeze.initial_records(self.batch_size, num_centers, "meta")
        if set(self.records) != set(wanted):
            raise ValueError(
                f"{name}.records holds {sorted(self.records)}; squeeze {squeeze.kind!r} keeps "
                f"{sorted(wanted)}"
            )
        for key, want in wanted.items():
            check_shape(f"{name}.records[{key!r}]", self.records[key], tuple(want.shape))
            check_dtype(f"{name}.records[{key!r}]", self.records[key], want.dtype)

    def select(self, rows: torch.Tensor, other: LongTermState) -> LongTermState:
        """Row-wise choice: this state where the bool mask `rows` [batch] is True, `other`
        elsewhere."""

        def pick(mine: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
            return torch.where(rows.view(-1, *([1] * (mine.dim() - 1))), mine, theirs)

        records = {k: pick(v, other.records[k]) for k, v in self.records.items()}
        return LongTermState(
            *(
                pick(getattr(self, f.name), getattr(other, f.name))
                for f in fields(self)
                if f.name != "records"
            ),
            records,
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
            records={k: torch.zeros_like(v) for k, v in self.records.items()},
        )
        return cleared.select(rows, self)
