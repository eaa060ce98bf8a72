"""`inftyformer train lm --base-model DIR`: a tiny random pretrained model saved in the test (with a
byte-level BPE tokenizer trained here: nothing is downloaded) trains, evaluates, generates and
resumes through the same trainer and command line as the native models."""

import json
import os
import random
import re
import subprocess
from pathlib import Path

import pytest
import torch
from tiny_models import torchrun_cli
from tiny_pretrained import write_tiny_model
from typer.testing import CliRunner

from inftyformer.cli import app
from inftyformer.model_kinds import PretrainedMemoryConfig, build_model
from inftyformer.training import load_checkpoint, read_metrics

WORDS = "the of memory book long short continuous said and signal basis".split()
SETTINGS = [
    "--steps", "4", "--batch-size", "2", "--eval-every", "2", "--no-progress", "--threads", "1",
    "--set", "segment_len=16", "--set", "num_basis=8", "--set", "num_samples=8",
    "--set", "warmup_steps=1", "--set", "eval_batches=1", "--set", "log_every=1",
    "--set", "tensorboard=false", "--set", "max_tokens=64",
]  # fmt: skip


def texts(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 90))) for _ in range(n)]


def save_pretrained(directory: Path, arch: str) -> Path:
    """A tiny random causal LM and a byte-level BPE tokenizer, as a model directory."""
    return write_tiny_model(directory, arch, corpus=texts(0, 50))


def write_corpus(root: Path) -> Path:
    for seed, (split, n) in enumerate((("train", 4), ("valid", 2), ("test", 2))):
        (root / split).mkdir(parents=True)
        for i, text in enumerate(texts(seed + 1, n)):
            (root / split / f"{i}.txt").write_text(text + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("pretrained")
    return save_pretrained(root / "base", "llama"), write_corpus(root / "corpus"), root


def run(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def test_the_tokenizer_and_vocabulary_come_from_the_base_model(setup):
    base, _, _ = setup
    cfg = PretrainedMemoryConfig(base_model=str(base), num_basis=8, num_samples=8)
    assert cfg.vocab_size == json.loads((base / "config.json").read_text())["vocab_size"]
    with pytest.raises(FileNotFoundError, match="not a Hugging Face model directory"):
        PretrainedMemoryConfig(base_model=str(base.parent / "nowhere"))
    with pytest.raises(ValueError, match="num_basis"):
        PretrainedMemoryConfig(base_model=str(base), num_basis=7)  # not a multiple of 2 widths


def test_loading_the_base_model_draws_no_second_bar(setup, capfd):
    """transformers draws a "Loading weights" bar on every load, under the run's own bar: the
    load is quiet, and transformers' setting is as it was after."""
    from transformers.utils import logging as hf_logging

    base, _, _ = setup
    capfd.readouterr()
    assert hf_logging.is_progress_bar_enabled()
    build_model(PretrainedMemoryConfig(base_model=str(base), num_basis=8, segment_len=16))
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()


def test_param_groups_split_memory_and_base(setup):
    base, _, _ = setup
    model = build_model(
        PretrainedMemoryConfig(base_model=str(base), num_basis=8, memory_lr=1e-3, segment_len=16)
    )
    groups = model.param_groups(5e-5, 0.01)
    memory = {id(p) for p in model.lm.memory_parameters()}
    assert {id(p) for p in groups[0]["params"]} == memory
    assert groups[0]["lr"] == 1e-3 and groups[0]["weight_decay"] == 0.0
    assert all(g["lr"] == 5e-5 for g in groups[1:])
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    frozen = build_model(PretrainedMemoryConfig(base_model=str(base), num_basis=8, segment_len=16,
                                                freeze_base=True))  # fmt: skip
    assert len(frozen.param_groups(5e-5, 0.01)) == 1  # the memory only
    # the density heads w_μ, w_σ at a rate of their own: weight and bias of 2 heads per layer
    heads = build_model(PretrainedMemoryConfig(base_model=str(base), num_basis=8, segment_len=16,
                                               freeze_base=True, density_lr=0.1))  # fmt: skip
    rest, density = heads.param_groups(5e-5, 0.01)
    layers = heads.lm.long_term
    expected = {id(p) for m in layers for head in (m.attention.mu_head, m.attention.sigma_head)
                for p in head.parameters()}  # fmt: skip
    assert {id(p) for p in density["params"]} == expected and len(expected) == 4 * len(layers)
    assert density["lr"] == 0.1 and rest["lr"] == 2.5e-4
    assert not expected & {id(p) for p in rest["params"]}
    assert len(rest["params"]) + len(expected) == len(list(heads.lm.memory_parameters()))
    with pytest.raises(ValueError, match="density_lr"):
        PretrainedMemoryConfig(base_model=str(base), density_lr=0.0)


@pytest.mark.parametrize("freeze", [False, True])
def test_train_evaluate_generate_with_a_base_model(setup, freeze):
    base, corpus, root = setup
    out = root / f"run-{freeze}"
    extra = ["--freeze-base"] if freeze else []
    code, output = run("train", "lm", "--base-model", base, "--data-dir", corpus, "-o", out,
                       *extra, *SETTINGS)  # fmt: skip
    assert code == 0, output
    assert "test ppl" in output
    banner = re.search(
        r"training base \+ long-term memory \(([\d.]+)M parameters(, [\d.]+M trained)?\)", output
    )
    assert banner and bool(banner.group(2)) is freeze, output  # what trains, when not all
    meta = load_checkpoint(out / "last").meta
    assert meta["model_kind"] == "pretrained" and meta["task_config"]["tokenizer"] == str(base)
    weights = load_checkpoint(out / "last").section("model")
    start = build_model(PretrainedMemoryConfig(**meta["model_config"])).state_dict()
    base_keys = [k for k in start if k.startswith("lm.base.")]
    memory_keys = [k for k in start if k.startswith("lm.long_term.")]
    assert base_keys and memory_keys
    if freeze:  # the checkpoint refers to the frozen base instead of holding it
        assert sorted(weights) == sorted(memory_keys) and meta["base"]["prefix"] == "lm.base."
    else:
        assert any(not torch.equal(weights[k], start[k]) for k in base_keys)  # the base trained
    assert any(not torch.equal(weights[k], start[k]) for k in memory_keys)
    code, output = run("evaluate", out, "--max-tokens", "32")
    assert code == 0 and "test ppl" in output, output
    code, output = run("generate", out, "--prompt", "the memory of", "--max-new-tokens", 4)
    assert code == 0 and "output:" in output, output
    # a prompt this short never left the window: the report says what the memory holds
    assert "memory: long-term memory empty (text enters it once it has left the window)" in output
    assert re.search(r"; window \d+ tokens \([\d,]+ numbers allocated", output), output


@pytest.mark.slow
def test_resume_with_a_base_model_continues_exactly(setup):
    base, corpus, root = setup
    full, part = root / "full", root / "part"
    args = ["train", "lm", "--base-model", base, "--data-dir", corpus, *SETTINGS,
            "--set", "sticky=true"]  # fmt: skip
    assert run(*args, "-o", full)[0] == 0
    assert run(*args, "-o", part, "--set", "halt_after=2")[0] == 0
    code, output = run("train", "lm", "-o", part, "--resume", "--no-progress",
                       "--set", "halt_after=0")  # fmt: skip
    assert code == 0 and "resumed" in output, output

    def losses(out):
        return [(r["step"], r["value"]) for r in read_metrics(out)
                if r["split"] == "train" and r["metric"] == "loss"]  # fmt: skip

    assert losses(part) == losses(full)


@pytest.mark.slow
def test_two_process_ddp_matches_one_process(setup):
    base, corpus, root = setup
    # the KL regulariser on, and strong: weighed per scored token like the NLL (`kl_term.py`),
    # the split over processes reproduces it (as a mean over each process's rows, it moved
    # W^Q's bias by more than the tolerance)
    args = ["train", "lm", "--base-model", base, "--data-dir", corpus, *SETTINGS,
            "--set", "test_batches=0", "--set", "kl_weight=0.1"]  # fmt: skip
    assert run(*args, "-o", root / "single")[0] == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = torchrun_cli(*args, "-o", root / "ddp")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    a = load_checkpoint(root / "single" / "last").section("model")
    b = load_checkpoint(root / "ddp" / "last").section("model")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5, msg=key)
