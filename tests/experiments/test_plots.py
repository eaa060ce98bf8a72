"""The experiments' plots and tables of needle scores (experiments/retrieval.py `plot_scores`,
`score_table`; experiments/_plot_style.py): one colour per row whatever the figure holds, rows
never run left out, panels of one length merged into one panel of points, a panel of a single
point dropped, and one legend below the axes."""

import pytest
import retrieval as rx
import ruler as rr
from _plot_style import ROW_STYLE, row_style


def cell(score: float) -> dict:
    return {"exact": score, "interval": [max(0.0, score - 0.1), min(1.0, score + 0.1)],
            "samples": 25}  # fmt: skip


def test_every_row_of_the_experiments_has_a_colour_of_its_own():
    rows = {*rx.ROWS, *rr.RULER_ROWS, *rr.PEERS}
    assert rows <= set(ROW_STYLE)  # a fixed mapping: no row falls back to a spare colour
    colours = [colour for colour, _ in ROW_STYLE.values()]
    assert len(set(colours)) == len(colours)
    assert row_style("retrieval")[0] != row_style("kvpress_knorm")[0]
    assert row_style("a new row") == row_style("a new row")  # spare colours by name


def test_a_row_never_run_is_left_out_of_the_table():
    cells = {"single-full-4096": cell(0.9), "single-retrieval-8192": cell(0.5)}
    lines = rx.score_table(cells, "single-{row}-{n}", [4096, 8192], rows=rx.ROWS)
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| full", "| retrieval"]
    assert lines[2].endswith("| – |")  # a length the row was not run at: a dash


def test_panels_of_one_length_merge_and_a_single_point_is_no_panel(tmp_path, monkeypatch):
    from inftyformer._measure import pyplot

    figures = []
    monkeypatch.setattr(pyplot(), "close", figures.append)
    cells = {
        "a-full-4096": cell(0.4), "a-full-8192": cell(0.3), "a-retrieval-8192": cell(0.6),
        "b-full-4096": cell(0.2), "b-retrieval-4096": cell(0.1), "c-full-4096": cell(0.7),
    }  # fmt: skip
    panels = [(t, t + "-{row}-{n}") for t in ("a", "b", "c", "d")]
    assert rx.plot_scores(cells, panels, rx.ROWS, tmp_path / "p.png", "exact", "tokens")
    axes = [ax for ax in figures[-1].axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["a", "measured at one length"]
    assert [t.get_text().split("\n")[0] for t in axes[1].get_xticklabels()] == ["b", "c"]
    legend = figures[-1].legends[0]
    assert [t.get_text() for t in legend.get_texts()] == ["full", "retrieval"]
    assert not any(ax.get_legend() for ax in axes)  # one legend, outside the axes
    drawn = {line.get_color() for line in axes[0].lines}  # full and retrieval, in their colours
    assert drawn == {row_style("full")[0], row_style("retrieval")[0]}
    only = {"b-full-4096": cell(0.2)}  # one panel of one point: nothing to plot
    assert not rx.plot_scores(only, panels, rx.ROWS, tmp_path / "q.png", "exact", "tokens")


@pytest.mark.parametrize("row", ["picked-trained", "retrieval-true"])
def test_a_row_the_script_no_longer_has_is_not_drawn_or_listed(row):
    cells = {"full-niah_single_1-4096": {"row": "full", **cell(1.0)},
             f"{row}-niah_single_1-4096": {"row": row, **cell(1.0)}}  # fmt: skip
    assert rr.rows_run(cells) == ("full",)
