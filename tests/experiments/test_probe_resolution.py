"""experiments/probe_resolution.py on a tiny random model: the probe decodes the stored states
themselves better than chance, and the report renders from its JSON."""

import json

import probe_resolution
import pytest


def test_the_quick_probe_runs_and_renders_from_its_json(tmp_path):
    pytest.importorskip("transformers")
    probe_resolution.main(["--quick", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "probe_resolution.json").read_text())
    row = data["results"]["40"]
    assert set(row) == {
        "states",
        "N=32, widths=[0.02]",
        "N=64, widths=[0.01]",
        "N=64, widths=[0.01], read σ²=0.001",
        "seconds",
    }
    for name, result in row.items():
        if name != "seconds":
            assert 0.0 <= result["key_exact"] <= result["digit_accuracy"] <= 1.0
    assert row["states"]["digit_accuracy"] > 0.3  # token identity is in the states (chance 0.1)
    report = (tmp_path / "probe_resolution.md").read_text()
    probe_resolution.main(["--render-only", "--out", str(tmp_path)])
    assert (tmp_path / "probe_resolution.md").read_text() == report


def test_a_probe_finds_a_linear_code_and_misses_noise():
    """The probe itself: digits written as one-hot directions are decoded exactly; labels
    unrelated to the inputs stay near chance."""
    import torch

    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 10, (40, 5), generator=g)
    coded = torch.nn.functional.one_hot(labels, 16).float() + 0.01 * torch.randn(
        40, 5, 16, generator=g
    )
    assert probe_resolution.probe(coded, labels)["key_exact"] == 1.0
    noise = torch.randn(40, 5, 16, generator=g)
    assert probe_resolution.probe(noise, labels)["digit_accuracy"] < 0.4
