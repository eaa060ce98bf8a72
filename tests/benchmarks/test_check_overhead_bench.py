"""benchmarks/bench_check_overhead.py: the summary over workers and trees, the report rendered from
the JSON, and a git tree spec extracted to a directory the worker can import."""

import json

import pytest

MODELS = ("transformer", "xl", "compressive", "infty", "reference")


def worker(step_ms: float, ratio: float, checks_ms: float) -> dict:
    """A worker's result in which every model has the same step time and ratio."""
    row = {"median_ms": step_ms, "ratio_to_reference": ratio}
    return {
        "inftyformer_file": "x",
        "modes": {mode: {m: dict(row) for m in MODELS} for mode in ("train", "infer")},
        "validation_ms": {m: checks_ms for m in MODELS[:4]},
    }


def test_summary_takes_medians_over_workers_and_ratios_over_the_first_tree():
    from bench_check_overhead import summarize

    summary = summarize(
        {
            "before": [worker(100, 1.5, 1.0), worker(300, 1.7, 2.0), worker(200, 1.6, 9.0)],
            "after": [worker(90, 1.2, 0.5), worker(95, 1.6, 0.5), worker(99, 1.4, 0.5)],
        }
    )
    assert summary["before"]["train"]["xl"]["median_ms"] == 200
    assert summary["before"]["train"]["xl"]["ratio_to_reference"] == 1.6
    assert summary["before"]["validation_ms"]["infty"] == 2.0
    assert summary["after"]["infer"]["xl"]["over_before"] == pytest.approx(1.4 / 1.6)
    assert "over_before" not in summary["before"]["train"]["xl"]


def test_report_renders_from_the_json_and_keeps_the_notes(tmp_path):
    from bench_check_overhead import summarize, write_report

    from inftyformer import _measure as common

    workers = {"before": [worker(100, 1.5, 1.0)], "after": [worker(98, 1.47, 1.0)]}
    result = {
        "command": "python benchmarks/bench_check_overhead.py",
        "machine": {
            "cpu": "cpu",
            "logical_cpus": 2,
            "memory_gib": 1,
            "torch_threads": 1,
            "platform": "p",
            "libc": "l",
            "python": "3",
            "torch": "2",
            "load_average": [1.0, 1.0, 1.0],
        },
        "settings": {"workers": 1, "repeats": 3, "warmup": 4},
        "batch": 8,
        "segment_len": 128,
        "trees": {"before": "git:abc", "after": "src"},
        "workers": workers,
        "summary": summarize(workers),
    }
    out = tmp_path / "check_overhead"
    out.with_suffix(".json").write_text(json.dumps(result))
    write_report(result, out)
    text = out.with_suffix(".md").read_text()
    assert "| xl | 100 | 1.500 | 98.0 | 1.470 | 0.980 |" in text
    assert "at most 1.02% of a training step" in text  # 1 ms of the 98 ms step
    # hand-written notes survive a re-render
    notes = f"{common.NOTES_BEGIN}\nwhy it is so\n{common.NOTES_END}"
    out.with_suffix(".md").write_text(
        text.replace(common.kept_notes(out.with_suffix(".md")), notes)
    )
    write_report(result, out)
    assert "why it is so" in out.with_suffix(".md").read_text()
    assert "Spread of the same ratio" not in text  # one worker per tree: no spread to show
    workers["before"].append(worker(100, 2.0, 1.0))  # ratios 1.5 and 2.0: spread 0.5 / 1.75
    result["summary"] = summarize(workers)
    write_report(result, out)
    assert "up to 0.286, median 0.286" in out.with_suffix(".md").read_text()


def test_a_git_tree_is_the_src_directory_of_that_commit(tmp_path):
    import subprocess

    from bench_check_overhead import ROOT, source_tree

    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    src = source_tree(f"git:{head}", tmp_path)
    assert (src / "inftyformer" / "__init__.py").is_file()
    assert source_tree(str(tmp_path), tmp_path / "unused") == tmp_path.resolve()
