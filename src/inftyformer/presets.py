"""Named configurations a user picks instead of a dozen settings (`inftyformer presets` lists
them): each a model kind, one line of what it is, its settings by their flat names and where it
was measured.

    native       a model trained from scratch (`ModelConfig`): its size and memory
    pretrained   how the memory is added to a pretrained base (`AdapterConfig`); the blocks
                 with a memory may depend on the base's depth (`memory_layers` as a rule)
    retrieval    what a pretrained base reads of its exact past, training-free
                 (`RetrievalConfig`, `inftyformer.retrieval`)
    baseline     what the retrieval is measured against (StreamingLLM, a KV window), read by
                 the same model

`preset_settings(name, kind, blocks=…)` gives a preset's settings for a base of `blocks` blocks;
`PretrainedMemoryConfig(base_model=DIR, preset="…")`, `add_long_term_memory(base, preset="…")`
and `--preset` on the command line take them, with the caller's settings on top.

A preset gives each strategy (`core/seams.py`: its squeeze, density, read) with its settings, as
{"kind": …, its settings}; `preset_settings` writes them flat, those settings as `fallback`s: a
caller who chooses another strategy gets none of those the new one lacks (`seams.build` drops
them), where a setting the caller gives for a strategy not chosen is refused by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

KINDS = ("native", "pretrained", "retrieval", "baseline")
READ_KINDS = ("retrieval", "baseline")  # the presets a `RetrievalLM` reads


@dataclass(frozen=True)
class Preset:
    """One named configuration."""

    name: str
    kind: str  # one of KINDS
    summary: str  # one line: what it is
    settings: Mapping[str, Any]  # flat settings
    measured: str = ""  # where it was measured (a page of docs/)
    # pretrained: the blocks with a memory for a base of n blocks (None: every block)
    layers: Callable[[int], tuple[int, ...]] | None = field(default=None, compare=False)
    layers_rule: str = ""  # that rule in words

    def settings_for(self, blocks: int | None = None, fallbacks: bool = False) -> dict[str, Any]:
        """The settings, flat (each strategy's kind by its seam's name, its settings beside it:
        `fallback`s if `fallbacks`), with the blocks resolved for a base of `blocks` blocks."""
        out: dict[str, Any] = {}
        for key, value in self.settings.items():
            if isinstance(value, Mapping):  # a strategy: {"kind": …, its settings}
                own = dict(value)
                out[key] = own.pop("kind")
                out.update({k: fallback(v) if fallbacks else v for k, v in own.items()})
            else:
                out[key] = value
        if self.layers is not None:
            if blocks is None:
                raise ValueError(f"preset {self.name!r} places its memory by the base's depth")
            out["memory_layers"] = self.layers(int(blocks))
        return out


def every_fourth_from_the_middle(n: int) -> tuple[int, ...]:
    """Blocks n/2, n/2 + 4, …: four late blocks of SmolLM2-135M's 30 (15, 19, 23, 27)."""
    return tuple(range(n // 2, n, 4))


# each strategy with its settings: {"kind": …, its settings} (`Preset.settings_for`)
_SORTING = dict(
    vocab_size=22, n_layers=3, dropout=0.1, compression_rate=4, widths=(0.01, 0.05),
    ridge_lambda=1.0, kl_weight=1e-6,
)  # fmt: skip
_SORTING_TAU = 0.75
# the paper's GPT-2 memory (§4.2): N = 512, widths {0.005, 0.01}, λ = 0.5, τ = 0.5, M = 512
_GPT2 = dict(num_basis=512, widths=(0.005, 0.01), ridge_lambda=0.5)


def _fixed(tau: float, num_samples: int) -> dict[str, Any]:
    """The paper's squeeze (§3.3): into [0, τ], resampled at M points."""
    return dict(kind="fixed", tau=tau, num_samples=num_samples)


PRESETS: dict[str, Preset] = {}


def register_preset(preset: Preset) -> Preset:
    if preset.kind not in KINDS:
        raise ValueError(f"a preset's kind must be one of {KINDS}, got {preset.kind!r}")
    if preset.name in PRESETS:
        raise ValueError(f"preset {preset.name!r} is already registered")
    PRESETS[preset.name] = preset
    return preset


register_preset(Preset(
    "cpu-small", "native",
    "3 layers of 128, N = M = 128: trains in minutes on 2 CPU cores (the default)",
    dict(_SORTING, d_model=128, n_heads=4, d_ff=512, segment_len=128, mem_len=128,
         compressed_len=128, num_basis=128, density="normalized",
         squeeze=_fixed(_SORTING_TAU, 128)),
    measured="docs/results/sorting.md",
))  # fmt: skip
register_preset(Preset(
    "paper-sorting", "native",
    "the paper's sorting size (§4.1: d 300, L = m = 1024, N = M = 512), standardised scores",
    dict(_SORTING, d_model=300, n_heads=6, d_ff=300, segment_len=1024, mem_len=1024,
         compressed_len=512, num_basis=512, density="normalized",
         squeeze=_fixed(_SORTING_TAU, 512)),
    measured="docs/results/sorting.md",
))  # fmt: skip
register_preset(Preset(
    "paper", "native",
    "the ∞-former as published (§3, §4.1): paper-sorting with the paper's density",
    dict(_SORTING, d_model=300, n_heads=6, d_ff=300, segment_len=1024, mem_len=1024,
         compressed_len=512, num_basis=512, density="paper", squeeze=_fixed(_SORTING_TAU, 512)),
    measured="docs/results/density.md",
))  # fmt: skip
register_preset(Preset(
    "paper-gpt2", "pretrained",
    "the paper's GPT-2 memory (§4.2: N = M = 512, τ = 0.5, its density) in every block",
    dict(_GPT2, density="paper", squeeze=_fixed(0.5, 512), memory_read="added", kl_weight=1e-6),
    measured="docs/results/pretrained.md",
))  # fmt: skip
register_preset(Preset(
    "adapter", "pretrained",
    "the memory to train on a frozen base (the default): N = M = 256, every 4th late block",
    dict(_GPT2, num_basis=256, density="normalized", squeeze=_fixed(0.5, 256),
         memory_read="added"),
    measured="docs/hf.md",
    layers=every_fourth_from_the_middle,
    layers_rule="every fourth block from the middle",
))  # fmt: skip
register_preset(Preset(
    "salient-places", "pretrained",
    "training-free: the base's heads read 2,048 exact places, salient ones kept by surprisal",
    dict(memory_read=dict(kind="heads", memory_positions="ranks"),
         density=dict(kind="mixture", sharpness=1.0, sink_edge=0.0), min_sigma_sq=1e-6,
         num_basis=2048, widths=(0.0003,), edge_padding=False,
         squeeze=dict(kind="fill", keep_first=64, keep_last=1024, keep_salient=959,
                      salient_before=2),
         segment_len=256, window=256),
    measured="docs/results/passkey.md (row xxiii)",
))  # fmt: skip
# the retrieval kind: what a pretrained base reads of its exact past (`RetrievalConfig`), one
# preset for every job: a budget of 2,048 read places (sink + blocks + window) for a stream
register_preset(Preset(
    "retrieval", "retrieval",
    "the default: a stream reads its first 64 tokens, the 16 past blocks of 64 its queries "
    "match best and the last 960 (2,048 places); a question (a prompt's last call) reads the "
    "first 64, its 2 past blocks of most attention weight at three fifths of the base's "
    "blocks, each with the block after it, and its last 256",
    dict(block_size=64, sink_blocks=1, window=960, segment_len=256,
         choice=dict(kind="question", blocks=16, read_from=0)),
    measured="docs/results/question_choices/question_choices.md",
))  # fmt: skip
# the baselines the retrieval is measured against, at the same budget of read places: read by
# `RetrievalLM` as its presets are, not offered beside them
register_preset(Preset(
    "streaming", "baseline",
    "the StreamingLLM baseline at the retrieval budget: the first 64 tokens and the last 1,984",
    dict(block_size=64, sink_blocks=1, window=1984, segment_len=256, choice=dict(kind="none")),
    measured="docs/results/retrieval.md",
))  # fmt: skip
register_preset(Preset(
    "window", "baseline",
    "the base with a KV cache of its last 2,048 tokens and nothing older",
    dict(block_size=64, sink_blocks=0, window=2048, segment_len=256, choice=dict(kind="none")),
    measured="docs/results/retrieval.md",
))  # fmt: skip


def get_preset(name: str, kind: str | None = None) -> Preset:
    """The preset `name` (of `kind`, when given), or a ValueError listing those there are."""
    if name not in PRESETS or (kind is not None and PRESETS[name].kind != kind):
        known = [p.name for p in PRESETS.values() if kind is None or p.kind == kind]
        what = f"{kind} " if kind else ""
        raise ValueError(f"unknown {what}preset {name!r}; known: {', '.join(known)}")
    return PRESETS[name]


def preset_settings(name: str, kind: str, blocks: int | None = None) -> dict[str, Any]:
    """The flat settings of preset `name` (of `kind`) for a base of `blocks` blocks, to take the
    caller's on top (``{**preset_settings(…), **settings}``): its strategies' settings (its
    squeeze's τ, its density's sharpness, …) as `fallback`s (module doc)."""
    return get_preset(name, kind).settings_for(blocks, fallbacks=True)


def retrieval_settings(name: str) -> dict[str, Any]:
    """The settings of preset `name` that a `RetrievalLM` reads: a retrieval preset or a
    baseline (`READ_KINDS`); a ValueError listing those there are otherwise."""
    if name not in PRESETS or PRESETS[name].kind not in READ_KINDS:
        known = [p.name for p in PRESETS.values() if p.kind in READ_KINDS]
        raise ValueError(f"unknown retrieval preset {name!r}; known: {', '.join(known)}")
    return PRESETS[name].settings_for(fallbacks=True)


def preset_changes(
    name: str, kind: str, current: Mapping[str, Any], blocks: int | None = None
) -> dict[str, Any]:
    """The settings of preset `name` that differ from `current` (a trained model's flat
    settings, its config's `to_dict()`): what applying the preset to it changes (its
    strategies' settings as `fallback`s, as `preset_settings` gives them)."""
    marked = preset_settings(name, kind, blocks)
    out = {}
    for key, value in get_preset(name, kind).settings_for(blocks).items():
        now = current.get(key)
        same = list(value) if isinstance(value, tuple) else value
        if now != same and not (isinstance(now, list) and list(now) == same):
            out[key] = marked[key]
    return out


# ---------------------------------------------------------------------- a preset's settings
class Fallback:
    """A setting given under the caller's (a preset's strategy's, `fallback`): `seams.build`
    gives it to the chosen strategy when that strategy has it and drops it otherwise, where a
    plain setting the chosen strategy lacks is refused. It is its value still (equal, hashed,
    shown and written to JSON the same), an instance of a subclass of the value's type where
    the type allows one; it never reaches a built config (`plain`)."""

    __slots__ = ()


class _Held(Fallback):
    """A fallback of a type that takes no subclass (bool, None): the value, held."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return bool(self.value == plain(other))

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return repr(self.value)


_FALLBACK_TYPES: dict[type, type] = {}


def fallback(value: Any) -> Any:
    """`value` marked as a `Fallback`."""
    if isinstance(value, Fallback):
        return value
    kind = type(value)
    if kind not in _FALLBACK_TYPES:
        try:
            _FALLBACK_TYPES[kind] = type(kind.__name__, (kind, Fallback), {"__slots__": ()})
        except TypeError:  # bool, NoneType: no subclass
            _FALLBACK_TYPES[kind] = _Held
    return _FALLBACK_TYPES[kind](value)


def is_fallback(value: object) -> bool:
    return isinstance(value, Fallback)


def plain(value: Any) -> Any:
    """`value` without its `Fallback` mark (of its own type again)."""
    if isinstance(value, _Held):
        return value.value
    if isinstance(value, Fallback):
        return next(t for t in type(value).__mro__ if not issubclass(t, Fallback))(value)
    return value


def describe_presets() -> list[str]:
    """One line per preset, by kind (what `inftyformer presets` prints)."""
    lines = []
    for kind in KINDS:
        lines.append(f"{kind}:")
        for p in PRESETS.values():
            if p.kind == kind:
                where = f" [{p.measured}]" if p.measured else ""
                lines.append(f"  {p.name:<14} {p.summary}{where}")
    return lines


__all__ = [
    "Fallback",
    "KINDS",
    "PRESETS",
    "READ_KINDS",
    "Preset",
    "describe_presets",
    "every_fourth_from_the_middle",
    "fallback",
    "get_preset",
    "is_fallback",
    "plain",
    "preset_changes",
    "preset_settings",
    "register_preset",
    "retrieval_settings",
]
