"""`inftyformer inspect`: a saved run in, PNGs and a JSON summary out."""

from __future__ import annotations

import json

import pytest
from tiny_models import tiny, tiny_train
from typer.testing import CliRunner

from inftyformer.cli import app
from inftyformer.tasks import RecallConfig, RecallTask
from inftyformer.training import Trainer


def _train(tmp_path, model_type: str, **overrides):
    config = RecallConfig(num_pairs=2, gap=(0, 8), num_keys=4, num_values=4, num_fillers=2)
    model = tiny(model_type, **RecallTask.model_overrides(config), **overrides)
    run = tiny_train(tmp_path, task="recall", steps=2, eval_every=2, test_batches=0)
    Trainer(run, config, model, echo=lambda s: None).fit()
    return tmp_path


@pytest.mark.slow
def test_inspect_draws_a_sticky_infinity_former(tmp_path) -> None:
    run = _train(tmp_path / "run", "infty", sticky=True)
    out = tmp_path / "pictures"
    result = CliRunner().invoke(app, ["inspect", str(run), "--segments", "24", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "median sigma" in result.output and "fidelity cos k=1" in result.output
    names = {p.name for p in out.iterdir()}
    assert names == {"reads.png", "sigma.png", "samples.png", "fidelity.png", "summary.json"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["segments"] == 24 and summary["sticky"] is True
    assert summary["source"] == "test split"
    layer = summary["layers"][0]
    assert {"sigma", "mu", "fidelity", "sample_entropy_vs_uniform"} <= set(layer)


def test_inspect_a_compressive_run_from_a_text_file(tmp_path) -> None:
    run = _train(tmp_path / "run", "compressive")
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("random:60")
    result = CliRunner().invoke(app, ["inspect", str(run), "--text", str(prompt)])
    assert result.exit_code == 0, result.output
    out = run / "inspect"
    assert {p.name for p in out.iterdir()} == {"fidelity.png", "summary.json"}
    # what it is doing is said as it goes: the stream's segments counted, then the layers
    said = result.output
    assert said.index("streaming: ") < said.index("measuring: ") < said.index("drawing the")
    summary = json.loads((out / "summary.json").read_text())
    assert "compressed_fidelity" in summary["layers"][0]
    bad = CliRunner().invoke(app, ["inspect", str(run), "--segments", "0"])
    assert bad.exit_code != 0 and "--segments" in bad.output
