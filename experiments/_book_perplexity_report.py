"""The page and plot of experiments/book_perplexity.py, rendered from the JSON it wrote."""

from __future__ import annotations

import math
from pathlib import Path

from book_perplexity import BUCKETS, NAME, WHAT, bucket_name

from inftyformer._measure import machine_markdown, pyplot


def verdict(data: dict) -> str:
    """Whether retrieval's perplexity at positions ≥ 1K is no worse than the window's, read
    from the ratio the JSON holds."""
    r = data["results"]["ratios"].get("retrieval/window", {}).get(bucket_name(BUCKETS[-1]))
    if r is None:
        return "Not measured: no retrieval and window cells for every book at positions ≥ 1K."
    lo, hi = r["interval"]
    met = "met" if r["ratio"] <= 1 else "not met"
    sure = (
        "the whole interval lies below 1" if hi < 1
        else "the whole interval lies above 1" if lo > 1
        else "the interval holds 1"
    )  # fmt: skip
    n = len(r["per_book"])
    return (
        f"**Goal (retrieval no worse than the 2K window at positions ≥ 1K): {met}.** "
        f"retrieval / window = {r['ratio']:.4f} [{lo:.4f}, {hi:.4f}] ({sure}); lower on "
        f"{r['books_below_1']} of {n} books."
    )


def hybrid_verdict(data: dict) -> str:
    """Whether the continuous memory is a memory, not an adapter: hybrid / retrieval at
    positions ≥ 2K at most 0.97, the gain at [8K, 16K) larger than at [1K, 2K) (their intervals
    apart), and hybrid at least 1% below hybrid-other, another book's memory (the whole
    interval; less is a correction any book's memory carries), and, when measured (weights
    trained with adapters), at least 1% below hybrid-empty, the same weights with the memory
    empty — all of them, each read from the ratios the JSON holds."""
    ratios = data["results"]["ratios"]

    def shown(pair: str, bucket: str) -> str:
        r = ratios.get(pair, {}).get(bucket)
        if r is None:
            return f"{pair} at {bucket}: not measured"
        lo, hi = r["interval"]
        n = len(r["per_book"])
        return (f"{pair} at {bucket} = {r['ratio']:.4f} [{lo:.4f}, {hi:.4f}] (below 1 on "
                f"{r['books_below_1']} of {n} books)")  # fmt: skip

    gain = ratios.get("hybrid/retrieval", {})
    far, near, late = gain.get("[8K, 16K)"), gain.get("[1K, 2K)"), gain.get("≥2K")
    gains = late is not None and late["ratio"] <= 0.97
    grows = far is not None and near is not None and far["interval"][1] < near["interval"][0]
    control = ratios.get("hybrid/hybrid-other", {}).get("≥2K")
    own = control is not None and control["interval"][1] < 0.99
    # with adapters trained beside the memory: the same weights with the memory empty
    emptied = ratios.get("hybrid/hybrid-empty", {}).get("≥2K")
    reads = emptied is None or emptied["interval"][1] < 0.99
    word = lambda ok: "yes" if ok else "no"  # noqa: E731
    return "\n".join([
        f"**Goal (a memory, not an adapter: at least 3% below the retrieval at positions ≥ 2K, "
        f"the gain growing with distance, and its own book's memory at least 1% better than "
        f"another's{' and than none' if emptied else ''}): "
        f"{'met' if gains and grows and own and reads else 'not met'}.**",
        "",
        f"- At least 3% below the retrieval at ≥ 2K: {word(gains)}: "
        f"{shown('hybrid/retrieval', '≥2K')}.",
        f"- Growing with distance (the intervals apart): {word(grows)}: "
        f"{shown('hybrid/retrieval', '[1K, 2K)')}; {shown('hybrid/retrieval', '[8K, 16K)')}.",
        f"- Its own book's memory at least 1% better than another book's (the whole interval "
        f"below 0.99): "
        f"{word(own)}: {shown('hybrid/hybrid-other', '≥2K')}.",
        *([f"- At least 1% better than the same weights with the memory empty (the whole "
           f"interval below 0.99): {word(reads)}: {shown('hybrid/hybrid-empty', '≥2K')}."]
          if emptied else []),
    ])  # fmt: skip


def render(data: dict, notes: str = "") -> str:
    s, res = data["setup"], data["results"]
    names = [bucket_name(b) for b in BUCKETS]
    boot = f"{s['resamples']:,} bootstrap draws of the {len(s['books'])} books (seed {s['seed']})"
    lines = [
        "# Book perplexity by position: the 2K window, StreamingLLM and retrieval"
        + (" with the continuous memory beside it" if "hybrid" in s["rows"] else ""),
        "",
        f"Base model `{s['base_model']}`; the first {s['tokens']:,} tokens of each of "
        f"{len(s['books'])} held-out books, streamed in calls of {s['segment_len']} tokens; "
        "every token's NLL given what the row reads of its past. Perplexity = exp(mean NLL) "
        "over the tokens of every book at those positions (pooled; each book gives the same "
        f"number) [95% interval: {boot}, books drawn with replacement, the same draws for "
        "every row]. Every row reads at most 2,048 places but `full`. Rendered from "
        f"`{NAME}.json` by `experiments/{NAME}.py`.",
        "",
        "Rows: " + "; ".join(f"`{r}` {WHAT[r]}" for r in s["rows"]) + ".",
        "",
        "Books: " + "; ".join(f"{b['title']} ({b['split']} {b['id']})" for b in s["books"]) + ".",
        "",
        verdict(data),
        "",
        *([hybrid_verdict(data), ""] if "hybrid" in s["rows"] else []),
        "## Perplexity",
        "",
        "| row | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for row in s["rows"]:
        shown = []
        for bucket, name in zip(BUCKETS, names, strict=True):
            c = res["rows"].get(row, {}).get(name)
            beyond = row == "full" and s["full_tokens"] < min(bucket[1] or 1 << 30, s["tokens"])
            if c is None:
                shown.append("(beyond its positions)" if beyond else "–")
            else:
                shown.append(f"{c['ppl']:.3f} [{c['interval'][0]:.3f}, {c['interval'][1]:.3f}]")
        lines.append(f"| {row} | " + " | ".join(shown) + " |")
    lines += ["", "## Ratios", "",
              "Perplexity of a row / perplexity of another on the same tokens [95% paired "
              "bootstrap interval over books] (books where it is below 1).", "",
              "| rows | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]  # fmt: skip
    for pair, by in res["ratios"].items():
        shown = []
        for name in names:
            r = by.get(name)
            shown.append(
                "–" if r is None else
                f"{r['ratio']:.4f} [{r['interval'][0]:.4f}, {r['interval'][1]:.4f}] "
                f"({r['books_below_1']}/{len(r['per_book'])})"
            )  # fmt: skip
        lines.append(f"| {pair} | " + " | ".join(shown) + " |")
    last = bucket_name(BUCKETS[-1])
    lines += ["", f"## Per book, positions {last}", "",
              "| row | " + " | ".join(b["title"] for b in s["books"]) + " |",
              "|---|" + "---:|" * len(s["books"])]  # fmt: skip
    for row in s["rows"]:
        c = res["rows"].get(row, {}).get(last)
        if c is not None:
            lines.append(f"| {row} | " + " | ".join(f"{p:.3f}" for p in c["per_book"]) + " |")
    meta = data["meta"]
    cpu = meta["cpu_seconds"]
    lines += ["", f"![NLL against position]({NAME}.png)", "", "## How it was measured", "",
              "```", meta["command"], "```", "",
              f"- Cost: {len(data['cells'])} cells (one per row and book), "
              f"{cpu / 60:.1f} CPU-minutes in all ({meta['threads']} torch thread), "
              f"{meta['seconds'] / 60:.1f} min of wall time; NLL per block of {s['block']} "
              f"predicted positions in `{NAME}.cells/`.",
              machine_markdown(meta["machine"]), ""]  # fmt: skip
    if notes:
        lines += [notes, ""]
    return "\n".join(lines)


def plot(data: dict, path: Path) -> bool:
    """Mean NLL per power-of-two position bin per row (left, with the bootstrap intervals over
    books) and each row's difference from streaming's, the baseline at the same budget (right:
    the window's, far above, left out); False: nothing to draw."""
    curves = data["results"]["curves"]
    if not any(curves.values()):
        return False
    plt = pyplot()
    fig, (ax, dx) = plt.subplots(1, 2, figsize=(11, 4))
    reference = {p["from"]: p["nll"] for p in curves.get("streaming", [])}
    for row, points in curves.items():
        if not points:
            continue
        xs = [math.sqrt(p["from"] * p["to"]) for p in points]
        ys = [p["nll"] for p in points]
        err = [[y - p["interval"][0] for y, p in zip(ys, points, strict=True)],
               [p["interval"][1] - y for y, p in zip(ys, points, strict=True)]]  # fmt: skip
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=row)
        dy = [(x, p["nll"] - reference[p["from"]])
              for x, p in zip(xs, points, strict=True) if p["from"] in reference]  # fmt: skip
        if row != "window" and dy:
            dx.plot(*zip(*dy, strict=True), marker="o", label=row)
        else:
            dx.plot([], [])  # keep each row's colour
    for a in (ax, dx):
        a.axvline(2048, color="grey", lw=0.8, ls=":")
        a.set(xscale="log", xlabel="position of the predicted token (bins [2^k, 2^(k+1)))")
        if a.get_legend_handles_labels()[0]:  # (no streaming row: nothing on the right)
            a.legend()
    ax.set(ylabel="mean NLL (nats/token)", title="NLL per position bin (95% over books)")
    dx.set(ylabel="NLL − streaming's NLL", title="against streaming (the same 2,048 places)")
    dx.axhline(0, color="grey", lw=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
