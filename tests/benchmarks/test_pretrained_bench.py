"""benchmarks/bench_pretrained.py end to end on a tiny random Llama (--quick): the checks hold,
every candidate setting is measured, the goals table and the report render from the JSON, and
--only-settings keeps the sections measured before."""

import json

import pytest


def test_late_blocks_and_the_choice_rule():
    from _bench_pretrained_settings import GOALS, choose, late_blocks

    assert late_blocks(30) == [15, 19, 23, 27]
    assert late_blocks(2) == [1]

    def row(params, ckpt, ratio):
        return {
            "trained_fraction": params,
            "checkpoint_fraction": ckpt,
            "stream": {"ratio_to_base": ratio},
        }

    over = GOALS["stream_ratio"] + 0.5
    rows = [row(0.5, 1.0, 1.0), row(0.1, 0.2, over), row(0.1, 0.2, 1.1)]
    assert choose(rows) == 2  # the first meeting every goal
    assert choose(rows[:2]) == 0  # none: the cheapest to stream
    # a run's checkpoint (with the memory it carries) counts when measured
    heavy = {**row(0.1, 0.2, 1.0), "run_checkpoint_fraction": GOALS["checkpoint_fraction"] + 0.01}
    light = {**row(0.1, 0.2, 1.1), "run_checkpoint_fraction": GOALS["checkpoint_fraction"]}
    assert choose([heavy, light]) == 1


def test_the_quick_run_measures_every_candidate_and_renders_from_json(tmp_path):
    pytest.importorskip("transformers")
    import bench_pretrained

    stub = {"kept": "measured before"}
    (tmp_path / "pretrained_cost_tiny.json").write_text(json.dumps(stub))
    bench_pretrained.main(["--quick", "--only-settings", "--out-dir", str(tmp_path)])
    data = json.loads((tmp_path / "pretrained_cost_tiny.json").read_text())
    assert data["kept"] == "measured before"  # the other sections stay
    s = data["settings"]
    assert [c["memory_layers"] for c in s["candidates"]] == [None, [1], [1]]
    assert 0 <= s["chosen"] < len(s["candidates"])
    for c in s["candidates"]:
        assert c["trained_params"] > 0 and c["checkpoint_bytes"] > 0
        assert c["carried_bytes"] > 0
        assert c["run_checkpoint_bytes"] == c["checkpoint_bytes"] + c["carried_bytes"]
        assert c["stream"]["ratio_to_base"] > 0
    assert "run checkpoint, batch" in (tmp_path / "pretrained_cost_tiny.md").read_text()
    timings = [c["stream"] for c in s["candidates"]]
    bench_pretrained.main(["--quick", "--only-settings", "--keep-timings", "--out-dir",
                           str(tmp_path)])  # fmt: skip
    kept = json.loads((tmp_path / "pretrained_cost_tiny.json").read_text())["settings"]
    assert [c["stream"] for c in kept["candidates"]] == timings  # not measured again
    assert kept["timings_from"]["command"] == s["command"]
    assert "Streaming timings kept from" in (tmp_path / "pretrained_cost_tiny.md").read_text()
    with pytest.raises(SystemExit):  # the whole run measures everything
        bench_pretrained.main(["--quick", "--keep-timings", "--out-dir", str(tmp_path)])
    speeds = s["generation"]["rows"]
    assert set(speeds) == {"base, same prompt", "base, window + prompt", "memory model"}
    assert all(r["decode_tokens_per_s"] > 0 for r in speeds.values())
    report = (tmp_path / "pretrained_cost_tiny.md").read_text()
    assert "## Recommended settings" in report and "### Goals at the recommended setting" in report

    bench_pretrained.main(["--quick", "--out-dir", str(tmp_path)])
    data = json.loads((tmp_path / "pretrained_cost_tiny.json").read_text())
    assert "kept" not in data and "settings" in data
    assert data["generation"]["tokens_equal_recomputation"]
    assert all(d == 0 for row in data["parity"] for d in row["max_abs_logit_diff"])
    report = (tmp_path / "pretrained_cost_tiny.md").read_text()
    bench_pretrained.main(["--quick", "--only-generation", "--out-dir", str(tmp_path)])
    again = json.loads((tmp_path / "pretrained_cost_tiny.json").read_text())
    assert "command" in again["settings"]["generation"]
    assert again["settings"]["candidates"] == data["settings"]["candidates"]
    data, report = again, (tmp_path / "pretrained_cost_tiny.md").read_text()
    bench_pretrained.main(["--quick", "--render-only", "--out-dir", str(tmp_path)])
    assert (tmp_path / "pretrained_cost_tiny.md").read_text() == report  # from the JSON alone


def test_the_hf_doc_block_is_replaced_between_its_markers(tmp_path):
    from _bench_pretrained_report import HF_BEGIN, HF_END, update_hf_doc

    settings = {
        "machine": {"cpu": "a CPU", "load_average": [1.0, 2.0, 3.0]},
        "goals": {"trained_fraction": 0.15, "checkpoint_fraction": 0.25, "stream_ratio": 1.3,
                  "generate_ratio": 0.8},
        "chosen": 0,
        "base_bytes": 1000,
        "candidates": [
            {"memory_layers": [1, 3], "num_basis": 8, "num_samples": 8, "trained_params": 10,
             "trained_fraction": 0.1, "checkpoint_bytes": 100, "checkpoint_fraction": 0.1,
             "stream": {"ratio_to_base": 1.1}},
        ],
        "generation": {"rows": {"memory model": {"decode_ratio_to_base, same prompt": 0.9}}},
        "command_line": None,
        "train_batch": 4,
    }  # fmt: skip
    doc = tmp_path / "hf.md"
    doc.write_text(f"before\n{HF_BEGIN}\nold\n{HF_END}\nafter\n")
    assert update_hf_doc(doc, settings)
    text = doc.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old" not in text
    # the command names the batch its peak memory was measured at
    assert "--batch-size 4 --set memory_layers=1,3 --set num_basis=8 --set num_samples=8" in text
    assert "1,3 (recommended)" in text
    doc.write_text("no markers\n")
    assert not update_hf_doc(doc, settings)


def test_a_command_s_peak_rss_is_its_own_not_this_process_s():
    import os
    import sys

    from _bench_pretrained_settings import _run_child

    held = bytearray(400_000_000)  # this process: 400 MB more, touched
    held[::4096] = b"\1" * len(held[::4096])
    small = _run_child([sys.executable, "-c", "print('hi')"], dict(os.environ))
    assert small["peak_rss_bytes"] < 150e6 and small["output_tail"].strip() == "hi"
    assert small["wall_seconds"] > 0 and small["cpu_seconds"] > 0
    big = _run_child([sys.executable, "-c", "b = bytearray(300_000_000); b[::4096] = b'1' * "
                      "len(b[::4096])"], dict(os.environ))  # fmt: skip
    assert 300e6 < big["peak_rss_bytes"] < 450e6
    with pytest.raises(RuntimeError, match="failed"):
        _run_child([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ))
    del held
