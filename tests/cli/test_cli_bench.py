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
