"""The pictures of `inftyformer inspect` read without help: text large enough at the size the
figure is shown, a layer's heads drawn once when they read alike, each panel saying which way is
better, and no negative ages on an axis of ages."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib
import pytest
import torch
from tiny_models import tiny

from inftyformer import MemoryLM
from inftyformer import inspection_plots as plots
from inftyformer.inspection import inspect_stream

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def result():
    torch.manual_seed(0)
    model = MemoryLM(tiny("infty", sticky=True)).eval()
    tokens = torch.randint(0, 13, (1, 8 * 14), generator=torch.Generator().manual_seed(2))
    return inspect_stream(model, tokens, ages=(0, 1, 5, 11), bins=16)


def draw(result, tmp_path, monkeypatch, only=None):
    """name → the matplotlib figure of every picture `draw_all` makes (`only`: this picture)."""
    figures = {}

    def keep(fig, path, dpi):
        figures[Path(path).name] = fig
        fig.canvas.draw()  # lays out the text and the tick labels
        return Path(path)

    monkeypatch.setattr(plots, "_save", keep)
    if only == "reads.png":
        plots.plot_reads(result, tmp_path / only)
    elif only == "fidelity.png":
        plots.plot_fidelity(plots.fidelity_curves(result), tmp_path / only)
    else:
        plots.draw_all(result, tmp_path)
    return figures


@pytest.fixture(autouse=True)
def close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def panels(fig):
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


def test_every_picture_is_drawn_with_text_readable_at_its_size(result, tmp_path, monkeypatch):
    from matplotlib.text import Text

    figures = draw(result, tmp_path, monkeypatch)
    assert set(figures) == {"reads.png", "sigma.png", "samples.png", "fidelity.png"}
    for name, fig in figures.items():
        width_pt = fig.get_figwidth() * 72
        texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
        assert texts
        for text in texts:  # shown ~900 px wide, 1% of the width is a 9 px letter
            assert text.get_fontsize() / width_pt >= 0.01, (name, text.get_text())


def test_reads_draw_a_layer_once_when_its_heads_read_alike(result, tmp_path, monkeypatch):
    layers = sum(r is not None for r in result.reads)
    heads = result.reads[0].mass.shape[1]
    alike = dataclasses.replace(
        result,
        reads=[dataclasses.replace(r, mass=r.mass.mean(1, keepdim=True).expand_as(r.mass))
               for r in result.reads],
    )  # fmt: skip
    fig = draw(alike, tmp_path, monkeypatch, "reads.png")["reads.png"]
    assert len(panels(fig)) == layers
    assert f"mean of the {heads} heads: alike" in fig._suptitle.get_text()
    apart = [r.mass.clone() for r in result.reads]
    for mass in apart:  # head 1 reads elsewhere
        mass[:, 1] = mass[:, 0].flip(-1)
    reads = [dataclasses.replace(r, mass=m) for r, m in zip(result.reads, apart, strict=True)]
    different = dataclasses.replace(result, reads=reads)
    fig = draw(different, tmp_path, monkeypatch, "reads.png")["reads.png"]
    assert len(panels(fig)) == layers * heads
    for ax in panels(fig):
        assert "segments back" in ax.get_title() and "segment 0" not in ax.get_title()
        query_lines = [line for line in ax.get_lines() if line.get_color() == plots.QUERY_COLOUR]
        assert query_lines and query_lines[0].get_linewidth() >= 2


def test_fidelity_says_which_way_is_better_and_has_no_negative_ages(result, tmp_path, monkeypatch):
    fig = draw(result, tmp_path, monkeypatch, "fidelity.png")["fidelity.png"]
    titles = [ax.get_title() for ax in panels(fig)]
    assert len(titles) == 3
    assert "higher is better" in titles[0] and "higher is better" in titles[1]
    assert "LOWER is better" in titles[2] and "stored‖" in panels(fig)[2].get_ylabel()
    for ax in panels(fig):
        ages = [label.get_text() for label in ax.get_xticklabels() if label.get_text()]
        assert ages and all(float(a.replace("−", "-")) >= 0 for a in ages), ages
        assert ax.get_xlim()[0] > -1


def test_sigma_legend_names_what_every_panel_draws_and_medians_share_one_precision(
    result, tmp_path, monkeypatch
):
    """A layer whose heads read alike is one grey histogram, a layer whose heads differ one
    outline per head: the legend names both, whichever panel comes last."""
    sigmas = [s.clone() for s in result.sigmas]
    assert len(sigmas) >= 2 and sigmas[0].shape[0] >= 2
    sigmas[0][:] = 0.8  # heads alike; median 0.8 is written 0.800, as 0.843 is
    sigmas[1][1] = sigmas[1][0] * 4  # head 1 reads 4× wider
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path, dpi: figures.append(fig) or Path(path))
    plots.plot_sigma(dataclasses.replace(result, sigmas=sigmas), tmp_path / "sigma.png")
    fig = figures[0]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "all heads (alike)" in labels and "head 0" in labels and "head 1" in labels
    titles = [ax.get_title() for ax in panels(fig)]
    assert titles[0] == "layer 0: median σ = 0.800"
    for title in titles:
        digits = title.split("= ")[1].replace(".", "").lstrip("0")
        assert len(digits) == 3, title  # three significant digits, trailing zeros kept


def test_reads_say_what_outside_the_memory_means(result, tmp_path, monkeypatch):
    fig = draw(result, tmp_path, monkeypatch, "reads.png")["reads.png"]
    assert all("read outside t ∈ [0, 1]" in ax.get_title() for ax in panels(fig))
    assert "Gaussian density beyond the stored\nsignal" in fig._suptitle.get_text()
