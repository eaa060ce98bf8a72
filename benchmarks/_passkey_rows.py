"""The settings of passkey.py's memory rows (each row's adapter settings over the one before it,
in the order the rows were measured; the labels are in _passkey_report.py)."""

# the heads row's fixed settings (its sharpness and sink edge are options)
HEADS = dict(memory_read="heads", density="content", min_sigma_sq=1e-6)
# the mixture rows' settings (sink edge: --heads-sink-edge)
MIXTURE = {
    "mixture": dict(memory_read="heads", density="mixture", min_sigma_sq=1e-6, sharpness=1.0),
}
MIXTURE["mixture-n2048"] = dict(
    MIXTURE["mixture"], num_basis=2048, num_samples=2048, widths=(0.00125, 0.0025)
)
# row (xiii) with every stored token an equal share of the signal (until τ = 0.95 caps it)
MIXTURE["mixture-length"] = dict(MIXTURE["mixture-n2048"], squeeze="by_length", tau=0.95)
# one stored token per centre until the memory is full, at a width below the centres' spacing
# (the signal at the centres is then the stored states), equal runs of tokens merged after that
MIXTURE["mixture-fill"] = dict(
    MIXTURE["mixture"],
    num_basis=2048,
    widths=(0.0003,),
    squeeze="fill",
    edge_padding=False,
)
# the first tokens read too: the pretrained heads park attention there (the attention sink)
MIXTURE["mixture-fill-sink"] = dict(MIXTURE["mixture-fill"], sink_edge=0.0)
# and the first 64 tokens never merged once the memory is full: the sink stays a sink
MIXTURE["mixture-fill-keep"] = dict(MIXTURE["mixture-fill-sink"], keep_first=64)
# and every place read at its own stream position, not at one distance
MIXTURE["mixture-fill-positions"] = dict(MIXTURE["mixture-fill-keep"], memory_positions="places")
# and the last 1,024 tokens never merged either: the recent past exact, the older past merged
MIXTURE["mixture-fill-recent"] = dict(MIXTURE["mixture-fill-positions"], keep_last=1024)
# and 256 places for the most salient older tokens (right after a burst of the base's surprisal)
MIXTURE["mixture-fill-salient"] = dict(MIXTURE["mixture-fill-recent"], keep_salient=256)
# and every place at its rank, not its stream position: no place more than K before the window
MIXTURE["mixture-fill-ranks"] = dict(MIXTURE["mixture-fill-salient"], memory_positions="ranks")
# and every place between the first 64 and the last 1,024 tokens but one kept for a salient
# token: the older past is its most surprising tokens, with no merged runs between them
MIXTURE["mixture-fill-ranks-salient"] = dict(MIXTURE["mixture-fill-ranks"], keep_salient=959)
# and the two tokens before a burst salient too: the words that open a fact, not only its end
MIXTURE["mixture-fill-ranks-before"] = dict(MIXTURE["mixture-fill-ranks-salient"], salient_before=2)
WIDE_WINDOW = 2048  # row window-2048: the base alone with this window, no memory
EXACT = ("exact", "exact-positions")  # the ceiling rows: the heads read exact stored states
# their cost grows with the square of the stream: prompts longer than this are not run (–)
EXACT_MAX_TOKENS = 8192
