"""experiments/passkey.py end to end on a tiny random model: every row sees the same prompts, the
untrained memory row equals the base with the same window (the read starts at zero), the heads
row differs from it, and the report renders from its JSON."""

import json

import passkey
import pytest


def test_the_quick_side_by_side_runs_and_the_untrained_row_is_the_window_row(tmp_path):
    pytest.importorskip("transformers")
    passkey.main(["--quick", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "passkey.json").read_text())
    rows = data["rows"]
    assert set(rows) == {"window", "full", "untrained", "heads", "mixture", "exact",
                         "exact-positions"}  # fmt: skip
    assert data["parity"] == 0.0
    for d in ("40", "90"):
        assert rows["untrained"]["passkey"][d] == rows["window"]["passkey"][d]
        assert rows["full"]["passkey"][d]["tokens"] == rows["window"]["passkey"][d]["tokens"]
    report = (tmp_path / "passkey.md").read_text()
    assert "(iii) memory, untrained" in report and "gap closed" in report
    assert "which blocks' heads find the key" in report
    assert rows["heads"]["settings"]["memory_read"] == "heads"
    # the heads read is not zero at initialisation: with something in memory it moves the NLL
    assert rows["heads"]["passkey"]["90"]["nll"] != rows["window"]["passkey"]["90"]["nll"]
    # the ceiling row reads the exact stored states: it moves the NLL, and not as the signal does
    names = ("window", "mixture", "exact", "exact-positions")
    nll = {r: rows[r]["passkey"]["90"]["nll"] for r in names}
    assert abs(nll["exact"] - nll["window"]) > 1e-3, nll
    assert abs(nll["exact"] - nll["mixture"]) > 1e-3, nll
    assert abs(nll["exact-positions"] - nll["exact"]) > 1e-6, nll  # the positions reach it
    passkey.main(["--render-only", "--out", str(tmp_path)])
    assert (tmp_path / "passkey.md").read_text() == report


def test_rows_measured_before_stay_in_the_report_until_measured_again(tmp_path):
    """gather: the existing passkey.json's rows (same setup) plus this setup's row files, the
    files winning; a report of another setup contributes nothing."""
    from _experiment_report import FORMAT
    from _passkey_report import gather

    setup = {"distances": [40], "keys": 1}
    old = {
        "format": FORMAT,
        "setup": setup,
        "rows": {"window": {"seconds": 1.0}, "lm": {"seconds": 2.0}},
    }
    (tmp_path / "passkey.json").write_text(json.dumps(old))
    (tmp_path / "passkey.rows").mkdir()
    row = {"setup": setup, "row": {"seconds": 5.0}}
    (tmp_path / "passkey.rows" / "lm.json").write_text(json.dumps(row))
    other = {"setup": {**setup, "keys": 2}, "row": {"seconds": 7.0}}
    (tmp_path / "passkey.rows" / "full.json").write_text(json.dumps(other))
    rows = gather(tmp_path, setup)["rows"]
    assert rows == {"window": {"seconds": 1.0}, "lm": {"seconds": 5.0}}
    assert gather(tmp_path, {**setup, "keys": 3})["rows"] == {}


@pytest.mark.slow  # the row's N = 2,048 design matrices: about a minute
def test_a_row_can_skip_long_prompts_and_the_by_length_row_runs(tmp_path):
    """--max-prompt-tokens leaves the longer distance out (–, and the report says why); the
    by-length row's settings reach the model, and its read moves the NLL."""
    pytest.importorskip("transformers")
    argv = ["--quick", "--out", str(tmp_path), "--rows", "window,mixture-length"]
    passkey.main([*argv, "--max-prompt-tokens", "150"])  # prompts of 128 and 176 tokens
    rows = json.loads((tmp_path / "passkey.json").read_text())["rows"]
    assert set(rows["window"]["passkey"]) == set(rows["mixture-length"]["passkey"]) == {"40"}
    assert rows["mixture-length"]["settings"]["squeeze"] == "by_length"
    assert rows["mixture-length"]["max_prompt_tokens"] == 150
    assert "ran no prompt over 150 tokens" in (tmp_path / "passkey.md").read_text()
    window, memory = (rows[r]["passkey"]["40"]["nll"] for r in ("window", "mixture-length"))
    assert abs(window - memory) > 1e-3


def test_the_exact_positions_ceiling_is_the_full_context_within_the_bases_positions():
    """Every block's heads read every earlier state exactly, each at its own stream position:
    block by block with a window, the logits are the base's over the whole text (64 tokens, the
    tiny base's positions). Read at one distance (row exact) they are not. The base with a
    2,048-token window sees the whole text too; with a window of 16 it does not."""
    pytest.importorskip("transformers")
    import argparse
    import tempfile
    from pathlib import Path

    import experiment as ex
    import torch

    base = str(ex.tiny_model_writer()(Path(tempfile.mkdtemp()) / "base"))
    args = argparse.Namespace(base_model=base, window=16, segment_len=16, memory_layers=None,
                              heads_sink_edge=0.01, heads_sharpness=100.0)  # fmt: skip
    ids = torch.randint(1, 100, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        [(_, want)], _ = passkey.Row("full", args).stream(ids)
        rows = (
            ("exact-positions", True),
            ("exact", False),
            ("window-2048", True),
            ("window", False),
        )
        for name, close in rows:
            pieces, _ = passkey.Row(name, args).stream(ids)
            error = max((got - want[:, a : a + 16]).abs().max().item() for a, got in pieces)
            assert (error < 1e-5) == close, (name, error)


def test_a_part_measured_on_its_own_joins_its_row(tmp_path):
    """passkey.py --part: the longer prompts of a row, in ROW@PART.json, join the row's own
    (the row then ran every prompt); a part whose row is not there is left out."""
    from _passkey_report import gather

    setup = {"distances": [40, 90], "keys": 1}
    rows_dir = tmp_path / "passkey.rows"
    rows_dir.mkdir()
    short = {"passkey": {"40": {"exact": 1.0}}, "books": {"x": 1}, "seconds": 5.0,
             "max_prompt_tokens": 64}  # fmt: skip
    long = {"passkey": {"90": {"exact": 0.0}}, "books": None, "seconds": 7.0,
            "min_prompt_tokens": 65}  # fmt: skip
    for name, row in (("lm", short), ("lm@long", long), ("other@long", long)):
        (rows_dir / f"{name}.json").write_text(json.dumps({"setup": setup, "row": row}))
    rows = gather(tmp_path, setup)["rows"]
    assert rows == {"lm": {"passkey": {"40": {"exact": 1.0}, "90": {"exact": 0.0}},
                           "books": {"x": 1}, "seconds": 12.0}}  # fmt: skip


def test_a_row_split_by_prompt_length_over_two_runs_has_every_prompt(tmp_path):
    pytest.importorskip("transformers")
    argv = ["--quick", "--rows", "window", "--out", str(tmp_path), "--max-prompt-tokens", "150"]
    passkey.main(argv)
    short = json.loads((tmp_path / "passkey.json").read_text())["rows"]["window"]
    assert set(short["passkey"]) == {"40"} and short["max_prompt_tokens"] == 150
    passkey.main([*argv, "--part", "long"])
    row = json.loads((tmp_path / "passkey.json").read_text())["rows"]["window"]
    assert set(row["passkey"]) == {"40", "90"} and "max_prompt_tokens" not in row
    assert row["books"] == short["books"]
    # a part with a limit of its own leaves the row limited by it
    (tmp_path / "passkey.rows" / "window@long.json").unlink()
    passkey.main([*argv, "--part", "long", "--part-max-tokens", "160"])
    row = json.loads((tmp_path / "passkey.json").read_text())["rows"]["window"]
    assert set(row["passkey"]) == {"40"} and row["max_prompt_tokens"] == 160
    with pytest.raises(SystemExit):
        passkey.main(["--quick", "--rows", "window", "--out", str(tmp_path), "--part", "long"])
