"""The settings of the training-free retrieval of exact past blocks (`retrieval/model.py`; no
transformers import): what every call reads, and two strategies behind seams of their own.

    RetrievalConfig(block_size=64, sink_blocks=1, window=960, segment_len=256,
                    choice=QuestionChoice(blocks=16, read_from=0), layout=StreamLayout())

    seam     what it decides                      kinds (`scorers.py`, `layouts.py`)
    choice   which stored blocks a call reads     "max": the best q·k of any query, head and
                                                  token; "attention": the best attention weight
                                                  over all stored tokens; "question": a stream's
                                                  call as "max", a question's as "attention";
                                                  "none": no past blocks (the baselines: sink
                                                  and window only)
    layout   where the chosen blocks sit          "stream": in stream order; "nearest": by
                                                  rising score, the best next to the window

Each strategy validates its own settings; a setting of a strategy that was not chosen cannot be
written: ``RetrievalConfig(choice="none", blocks=4)`` is refused (blocks is a setting of the
choices that score blocks). The settings go by flat names too, as presets and the command line write
them (``RetrievalConfig(choice="attention", blocks=2, select_queries=32)``), and read back the
same way (``config.blocks`` is ``config.choice.blocks``; 0 for choice "none").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._checks import check_positive_int, check_segment_len
from ..core.flat_settings import flat_dict, flat_setting, takes_flat_settings
from ..core.seams import Strategy, setting_names
from . import layouts, scorers  # noqa: F401  (register the strategies: their settings are names)
from .layouts import StreamLayout
from .scorers import QuestionChoice

SEAMS = ("choice", "layout")


@takes_flat_settings(*SEAMS)
@dataclass(frozen=True)
class RetrievalConfig:
    """Each call of at most `segment_len` tokens attends, in every block of the base, to the
    stream's first `sink_blocks` blocks of B = `block_size` tokens, to the blocks its `choice`
    picks among the older ones (placed by `layout`) and to the `window` most recent tokens (kept
    as keys and values, not recomputed). The older blocks' keys and values are kept on disk
    (`store_dir`; None: a temporary folder)."""

    block_size: int = 64
    sink_blocks: int = 1
    window: int = 960  # the most recent tokens every call reads (a KV cache)
    segment_len: int = 256  # the tokens of one call of the base
    store_dir: str | None = None
    choice: Strategy = field(default_factory=lambda: QuestionChoice(read_from=0))
    layout: Strategy = field(default_factory=StreamLayout)

    def __post_init__(self) -> None:
        check_positive_int("block_size", self.block_size)
        check_positive_int("sink_blocks", self.sink_blocks, minimum=0)
        check_positive_int("window", self.window, minimum=0)
        check_segment_len(self.segment_len)
        if self.store_dir is not None:
            if not isinstance(self.store_dir, str | Path) or not str(self.store_dir):
                raise TypeError(f"store_dir must be a path or None, got {self.store_dir!r}")
            object.__setattr__(self, "store_dir", str(self.store_dir))
        for seam in SEAMS:
            strategy = getattr(self, seam)
            if not isinstance(strategy, Strategy) or strategy.seam != seam:
                raise TypeError(f"{seam} must be a {seam} strategy, got {strategy!r}")
            strategy.check(self)

    def __getattr__(self, name: str) -> Any:  # only when `name` is not a field
        """A strategy's setting by its flat name: ``config.blocks`` is ``config.choice.blocks``."""
        return flat_setting(self, name, SEAMS)

    @property
    def context(self) -> int:
        """P0: the positions before a call's first token (sink, chosen blocks, window)."""
        B = self.block_size
        return (self.sink_blocks + self.choice.blocks) * B + self.window + B - 1

    def replace(self, **changes: Any) -> RetrievalConfig:
        return dataclasses.replace(self, **changes)

    def settings(self) -> dict[str, Any]:
        """Every setting, flat: each strategy's kind and its settings (what `--set` names and
        `RetrievalConfig(**settings)` takes back)."""
        return flat_dict(self)

    def to_dict(self) -> dict[str, Any]:
        """JSON, nested: each strategy as {"kind": …, its settings}."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if isinstance(value, Strategy) else value
        return out

    @classmethod
    def from_preset(cls, name: str, **settings: Any) -> RetrievalConfig:
        """Preset `name` (of the retrieval or baseline kind, `inftyformer presets`) with
        `settings` on top; a setting of the preset's strategy that the one chosen lacks drops."""
        from ..presets import retrieval_settings

        return cls(**{**retrieval_settings(name), **settings})

    @classmethod
    def of(cls, preset: str | None = None, **settings: Any) -> RetrievalConfig:
        """Preset `preset` with `settings` on top (`from_preset`), or, with no preset, the
        default config with them: what `RetrievalLM(base, preset=…, **settings)` reads."""
        if preset is None:
            return cls().replace(**settings)
        return cls.from_preset(preset, **settings)

    @classmethod
    def setting_names(cls) -> tuple[str, ...]:
        """Every flat setting name (the fields and the settings of every registered strategy of
        the two seams)."""
        names = [f.name for f in dataclasses.fields(cls)]
        for seam in SEAMS:
            names += [n for n in setting_names(seam) if n not in names]
        return tuple(names)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RetrievalConfig:
        """`to_dict`'s JSON (or the flat `settings`)."""
        if not isinstance(data, dict):
            raise ValueError(f"the retrieval's settings must be a dict, got {data!r}")
        return cls(**data)


__all__ = ["SEAMS", "RetrievalConfig"]
