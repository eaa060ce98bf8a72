"""The long-term memory's settings: `LongTermConfig`, which of them may change on a trained
memory, the update-gain check that refuses settings whose unbounded update (paper §3.3) would
make the memory grow, and `WithLongTerm`, how a model's config nests them (the native
`ModelConfig`, the pretrained `PretrainedMemoryConfig`). The memory itself is
`core/memory.py`."""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

from .._checks import check_bool, check_positive_int, check_range
from .basis import MAX_WIDTH, check_widths
from .ridge import update_gain

# The largest gain (`ridge.update_gain`) of the unbounded update accepted: below 1 with a margin,
# so that the memory stays bounded (a constant input accumulates to at most 1 / (1 − 0.95) = 20×)
# and the ~1% error of the estimate cannot matter.
MAX_UPDATE_GAIN = 0.95

DENSITY_FORMS = ("paper", "normalized", "content", "mixture")
# the densities built from a discrete attention over the basis centres (retrieval by content)
CONTENT_DENSITIES = ("content", "mixture")
# how a pretrained model's block uses its read (`inftyformer.hf`): added to the attention output
# (the paper's), or merged into the base's own heads by attention mass (`hf/head_read.py`)
MEMORY_READS = ("added", "heads")
# how much of [0, 1] the unbounded update leaves the old signal: τ itself (the paper's), or
# τ_t = min(τ, S / (S + L)) for S tokens stored and L new ones, so that every stored token keeps
# the same share until the memory holds L·τ/(1 − τ) tokens, and τ from then on; "fill" keeps
# the stream on the K distinct centres, j/(K − 1): one token per centre until the memory holds K
# tokens (the reads skip the centres not yet filled), then neighbouring places merged so that
# each stands for an equal run of S / K tokens (`long_term_memory.pool_by_length`; τ unused)
SQUEEZES = ("fixed", "by_length", "fill")
# the squeezes under which every place of the signal stands for the same number of tokens
EVEN_SQUEEZES = ("by_length", "fill")


def check_density(
    density: object, sigma_init: object, sharpness: object = 1.0, sink_edge: object = 0.0
) -> None:
    """The density settings of a long-term memory (shared by the native and pretrained configs)."""
    if density not in DENSITY_FORMS:
        raise ValueError(f"density must be one of {DENSITY_FORMS}, got {density!r}")
    if sigma_init is not None:
        check_range("sigma_init", sigma_init, 0.0, 10.0, low_open=True)
    check_range("sharpness", sharpness, 0.0, 1e6, low_open=True)
    check_range("sink_edge", sink_edge, 0.0, 0.5)
    if density not in CONTENT_DENSITIES and (sharpness != 1.0 or sink_edge != 0.0):
        raise ValueError(
            "sharpness and sink_edge shape the content density: set density='content' or "
            "'mixture' "
            f"(got density={density!r})"
        )


def check_memory_read(memory_read: object, density: object) -> None:
    """`memory_read` of a pretrained model's memory: one of MEMORY_READS; "heads" reads with a
    content density ("content" or "mixture")."""
    if memory_read not in MEMORY_READS:
        raise ValueError(f"memory_read must be one of {MEMORY_READS}, got {memory_read!r}")
    if memory_read == "heads" and density not in CONTENT_DENSITIES:
        raise ValueError(
            "memory_read='heads' reads with the content density: set density='mixture' or "
            "'content' "
            f"(got {density!r})"
        )


# where a pretrained model's heads read puts the memory's places (`hf/head_read.py`): every
# place just beyond the window, each at its own stream position, or each at its rank (the
# places as the last tokens before the window; rotary bases)
MEMORY_POSITIONS = ("window", "places", "ranks")


def check_memory_positions(memory_positions: object, memory_read: object, squeeze: object) -> None:
    """`memory_positions` of a pretrained model's memory: one of MEMORY_POSITIONS; "places" and
    "ranks" read with the base's heads (memory_read="heads") a memory whose places know where
    their tokens lie (squeeze="fill"). Whether the base has rotary positions is the model's
    check."""
    if memory_positions not in MEMORY_POSITIONS:
        raise ValueError(
            f"memory_positions must be one of {MEMORY_POSITIONS}, got {memory_positions!r}"
        )
    if memory_positions != "window" and (memory_read != "heads" or squeeze != "fill"):
        raise ValueError(
            f"memory_positions={memory_positions!r} needs memory_read='heads' and "
            "squeeze='fill' (places "
            f"that know where their tokens lie), got memory_read={memory_read!r}, "
            f"squeeze={squeeze!r}"
        )


# The settings of a trained long-term memory that may change (`--resume --allow-changes`, or
# evaluation with other memory settings): how the memory is updated and read and the weight of
# its KL term, not N, the widths, the gate or the density heads, which shape its weights or what
# they learned. Each model kind adds its own (`models.MODEL_KINDS`: the native short-term
# lengths and dropout, the pretrained model's window and learning rates).
CHANGEABLE_SETTINGS = (
    "num_samples",
    "tau",
    "squeeze",
    "ridge_lambda",
    "sticky",
    "sticky_bins",
    "edge_padding",
    "sigma_0",
    "sharpness",
    "sink_edge",
    "token_mass",
    "keep_first",
    "keep_last",
    "keep_salient",
    "salient_before",
    "kl_weight",
)
# what the model around the memory decides, never a user's setting (None in a config nested in
# a model's config, filled in by `LongTermConfig.sized`)
DERIVED_SETTINGS = ("dim", "out_dim", "query_projection", "segment_len")


@dataclass(frozen=True)
class LongTermConfig:
    """Hyper-parameters of the long-term memory and its continuous attention.

    Paper values: sorting N=512, widths (0.01, 0.05), λ=1, τ=0.75, M=512;
    GPT-2 N=512, widths (0.005, 0.01), λ=0.5, τ=0.5 (`GPT2_LONG_TERM`).

    A memory needs `dim` and `num_heads`; a config nested in a model's config leaves them (and
    the other `DERIVED_SETTINGS`) to the model, which fills them in with `sized`.
    """

    dim: int | None = None  # e: size of the stored vectors, of the queries and of W^K, W^V
    num_heads: int | None = None  # H (head size d = e / H); None: the model's
    num_basis: int = 256  # N
    widths: tuple[float, ...] = (0.01, 0.05)
    ridge_lambda: float = 1.0  # λ
    tau: float = 0.75  # τ: the old signal is squeezed into [0, τ]
    # "fixed": τ every update (paper §3.3); "by_length": min(τ, S / (S + L)); "fill": one
    # token per centre until full, then equal runs of tokens merged per centre (SQUEEZES)
    squeeze: str = "fixed"
    num_samples: int = 512  # M: points at which the old signal is resampled
    edge_padding: bool = True
    conv_gate: bool = True
    sticky: bool = False
    sticky_bins: int = 128
    sigma_0: float = 0.05  # σ₀ of the KL prior
    kl_weight: float = 1e-6  # weight of the reads' variance KL (toward σ₀) in the model's loss
    min_sigma_sq: float = 1e-4  # clamp on σ² (1e-6 is unsafe in float32)
    # how the scores s = K q / √d become the density (core/attention.py): "paper" feeds s
    # to w_μ, w_σ as in the paper's §3.2; "normalized" standardises s over the N basis keys
    # first, so that μ and σ depend on the query however small s is (at initialisation);
    # "content" matches the density to a softmax over the basis keys (retrieval by content);
    # "mixture" reads that softmax itself: a mixture of the signal at the basis centres
    density: str = "normalized"
    # "content"/"mixture" only: β of p_n = softmax(β s_n + w_μ,n), how sharply a read settles on
    # the best match (the log-mass of a read, `LongTermAttention.read_heads`, uses s itself)
    sharpness: float = 1.0
    # "content"/"mixture" only: the centres c_n < sink_edge are not read. The oldest edge of the
    # signal holds the document's first tokens, where a pretrained model parks attention it does not
    # need (the attention sink); a window recomputed before each segment has its own.
    sink_edge: float = 0.0
    # the heads read (`read_heads`): the memory's attention mass counts the tokens each basis
    # function stands for, log Z_M + log(S / places read) for S stored tokens, so that a memory
    # of 256 tokens over 2,048 places does not weigh as 2,048 tokens against the window; needs
    # squeeze="by_length" or "fill", under which every place stands for as many tokens
    token_mass: bool = False
    # squeeze="fill": the stream's first tokens keep a place each and are never merged (where a
    # pretrained model parks attention it does not need: its attention sink)
    keep_first: int = 0
    # squeeze="fill": the stream's most recent tokens keep a place each (the last places) and are
    # never merged; the tokens between the first and the last kept share the other places
    keep_last: int = 0
    # squeeze="fill": places that keep one token each for the most salient tokens between the
    # first and the last kept ones (the salience comes with the tokens: a pretrained model's
    # surprisal, `stream_places.salience`), chosen again at every update; the records of the
    # places are then kept in the state (`LongTermState.places`)
    keep_salient: int = 0
    # keep_salient: a token up to this many before a burst of surprisal is salient too (the
    # words that introduce a fact, not only those after the surprise; `stream_places.salience`)
    salient_before: int = 0
    # σ of every density at initialisation (the bias of w_σ); None: PyTorch's default
    # initialisation of the head, the paper's (σ ≈ 0.83)
    sigma_init: float | None = None
    out_dim: int | None = None  # size of the context (default: dim)
    query_projection: bool = False  # own W^Q; otherwise queries come already projected
    segment_len: int | None = None  # L of the updates: the update's gain is checked for it here

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
        check_range("tau", self.tau, 0.0, 1.0, low_open=True, high_open=True)
        if self.squeeze not in SQUEEZES:
            raise ValueError(f"squeeze must be one of {SQUEEZES}, got {self.squeeze!r}")
        check_positive_int("num_samples", self.num_samples)
        check_positive_int("sticky_bins", self.sticky_bins)
        # at most the widest basis function (and its square): larger values overflow float32
        # where the densities are computed (σ² = 1e300 passed a finiteness check, then failed)
        check_range("sigma_0", self.sigma_0, 0.0, MAX_WIDTH, low_open=True)
        check_range("min_sigma_sq", self.min_sigma_sq, 0.0, MAX_WIDTH**2, low_open=True)
        check_range("kl_weight", self.kl_weight, 0.0)
        check_density(self.density, self.sigma_init, self.sharpness, self.sink_edge)
        check_bool("token_mass", self.token_mass)
        if self.token_mass and (
            self.squeeze not in EVEN_SQUEEZES or self.density not in CONTENT_DENSITIES
        ):
            raise ValueError(
                "token_mass counts the tokens each basis function stands for: it needs "
                "squeeze='by_length' or 'fill' and a content density ('mixture' or 'content'), "
                f"got squeeze={self.squeeze!r}, density={self.density!r}"
            )
        # the tokens a squeeze="fill" memory keeps out of the merge, one per centre: each setting
        # with the ones before it leaves one place at least for the merged tokens
        kept, names = 0, []
        for name, what in (
            ("keep_first", "the first tokens"),
            ("keep_last", "the most recent tokens"),
            ("keep_salient", "the most salient tokens"),
        ):
            value = getattr(self, name)
            check_positive_int(name, value, minimum=0)
            kept, names = kept + value, [*names, name]
            if value and (self.squeeze != "fill" or kept >= self.num_samples):
                given = ", ".join(f"{n}={getattr(self, n)}" for n in names)
                raise ValueError(
                    f"{name} keeps {what} of a squeeze='fill' memory on their own centres: it "
                    f"needs squeeze='fill' and {' + '.join(names)} < num_samples (one place at "
                    f"least for the merged tokens), got squeeze={self.squeeze!r}, {given}, "
                    f"num_samples={self.num_samples}"
                )
        check_positive_int("salient_before", self.salient_before, minimum=0)
        if self.salient_before and not self.keep_salient:
            raise ValueError(
                "salient_before widens the salience that chooses keep_salient's places: it "
                f"needs keep_salient > 0, got salient_before={self.salient_before}, keep_salient=0"
            )
        if self.squeeze == "fill" and self.num_samples != self.num_basis // len(self.widths):
            raise ValueError(
                "squeeze='fill' reads the old signal at its centres: num_samples must equal "
                f"num_basis / len(widths) = {self.num_basis // len(self.widths)}, got "
                f"{self.num_samples}"
            )
        if self.squeeze == "fill" and (self.sticky or self.density not in CONTENT_DENSITIES):
            raise ValueError(
                "squeeze='fill' keeps the stream in order on its centres and its reads skip the "
                "centres not yet filled: it needs sticky=false (sticky memories resample by "
                "attention) "
                "and a content density ('mixture' or 'content'), got "
                f"sticky={self.sticky}, density={self.density!r}"
            )
        if self.out_dim is not None:
            check_positive_int("out_dim", self.out_dim)
        for name in ("edge_padding", "conv_gate", "sticky", "query_projection"):
            check_bool(name, getattr(self, name))
        if self.segment_len is not None:
            check_positive_int("segment_len", self.segment_len)
            if self.squeeze != "fill":  # "fill" never resamples between the centres
                check_update_gain(self, (self.segment_len,))  # other L when first used

    @property
    def head_dim(self) -> int:
        self.check_sized()
        return self.dim // self.num_heads

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


def check_update_gain(config: LongTermConfig, lengths: tuple[int, ...]) -> None:
    """Refuse settings whose unbounded update expands the memory (paper §3.3, `ridge.update_gain`)
    for segments of the given lengths: a ValueError naming the settings, the gain and single
    changes that bring it below `MAX_UPDATE_GAIN`."""
    c = config
    for length in sorted(set(lengths)):
        gain = _gain(c, length)
        if gain <= MAX_UPDATE_GAIN:
            continue
        fixes = []
        for name, value in _candidate_fixes(c):
            try:
                fixed = _gain(replace(c, segment_len=None, **{name: value}), length)
            except ValueError:
                continue
            if fixed <= MAX_UPDATE_GAIN:
                fixes.append(f"{name}={value!r} (gain {fixed:.2f})")
        hint = "; e.g. " + " or ".join(fixes[:3]) if fixes else ""
        raise ValueError(
            f"the long-term memory's update expands what it stores: with num_basis={c.num_basis}, "
            f"widths={c.widths}, ridge_lambda={c.ridge_lambda:g}, tau={c.tau:g}, "
            f"num_samples={c.num_samples}, edge_padding={c.edge_padding} and segments of length "
            f"{length} its gain is {gain:.2f} > {MAX_UPDATE_GAIN} (the memory would grow about "
            f"{gain:.2f}x per segment); use wider widths, more num_samples, a smaller tau or "
            f"fewer basis functions per width{hint}"
        )


def _gain(c: LongTermConfig, length: int) -> float:
    return update_gain(
        c.num_basis, c.widths, c.ridge_lambda, c.tau, c.num_samples, length, c.edge_padding
    )


def _candidate_fixes(c: LongTermConfig):
    """Single changes to try when the update expands (for the error message)."""
    for factor in (2, 4, 8):
        yield "widths", tuple(min(w * factor, 1.0) for w in c.widths)
    for factor in (2, 4):
        yield "num_samples", c.num_samples * factor
    yield "tau", round(c.tau * 2 / 3, 3)
    yield "tau", round(c.tau / 2, 3)
    if c.num_basis % (2 * len(c.widths)) == 0:
        yield "num_basis", c.num_basis // 2


# the paper's GPT-2 memory (§4.2): the pretrained model's defaults, in both of its configs
GPT2_LONG_TERM = LongTermConfig(
    num_basis=512, widths=(0.005, 0.01), ridge_lambda=0.5, tau=0.5, num_samples=512
)


class WithLongTerm:
    """A model's config with the long-term memory's settings nested as `long_term` (a
    `LongTermConfig` without what the model decides: `MODEL_DECIDES`, filled in by the model's
    `long_term_config()`); a frozen dataclass decorated with `takes_long_term_settings`.

    The memory's settings also go by their own names, flat, as the command line (`--set
    num_basis=256`) and every saved config (checkpoints, runs, results) name them: the
    constructor and `replace` take them (on top of `long_term`), `to_dict` writes them,
    `from_dict` reads them (or a nested "long_term"), and `config.num_basis` reads
    `config.long_term.num_basis`."""

    long_term: LongTermConfig
    MODEL_DECIDES: ClassVar[tuple[str, ...]] = DERIVED_SETTINGS

    @classmethod
    def long_term_names(cls) -> tuple[str, ...]:
        """The memory's settings a user sets, by name."""
        return tuple(f.name for f in fields(LongTermConfig) if f.name not in cls.MODEL_DECIDES)

    @classmethod
    def setting_types(cls) -> dict[str, Any]:
        """Every setting, flat (the memory's by their names), and its type."""
        own, memory = typing.get_type_hints(cls), typing.get_type_hints(LongTermConfig)
        out = {f.name: own[f.name] for f in fields(cls) if f.init and f.name != "long_term"}
        return {**out, **{name: memory[name] for name in cls.long_term_names()}}

    def replace(self, **changes: Any) -> Any:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Every setting, flat (JSON: tuples as lists)."""
        flat = {name: getattr(self, name) for name in self.setting_types()}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in flat.items()}

    @classmethod
    def _from_saved(cls, data: dict[str, Any], defaults: dict[str, Any]) -> Any:
        """A saved config: flat, or with the memory's settings nested under "long_term";
        `defaults` for settings that configs saved before they existed lack."""
        data = dict(data)
        nested = data.pop("long_term", None) or {}
        if not isinstance(nested, dict):
            raise ValueError(f"long_term must be a dict of settings, got {type(nested).__name__}")
        data = {**nested, **data}
        unknown = sorted(set(data) - set(cls.setting_types()))
        if unknown:
            raise ValueError(f"unknown {cls.__name__} fields {unknown}")
        return cls(**{**defaults, **data})

    def _check_long_term(self) -> None:
        """`long_term` is a LongTermConfig whose model-decided settings are left to the model;
        a model's floor of σ² is at most 1."""
        lt = self.long_term
        if not isinstance(lt, LongTermConfig):
            raise TypeError(f"long_term must be a LongTermConfig, got {type(lt).__name__}")
        unset = {f.name: f.default for f in fields(LongTermConfig)}
        for name in self.MODEL_DECIDES:
            if getattr(lt, name) != unset[name]:
                raise ValueError(f"long_term.{name} is the model's: leave it unset")
        check_range("min_sigma_sq", lt.min_sigma_sq, 0.0, 1.0, low_open=True)

    def __getattr__(self, name: str) -> Any:  # only when `name` is not an attribute
        if name in type(self).long_term_names():
            return getattr(self.long_term, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def takes_long_term_settings(cls: type) -> type:
    """Class decorator, over @dataclass, of a `WithLongTerm` config: its constructor (hence
    `dataclasses.replace`) also takes the memory's settings by their own names and applies them
    to `long_term` (given, or the class's default)."""
    init = cls.__init__
    names = set(cls.long_term_names())
    default = next(f.default for f in fields(cls) if f.name == "long_term")

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **settings: Any) -> None:
        memory = {k: settings.pop(k) for k in list(settings) if k in names}
        if memory:
            settings["long_term"] = replace(settings.get("long_term", default), **memory)
        init(self, *args, **settings)

    cls.__init__ = __init__
    return cls


__all__ = [
    "MEMORY_POSITIONS",
    "CHANGEABLE_SETTINGS",
    "CONTENT_DENSITIES",
    "DENSITY_FORMS",
    "DERIVED_SETTINGS",
    "GPT2_LONG_TERM",
    "MAX_UPDATE_GAIN",
    "LongTermConfig",
    "WithLongTerm",
    "takes_long_term_settings",
    "MEMORY_READS",
    "check_density",
    "check_memory_positions",
    "check_memory_read",
    "check_update_gain",
]
