"""Two presets the package offered until its default chose a question's blocks, kept here as
settings on the default preset so that the experiments that measured them can measure them
again as they were (their cells are in docs/results: the default matches or beats both wherever
both were measured, docs/retrieval_guide.md).

    retrieval-near    the first 64 tokens, the 24 past blocks of 64 its queries match best read
                      by rising score (the best right before the window) and the last 448
    retrieval-picked  one fact read: the first 64, the past block a call's last 32 queries give
                      the most attention weight with the block after it, and the last 256; the
                      answer reads its question's blocks

Each is the `retrieval` preset with the settings below on top: the default's question settings
drop with its choice (`RetrievalConfig.from_preset`).
"""

from __future__ import annotations

from typing import Any

PRESET = "retrieval"  # the preset the retired rows are settings on
NEAR, PICKED = "retrieval-near", "retrieval-picked"
RETIRED: dict[str, dict[str, Any]] = {
    NEAR: {"window": 448, "choice": "max", "blocks": 24, "read_from": 0, "layout": "nearest"},
    PICKED: {"window": 256, "choice": "attention", "blocks": 2, "neighbours": 1, "read_from": 0,
             "answer_choice": "question", "select_queries": 32},
}  # fmt: skip


def preset_of(row: str) -> tuple[str, dict[str, Any]]:
    """The preset a `RetrievalLM` of `row` takes and the settings on top of it: a retired row's
    (`RETIRED`), or the preset of that name with nothing on top."""
    if row in RETIRED:
        return PRESET, dict(RETIRED[row])
    return row, {}


def model_args(settings: dict[str, Any]) -> str:
    """`settings` as lm_eval's model_args write them (``window=448,choice=max,…``)."""
    return ",".join(f"{k}={v}" for k, v in settings.items())


def row_settings(row: str) -> dict[str, Any]:
    """Every flat setting `row` reads with (its config's `settings()`): what a cell records."""
    from inftyformer.retrieval import RetrievalConfig

    preset, on_top = preset_of(row)
    return RetrievalConfig.from_preset(preset, **on_top).settings()
