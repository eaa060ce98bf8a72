"""The pretrained adapter validates its settings like the native config: the same checks (types,
finiteness, ranges) whether the settings come from `add_long_term_memory`, from
`InftyformerConfig` or from a saved model's config.json; strings such as 'false' are refused,
never read as truthy."""

import json
import math

import pytest
from tiny_hf import MEMORY, tiny_base
from transformers import AutoModelForCausalLM

from inftyformer import ModelConfig
from inftyformer.hf import add_long_term_memory

BAD = [
    ("kl_weight", math.inf),
    ("kl_weight", math.nan),
    ("kl_weight", -1.0),
    ("kl_weight", "1"),
    ("sticky", "false"),
    ("sticky", 1),
    ("conv_gate", "no"),
    ("edge_padding", 2),
    ("edge_padding", None),
    ("widths", ["0.005", "0.01"]),
    ("widths", [True, 0.01]),
    ("widths", "0.01"),
    ("tau", "0.5"),
    ("tau", 1.0),
    ("ridge_lambda", math.inf),
    ("ridge_lambda", 0.0),
    ("num_samples", 16.0),
    ("num_basis", "16"),
    ("sigma_0", math.nan),
    ("sigma_0", 1e300),  # finite, but overflows float32 in the densities
    ("min_sigma_sq", 1e300),
    ("min_sigma_sq", -1e-4),
    ("sticky_bins", 0),
    ("segment_len", True),
    ("segment_len", 8.0),
    ("num_heads", "4"),
]


def _ids(case):
    return f"{case[0]}={case[1]!r}"


@pytest.mark.parametrize("name, value", BAD, ids=[_ids(c) for c in BAD])
def test_add_long_term_memory_refuses_bad_settings_by_name(name, value):
    settings = {**MEMORY, name: value}
    with pytest.raises((TypeError, ValueError), match=name):
        add_long_term_memory(tiny_base("gpt2"), **settings)


NATIVE = [c for c in BAD if c[0] != "min_sigma_sq"]  # not a setting of the native model


@pytest.mark.parametrize("name, value", NATIVE, ids=[_ids(c) for c in NATIVE])
def test_the_native_config_refuses_the_same_settings(name, value):
    name = {"num_heads": "n_heads"}.get(name, name)
    with pytest.raises((TypeError, ValueError), match=name):
        ModelConfig(
            vocab_size=13, d_model=32, n_heads=2, num_basis=16, num_samples=16, **{name: value}
        )


@pytest.mark.parametrize(
    "name, value",
    [c for c in BAD if c[0] not in ("num_heads",)],
    ids=[_ids(c) for c in BAD if c[0] not in ("num_heads",)],
)
def test_a_saved_models_config_json_is_checked_the_same_way(name, value, tmp_path):
    add_long_term_memory(tiny_base("gpt2"), **MEMORY).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config[name] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises((TypeError, ValueError), match=name):
        AutoModelForCausalLM.from_pretrained(tmp_path)


def test_valid_settings_still_load(tmp_path):
    model = add_long_term_memory(tiny_base("llama"), **MEMORY, sticky=True, conv_gate=False)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.adapter.sticky is True and loaded.config.adapter.conv_gate is False
    assert loaded.config.adapter.widths == (0.005, 0.01)


def test_a_memory_carries_its_base_and_another_base_refuses_it(tmp_path):
    import torch

    from inftyformer import MemoryState, load_state, save_state

    gpt2 = add_long_term_memory(tiny_base("gpt2"), **MEMORY).eval()
    llama = add_long_term_memory(tiny_base("llama"), **MEMORY).eval()  # the same shapes
    ids = torch.randint(0, 61, (2, 8))
    with torch.no_grad():
        memory = llama(ids).state
        assert memory.source == llama.state_source != gpt2.state_source
        with pytest.raises(ValueError, match="state was made by pretrained LlamaForCausalLM"):
            gpt2(ids, state=memory)
        save_state(tmp_path / "memory.safetensors", memory)
        loaded = load_state(tmp_path / "memory.safetensors")
        assert loaded.source == llama.state_source
        with pytest.raises(ValueError, match="state was made by"):
            gpt2(ids, state=loaded)
        # its own model reads it, after every operation that keeps a state
        reset = memory.reset(torch.tensor([True, False]))
        kept_states = (loaded, memory.detach(), memory.to("cpu"), memory.repeat_rows(1), reset)
        for kept in (*kept_states, llama.consolidate(memory)):
            assert kept.source == llama.state_source
            llama(ids, state=kept)
        # a state without provenance (built by hand) is checked by its contents only
        gpt2(ids, state=MemoryState.from_tensors(memory.tensors(), len(memory.layers)))


def test_a_pretrained_memory_is_checked_like_a_native_state():
    import torch

    from inftyformer import MemoryState

    model = add_long_term_memory(tiny_base("gpt2"), **MEMORY).eval()
    ids = torch.randint(0, 61, (1, 8))
    with torch.no_grad():
        memory = model(ids).state
        tensors = memory.tensors()
        huge = dict(tensors)
        huge["layers.0.long_term.coefficients"] = torch.full_like(
            tensors["layers.0.long_term.coefficients"], 1e20
        )  # finite, beyond what a model's memory holds: NaN logits downstream
        with pytest.raises(ValueError, match="coefficients"):
            model(ids, state=MemoryState.from_tensors(huge, 2, memory.source))
        long = dict(tensors)
        for i in range(2):  # more waiting states than one call of the base can leave
            long[f"layers.{i}.short_term.memory"] = torch.zeros(1, 65, 32)
            long[f"layers.{i}.short_term.length"] = torch.tensor([65])
        with pytest.raises(ValueError, match="short_term"):
            model(ids, state=MemoryState.from_tensors(long, 2, memory.source))


def test_from_pretrained_refuses_weights_that_do_not_fit(tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    model = add_long_term_memory(tiny_base("gpt2"), **MEMORY)
    model.save_pretrained(tmp_path / "ok")
    loaded, info = AutoModelForCausalLM.from_pretrained(tmp_path / "ok", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]

    # the memory's weights missing from the file: refused, not re-initialised
    model.save_pretrained(tmp_path / "no-memory")
    weights = load_file(tmp_path / "no-memory" / "model.safetensors")
    kept = {k: v for k, v in weights.items() if not k.startswith("long_term.1.")}
    save_file(kept, tmp_path / "no-memory" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing \(they would be initialised at random\)"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "no-memory")

    # the layer count in config.json changed: raised → missing, lowered → unexpected weights
    for layers, pattern in ((3, "missing"), (1, "unexpected")):
        folder = tmp_path / f"layers{layers}"
        model.save_pretrained(folder)
        config = json.loads((folder / "config.json").read_text())
        config["text_config"]["n_layer"] = layers
        (folder / "config.json").write_text(json.dumps(config))
        with pytest.raises(ValueError, match=f"do not fit .*{pattern}"):
            AutoModelForCausalLM.from_pretrained(folder)
    assert torch.equal(loaded.long_term[0].attention.mu_head.weight,
                       model.long_term[0].attention.mu_head.weight)  # fmt: skip


def test_labels_on_a_one_token_input_score_nothing():
    import torch

    model = add_long_term_memory(tiny_base("gpt2"), **MEMORY)
    ids = torch.randint(0, 61, (2, 1))
    out = model(ids, labels=ids)  # the shift leaves no position to predict
    assert out.token_loss.shape == (2, 0) and float(out.lm_loss.detach()) == 0.0
    assert torch.isfinite(out.loss)
