"""The pure parts of experiments/experiment.py: the memory-budget rule, the parameter matcher, the
resumable results store and the worker pool, mean ± std, and that the committed reports render
from their JSON."""

import json
import math
import os
from pathlib import Path

import compare_density
import compare_lm
import compare_recall
import compare_sorting
import experiment as ex
import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "results"


# --------------------------------------------------------------------------- memory budget
def test_memory_budget_by_hand():
    assert ex.memory_settings("transformer", 128) == {"mem_len": 0}
    assert ex.memory_settings("xl", 128) == {"mem_len": 128}
    assert ex.memory_settings("compressive", 128) == {"mem_len": 64, "compressed_len": 64}
    assert ex.memory_settings("infty", 512) == {
        "mem_len": 256,
        "num_basis": 256,
        "num_samples": 256,
    }


@pytest.mark.parametrize("budget", [0, 7, 12.0, "8"])
def test_memory_budget_refuses_bad_budgets(budget):
    with pytest.raises(ValueError, match="memory budget"):
        ex.memory_settings("xl", budget)


@pytest.mark.parametrize("variant", list(ex.VARIANTS))
def test_every_memory_holds_the_budget(variant):
    base = {"d_model": 16, "n_layers": 1, "n_heads": 2, "segment_len": 32}
    config = ex.model_config(variant, base, budget=48, d_ff=32).to_dict()
    expected = 0 if variant == "transformer" else 48
    assert ex.memory_vectors(config) == expected
    assert config["model_type"] == ex.VARIANTS[variant].model_type
    assert config["sticky"] is (variant == "infty-sticky")


# --------------------------------------------------------------------------- parameter matcher
def closest_by_brute_force(count, target, multiple):
    widths = range(multiple, 40_000, multiple)
    return min(widths, key=lambda w: (abs(count(w) - target), w))


@pytest.mark.parametrize(
    "count",
    [lambda w: 1000 + 37 * w, lambda w: 5 * w * w + 3, lambda w: 200 * (w // 24) + w],
    ids=["affine", "quadratic", "steps"],
)
def test_match_width_finds_the_closest_multiple(count):
    for target in (1, 1500, 20_000, 123_457, 300_001):
        got = ex.match_width(count, target, multiple=8)
        assert got % 8 == 0
        assert got == closest_by_brute_force(count, target, 8), target


def test_match_width_is_monotone_in_the_target():
    count = lambda w: 10_000 + 129 * w  # noqa: E731 - a parameter count linear in d_ff
    widths = [ex.match_width(count, target) for target in range(10_000, 200_000, 997)]
    assert widths == sorted(widths)
    assert len(set(widths)) > 100  # and it does move


def test_matched_models_hit_the_infty_parameter_count():
    base = {"d_model": 32, "n_layers": 2, "n_heads": 2, "segment_len": 32, "vocab_size": 50}
    matched = ex.matched_variants(list(ex.VARIANTS), base, budget=32, d_ff=64)
    target = matched["infty"]["params"]
    assert matched["infty"]["d_ff"] == 64
    for name, info in matched.items():
        # one step of 8 FFN units costs (2 d_model + 1) · 8 per layer: within half a step
        step = (2 * 32 + 1) * 8 * 2
        assert abs(info["params"] - target) <= step / 2, name
        config = ex.model_config(name, base, 32, info["d_ff"])
        assert ex.count_params(config) == info["params"]


# --------------------------------------------------------------------------- mean ± std
def test_mean_std_formatting():
    assert ex.fmt_mean_std([0.2, 0.3]) == "0.250 ± 0.071"  # sample std: 0.1 / sqrt(2)
    assert ex.fmt_mean_std([3.0186], digits=2) == "3.02 ± 0.00"
    assert ex.fmt_mean_std([0.5, math.nan, None, 0.7]) == "0.600 ± 0.141"
    assert ex.fmt_mean_std([]) == "–"
    mean, std = ex.mean_std([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and std == pytest.approx(math.sqrt(5 / 3))


# --------------------------------------------------------------------------- results store
def test_store_resumes_and_never_duplicates(tmp_path):
    path = tmp_path / "runs" / "results.jsonl"
    store = ex.ResultStore(path)
    assert store.add(("xl", 256, 0), "fp1", {"acc": 0.25}, elapsed=10.0)
    assert not store.add(("xl", 256, 0), "fp1", {"acc": 0.99})  # already there
    assert store.add(("xl", 256, 0), "fp2", {"acc": 0.30})  # another recipe: its own result
    assert store.add(("infty", None, 1), "fp1", {"acc": 0.5}, elapsed=20.0)

    again = ex.ResultStore(path)  # a later invocation
    assert again.get(("xl", 256, 0), "fp1") == {"acc": 0.25}
    assert again.get(["xl", 256, 0], "fp2") == {"acc": 0.30}
    assert again.get(("infty", None, 1), "fp1") == {"acc": 0.5}
    assert again.get(("xl", 256, 1), "fp1") is None
    assert again.elapsed([(("xl", 256, 0), "fp1"), (("infty", None, 1), "fp1")]) == 20.0
    assert not again.add(("xl", 256, 0), "fp1", {"acc": 0.0})
    assert len(path.read_text().splitlines()) == 3


def test_store_survives_a_line_cut_by_a_kill(tmp_path):
    path = tmp_path / "results.jsonl"
    ex.ResultStore(path).add(("xl", 64, 0), "fp", {"acc": 0.1})
    with open(path, "a") as f:
        f.write('{"key": ["infty", 64, 0], "fingerprint": "fp", "res')  # killed mid-write
    store = ex.ResultStore(path)
    assert store.get(("infty", 64, 0), "fp") is None  # lost: it will be run again
    assert store.add(("infty", 64, 0), "fp", {"acc": 0.2})
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[-1])["result"] == {"acc": 0.2}
    assert ex.ResultStore(path).get(("infty", 64, 0), "fp") == {"acc": 0.2}


def test_fresh_store_starts_over(tmp_path):
    path = tmp_path / "results.jsonl"
    ex.ResultStore(path).add(("xl", 64, 0), "fp", {"acc": 0.1})
    assert ex.ResultStore(path, fresh=True).get(("xl", 64, 0), "fp") is None
    assert (tmp_path / "results.jsonl.old").exists()


def test_job_fingerprint_ignores_where_the_run_goes(tmp_path):
    spec = {"model": {"d_ff": 8}, "task": {}, "train": {"seed": 0}, "evaluations": {}}
    a = ex.make_job(("xl", 1, 0), json.loads(json.dumps(spec)), tmp_path / "a", "xl")
    b = ex.make_job(("xl", 1, 0), json.loads(json.dumps(spec)), tmp_path / "b", "xl")
    spec["train"]["seed"] = 1
    c = ex.make_job(("xl", 1, 1), spec, tmp_path / "a", "xl")
    assert a.fingerprint == b.fingerprint != c.fingerprint
    assert a.spec["train"]["out_dir"] == str(tmp_path / "a" / f"xl-{a.fingerprint}")


def square(spec):
    """A stand-in for train_and_evaluate (runs in a worker process)."""
    if spec["x"] < 0:
        raise ValueError("negative")
    return {"square": spec["x"] ** 2, "pid": os.getpid()}


def test_pool_runs_what_the_store_lacks(tmp_path):
    store = ex.ResultStore(tmp_path / "results.jsonl")
    jobs = [ex.make_job(("v", x, 0), {"x": x, "train": {}}, tmp_path, f"x{x}") for x in (1, 2, -1)]
    records, failed, _ = ex.run_jobs(jobs[:2], store, workers=2, fn=square, echo=lambda _: None)
    assert [r["square"] for r in records] == [1, 4]
    assert all(r["pid"] != os.getpid() and r["cpu_seconds"] >= 0 for r in records)
    assert failed == []

    later = ex.ResultStore(tmp_path / "results.jsonl")  # another invocation, one worker
    records, failed, _ = ex.run_jobs(jobs, later, workers=1, fn=square, echo=lambda _: None)
    assert [(r["setting"], r["square"]) for r in records] == [(1, 1), (2, 4)]  # reused
    assert failed == [("v", -1, 0)]
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 2


# --------------------------------------------------------------------------- committed reports
@pytest.mark.parametrize(
    ("module", "report"),
    [
        (compare_sorting, DOCS / "sorting.json"),
        (compare_sorting, DOCS / "sorting_long" / "sorting.json"),
        (compare_lm, DOCS / "lm.json"),
        (compare_density, DOCS / "density.json"),
        (compare_recall, DOCS / "recall.json"),
    ],
)
def test_committed_reports_render_from_their_json(module, report, tmp_path, monkeypatch):
    """docs/results/X.md is what rendering docs/results/X.json gives, with its pointer to the
    notes in experiments/notes: no number in the report comes from anywhere else."""
    import _experiment_report

    monkeypatch.setattr(_experiment_report, "RESULTS", tmp_path)  # rendered as if in place
    out = tmp_path / report.parent.relative_to(DOCS)
    out.mkdir(parents=True, exist_ok=True)
    module.render(ex.load_report(report), out)
    md = report.with_suffix(".md").name
    page = (out / md).read_text(encoding="utf-8")
    assert page == (report.parent / md).read_text(encoding="utf-8")
    assert "](../" in page and "experiments/notes/" in page  # the notes stay out of the page


# --------------------------------------------------------------------------- writing results
def test_a_full_disk_mid_write_keeps_the_old_results(tmp_path, monkeypatch):
    """A report's JSON (measured figures) and a Markdown report with hand-kept notes are written
    whole or not at all: a write that fails half-way leaves the old file and nothing beside it."""
    import errno

    from inftyformer import _measure as _common

    def half_then_full(self, data, *args, **kwargs):
        with open(self, "wb") as f:
            f.write((data.encode() if isinstance(data, str) else data)[:5])
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    writers = [
        (tmp_path / "r.json", lambda p: ex.write_report(p, {"new": 2})),
        (tmp_path / "j.json", lambda p: _common.write_json(p, {"new": 2})),
        (tmp_path / "m.md", lambda p: _common.write_text(p, "new\n")),
    ]
    for path, _ in writers:
        path.write_text("old results\n")
    monkeypatch.setattr(Path, "write_text", half_then_full)
    monkeypatch.setattr(Path, "write_bytes", half_then_full)
    for path, write in writers:
        with pytest.raises(OSError, match="No space"):
            write(path)
    monkeypatch.undo()
    for path, _ in writers:
        assert path.read_text() == "old results\n", path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j.json", "m.md", "r.json"]
