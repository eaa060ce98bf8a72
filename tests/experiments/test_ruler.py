"""experiments/ruler.py: each row is the lm_eval model it names, a row beyond the base's positions
is skipped, the page renders every cell from the JSON (RULER's score, Wilson interval, prompts),
tasks that need a download are refused with the reason; the quick run fills every cell on the
same prompts for every row and resumes.

Needs the extra `inftyformer[eval]` (lm-eval 0.4.x); CI installs it."""

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("lm_eval")

import ruler as rr  # noqa: E402


def cell(score: float, n: int) -> dict:
    return {"score": score, "samples": n, "interval": rr.wilson(score * n, n)}


def test_the_page_renders_each_cell_from_the_json():
    cells = {
        "full-niah_single_1-4096": cell(0.6, 25),
        "full-niah_single_1-16384": {"skipped": "beyond"},
        "retrieval-niah_single_1-16384": cell(0.4, 25),
        "window-ruler_vt-4096": cell(0.5, 10),  # vt: a share of 5 variables per prompt
    }
    data = {
        "setup": {"base_model": "m", "limit": 25, "seed": 0, "lengths": "4096,16384",
                  "lm_eval": "0.4.13"},
        "cells": cells, "machine": {"cpu": "c"},
    }  # fmt: skip
    page = rr.render(data, "NOTES")
    assert "| full | 0.60 [0.41, 0.77] (25) | (beyond its positions) |" in page
    assert "| retrieval | – | 0.40 [0.23, 0.59] (25) |" in page
    assert "| window | 0.50 [0.24, 0.76] (10) |" in page  # one length: the vt table's own
    assert "## niah_multikey_2" not in page  # no cell of it
    assert page.index("## niah_single_1") < page.index("## ruler_vt") < page.index("NOTES")
    assert "`niah_single_2`, `niah_single_3`, `niah_multikey_1`" in page  # left out, one reason
    assert "run here as the `*_books` tasks" in page  # and where they stand in for the essays
    assert "`niah_multikey_1_books`" in page and "Punkt model" in page


def test_the_memory_table_shows_each_cells_peak_and_a_rows_change_with_length():
    def at(row: str, n: int, mb: float | None) -> dict:
        c = {"row": row, "task": "niah_single_1", "length": n, **cell(1.0, 3)}
        return c if mb is None else {**c, "peak_rss_mb": mb}

    cells = {"a": at("retrieval", 8192, 1000.0), "b": at("retrieval", 32768, 1100.0),
             "c": at("window", 32768, 990.0), "d": at("full", 4096, None),
             "e": at("retrieval-true", 8192, 900.0)}  # fmt: skip
    lines = rr.memory_lines(cells, rr.OFFLINE, rr.RULER_ROWS)
    assert "| row | 8,192 tokens | 32,768 tokens | first → last |" in lines
    assert "| retrieval | 1,000 | 1,100 | +10.0% |" in lines
    assert "| window | – | 990 | – |" in lines
    assert not any(line.startswith("| full") for line in lines)  # no peak recorded: no row
    assert not any(line.startswith("| retrieval-true") for line in lines)  # not a row any more
    assert rr.memory_lines({"d": at("full", 4096, None)}, rr.OFFLINE, rr.RULER_ROWS) == []
    assert not any("added" in line for line in lines)  # no cell recorded its start


def test_the_memory_table_shows_what_a_cells_run_added_above_its_start():
    def at(row: str, n: int, peak: float, start: float | None) -> dict:
        c = {"row": row, "task": "niah_single_1", "length": n, **cell(1.0, 3), "peak_rss_mb": peak}
        return c if start is None else {**c, "rss_start_mb": start}

    cells = {"a": at("retrieval", 8192, 2000.0, 1200.0),
             "b": at("retrieval", 32768, 2300.0, 1480.0),
             "c": at("window", 8192, 1900.0, None)}  # fmt: skip
    lines = rr.memory_lines(cells, rr.OFFLINE, rr.RULER_ROWS)
    assert lines.index("niah_single_1, peak:") < lines.index("niah_single_1, added:")
    added = lines[lines.index("niah_single_1, added:") :]
    assert "| retrieval | 800 | 820 | +2.5% |" in added  # 2000 − 1200, 2300 − 1480
    assert not any(line.startswith("| window") for line in added)  # its start not recorded
    assert "| window | 1,900 | – | – |" in lines  # its peak is shown
    said = next(line for line in lines if line.startswith("MiB, the peak"))
    assert "Added: the peak less" in said  # one paragraph


def test_rows_are_the_models_they_name(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    assert rr.model_of("full", str(tmp_path)) == (
        "hf", f"pretrained={tmp_path},dtype=float32,max_length=8192"
    )  # fmt: skip
    for row in ("window", "streaming", "retrieval"):
        assert rr.model_of(row, str(tmp_path)) == (
            "inftyformer-retrieval", f"pretrained={tmp_path},preset={row}"
        )  # fmt: skip
    with pytest.raises(ValueError, match="cannot be passed in lm_eval's --model_args"):
        rr.model_of("retrieval", str(tmp_path / "a,b"))
    with pytest.raises(ValueError, match="--models-dir"):
        rr.model_of("paper", str(tmp_path))
    saved = tmp_path / "models" / rr.PAPER_PRESET
    saved.mkdir(parents=True)
    (saved / "config.json").write_text("{}")  # a folder already made is used as it is
    model, args = rr.model_of("paper", str(tmp_path), tmp_path / "models")
    assert model == "hf" and args.startswith(f"pretrained={saved},trust_remote_code=True,")
    assert rr.without_paths(args, str(tmp_path), str(tmp_path / "models")).startswith(
        "pretrained=PAPER_DIR,"
    )
    # a retired preset's rows: its settings on the default preset, as it read
    picked = ("window=256,choice={},blocks=2,neighbours=1,read_from=0,answer_choice=question,"
              "select_queries={}")  # fmt: skip
    assert rr.model_of("picked-all", str(tmp_path)) == (
        "inftyformer-retrieval",
        f"pretrained={tmp_path},preset=retrieval,{picked.format('attention', 0)}",
    )
    assert rr.model_of("picked-max", str(tmp_path)) == (
        "inftyformer-retrieval",
        f"pretrained={tmp_path},preset=retrieval,{picked.format('max', 32)}",
    )
    with pytest.raises(ValueError, match="names no layer count"):
        rr.model_of("retrieval-question", str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 30}))
    assert rr.model_of("retrieval-question", str(tmp_path)) == (  # as it was measured
        "inftyformer-retrieval",
        f"pretrained={tmp_path},preset=retrieval,choice=question,question_select_layer=15",
    )
    with pytest.raises(ValueError, match="no row"):  # the trained map's row is gone
        rr.model_of("picked-trained", str(tmp_path))


def test_the_full_row_beyond_the_base_positions_is_skipped_without_a_run(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    args = SimpleNamespace(limit=1, seed=0, batch_size=1)
    out = rr.run_cell("full", None, 16384, args, str(tmp_path))
    assert out == {"skipped": "the prompts do not fit the base's 8192 positions"}


def test_a_task_that_needs_a_download_is_refused_with_the_reason(tmp_path, capsys):
    with pytest.raises(SystemExit):
        rr.main(["--tasks", "niah_single_2", "--out", str(tmp_path), "--render-only"])
    err = capsys.readouterr().err
    assert "unknown task 'niah_single_2'" in err and "Paul Graham's essays" in err
    with pytest.raises(SystemExit):
        rr.main(["--rows", "trained", "--out", str(tmp_path), "--render-only"])
    assert "unknown row 'trained'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        rr.main(["--quick"])  # the tiny model's cells would land among docs/'s
    assert "--quick needs an --out of its own" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--lengths", "abc"], "argument --lengths: 'abc': 'abc' is not a whole number"),
        (["--lengths", "4096,"], "argument --lengths: '4096,': give whole numbers"),
        (["--lengths", "4096,-8"], "argument --lengths: '4096,-8': must be at least 1, got -8"),
        (["--limit", "0"], "argument --limit: must be at least 1, got 0"),
        (["--limit", "-2"], "argument --limit: must be at least 1, got -2"),
        (["--batch-size", "2.5"], "argument --batch-size: '2.5' is not a whole number"),
        (["--threads", "0"], "argument --threads: must be at least 1"),
        (["--max-gen-toks", "0"], "argument --max-gen-toks: must be at least 1"),
    ],
)
def test_bad_numbers_are_argparse_errors_not_tracebacks(tmp_path, capsys, argv, message):
    """`--lengths abc` was a ValueError traceback from int(); `--limit 0` and `-2` ran."""
    with pytest.raises(SystemExit) as done:
        rr.main([*argv, "--out", str(tmp_path), "--render-only"])
    assert done.value.code == 2 and message in capsys.readouterr().err


def test_the_kvpress_rows_take_the_same_argument_types(tmp_path, capsys):
    import ruler_kvpress

    with pytest.raises(SystemExit):
        ruler_kvpress.main(["--limit", "0", "--out", str(tmp_path)])
    assert "argument --limit: must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.slow
def test_the_quick_run_fills_every_cell_on_the_same_prompts_and_resumes(tmp_path):
    pytest.importorskip("wonderwords")  # lm_eval's ruler extra: RULER's data needs it
    rr.main(["--quick", "--out", str(tmp_path), "--threads", "1"])
    data = json.loads((tmp_path / "ruler.json").read_text())
    assert sorted(data["cells"]) == sorted(f"{row}-niah_single_1-3072" for row in rr.RULER_ROWS)
    prompts = {tuple(a["prompt_hash"] for a in c["answers"]) for c in data["cells"].values()}
    assert len(prompts) == 1 and len(next(iter(prompts))) == 2  # every row: the same 2 prompts
    for c in data["cells"].values():
        assert c["samples"] == 2 and c["score"] == pytest.approx(c["lm_eval_score"])
        assert all(len(a["expected"]) == 1 and a["ruler_length"] <= 3072 for a in c["answers"])
        assert c["model_args"].startswith(("pretrained=MODEL_DIR,", "pretrained=PAPER_DIR,"))
        assert c["peak_rss_mb"] > 0  # the cell's own peak (RSS reset before it, on Linux)
    path = tmp_path / "ruler.cells" / "retrieval-niah_single_1-3072.json"
    stamp = path.stat().st_mtime_ns
    rr.main(["--quick", "--out", str(tmp_path), "--threads", "1"])  # everything there: skipped
    assert path.stat().st_mtime_ns == stamp
    assert "## niah_single_1" in (tmp_path / "ruler.md").read_text()
