"""Pictures of an `inspection.Inspection` (matplotlib, imported only when drawing).

One function per picture, each writing one PNG and returning its path (None when the picture
does not apply to the model): where the long-term reads land, σ against σ₀, where the sticky
resampling points went, and fidelity by age. `draw_all` draws every picture that applies.
"""

from __future__ import annotations

import math
from pathlib import Path

from ._files import atomic_path
from .inspection import Fidelity, Inspection


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _title(result: Inspection, what: str) -> str:
    name = {"infty": "∞-former", "compressive": "Compressive", "xl": "Transformer-XL"}.get(
        result.model_type, result.model_type
    )
    sticky = " (sticky)" if result.sticky else ""
    return (
        f"{name}{sticky}: {what} ({result.num_tokens:,} tokens, segments of {result.segment_len})"
    )


# sizes that stay readable where the PNGs are shown (a documentation page, an image viewer)
TITLE, LABEL, TICK = 13, 11.5, 10.5
QUERY_COLOUR = "#00e5ff"  # the queries' segment: bright against the colour map, and on white
FUTURE_COLOUR = "0.82"  # positions the queries cannot have seen yet
HEADS_ALIKE = 0.15  # total-variation distance under which a layer's heads are drawn as one


def _head_spread(mass) -> float:
    """The largest mean total-variation distance between a head's read mass and the heads'
    mean (0: the heads read alike) over the layers' query segments; mass [S, H, B]."""
    mean = mass.mean(1, keepdims=True)
    total = mean.sum(-1).clip(min=1e-12)  # [S, 1]
    return float((0.5 * abs(mass - mean).sum(-1) / total).mean(0).max())


def _positions_axis(ax, C: int, end: float) -> None:
    """Token positions, linear over the first segment and logarithmic beyond, written out."""
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("symlog", linthresh=C, linscale=0.5)
    ax.set_xlim(0, end)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))


def plot_reads(result: Inspection, path: str | Path, dpi: int = 80) -> Path | None:
    """Per layer: the read mass (mean over each segment's queries) over the absolute positions
    of the past, one row per segment of queries; log colour scale, and a position axis linear
    over the first segment and logarithmic beyond, so that reads of the distant start show.
    A layer's heads are drawn as one panel (their mean) when they read alike, which is usual;
    otherwise every head has its panel. Grey: positions the queries have not seen yet."""
    layers = [i for i, r in enumerate(result.reads) if r is not None]
    if not layers:
        return None
    import numpy as np
    from matplotlib.colors import LogNorm
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    plt = _pyplot()
    heads = result.reads[layers[0]].mass.shape[1]
    spread = max(_head_spread(result.reads[i].mass.numpy()) for i in layers)
    per_head = heads > 1 and spread > HEADS_ALIKE
    if per_head:  # one row per layer, one panel per head
        shape, size = (len(layers), heads), (3.9 * heads + 1.0, 3.1 * len(layers) + 1.5)
    else:  # one panel per layer, side by side
        shape, size = (1, len(layers)), (3.7 * len(layers) + 1.0, 4.9)
    fig, axes = plt.subplots(*shape, figsize=size, squeeze=False, layout="constrained")
    C = result.segment_len
    image = None
    # one colour scale for every panel, so that the colour bar holds for all of them
    top = max(float(result.reads[i].mass.max()) for i in layers) or 1.0
    norm = LogNorm(vmin=top * 1e-4, vmax=top)
    for n, i in enumerate(layers):
        r = result.reads[i]
        calls = r.calls.numpy()
        rows = [*(calls - 0.5), calls[-1] + 0.5]
        end = float(r.bin_edges[-1])
        masses = r.mass.numpy()  # [S, H, B]
        panels = [(h, masses[:, h]) for h in range(heads)] if per_head else [(None, masses.mean(1))]
        for h, mass in panels:
            ax = axes[n][h] if per_head else axes[0][n]
            image = ax.pcolormesh(
                r.bin_edges.numpy(),
                rows,
                mass.clip(min=top * 1e-4),
                norm=norm,
                cmap="magma",
                shading="flat",
            )
            ax.fill_betweenx(calls, calls * C, end, color=FUTURE_COLOUR, lw=0)
            ax.plot(calls * C, calls, color=QUERY_COLOUR, lw=2.2)
            _positions_axis(ax, C, end)
            ax.set_ylim(rows[0], rows[-1])
            which = slice(None) if h is None else h
            distance = float(np.mean(r.mean_distance.numpy()[:, which])) / C
            outside = float(np.mean(r.outside.numpy()[:, which]))
            where = f"{distance:.1f} segments back\n{outside:.0%} of each read outside t ∈ [0, 1]"
            if h is None:
                what = f"layer {i}: on average {where}"
            else:
                what = f"layer {i}, head {h}: {where}"
            ax.set_title(what, fontsize=LABEL)
            ax.tick_params(labelsize=TICK)
            ax.set_xlabel("position read (token)", fontsize=LABEL)
            if (h or 0) == 0 and (per_head or n == 0):  # the first panel of a row
                ax.set_ylabel("segment of the queries", fontsize=LABEL)
    bar = fig.colorbar(image, ax=axes, fraction=0.04, pad=0.01, aspect=30)
    bar.set_label("share of the read mass (log)", fontsize=LABEL)
    bar.ax.tick_params(labelsize=TICK)
    how = ""
    if heads > 1:
        how = " (one panel per head)" if per_head else f" (mean of the {heads} heads: alike)"
    fig.suptitle(
        _title(result, "where the long-term reads land")
        + f"\nrow: a segment's queries; bright: read a lot, black: not read{how}"
        + "\noutside t ∈ [0, 1]: the share of a read's Gaussian density beyond the stored"
        "\nsignal (t = 0 oldest, 1 newest), where it reads nothing: the wider σ, the more",
        fontsize=TITLE,
    )
    fig.legend(
        handles=[
            Line2D([], [], color=QUERY_COLOUR, lw=2.2, label="start of the queries' segment"),
            Patch(color=FUTURE_COLOUR, label="not yet seen"),
        ],
        loc="outside lower center",
        ncols=2,
        fontsize=LABEL,
        frameon=False,
    )
    return _save(fig, path, dpi)


def plot_sigma(result: Inspection, path: str | Path, dpi: int = 80) -> Path | None:
    """Per layer: the distribution of σ of the reads (one histogram per head, one for the layer
    when its heads are alike), against σ₀, the width the KL term pulls σ towards."""
    layers = [i for i, s in enumerate(result.sigmas) if s is not None]
    if not layers:
        return None
    import numpy as np

    plt = _pyplot()
    fig, axes = plt.subplots(
        1, len(layers), figsize=(3.7 * len(layers) + 0.6, 4.2), squeeze=False, layout="constrained"
    )
    low = min(float(result.sigmas[i].min()) for i in layers)
    high = max(float(result.sigmas[i].max()) for i in layers)
    low = min(low, result.sigma_0 or low) * 0.8
    edges = np.geomspace(max(low, 1e-3), max(high * 1.25, low * 2), 60)
    for ax, i in zip(axes[0], layers, strict=True):
        s = result.sigmas[i].numpy()
        medians = np.median(s, axis=1)
        alike = bool(np.all(np.abs(np.log(medians / np.median(s))) < 0.1))
        if alike:  # the heads' histograms would lie on top of each other
            ax.hist(s.ravel(), bins=edges, color="0.55", alpha=0.8, label="all heads (alike)")
        else:
            for h in range(s.shape[0]):
                ax.hist(s[h], bins=edges, histtype="step", lw=1.8, label=f"head {h}")
        if result.sigma_0:
            ax.axvline(
                result.sigma_0,
                color="k",
                ls="--",
                lw=1.8,
                label=f"σ₀ = {result.sigma_0:g} (the KL term's target)",
            )
        ax.set_xscale("log")
        ax.set_title(f"layer {i}: median σ = {float(np.median(s)):#.3g}", fontsize=LABEL)
        ax.set_xlabel("σ of a read (memory: t ∈ [0, 1])", fontsize=LABEL)
        ax.tick_params(labelsize=TICK)
        ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda y, _: f"{y:,.0f}"))
    axes[0][0].set_ylabel("reads", fontsize=LABEL)
    legend: dict[str, object] = {}  # every panel's entries, once each: layers differ in kind
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    fig.legend(
        list(legend.values()),
        list(legend),
        loc="outside lower center",
        ncols=min(len(legend), 4),
        fontsize=LABEL,
        frameon=False,
    )
    fig.suptitle(
        _title(result, "how wide the long-term reads are")
        + "\nsmall σ: a read picks out one part of the memory; σ near 1: it averages all of it",
        fontsize=TITLE,
    )
    return _save(fig, path, dpi)


def plot_samples(result: Inspection, path: str | Path, dpi: int = 80) -> Path | None:
    """Per layer: where each update's resampling points went, over t ∈ [0, 1] (left) and mapped
    back to the positions of the stream they read (right)."""
    layers = [i for i, s in enumerate(result.samples) if s is not None]
    if not layers or not result.sticky:
        return None
    from matplotlib.lines import Line2D

    plt = _pyplot()
    fig, axes = plt.subplots(
        len(layers),
        2,
        figsize=(9.5, 3.2 * len(layers) + 1.6),
        squeeze=False,
        layout="constrained",
    )
    C = result.segment_len
    for row, i in enumerate(layers):
        s = result.samples[i]
        calls = s.calls.numpy()
        span = (calls[0] - 0.5, calls[-1] + 0.5)
        left, right = axes[row]
        style = dict(aspect="auto", origin="lower", cmap="viridis", interpolation="nearest")
        left.imshow(s.t_hist.numpy().T, extent=(*span, 0, 1), **style)
        left.set_ylabel("sample position u\n(0: oldest, 1: newest)", fontsize=LABEL)
        left.set_title(f"layer {i}: over the memory", fontsize=LABEL)
        right.pcolormesh(
            [*(calls - 0.5), calls[-1] + 0.5],
            s.abs_edges.numpy(),
            s.abs_hist.numpy().T,
            cmap="viridis",
            shading="flat",
        )
        right.set_yscale("symlog", linthresh=C, linscale=0.5)
        right.set_ylim(0, float(s.abs_edges[-1]))
        right.yaxis.set_major_formatter(plt.FuncFormatter(lambda y, _: f"{y:,.0f}"))
        right.plot(calls, calls * C, color=QUERY_COLOUR, lw=2.2)
        right.set_ylabel("position sampled (token)", fontsize=LABEL)
        first = float(s.first_segment.mean())
        right.set_title(
            f"layer {i}: in the stream ({first:.0%} on its first segment)", fontsize=LABEL
        )
        for ax in (left, right):
            ax.tick_params(labelsize=TICK)
            ax.set_xlabel("segment (update)", fontsize=LABEL)
    fig.legend(
        handles=[Line2D([], [], color=QUERY_COLOUR, lw=2.2, label="start of the current segment")],
        loc="outside lower center",
        fontsize=LABEL,
        frameon=False,
    )
    fig.suptitle(
        _title(result, "where the M resampling points went")
        + "\nbright: many points; an even colour: no preference",
        fontsize=TITLE,
    )
    return _save(fig, path, dpi)


def plot_fidelity(
    curves: dict[str, Fidelity], path: str | Path, title: str = "", dpi: int = 80
) -> Path | None:
    """Cosine, centred cosine and relative error between stored vectors and what is read back
    at their place, against their age in segments; one line per entry of `curves` (label →
    Fidelity), dotted: the same score for a memory returning the mean stored vector. Each
    panel's title says which way is better (the error panel: lower)."""
    curves = {k: v for k, v in curves.items() if v is not None}
    if not curves:
        return None
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12.5, 4.4), layout="constrained")
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    panels = (  # (field, title: what and which way is better, y label, baseline field)
        ("cosine", "similarity: higher is better", "cosine(read back, stored)", "baseline_cosine"),
        (
            "centred_cosine",
            "specific to the vector: higher is better",
            "cosine after removing the mean vector",
            None,
        ),
        (
            "rel_error",
            "error: LOWER is better",
            "‖read back − stored‖ / ‖stored‖",
            "baseline_rel_error",
        ),
    )
    oldest = 1
    for n, (label, fid) in enumerate(curves.items()):
        colour = colours[n % len(colours)]
        for ax, (field, _, _, baseline) in zip(axes, panels, strict=True):
            pairs = [
                (a, v)
                for a, v in zip(fid.ages, getattr(fid, field), strict=True)
                if not math.isnan(v)
            ]
            if pairs:
                ax.plot(
                    *zip(*pairs, strict=True), marker="o", ms=4, lw=1.8, color=colour, label=label
                )
                oldest = max(oldest, max(a for a, _ in pairs))
            if baseline is not None and not math.isnan(getattr(fid, baseline)):
                ax.axhline(getattr(fid, baseline), color=colour, ls=":", lw=1.5)
    ticks = [t for t in (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if t <= oldest]
    for ax, (_, what, ylabel, _) in zip(axes, panels, strict=True):
        ax.set_title(what, fontsize=LABEL)
        ax.set_ylabel(ylabel, fontsize=LABEL)
        ax.set_xscale("symlog", linthresh=1, linscale=0.6)
        ax.set_xlim(-0.15, oldest * 1.15)  # no negative ages: no "−10⁰" tick
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda x, _: f"{x:g}"))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("age (segments since stored)", fontsize=LABEL)
        ax.tick_params(labelsize=TICK)
        ax.grid(alpha=0.3)
    axes[0].axhline(0, color="grey", lw=0.6)
    axes[1].axhline(0, color="grey", lw=0.6)
    handles = [
        *axes[0].get_legend_handles_labels()[0],
        Line2D(
            [],
            [],
            color="0.3",
            ls=":",
            lw=1.5,
            label="dotted: a memory that returns the mean vector",
        ),
    ]
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncols=min(len(handles), 4),
        fontsize=LABEL,
        frameon=False,
    )
    fig.suptitle(
        (title or "fidelity of the memory by age")
        + "\nhow well a stored vector is read back, as it ages",
        fontsize=TITLE,
    )
    return _save(fig, path, dpi)


def fidelity_curves(result: Inspection) -> dict[str, Fidelity]:
    """label → Fidelity for every layer that has one (∞-former memory, compressed slots)."""
    curves: dict[str, Fidelity] = {}
    for i, fid in enumerate(result.fidelity):
        if fid is not None:
            curves[f"layer {i}"] = fid
    for i, fid in enumerate(result.compressed):
        if fid is not None:
            curves[f"layer {i} (compressed slots)"] = fid
    return curves


def draw_all(result: Inspection, out_dir: str | Path, dpi: int = 80) -> list[Path]:
    """Every picture that applies to the model, as PNGs in `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    drawn = [
        plot_reads(result, out / "reads.png", dpi),
        plot_sigma(result, out / "sigma.png", dpi),
        plot_samples(result, out / "samples.png", dpi),
        plot_fidelity(
            fidelity_curves(result), out / "fidelity.png", _title(result, "fidelity by age"), dpi
        ),
    ]
    return [p for p in drawn if p is not None]


def _save(fig, path: str | Path, dpi: int) -> Path:
    """Write `fig` as a PNG with a palette of 256 colours (a third of the size of full colour:
    these pictures go into the documentation)."""
    import io

    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    _pyplot().close(fig)
    image = Image.open(buffer).convert("RGB")
    with atomic_path(path) as tmp:  # (the temporary name has no .png: say the format)
        image.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(
            tmp, format="PNG", optimize=True
        )
    return path


__all__ = [
    "draw_all",
    "fidelity_curves",
    "plot_fidelity",
    "plot_reads",
    "plot_samples",
    "plot_sigma",
]
