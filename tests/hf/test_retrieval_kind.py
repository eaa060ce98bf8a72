"""The retrieval as a model kind: its generate is the model contract's (greedy equal to the
base's own while the window holds the stream; end ids stop it), its call gives the loss, and the
command line takes it by preset (`generate --base-model DIR`) and refuses to train it."""

from __future__ import annotations

import pytest
import torch
from tiny_pretrained import write_tiny_model
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from inftyformer.cli import app
from inftyformer.native.model import token_losses
from inftyformer.retrieval import RetrievalLM

POSITIONS = 4096  # room for the default preset's context and a segment


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("base"), max_positions=POSITIONS)


def base_of(folder):
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


@torch.no_grad()
def test_greedy_generation_is_the_bases_own_while_the_window_holds_the_stream(folder):
    ids = torch.randint(1, 250, (2, 300), generator=torch.Generator().manual_seed(0))
    model = RetrievalLM(base_of(folder)).eval()  # the default preset: 960 tokens of window
    new, state = model.generate(ids, 8, temperature=0)
    own = base_of(folder).generate(ids, max_new_tokens=8, do_sample=False, min_new_tokens=8)
    assert torch.equal(new, own[:, 300:])
    assert int(state.tokens[0]) == 308  # the prompt and every new token read


@torch.no_grad()
def test_end_ids_stop_generation_and_pad_the_rows_that_ended(folder):
    ids = torch.randint(1, 250, (2, 40), generator=torch.Generator().manual_seed(1))
    model = RetrievalLM(base_of(folder)).eval()
    free, _ = model.generate(ids, 6, temperature=0)
    end = int(free[0, 2])  # row 0 writes it third
    new, state = model.generate(ids, 6, temperature=0, end_ids=[end])
    assert new[0].tolist()[:3] == free[0].tolist()[:3] and set(new[0, 3:].tolist()) <= {end}
    hit = [i for i, t in enumerate(free[1].tolist()) if t == end]
    assert new.shape[1] == (6 if not hit else max(3, hit[0] + 1))
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        model.generate(ids, -1)
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="temperature"):
            model.generate(ids, 2, temperature=bad)
    none, _ = model.generate(ids, 0)
    assert none.shape == (2, 0)


@torch.no_grad()
def test_the_call_gives_the_contracts_loss(folder):
    ids = torch.randint(1, 250, (2, 100), generator=torch.Generator().manual_seed(2))
    targets = ids.roll(-1, 1)
    targets[:, -1] = -100
    model = RetrievalLM(base_of(folder), preset="streaming", window=32, block_size=16).eval()
    out = model(ids, targets=targets)
    token_loss, lm_loss = token_losses(out.logits, targets)
    torch.testing.assert_close(out.loss, lm_loss)
    assert torch.equal(out.token_loss, token_loss) and out.logits.shape[1] == 100
    with pytest.raises(ValueError, match="must match input_ids"):
        model(ids, targets=targets[:, :5])
    with pytest.raises(ValueError, match="training-free"):
        model.param_groups(1e-3, 0.0)


def test_the_command_line_generates_with_the_retrieval_and_refuses_to_train_it(folder, tmp_path):
    text = "the memory of a long book, said the signal. " * 40
    (tmp_path / "prompt.txt").write_text(text)
    runner = CliRunner()
    result = runner.invoke(app, ["generate", "--base-model", str(folder), "--prompt-file",
                                 str(tmp_path / "prompt.txt"), "--temperature", "0",
                                 "--max-new-tokens", "5"])  # fmt: skip
    assert result.exit_code == 0, result.output
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    ids = torch.tensor([tokenizer(text).input_ids])
    with torch.no_grad():
        new, _ = RetrievalLM(base_of(folder)).eval().generate(ids, 5, temperature=0)
    assert "read with preset retrieval" in result.output
    assert f"output:   {tokenizer.decode(new[0].tolist())}" in result.output
    result = runner.invoke(app, ["generate", "--base-model", str(folder), "--preset", "paper"])
    assert result.exit_code != 0 and "unknown retrieval preset 'paper'" in result.output
    result = runner.invoke(app, ["train", "lm", "--base-model", str(folder), "--preset",
                                 "retrieval", "--out-dir", str(tmp_path / "run")])  # fmt: skip
    assert result.exit_code != 0 and "training-free" in result.output
    assert not (tmp_path / "run").exists()


def test_evaluate_scores_text_read_by_the_retrieval_as_the_base_does_within_its_window(
    folder, tmp_path
):
    """`inftyformer evaluate --base-model DIR --data-dir TEXT`: each document after the
    end-of-text token, every token scored once; while the default preset's window holds a
    document, the loss is the base's own on the whole document."""
    import json
    import math

    from inftyformer.data.tokenizer import BPETokenizer

    texts = ["the memory of a long book, said the signal. " * 12, "a short one. " * 9]
    for i, text in enumerate(texts):
        (tmp_path / f"doc{i}.txt").write_text(text)
    out = tmp_path / "scores.json"
    result = CliRunner().invoke(app, ["evaluate", "--base-model", str(folder), "--data-dir",
                                      str(tmp_path), "--json", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    metrics = json.loads(out.read_text())["metrics"]
    tokenizer, base, nll, count = BPETokenizer.from_directory(folder), base_of(folder), 0.0, 0
    for text in texts:
        ids = torch.tensor([[tokenizer.eos_id, *tokenizer.encode(text)]])
        with torch.no_grad():
            logits = base(ids).logits[:, :-1]
        nll += float(torch.nn.functional.cross_entropy(logits[0], ids[0, 1:], reduction="sum"))
        count += ids.shape[1] - 1
    assert metrics["tokens"] == count and metrics["documents"] == 2
    assert math.isclose(metrics["loss"], nll / count, rel_tol=1e-4)
    # --max-docs 1 --max-tokens 20: the first document's end-of-text and first 20 tokens
    result = CliRunner().invoke(app, ["evaluate", "--base-model", str(folder), "--data-dir",
                                      str(tmp_path), "--json", str(out), "--max-docs", "1",
                                      "--max-tokens", "20"])  # fmt: skip
    assert result.exit_code == 0, result.output
    cut = json.loads(out.read_text())["metrics"]
    ids = torch.tensor([[tokenizer.eos_id, *tokenizer.encode(texts[0])[:20]]])
    with torch.no_grad():
        logits = base(ids).logits[:, :-1]
    want = float(torch.nn.functional.cross_entropy(logits[0], ids[0, 1:]))
    assert cut["tokens"] == 20 and cut["documents"] == 1
    assert math.isclose(cut["loss"], want, rel_tol=1e-4)
    bad = CliRunner().invoke(app, ["evaluate", "--base-model", str(folder)])
    assert bad.exit_code != 0 and "--data-dir TEXT" in bad.output
