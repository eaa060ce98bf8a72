"""`inftyformer bench`: the built-in timing table and the script runner."""

import pytest
from typer.testing import CliRunner

from inftyformer.cli import app

runner = CliRunner()


@pytest.mark.slow
def test_builtin_benchmark_prints_a_row_per_model():
    args = ["bench", "--models", "xl,infty", "-T", "128", "--batch-size", "2", "--steps", "1"]
    args += ["--threads", "1"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(line.startswith("xl ") for line in lines)
    assert any(line.startswith("infty ") for line in lines)


def test_bad_benchmark_requests_fail_clearly():
    result = runner.invoke(app, ["bench", "--models", "rnn"])
    assert result.exit_code != 0 and "unknown model 'rnn'" in result.output
    result = runner.invoke(app, ["bench", "--script", "no_such_script"])
    assert result.exit_code != 0 and "no benchmark script" in result.output


def test_scripts_are_found_in_the_checkout_and_helpers_are_not_scripts():
    from inftyformer.bench import benchmark_scripts, benchmarks_dir

    assert benchmarks_dir() is not None and (benchmarks_dir() / "bench_core.py").is_file()
    scripts = benchmark_scripts()
    assert {"bench_core", "bench_models", "compare_sorting"} <= set(scripts)
    assert not any(name.startswith("_") for name in scripts)
    assert "experiment" not in scripts  # the comparisons' shared module, not a program


def test_only_files_that_run_as_programs_are_scripts(tmp_path):
    from inftyformer.bench import benchmark_scripts

    folder = tmp_path / "benchmarks"
    folder.mkdir()
    (folder / "tool.py").write_text(
        'def main():\n    pass\n\n\nif __name__ == "__main__":\n    main()\n'
    )
    (folder / "shared.py").write_text('"""Called from `if __name__ == "__main__":` blocks."""\n')
    (folder / "_helper.py").write_text('if __name__ == "__main__":\n    pass\n')
    assert set(benchmark_scripts(tmp_path)) == {"tool"}


def test_an_installed_package_without_the_scripts_says_what_is_missing(monkeypatch, tmp_path):
    """Installed from a wheel, the package sits in site-packages, not in a checkout's src/: the
    scripts are not there, and the error says so instead of listing no scripts."""
    from inftyformer import bench

    installed = tmp_path / "lib" / "site-packages" / "inftyformer"
    installed.mkdir(parents=True)
    (tmp_path / "lib" / "benchmarks").mkdir()  # a folder two levels up is not a checkout's
    monkeypatch.setattr(bench, "__file__", str(installed / "bench.py"))
    assert bench.benchmarks_dir() is None and bench.benchmark_scripts() == {}
    result = runner.invoke(app, ["bench", "--script", "bench_core"])
    assert result.exit_code == 2, result.output
    assert "source checkout" in result.output and str(installed) in result.output
    assert "pip install -e ." in result.output
