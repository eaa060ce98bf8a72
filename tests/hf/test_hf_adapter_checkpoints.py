"""Adapter checkpoints: a run that trains only the memory on a frozen pretrained base saves the
memory (weights and optimiser moments) and a reference to the base (its folder and a hash of its
weights), loads the base from that reference, follows it to a new folder with --base-model, and
refuses a base whose weights differ; checkpoints that hold the whole base still load."""

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_hf_training import SETTINGS, run, save_pretrained, write_corpus

from inftyformer import base_weights
from inftyformer.base_weights import BaseMismatchError, BaseReference, weights_hash
from inftyformer.model_kinds import PretrainedMemoryConfig, build_model
from inftyformer.training import (
    CheckpointError,
    load_checkpoint,
    load_run,
    read_metrics,
    save_checkpoint,
)
from inftyformer.training.checkpoint_weights import relocate


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return save_pretrained(root / "base", "llama"), write_corpus(root / "corpus"), root


def train(base, corpus, out, *extra):
    args = ["train", "lm", "--base-model", base, "--data-dir", corpus, "--freeze-base",
            "-o", out, *SETTINGS, "--set", "sticky=true", *extra]  # fmt: skip
    code, output = run(*args)
    assert code == 0, output
    return output


def losses(out):
    return [(r["step"], r["value"]) for r in read_metrics(out)
            if r["split"] == "train" and r["metric"] == "loss"]  # fmt: skip


def alter_one_weight(directory):
    """Change one number of the saved base (re-saved with the same names and metadata)."""
    path = directory / "model.safetensors"
    tensors = load_file(path)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] += 1e-3
    save_file(tensors, path, metadata={"format": "pt"})


# ---------------------------------------------------------------------- the weights hash
def test_the_hash_is_of_the_tensors_and_computed_once_per_file(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    one = save_pretrained(tmp_path / "one", "gpt2")
    digest = weights_hash(one)
    assert len(digest) == 64 and weights_hash(str(one)) == digest
    # the same tensors in other shards and with other file metadata: the same hash
    model = AutoModelForCausalLM.from_pretrained(one)
    model.save_pretrained(tmp_path / "shards", max_shard_size="20KB")
    assert len(list((tmp_path / "shards").glob("*.safetensors"))) > 1
    assert weights_hash(tmp_path / "shards") == digest
    # one number changed: another hash
    alter_one_weight(one)
    assert weights_hash(one) != digest
    # read once per file: a second hash of an unchanged file reads nothing
    reads = []
    original = base_weights._safetensors_lines
    monkeypatch.setattr(base_weights, "_safetensors_lines",
                        lambda *a: reads.append(a[0]) or original(*a))  # fmt: skip
    weights_hash(one), weights_hash(one)
    assert reads == []
    with pytest.raises(ValueError, match="holds no model weights"):
        weights_hash(tmp_path)
    # a base without safetensors files: the bytes of its pytorch_model*.bin files
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "pytorch_model.bin").write_bytes(b"weights")
    first = weights_hash(tmp_path / "bin")
    (tmp_path / "bin" / "pytorch_model.bin").write_bytes(b"other weights")
    assert weights_hash(tmp_path / "bin") != first


def test_a_reference_names_both_bases_when_they_differ(tmp_path):
    base = save_pretrained(tmp_path / "base", "llama")
    reference = BaseReference.of(base, "lm.base.")
    assert reference.path == str(base.resolve()) and reference.check(base) == reference.sha256
    other = shutil.copytree(base, tmp_path / "other")
    alter_one_weight(other)
    with pytest.raises(BaseMismatchError) as err:
        reference.check(other)
    message = str(err.value)
    assert "\n" not in message and str(other) in message and str(base) in message
    assert reference.sha256[:16] in message and weights_hash(other)[:16] in message
    assert "--base-model" in message


# ---------------------------------------------------------------------- runs
def test_a_frozen_base_run_saves_only_what_it_trains(setup):
    base, corpus, root = setup
    frozen, full = root / "frozen", root / "full"
    train(base, corpus, frozen)
    code, output = run("train", "lm", "--base-model", base, "--data-dir", corpus, "-o", full,
                       *SETTINGS)  # fmt: skip
    assert code == 0, output
    model = build_model(PretrainedMemoryConfig(**load_checkpoint(frozen / "last").meta[
        "model_config"]))  # fmt: skip
    memory = {f"lm.{k}" for k in model.lm.state_dict() if k.startswith("long_term.")}
    trained = [p for p in model.parameters() if p.requires_grad]
    for name in ("last", "best"):
        ckpt = load_checkpoint(frozen / name)
        assert set(ckpt.section("model")) == memory
        # AdamW's two moments and step count of the memory's parameters, nothing else
        assert len(ckpt.section("optim")) == 3 * len(trained)
        assert ckpt.meta["base"] == {"path": str(base.resolve()), "sha256": weights_hash(base),
                                     "prefix": "lm.base."}  # fmt: skip
    # a run that fine-tunes its base keeps holding it (and refers to nothing)
    whole = load_checkpoint(full / "last")
    assert "base" not in whole.meta
    assert any(k.startswith("lm.base.") for k in whole.section("model"))
    size = (frozen / "last.safetensors").stat().st_size
    base_size = (base / "model.safetensors").stat().st_size
    # the fine-tuned run holds the base and its two Adam moments on top (tiny memory-heavy model)
    assert size < (full / "last.safetensors").stat().st_size - 2 * base_size
    # loaded back: the base's weights are the folder's, the memory's the checkpoint's
    saved = load_run(frozen)
    start = build_model(saved.model_config).state_dict()
    weights = saved.model.state_dict()
    trained_memory = load_checkpoint(frozen / "best").section("model")
    assert all(torch.equal(weights[k], start[k]) for k in weights if k.startswith("lm.base."))
    assert all(torch.equal(weights[k], v) for k, v in trained_memory.items())


def test_resume_after_moving_the_base_continues_exactly(setup):
    base, corpus, root = setup
    full, part = root / "uninterrupted", root / "moved"
    # the folder keeps its name (the tokenizer's name, in the data fingerprint, is the folder's)
    old, new = root / "old" / "smol", root / "new" / "smol"
    train(base, corpus, full)
    shutil.copytree(base, old)
    train(old, corpus, part, "--set", "halt_after=2")
    new.parent.mkdir()
    old.rename(new)
    resume = ["train", "lm", "-o", part, "--resume", "--no-progress", "--set", "halt_after=0"]
    renamed = shutil.copytree(new, root / "renamed")
    code, output = run(*resume, "--base-model", renamed)
    assert code == 2 and "renamed from smol to renamed" in output, output
    code, output = run(*resume)
    assert code == 2 and f"base model {old} is not there any more" in output, output
    assert "--base-model" in output and len(output.strip().splitlines()) == 1
    code, output = run(*resume, "--base-model", new)
    assert code == 0 and "resumed" in output and f"base model is now {new}" in output, output
    assert losses(part) == losses(full)
    meta = load_checkpoint(part / "last").meta
    assert meta["base"]["path"] == str(new.resolve())
    assert meta["model_config"]["base_model"] == meta["task_config"]["tokenizer"] == str(new)
    # checkpoints saved after the move name the new folder; those before it are pointed there
    assert load_run(part / "last").model_config.base_model == str(new)
    code, output = run("evaluate", part / "best", "--max-tokens", "32", "--base-model", new)
    assert code == 0 and "test ppl" in output, output
    code, output = run("generate", part, "--prompt", "the memory of", "--max-new-tokens", 3,
                       "--base-model", new)  # fmt: skip
    assert code == 0 and "output:" in output, output


def test_a_changed_base_is_refused(setup):
    base, corpus, root = setup
    out, copy = root / "refused", root / "edited"
    train(base, corpus, out, "--set", "halt_after=2")
    shutil.copytree(base, copy)
    alter_one_weight(copy)
    expected = f"is not the one this was trained on ({base.resolve()}"
    for args in (
        ["train", "lm", "-o", out, "--resume", "--no-progress", "--base-model", copy],
        ["evaluate", out, "--max-tokens", "32", "--base-model", copy],
        ["generate", out, "--prompt", "the", "--max-new-tokens", 2, "--base-model", copy],
    ):
        code, output = run(*args)
        assert code == 2 and expected in output and str(copy.resolve()) in output, output
        assert len(output.strip().splitlines()) == 1, output
    with pytest.raises(BaseMismatchError):
        load_run(out, base_model=str(copy))
    # the base changed in its own folder: refused as well
    own = shutil.copytree(base, root / "own" / "base")
    train(own, corpus, root / "in-place", "--set", "halt_after=2")
    alter_one_weight(own)
    code, output = run("evaluate", root / "in-place", "--max-tokens", "32")
    assert code == 2 and f"{own.resolve()} (weights sha256" in output, output


def edit_config(directory, **changes):
    """Change entries of a base's config.json (nested ones as "outer.inner")."""
    import json

    path = directory / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        *outer, last = key.split(".")
        node = config
        for name in outer:
            node = node[name]
        node[last] = value
    path.write_text(json.dumps(config, indent=2))


def test_a_base_whose_config_json_changed_is_refused(setup):
    """The same weights under another rope_theta or hidden_act give other logits: a run (one
    that refers to its frozen base, one that holds every weight) refuses a base folder whose
    config.json computes otherwise, naming the entry; a change that computes the same
    (use_cache, the version that wrote it) is accepted."""
    base, corpus, root = setup
    frozen, whole = root / "cfg-frozen", root / "cfg-whole"
    train(base, corpus, frozen, "--set", "halt_after=2")
    code, output = run("train", "lm", "--base-model", base, "--data-dir", corpus, "-o", whole,
                       *SETTINGS, "--set", "halt_after=2")  # fmt: skip
    assert code == 0, output
    for key, value, shown in (
        ("rope_parameters.rope_theta", 500000.0, "rope_parameters.rope_theta: 10000.0 -> 500000.0"),
        ("hidden_act", "gelu", "hidden_act: 'silu' -> 'gelu'"),
    ):
        copy = shutil.copytree(base, root / f"cfg-{key}")
        edit_config(copy, **{key: value})
        for out in (frozen, whole):
            code, output = run("evaluate", out, "--max-tokens", "32", "--base-model", copy)
            assert code == 2 and "has another config.json than the one" in output, output
            assert shown in output and len(output.strip().splitlines()) == 1, output
            with pytest.raises(BaseMismatchError, match="restore its config.json"):
                load_run(out, base_model=str(copy))
    same = shutil.copytree(base, root / "cfg-same")
    edit_config(same, use_cache=False, transformers_version="0.0.1")
    for out in (frozen, whole):
        code, output = run("evaluate", out, "--max-tokens", "32", "--base-model", same)
        assert code == 0 and "test ppl" in output, output
    code, output = run("train", "lm", "-o", whole, "--resume", "--no-progress",
                       "--base-model", root / "cfg-hidden_act")  # fmt: skip
    assert code == 2 and "hidden_act: 'silu' -> 'gelu'" in output, output


def test_base_model_needs_a_run_with_a_base():
    with pytest.raises(CheckpointError, match="no pretrained base"):
        relocate({"model_config": {"vocab_size": 8}}, "elsewhere", "runs/lm-infty")
    assert relocate({"model_config": {"vocab_size": 8}}, None, "runs/lm-infty") is None


def test_checkpoints_holding_the_whole_base_still_load(setup):
    """Frozen-base runs saved before references existed hold every weight and no reference:
    they load, evaluate, resume (the continuation saves a reference) as before."""
    base, corpus, root = setup
    new_style, old_style = root / "new-style", root / "old-style"
    train(base, corpus, new_style, "--set", "halt_after=2")
    shutil.copytree(new_style, old_style)
    model = build_model(load_run(new_style).model_config)
    base_tensors = {f"model/{k}": v for k, v in model.state_dict().items()
                    if k.startswith("lm.base.")}  # fmt: skip
    for name in ("last", "best"):
        ckpt = load_checkpoint(new_style / name)
        meta = {k: v for k, v in ckpt.meta.items() if k != "base"}
        save_checkpoint(old_style, name, {**ckpt.tensors, **base_tensors}, meta)
    assert "base" not in load_checkpoint(old_style / "last").meta
    a, b = load_run(new_style).model, load_run(old_style).model
    ids = torch.randint(0, 100, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(a(ids).logits, b(ids).logits)
    code, output = run("evaluate", old_style, "--max-tokens", "32")
    assert code == 0 and "test ppl" in output, output
    for out in (old_style, new_style):
        code, output = run("train", "lm", "-o", out, "--resume", "--no-progress",
                           "--set", "halt_after=0")  # fmt: skip
        assert code == 0 and "resumed" in output, output
    assert losses(old_style) == losses(new_style) and len(losses(old_style)) == 4
    assert "base" in load_checkpoint(old_style / "last").meta


def test_a_run_given_a_relative_base_loads_from_another_directory(setup, monkeypatch):
    """The reference records the base's absolute folder: a run trained with a relative
    --base-model evaluates from anywhere."""
    base, corpus, root = setup
    shutil.copytree(base, root / "models" / "tiny")
    monkeypatch.chdir(root)
    train("models/tiny", corpus, root / "relative", "--set", "halt_after=2")
    assert load_checkpoint(root / "relative" / "last").meta["model_config"]["base_model"] == (
        "models/tiny"
    )
    monkeypatch.chdir(corpus)
    saved = load_run(root / "relative")
    assert saved.model_config.base_model == str((root / "models" / "tiny").resolve())
    assert saved.task_config.tokenizer == saved.model_config.base_model
