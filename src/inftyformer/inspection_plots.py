"""Pictures of an `inspection.Inspection` (matplotlib, imported only when drawing).

One function per picture, each writing one PNG and returning its path (None when the picture
does not apply to the model): where the long-term reads land, σ against σ₀, where the sticky
resampling points went, and fidelity by age. `draw_all` draws every picture that applies.
"""

from __future__ import annotations

import math
from pathlib import Path

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


def plot_reads(result: Inspection, path: str | Path, dpi: int = 80) -> Path | None:
    """Per layer and head: the read mass (mean over each segment's queries) over the absolute
    positions of the past, one row per segment; log colour scale, and a position axis linear
    over the first segment and logarithmic beyond, so that reads of the distant start show."""
    layers = [i for i, r in enumerate(result.reads) if r is not None]
    if not layers:
        return None
    from matplotlib.colors import LogNorm

    plt = _pyplot()
    heads = result.reads[layers[0]].mass.shape[1]
    fig, axes = plt.subplots(
        len(layers), heads, figsize=(2.6 * heads + 1, 2.4 * len(layers) + 0.6), squeeze=False
    )
    C = result.segment_len
    for row, i in enumerate(layers):
        r = result.reads[i]
        calls = r.calls.numpy()
        rows = [*(calls - 0.5), calls[-1] + 0.5]
        for h in range(heads):
            ax = axes[row][h]
            mass = r.mass[:, h].numpy()  # [S, B]
            top = float(mass.max()) or 1.0
            image = ax.pcolormesh(
                r.bin_edges.numpy(),
                rows,
                mass.clip(min=top * 1e-5),
                norm=LogNorm(vmin=top * 1e-5, vmax=top),
                cmap="magma",
                shading="flat",
            )
            ax.plot(calls * C, calls, color="cyan", lw=0.6, ls="--")
            ax.set_xscale("symlog", linthresh=C, linscale=0.5)
            ax.set_xlim(0, float(r.bin_edges[-1]))
            first = float(r.first_segment[:, h].mean())
            ax.set_title(f"layer {i}, head {h}: {first:.0%} on segment 0", fontsize=7)
            ax.tick_params(labelsize=6)
            if row == len(layers) - 1:
                ax.set_xlabel("position read (token)", fontsize=7)
            if h == 0:
                ax.set_ylabel("segment of the queries", fontsize=7)
        fig.colorbar(image, ax=axes[row][-1], fraction=0.05).ax.tick_params(labelsize=6)
    fig.suptitle(
        _title(result, "where the long-term reads land")
        + "\nmass per position bin, mean over a segment's queries; dashed: the queries",
        fontsize=8,
    )
    fig.tight_layout()
    return _save(fig, path, dpi)


def plot_sigma(result: Inspection, path: str | Path, dpi: int = 80) -> Path | None:
    """Per layer: the distribution of σ of the reads (one histogram per head), against σ₀."""
    layers = [i for i, s in enumerate(result.sigmas) if s is not None]
    if not layers:
        return None
    import numpy as np

    plt = _pyplot()
    fig, axes = plt.subplots(1, len(layers), figsize=(3.2 * len(layers), 2.6), squeeze=False)
    low = min(float(result.sigmas[i].min()) for i in layers)
    high = max(float(result.sigmas[i].max()) for i in layers)
    low = min(low, result.sigma_0 or low) * 0.8
    edges = np.geomspace(max(low, 1e-3), max(high * 1.25, low * 2), 60)
    for ax, i in zip(axes[0], layers, strict=True):
        s = result.sigmas[i].numpy()
        for h in range(s.shape[0]):
            ax.hist(s[h], bins=edges, histtype="step", label=f"head {h}")
        if result.sigma_0:
            ax.axvline(result.sigma_0, color="k", ls="--", lw=1, label="σ₀")
        ax.set_xscale("log")
        ax.set_title(f"layer {i}: median σ = {float(np.median(s)):.3g}", fontsize=8)
        ax.set_xlabel("σ of a read (t ∈ [0, 1])", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("reads", fontsize=7)
    fig.suptitle(_title(result, "width of the long-term reads"), fontsize=8)
    fig.tight_layout()
    return _save(fig, path, dpi)


def plot_samples(result: Inspection, path: str | Path, dpi: int = 80) -> Path | None:
    """Per layer: where each update's resampling points went, over t ∈ [0, 1] (left) and mapped
    back to the positions of the stream they read (right)."""
    layers = [i for i, s in enumerate(result.samples) if s is not None]
    if not layers or not result.sticky:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(len(layers), 2, figsize=(8, 2.4 * len(layers) + 0.6), squeeze=False)
    for row, i in enumerate(layers):
        s = result.samples[i]
        calls = s.calls.numpy()
        span = (calls[0] - 0.5, calls[-1] + 0.5)
        left, right = axes[row]
        style = dict(aspect="auto", origin="lower", cmap="viridis", interpolation="nearest")
        left.imshow(s.t_hist.numpy().T, extent=(*span, 0, 1), **style)
        left.set_ylabel(f"layer {i}\nsample position u", fontsize=7)
        C = result.segment_len
        right.pcolormesh([*(calls - 0.5), calls[-1] + 0.5], s.abs_edges.numpy(),
                         s.abs_hist.numpy().T, cmap="viridis", shading="flat")  # fmt: skip
        right.set_yscale("symlog", linthresh=C, linscale=0.5)
        right.set_ylim(0, float(s.abs_edges[-1]))
        right.plot(calls, calls * C, color="w", lw=0.6, ls="--")
        right.set_ylabel("position sampled (token)", fontsize=7)
        right.set_title(f"{float(s.first_segment.mean()):.0%} on segment 0", fontsize=7)
        for ax in (left, right):
            ax.tick_params(labelsize=6)
            if row == len(layers) - 1:
                ax.set_xlabel("segment (update)", fontsize=7)
    fig.suptitle(
        _title(result, "sticky memories: where the M resampling points went")
        + "\nuniform = no preference; dashed: the current segment",
        fontsize=8,
    )
    fig.tight_layout()
    return _save(fig, path, dpi)


def plot_fidelity(
    curves: dict[str, Fidelity], path: str | Path, title: str = "", dpi: int = 80
) -> Path | None:
    """Cosine, centred cosine and relative error between stored vectors and what is read back
    at their place, against their age in segments; one line per entry of `curves` (label →
    Fidelity), dotted: the same score for a memory returning the mean stored vector."""
    curves = {k: v for k, v in curves.items() if v is not None}
    if not curves:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    panels = (
        ("cosine", "cosine(read back, stored)", "baseline_cosine"),
        ("centred_cosine", "cosine after removing the mean vector", None),
        ("rel_error", "‖read back − stored‖ / ‖stored‖", "baseline_rel_error"),
    )
    for n, (label, fid) in enumerate(curves.items()):
        colour = colours[n % len(colours)]
        for ax, (field, _, baseline) in zip(axes, panels, strict=True):
            pairs = [(a, v) for a, v in zip(fid.ages, getattr(fid, field), strict=True)
                     if not math.isnan(v)]  # fmt: skip
            if pairs:
                ax.plot(*zip(*pairs, strict=True), marker="o", ms=3, color=colour, label=label)
            if baseline is not None and not math.isnan(getattr(fid, baseline)):
                ax.axhline(getattr(fid, baseline), color=colour, ls=":", lw=1)
    for ax, (_, ylabel, _) in zip(axes, panels, strict=True):
        ax.set_ylabel(ylabel, fontsize=7)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("age k (segments since the vector entered)", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.grid(alpha=0.3)
    axes[0].axhline(0, color="grey", lw=0.6)
    axes[1].axhline(0, color="grey", lw=0.6)
    axes[0].legend(fontsize=6)
    fig.suptitle(
        (title or "fidelity of the memory by age")
        + "\ndotted: the same score for a memory that returns the mean stored vector",
        fontsize=8,
    )
    fig.tight_layout()
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
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    return path


__all__ = [
    "draw_all",
    "fidelity_curves",
    "plot_fidelity",
    "plot_reads",
    "plot_samples",
    "plot_sigma",
]
