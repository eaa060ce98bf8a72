"""How the experiments' plots draw their rows: one colour and marker per row, fixed by the row's
name (a row keeps its colour whichever rows a figure holds, and no two rows share one), and one
legend for the whole figure, below the axes, never over the data."""

from __future__ import annotations

import math
import zlib

# row -> (colour, marker): the base alone in black and greys, the retrieval presets warm, their
# variants in lighter shades, the StreamingLLM baseline blue, kvpress's presses purple and blues
ROW_STYLE = {
    "full": ("#000000", "*"),
    "window": ("#7f7f7f", "s"),
    "window-256": ("#c7c7c7", "s"),
    "streaming": ("#1f77b4", "s"),
    "retrieval": ("#d62728", "o"),
    "packed": ("#ff9896", "o"),
    "retrieval-near": ("#ff7f0e", "o"),
    "retrieval-picked": ("#2ca02c", "o"),
    "retrieval-scored": ("#e377c2", "o"),
    "picked-all": ("#98df8a", "v"),
    "picked-max": ("#17becf", "v"),
    "retrieval-question": ("#843c39", "P"),
    "question-first": ("#e7969c", "P"),
    "near-attention": ("#bcbd22", "v"),
    "near-attention-4": ("#dbdb8d", "v"),
    "near-attention-n1": ("#ffbb78", "v"),
    "near-attention-8n1": ("#c49c94", "v"),
    "paper": ("#8c564b", "^"),
    "kvpress_snapkv": ("#9467bd", "D"),
    "kvpress_snapkv_q": ("#c5b0d5", "D"),
    "kvpress_expected": ("#aec7e8", "D"),
    "kvpress_expected_q": ("#9edae5", "D"),
    "kvpress_knorm": ("#393b79", "D"),
    "kvpress_streaming": ("#6baed6", "D"),
}
_SPARE = ("#843c39", "#637939", "#7b4173", "#e7ba52", "#3182bd", "#31a354", "#756bb1", "#636363")


def row_style(row: str) -> tuple[str, str]:
    """(colour, marker) of `row`; a row not in ROW_STYLE takes a spare colour by its name."""
    if row in ROW_STYLE:
        return ROW_STYLE[row]
    return _SPARE[zlib.crc32(row.encode()) % len(_SPARE)], "P"


def legend_below(fig, handles: list, labels: list[str], columns: int = 5) -> None:
    """One legend for the figure, centred below its axes (the axes are laid out above it)."""
    if not handles:
        fig.tight_layout()
        return
    columns = min(columns, len(handles))
    lines = math.ceil(len(handles) / columns)
    height = fig.get_figheight()
    fig.legend(handles, labels, loc="lower center", ncol=columns, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, min(0.5, (0.22 * lines + 0.1) / height), 1, 1))
