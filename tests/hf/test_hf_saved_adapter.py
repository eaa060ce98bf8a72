"""`save_pretrained(dir, adapter_only=True)`: an adapter folder (config, the memory's weights, the
base's folder and weights hash) that loads on top of its base with identical logits, follows the
base to a new folder, and refuses a base with other weights or a base that trained."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from tiny_hf import MEMORY, V, tiny_base
from transformers import AutoModelForCausalLM

from inftyformer.base_weights import BaseMismatchError, weights_hash
from inftyformer.hf import InftyformerForCausalLM, add_long_term_memory


def memory_model_on_disk_base(tmp_path, arch):
    """A base saved to a folder and loaded from it, with an active memory (nonzero read)."""
    folder = tmp_path / "base"
    tiny_base(arch).save_pretrained(folder)
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model = add_long_term_memory(base, **MEMORY).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in model.long_term:
            for p in layer.attention.out.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
    return model, folder


def two_segments(model, ids):
    with torch.no_grad():
        first = model(ids[:, :8])
        second = model(ids[:, 8:16], state=first.state)
    return torch.cat([first.logits, second.logits], 1)


def test_an_adapter_folder_loads_on_its_base_with_the_same_logits(tmp_path, arch):
    model, folder = memory_model_on_disk_base(tmp_path, arch)
    ids = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(0))
    expected = two_segments(model, ids)
    out = tmp_path / "adapter"
    model.save_pretrained(out, adapter_only=True)
    assert sorted(p.name for p in out.iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors", "config.json",
        "inftyformer_auto.py"]  # fmt: skip
    info = json.loads((out / "adapter_config.json").read_text())
    assert info["base_model_name_or_path"] == str(folder.resolve())
    assert info["base_model_sha256"] == weights_hash(folder)
    saved = load_file(out / "adapter_model.safetensors")
    assert saved and all(k.startswith("long_term.") for k in saved)  # no base weight
    for loaded in (
        InftyformerForCausalLM.from_pretrained(out),
        AutoModelForCausalLM.from_pretrained(out),
    ):
        assert isinstance(loaded, InftyformerForCausalLM) and not loaded.training
        assert torch.equal(two_segments(loaded, ids), expected)
    # the whole model still saves as before
    model.save_pretrained(tmp_path / "whole")
    assert not (tmp_path / "whole" / "adapter_config.json").exists()
    whole = InftyformerForCausalLM.from_pretrained(tmp_path / "whole")
    assert torch.equal(two_segments(whole.eval(), ids), expected)


def test_an_adapter_follows_its_base_and_refuses_another(tmp_path):
    model, folder = memory_model_on_disk_base(tmp_path, "llama")
    ids = torch.randint(0, V, (1, 16), generator=torch.Generator().manual_seed(0))
    expected = two_segments(model, ids)
    out = tmp_path / "adapter"
    model.save_pretrained(out, adapter_only=True)
    moved = tmp_path / "elsewhere"
    shutil.move(folder, moved)
    with pytest.raises(ValueError, match="is not there .* pass base_model=DIR"):
        InftyformerForCausalLM.from_pretrained(out)
    loaded = InftyformerForCausalLM.from_pretrained(out, base_model=moved)
    assert torch.equal(two_segments(loaded, ids), expected)
    # another base of the same shapes: refused, both named
    other = tmp_path / "other"
    tiny_base("llama", seed=5).save_pretrained(other)
    with pytest.raises(BaseMismatchError, match=f"{other}.*{folder}.*point base_model="):
        InftyformerForCausalLM.from_pretrained(out, base_model=other)


def test_a_trained_base_is_not_saved_as_an_adapter(tmp_path):
    model, folder = memory_model_on_disk_base(tmp_path, "gpt2")
    with pytest.raises(ValueError, match="base weights differ .* save the whole model"):
        with torch.no_grad():
            next(model.base.parameters()).add_(1e-3)
        model.save_pretrained(tmp_path / "adapter", adapter_only=True)
    built = add_long_term_memory(tiny_base("gpt2"), **MEMORY)  # not loaded from a folder
    with pytest.raises(ValueError, match="needs the base model's folder .* base_model=DIR"):
        built.save_pretrained(tmp_path / "adapter", adapter_only=True)
    assert not (tmp_path / "adapter").exists()


def _nudge_memory(model, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.long_term.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.1)


def test_a_folder_loads_what_was_saved_last_whatever_was_there(tmp_path):
    """A whole save over an adapter folder left the adapter's files, and from_pretrained loaded
    the stale adapter without a word; an adapter save over a whole save left the whole
    model's weights. Each save now removes the other kind's files: the folder loads exactly
    the last save, in either order."""
    model, _ = memory_model_on_disk_base(tmp_path, "llama")
    ids = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(0))
    out = tmp_path / "saved"
    model.save_pretrained(out, adapter_only=True)
    _nudge_memory(model, 7)  # the model trained on: another memory
    expected = two_segments(model, ids)
    model.save_pretrained(out)  # whole, over the adapter folder
    assert not (out / "adapter_config.json").exists()
    assert not (out / "adapter_model.safetensors").exists()
    assert torch.equal(two_segments(InftyformerForCausalLM.from_pretrained(out), ids), expected)
    _nudge_memory(model, 8)
    expected = two_segments(model, ids)
    model.save_pretrained(out, adapter_only=True)  # an adapter, over the whole save
    assert not [p.name for p in out.iterdir() if p.name.startswith("model")]
    assert torch.equal(two_segments(InftyformerForCausalLM.from_pretrained(out), ids), expected)


def test_a_save_into_another_models_folder_is_refused(tmp_path):
    """An adapter_only save into the base's own folder overwrote the base's config.json (the
    base then failed to load with a RecursionError): a save of either kind into a folder of
    another model is refused, and the folder is left as it was."""
    model, folder = memory_model_on_disk_base(tmp_path, "gpt2")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    for adapter_only in (True, False):
        with pytest.raises(ValueError, match="holds another model .*'gpt2'.* another folder"):
            model.save_pretrained(folder, adapter_only=adapter_only)
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    AutoModelForCausalLM.from_pretrained(folder)  # the base still loads


def test_an_adapter_folder_mixing_two_saves_is_refused(tmp_path):
    """adapter_config.json lists the sha256 of the files saved with it: a folder whose adapter
    weights (or config) come from another save, as a save cut short would leave, is refused
    instead of read with the wrong weights."""
    model, _ = memory_model_on_disk_base(tmp_path, "llama")
    first, second = tmp_path / "first", tmp_path / "second"
    model.save_pretrained(first, adapter_only=True)
    _nudge_memory(model, 9)
    model.save_pretrained(second, adapter_only=True)
    shutil.copy(first / "adapter_model.safetensors", second / "adapter_model.safetensors")
    with pytest.raises(ValueError, match="mixes two saves: its adapter_model.safetensors"):
        InftyformerForCausalLM.from_pretrained(second)
    (second / "adapter_model.safetensors").unlink()
    with pytest.raises(ValueError, match="mixes two saves: .*missing"):
        InftyformerForCausalLM.from_pretrained(second)


def test_an_adapter_refuses_a_base_whose_config_computes_otherwise(tmp_path):
    """The base's weights hash alone let a base with another rope_theta load silently, with
    other logits: the adapter records what the base's config.json computes and refuses a
    base whose config differs there, naming the entry; file metadata may change."""
    import json

    model, folder = memory_model_on_disk_base(tmp_path, "llama")
    ids = torch.randint(0, V, (1, 16), generator=torch.Generator().manual_seed(0))
    expected = two_segments(model, ids)
    out = tmp_path / "adapter"
    model.save_pretrained(out, adapter_only=True)
    path = folder / "config.json"
    original = json.loads(path.read_text())
    for change, shown in (
        ({"rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}}, "rope_theta"),
        ({"rms_norm_eps": 1e-3}, "rms_norm_eps: 1e-06 -> 0.001"),
    ):
        path.write_text(json.dumps({**original, **change}))
        with pytest.raises(BaseMismatchError, match=f"another config.json .*{shown}"):
            InftyformerForCausalLM.from_pretrained(out)
    path.write_text(json.dumps({**original, "use_cache": False, "transformers_version": "x"}))
    assert torch.equal(two_segments(InftyformerForCausalLM.from_pretrained(out), ids), expected)


def test_a_whole_save_whose_config_moves_a_memory_is_refused(tmp_path):
    """config.json of a whole save edited to place the memories in other blocks loaded the
    saved weights there without a word (logits off by 0.54): the save records the blocks its
    memories' weights belong to, and a config that moves them is refused by name."""
    import json

    base = tiny_base("llama")
    model = add_long_term_memory(base, **MEMORY, memory_layers=(0,)).eval()
    out = tmp_path / "whole"
    model.save_pretrained(out)
    assert InftyformerForCausalLM.from_pretrained(out).memory_blocks == [0]
    config = json.loads((out / "config.json").read_text())
    config["adapter"]["memory_layers"] = [1]
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"places the memories in blocks \[1\].*saved for"):
        InftyformerForCausalLM.from_pretrained(out)
