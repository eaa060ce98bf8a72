"""benchmarks/bench_pretrained.py end to end on a tiny random Llama (--quick): the checks hold
and the report renders from the JSON alone."""

import json

import pytest


def test_the_quick_run_checks_parity_and_generation_and_renders_from_json(tmp_path):
    pytest.importorskip("transformers")
    import bench_pretrained

    bench_pretrained.main(["--quick", "--out-dir", str(tmp_path)])
    data = json.loads((tmp_path / "pretrained_cost_tiny.json").read_text())
    assert "settings" not in data  # the settings' measurement is a recorded result
    assert data["generation"]["tokens_equal_recomputation"]
    assert all(d == 0 for row in data["parity"] for d in row["max_abs_logit_diff"])
    assert data["save_load"]["max_abs_logit_diff"] == 0
    assert all(r["ratio_median"] > 0 for r in data["cost"].values())
    report = (tmp_path / "pretrained_cost_tiny.md").read_text()
    assert "[pretrained_settings.md](pretrained_settings.md)" in report
    bench_pretrained.main(["--quick", "--render-only", "--out-dir", str(tmp_path)])
    assert (tmp_path / "pretrained_cost_tiny.md").read_text() == report  # from the JSON alone
