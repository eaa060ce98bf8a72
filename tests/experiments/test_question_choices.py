"""experiments/question_choices.py: the rows answer from one read of each context, the cells and
their paired tests are the answers' (by hand), and the answers are lm_eval's for the same rows,
prompt by prompt; a run resumes from its answers.

Needs the extra `inftyformer[eval]` (lm-eval 0.4.x); CI installs it."""

import json

import pytest

pytest.importorskip("lm_eval")

import question_choices as qc  # noqa: E402


def test_cells_and_their_paired_counts_are_the_answers():
    """Row a right on prompts 1, 2; row b on 2, 3, 4 of the same four: b's 2 : 1 against a."""
    right = {"a": {1, 2}, "b": {2, 3, 4}}
    answers = [
        {"row": r, "task": "t", "length": 8, "prompt_hash": str(h), "score": float(h in right[r])}
        for r in ("a", "b")
        for h in (1, 2, 3, 4)
    ]
    cells = qc.summarise(answers, ["a", "b"])
    assert cells["a-t-8"]["score"] == 0.5 and "paired" not in cells["a-t-8"]
    b = cells["b-t-8"]
    assert b["score"] == 0.75 and b["samples"] == 4
    assert b["interval"] == pytest.approx(qc.wilson(3, 4))
    assert b["paired"] == {"against": "a", "prompts": 4, "b": 2, "c": 1, "p": 1.0}
    data = {"setup": {"base_model": "m", "seed": 0, "rows": ["a", "b"], "lm_eval": "0.4.13",
                      "max_gen_toks": 32}, "cells": cells, "machine": {"cpu": "c"}}  # fmt: skip
    page = qc.render(data)
    assert "| b | 0.75 [0.30, 0.95] (4); 2 : 1, p = 1.00 |" in page


def test_the_default_rows_cells_are_its_first_answers_in_ruler_cells_format():
    """Cells of row `retrieval` from question-late's answers: a (task, length) with fewer than
    `limit` answers has none; one with more takes its first `limit`."""
    answers = [{"row": r, "task": "t", "length": n, "prompt_hash": f"{n}-{i}", "written": " 7",
                "score": float(i != 1)} for r in ("question-late", "packed") for n, count in
               ((8, 3), (16, 1)) for i in range(count)]  # fmt: skip
    cells = qc.default_cells(answers, limit=2, max_gen_toks=32)
    assert list(cells) == ["retrieval-t-8"]
    cell = cells["retrieval-t-8"]
    assert (cell["row"], cell["score"], cell["samples"]) == ("retrieval", 0.5, 2)
    assert [a["prompt_hash"] for a in cell["answers"]] == ["8-0", "8-1"]
    assert cell["interval"] == pytest.approx(qc.wilson(1, 2))
    assert "preset=retrieval" in cell["model_args"] and cell["max_gen_toks"] == 32


def test_an_unknown_row_is_an_argparse_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        qc.main(["--rows", "packed,nope", "--out", str(tmp_path)])
    assert "unknown row 'nope'" in capsys.readouterr().err


@pytest.mark.slow
def test_the_quick_run_answers_as_lm_eval_does_and_resumes(tmp_path):
    pytest.importorskip("wonderwords")  # lm_eval's ruler extra: RULER's data needs it
    import ruler

    rows = "packed,retrieval-question"
    ruler.main(
        [
            "--quick",
            "--rows",
            rows + ",retrieval",
            "--out",
            str(tmp_path / "lm_eval"),
            "--threads",
            "1",
            "--max-gen-toks",
            "32",
        ]
    )  # the cut question_choices makes
    argv = ["--quick", "--rows", rows, "--out", str(tmp_path / "q"),
            "--ruler-cells", str(tmp_path / "lm_eval" / "ruler.cells")]  # fmt: skip
    qc.main(argv)
    data = json.loads((tmp_path / "q" / "question_choices.json").read_text())
    assert sorted(data["cells"]) == [f"{r}-niah_single_1-3072" for r in rows.split(",")]
    assert data["agreement"] == {f"{r}-niah_single_1-3072": {"prompts": 2, "same": 2}
                                 for r in rows.split(",")}  # fmt: skip
    assert len(list((tmp_path / "q" / "sessions").iterdir())) == 2  # one read per prompt
    log = tmp_path / "q" / "answers.jsonl"
    before = log.read_text()
    assert len(before.splitlines()) == 4
    qc.main(argv)  # every answer there: nothing read or answered again
    assert log.read_text() == before
    # the default's cells, written from question-late's answers, are lm_eval's `retrieval` row
    qc.main(["--quick", "--rows", "question-late", "--out", str(tmp_path / "q")])
    answers = [json.loads(x) for x in log.read_text().splitlines()]
    (cell,) = qc.default_cells(answers, limit=2, max_gen_toks=32).values()
    theirs = json.loads((tmp_path / "lm_eval" / "ruler.cells" /
                         "retrieval-niah_single_1-3072.json").read_text())  # fmt: skip
    assert [(a["prompt_hash"], a["written"]) for a in cell["answers"]] == [
        (a["prompt_hash"], a["written"]) for a in theirs["answers"]
    ]
