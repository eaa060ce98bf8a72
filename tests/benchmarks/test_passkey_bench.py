"""benchmarks/passkey.py end to end on a tiny random model: every row sees the same prompts, the
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
    assert set(rows) == {"window", "full", "untrained", "heads", "mixture", "exact"}
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
    nll = {r: rows[r]["passkey"]["90"]["nll"] for r in ("window", "mixture", "exact")}
    assert abs(nll["exact"] - nll["window"]) > 1e-3, nll
    assert abs(nll["exact"] - nll["mixture"]) > 1e-3, nll
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
