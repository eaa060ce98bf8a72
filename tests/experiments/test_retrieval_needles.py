"""experiments/retrieval.py: the passages hold their needles at the stated length, the interval
is Wilson's, cells resume, and the page renders from the JSON a run wrote."""

import json

import pytest
import retrieval as rx
from tokenizers import Tokenizer, models, pre_tokenizers


def word_tokenizer() -> Tokenizer:
    """Whole words and digits, one token each."""
    vocab = {w: i for i, w in enumerate(["[UNK]", *rx.WORDS, *"0123456789"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    return tok


@pytest.mark.parametrize("task", rx.TASKS)
def test_passages_are_the_stated_length_and_hold_each_answer(task):
    tok = word_tokenizer()
    filler = tok.encode(" ".join(rx.WORDS * 40)).ids
    data = rx.passages(tok, filler, 300, 2, 3, seed=0, task=task)
    assert len(data) == 2
    for passage, questions in data:
        assert passage.shape == (300,)
        assert len(questions) == (3 if task == "multikey" else 1)  # single: no distractor
        ids = passage.tolist()
        if task == "passkey":  # the test's instruction opens the passage
            assert ids[:4] == tok.encode(rx.PASSKEY_TASK).ids[:4]
        for _, answer in questions:
            n = len(answer)
            assert n == (5 if task == "passkey" else 7)  # digits, one token each
            assert any(ids[i : i + n] == answer for i in range(len(ids) - n))
    again = rx.passages(tok, filler, 300, 2, 3, seed=0, task=task)
    assert all((a[0] == b[0]).all() for a, b in zip(data, again, strict=True))  # seeded


def test_wilson_interval_by_hand():
    lo, hi = rx.wilson(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    assert rx.wilson(0, 25)[0] == 0.0 and rx.wilson(25, 25)[1] == 1.0
    assert rx.wilson(0, 0) == [0.0, 1.0]


def test_the_page_renders_each_cell_from_the_json():
    cells = {
        "multikey-full-4096": {"exact": 0.6, "samples": 25, "right": 15,
                               "interval": rx.wilson(15, 25)},
        "multikey-full-16384": {"skipped": "beyond"},
        "multikey-retrieval-16384": {"exact": 0.4, "samples": 25, "right": 10,
                                     "interval": rx.wilson(10, 25)},
    }  # fmt: skip
    data = {"setup": {"base_model": "m", "needles": 5, "passages": 5}, "cells": cells,
            "machine": {"cpu": "c"}}  # fmt: skip
    page = rx.render(data)
    assert "| full | 0.60 [0.41, 0.77] (25) | (beyond its positions) |" in page
    assert "| retrieval | – | 0.40 [0.23, 0.59] (25) |" in page
    assert "## passkey" not in page  # no cell of it


@pytest.mark.slow
def test_the_quick_run_fills_every_cell_and_resumes(tmp_path):
    rx.main(["--quick", "--out", str(tmp_path), "--threads", "1"])
    data = json.loads((tmp_path / "retrieval.json").read_text())
    assert len(data["cells"]) == len(rx.TASKS) * len(rx.ROWS)
    stamp = (tmp_path / "retrieval.cells" / "passkey-retrieval-2304.json").stat().st_mtime_ns
    rx.main(["--quick", "--out", str(tmp_path), "--threads", "1"])  # everything there: skipped
    assert (
        tmp_path / "retrieval.cells" / "passkey-retrieval-2304.json"
    ).stat().st_mtime_ns == stamp
    assert "## multikey" in (tmp_path / "retrieval.md").read_text()
