"""experiments/passkey_variant.py on a tiny random model: the variant's settings reach the model
and change what it scores; the window row is the base's."""

import json

import passkey_variant
import pytest


def test_a_variant_and_the_window_row_write_one_line_each(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "lines.jsonl"
    argv = ["--quick", "--rows", "variant,window,exact", "--jsonl", str(out)]
    passkey_variant.main([*argv, "--set", '{"tau": 0.75}'])
    passkey_variant.main([*argv[:2], "variant", "--jsonl", str(out), "--set", '{"tau": 0.25}'])
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["row"] for line in lines] == ["variant", "window", "exact", "variant"]
    assert lines[0]["set"] == {"tau": 0.75} and lines[1]["set"] == {}
    assert lines[0]["books"]["buckets"]
    nll = [line["passkey"]["40"]["nll"] for line in lines]
    assert abs(nll[0] - nll[1]) > 1e-3  # the heads read moves the answer's NLL
    assert abs(nll[0] - nll[3]) > 1e-6  # and τ reaches the memory
    assert abs(nll[2] - nll[1]) > 1e-3  # the ceiling row reads the exact states


def test_the_positions_setting_moves_the_variants_read(tmp_path):
    """The fill variant read at its places' own positions scores otherwise than at one distance
    (the quick base is a Llama: rotary positions)."""
    pytest.importorskip("transformers")
    out = tmp_path / "lines.jsonl"
    settings = dict(num_basis=64, widths=[0.003], squeeze="fill", keep_first=4,
                    edge_padding=False)  # fmt: skip
    argv = ["--quick", "--rows", "variant", "--jsonl", str(out)]
    passkey_variant.main([*argv, "--set", json.dumps(settings)])
    passkey_variant.main([*argv, "--set", json.dumps({**settings, "memory_positions": "places"})])
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    nll = [line["passkey"]["40"]["nll"] for line in lines]
    assert abs(nll[0] - nll[1]) > 1e-6
