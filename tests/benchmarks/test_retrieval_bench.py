"""benchmarks/bench_retrieval.py: the page renders from the JSON (ratios against `window` in the
same rounds, memory growth first to last, disk per token), and a tiny run writes every part."""

import json

import bench_retrieval as br
import pytest


def data() -> dict:
    return {
        "command": "python benchmarks/bench_retrieval.py",
        "machine": {"cpu": "c", "logical_cpus": 2, "memory_gib": 1, "torch_threads": 1,
                    "platform": "p", "libc": "l", "python": "3", "torch": "2",
                    "load_average": [1.0, 1.0, 1.0]},
        "setup": {"base_model": "m", "threads": 1, "block": 256, "full_limit": 8192,
                  "prompt": 4096, "new_tokens": 32, "repeats": 3},
        "time": {"ms_per_token": {"window": {"4096": 10.0, "16384": 10.0},
                                  "retrieval": {"4096": 12.0, "16384": 15.0},
                                  "full": {"4096": 5.0}}},
        "memory": {"retrieval": {"rss_mb": {"8192": 1000.0, "32768": 1050.0},
                                 "disk_bytes": 32768 * 1024, "tokens": 32768}},
        "generate": {"retrieval": {"median_ms": 320.0}, "base-2k": {"median_ms": 256.0}},
    }  # fmt: skip


def test_the_page_states_ratios_growth_and_disk_from_the_json():
    page = br.render(data())
    assert "| retrieval | 12.00 (1.20×) | 15.00 (1.50×) |" in page
    assert "| full | 5.00 (0.50×) | – |" in page
    assert "| retrieval | 1000 | 1050 | +5.0% | 1.0 KiB |" in page
    assert "retrieval 10.0 ms/token" in page and "8.0 ms/token: speed 0.80×" in page
    assert "hybrid / retrieval" not in page
    with_hybrid = data()
    with_hybrid["time"]["ms_per_token"]["hybrid"] = {"4096": 13.2, "16384": 18.0}
    assert "hybrid / retrieval per token (same rounds): 4,096: 1.10×, 16,384: 1.20×." in br.render(
        with_hybrid
    )


@pytest.mark.slow
def test_a_tiny_run_writes_json_page_and_plot(tmp_path):
    br.main(["--tiny", "--out", str(tmp_path)])
    written = json.loads((tmp_path / "retrieval_cost_tiny.json").read_text())
    assert set(written["time"]["ms_per_token"]) == set(br.ROWS)
    assert set(written["memory"]) == {"window", "retrieval"}
    assert (tmp_path / "retrieval_cost_tiny.png").stat().st_size > 0
    assert "retrieval_cost_tiny.png" in (tmp_path / "retrieval_cost_tiny.md").read_text()


def test_an_unknown_row_and_a_time_run_without_the_window_are_refused(capsys):
    for argv, said in ((["--rows", "window,nope"], "unknown row 'nope'"),
                       (["--rows", "retrieval-near"], "must include window")):  # fmt: skip
        with pytest.raises(SystemExit):
            br.main(argv)
        assert said in capsys.readouterr().err
