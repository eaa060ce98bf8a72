"""The settings of passkey.py's memory rows, each a preset plus overrides (the labels are in
_passkey_report.py). The rows, in the order they were measured, are docs/results/passkey.md's
history of how the `retrieval` preset (`inftyformer.presets`) was found: the last row is the
preset, and each earlier one the preset without what had not been tried yet (an override of None
leaves a setting out: the row ran with its default)."""

from inftyformer.presets import preset_settings

# the retrieval preset's memory (the benchmark's --segment-len and --window give the rest)
RETRIEVAL = {
    k: v
    for k, v in preset_settings("salient-places", "pretrained").items()
    if k not in ("segment_len", "window")
}


def retrieval(**overrides) -> dict:
    """The retrieval preset's memory with `overrides` (None: the setting left out)."""
    settings = {**RETRIEVAL, **overrides}
    return {k: v for k, v in settings.items() if v is not None}


# the heads row's fixed settings (its sharpness and sink edge are options)
HEADS = dict(memory_read="heads", density="content", min_sigma_sq=1e-6)
# the mixture rows before the fill squeeze: the mixture read over the pretrained default memory
# (sink edge: --heads-sink-edge, as for every row that does not set it)
MIXTURE_READ = dict(memory_read="heads", density="mixture", min_sigma_sq=1e-6, sharpness=1.0)
N2048 = dict(num_basis=2048, num_samples=2048, widths=(0.00125, 0.0025))
# what the fill rows had not tried yet, row by row
NOT_YET = ("salient_before", "keep_salient", "keep_last", "memory_positions", "keep_first")
MIXTURE = {
    "mixture": MIXTURE_READ,
    "mixture-n2048": dict(MIXTURE_READ, **N2048),
    "mixture-length": dict(MIXTURE_READ, **N2048, squeeze="by_length", tau=0.95),
    "mixture-fill": retrieval(sink_edge=None, **dict.fromkeys(NOT_YET)),
    "mixture-fill-sink": retrieval(**dict.fromkeys(NOT_YET)),
    "mixture-fill-keep": retrieval(**dict.fromkeys(NOT_YET[:4])),
    "mixture-fill-positions": retrieval(**dict.fromkeys(NOT_YET[:3]), memory_positions="places"),
    "mixture-fill-recent": retrieval(**dict.fromkeys(NOT_YET[:2]), memory_positions="places"),
    "mixture-fill-salient": retrieval(
        salient_before=None, keep_salient=256, memory_positions="places"
    ),
    "mixture-fill-ranks": retrieval(salient_before=None, keep_salient=256),
    "mixture-fill-ranks-salient": retrieval(salient_before=None),
    "mixture-fill-ranks-before": retrieval(),  # the preset
}
WIDE_WINDOW = 2048  # row window-2048: the base alone with this window, no memory
EXACT = ("exact", "exact-positions")  # the ceiling rows: the heads read exact stored states
# their cost grows with the square of the stream: prompts longer than this are not run (–)
EXACT_MAX_TOKENS = 8192
