"""The long-term memory's settings (`LongTermConfig`): the paper's, plus the two strategies behind
the core's seams (`seams.py`): how a query's density is formed and how the old signal is
squeezed. Which settings may change on a trained memory (`changeable_settings`: the paper's and
each strategy's), and which the model around the memory decides (`DERIVED_SETTINGS`).

    LongTermConfig(num_basis=512, widths=(0.01, 0.05), ridge_lambda=1.0,
                   density=PaperDensity(), squeeze=FixedSqueeze(tau=0.75, num_samples=512))

The same settings can be written flat, as the command line and saved runs name them:
``LongTermConfig(num_basis=512, tau=0.5, density="normalized")``; each flat name goes to the
strategy that owns it (`seams.build`), and a name whose strategy was not chosen is refused
(``LongTermConfig(keep_first=64)``: keep_first is a setting of squeeze 'fill'). Reading works the
same way: ``config.tau`` is ``config.squeeze.tau``.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .._checks import check_bool, check_positive_int, check_range, check_segment_len
from . import flat_settings, seams
from .basis import MAX_WIDTH, check_widths
from .density import PaperDensity
from .seams import SEAMS, Strategy, owners, setting_names
from .squeeze import FixedSqueeze, check_update_gain

# The paper's settings of a trained long-term memory that may change (`--resume
# --allow-changes`, or evaluation with other memory settings): how the memory is updated and read
# and the weight of its KL term, not N, the widths, the gate or the density, which shape its
# weights or what they learned. Each strategy adds its own (`Strategy.changeable`), each model
# kind its own (`model_kinds.ModelKind.changeable`): `changeable_settings`.
CHANGEABLE_SETTINGS = ("squeeze", "ridge_lambda", "edge_padding", "sigma_0", "kl_weight")
# what the model around the memory decides, never a user's setting (None in a config nested in
# a model's config, filled in by `LongTermConfig.sized`). `segment_len` among them is not a second
# declaration of the model's: it is the model's own value (its config's, the one place it is set)
# handed down, so that the memory can check its update's gain for updates of that many vectors
DERIVED_SETTINGS = ("dim", "out_dim", "query_projection", "segment_len")


def changeable_settings() -> tuple[str, ...]:
    """Every flat setting of a trained long-term memory that may change: the paper's
    (`CHANGEABLE_SETTINGS`) and those of every strategy registered at the seams
    (`Strategy.changeable`)."""
    names = list(CHANGEABLE_SETTINGS)
    for seam in SEAMS:
        names += seams.changeable_settings(seam)
    return tuple(dict.fromkeys(names))


# the constructor (hence `dataclasses.replace`) also takes the strategies' settings by their flat
# names and a strategy by its kind's name or as a dict (JSON): `flat_settings.py`
takes_flat_settings = flat_settings.takes_flat_settings(*SEAMS)


@takes_flat_settings
@dataclass(frozen=True)
class LongTermConfig:
    """Hyper-parameters of the long-term memory and its continuous attention.

    Paper values: sorting N=512, widths (0.01, 0.05), λ=1, τ=0.75, M=512; GPT-2 N=512, widths
    (0.005, 0.01), λ=0.5, τ=0.5 (`inftyformer.presets`).

    A memory needs `dim` and `num_heads`; a config nested in a model's config leaves them (and
    the other `DERIVED_SETTINGS`) to the model, which fills them in with `sized`.
    """

    dim: int | None = None  # e: size of the stored vectors, of the queries and of W^K, W^V
    num_heads: int | None = None  # H (head size d = e / H); None: the model's
    num_basis: int = 256  # N: Gaussian basis functions of the memory's signal
    widths: tuple[float, ...] = (0.01, 0.05)  # Gaussian RBF widths, N/len(widths) functions each
    ridge_lambda: float = 1.0  # λ: ridge penalty of the fit B = Xᵀ Fᵀ(F Fᵀ + λI)⁻¹
    edge_padding: bool = True  # centres also past [0, 1]: edges fitted as well
    conv_gate: bool = True  # smooth the stored states with the small CNN before fitting (§3.3)
    sigma_0: float = 0.05  # σ₀ of the KL prior
    kl_weight: float = 1e-6  # weight of the reads' variance KL (toward σ₀) in the model's loss
    min_sigma_sq: float = 1e-4  # clamp on σ² (1e-6 is unsafe in float32)
    # how the scores s = K q / √d become the density a query reads (the paper's §3.2, or ours:
    # `inftyformer.extensions.densities`)
    density: Strategy = field(default_factory=PaperDensity)
    # how the unbounded update makes room and which places it keeps (the paper's §3.3 with τ, M
    # and sticky memories, or ours: `inftyformer.extensions.squeezes`)
    squeeze: Strategy = field(default_factory=FixedSqueeze)
    out_dim: int | None = None  # size of the context (default: dim)
    query_projection: bool = False  # own W^Q; otherwise queries come already projected
    # L of the updates: the model's segment_len (`sized`); the update's gain is checked for it here
    segment_len: int | None = None

    def __post_init__(self) -> None:
        for name in ("dim", "num_heads"):
            if getattr(self, name) is not None:
                check_positive_int(name, getattr(self, name))
        if self.dim is not None and self.num_heads is not None and self.dim % self.num_heads:
            raise ValueError(f"dim ({self.dim}) must be divisible by num_heads ({self.num_heads})")
        check_positive_int("num_basis", self.num_basis)
        object.__setattr__(self, "widths", check_widths(self.widths, self.num_basis))
        # λ > 0: at λ = 0 the Gram matrix F Fᵀ is singular as soon as N exceeds the positions
        check_range("ridge_lambda", self.ridge_lambda, 0.0, low_open=True)
        # at most the widest basis function (and its square): larger values overflow float32
        # where the densities are computed (σ² = 1e300 passed a finiteness check, then failed)
        check_range("sigma_0", self.sigma_0, 0.0, MAX_WIDTH, low_open=True)
        check_range("min_sigma_sq", self.min_sigma_sq, 0.0, MAX_WIDTH**2, low_open=True)
        check_range("kl_weight", self.kl_weight, 0.0)
        for seam in SEAMS:
            strategy = getattr(self, seam)
            if not isinstance(strategy, Strategy) or strategy.seam != seam:
                raise TypeError(f"{seam} must be a {seam} strategy, got {strategy!r}")
        self.density.check(self)
        self.squeeze.check(self)
        if self.out_dim is not None:
            check_positive_int("out_dim", self.out_dim)
        for name in ("edge_padding", "conv_gate", "query_projection"):
            check_bool(name, getattr(self, name))
        if self.segment_len is not None:
            check_segment_len(self.segment_len)
            if self.squeeze.resamples:  # a squeeze that never resamples has no gain
                check_update_gain(self, (self.segment_len,))  # other L when first used

    def __getattr__(self, name: str) -> Any:  # only when `name` is not a field
        """A strategy's setting by its flat name: ``config.tau`` is ``config.squeeze.tau``."""
        for seam in SEAMS:
            if name in setting_names(seam) and seam in self.__dict__:
                strategy = self.__dict__[seam]
                if name in strategy.settings():
                    return getattr(strategy, name)
                which = " or ".join(repr(k) for k in owners(seam, name))
                raise AttributeError(
                    f"{name} is a setting of {seam} {which}; this memory's {seam} is "
                    f"{strategy.kind!r}"
                )
        raise AttributeError(f"'LongTermConfig' object has no attribute {name!r}")

    @property
    def head_dim(self) -> int:
        self.check_sized()
        return self.dim // self.num_heads

    @property
    def num_centers(self) -> int:
        """K: the distinct centres of the basis (N / number of widths)."""
        return self.num_basis // len(self.widths)

    def check_sized(self) -> None:
        """A memory is built from a config with its size: dim and num_heads."""
        if self.dim is None or self.num_heads is None:
            raise ValueError(
                "a long-term memory needs dim and num_heads (a config nested in a model's "
                "config gets them from the model: its long_term_config())"
            )

    def sized(self, **derived: Any) -> LongTermConfig:
        """This config with what the model around the memory decides (`dim`, `num_heads`,
        `out_dim`, …) filled in."""
        return replace(self, **derived)

    # ------------------------------------------------------------------ (de)serialisation
    def settings(self) -> dict[str, Any]:
        """Every setting a user sets, flat: the paper's, each strategy's kind and its settings
        (what `--set` names; `LongTermConfig(**settings)` gives this config back)."""
        return flat_settings.flat_dict(self, skip=DERIVED_SETTINGS)

    def to_dict(self) -> dict[str, Any]:
        """JSON, nested: each strategy as {"kind": …, its settings}; tuples as lists."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Strategy):
                out[f.name] = value.to_dict()
            else:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LongTermConfig:
        """`to_dict`'s JSON (or the flat `settings`)."""
        if not isinstance(data, dict):
            raise ValueError(f"a long-term memory's settings must be a dict, got {data!r}")
        return cls(**data)

    @classmethod
    def user_settings(cls) -> dict[str, Any]:
        """Every flat setting name a user may give (any strategy registered now) and its type."""
        hints = typing.get_type_hints(cls)
        out: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in DERIVED_SETTINGS:
                continue
            out[f.name] = str if f.name in SEAMS else hints[f.name]
        for seam in SEAMS:
            out.update(setting_names(seam))
        return out


def replace_settings(config: LongTermConfig, **settings: Any) -> LongTermConfig:
    """`config` with flat settings changed (a strategy's kind changes it for a new one)."""
    return dataclasses.replace(config, **settings)


__all__ = [
    "CHANGEABLE_SETTINGS",
    "DERIVED_SETTINGS",
    "LongTermConfig",
    "changeable_settings",
    "replace_settings",
    "takes_flat_settings",
]
