"""lm-evaluation-harness on a saved memory model (`inftyformer.integrations.harness`,
`docs/hf.md`): the
`lm_eval` command the harness module prints, run as written in a fresh process (offline, the
model found through its folder's loader module, nothing of inftyformer imported first), reports
the word perplexity, byte perplexity and bits per byte of the library's own whole-document
evaluation (`evaluate_lm`) of the same text, document by document; and that figure is the
memory's: documents longer than the base's positions reach the model whole and are streamed in
segments, and the same model with its memory reads off scores them otherwise.

Needs the extra `inftyformer[eval]` (lm-eval 0.4.x); CI installs it."""

import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch
from tiny_pretrained import write_tiny_model

from inftyformer.data.corpus import load_split
from inftyformer.data.tokenizer import BPETokenizer
from inftyformer.hf.pretrained_lm import PretrainedMemoryLM
from inftyformer.integrations import harness
from inftyformer.integrations.lm_eval import LMEvalConfig, evaluate_lm
from inftyformer.model_kinds import PretrainedMemoryConfig

pytest.importorskip("lm_eval")

POSITIONS = 64  # the base's; every document is longer, so lm_eval's call must be streamed
WORDS = "the memory of a long book said the signal and a reader".split()


def documents() -> list[str]:
    generator = torch.Generator().manual_seed(0)
    texts = []
    for n in (120, 180, 90):  # words: about 1.5 to 3 times the base's positions in tokens
        picks = torch.randint(0, len(WORDS), (n,), generator=generator).tolist()
        line = " ".join(WORDS[i] for i in picks)
        texts.append(f"Chapter {n}.\n\n{line[:200]},\n{line[200:]}.\n")
    return texts


def memory_model(base_dir, active: bool) -> PretrainedMemoryLM:
    config = PretrainedMemoryConfig(
        base_model=str(base_dir), segment_len=8, num_basis=16, num_samples=16
    )
    model = PretrainedMemoryLM(config).eval()
    if active:  # the read's output projection starts at zero: make the memory change logits
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for layer in model.lm.long_term:
                w = layer.attention.out.weight
                w.copy_(torch.randn(w.shape, generator=generator) * 0.3)
    return model


def save(model: PretrainedMemoryLM, base_dir, folder):
    """The memory model and its tokenizer (lm_eval loads both from the folder)."""
    from transformers import PreTrainedTokenizerFast

    model.lm.save_pretrained(folder)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(base_dir / "tokenizer.json"), eos_token="<|endoftext|>"
    )
    tokenizer.save_pretrained(folder)


def run_lm_eval(model_dir, task_dir, out_dir, home) -> tuple[dict, list[float]]:
    """The printed command, in a fresh offline process; (metrics, per-document log-likelihoods
    in document order)."""
    line = harness.command(model_dir, task_dir)
    assert line[0] == "lm_eval"
    cmd = [sys.executable, "-m", "lm_eval", *line[1:], "--output_path", str(out_dir)]
    env = {
        **os.environ,
        "HF_HOME": str(home),  # a fresh cache: datasets, transformers' loader modules
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",  # a tiny model: threads would only wait for each other
    }
    done = subprocess.run(
        [*cmd, "--log_samples"], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(p.read_text()) for p in out_dir.rglob("results_*.json")]
    samples = [p for p in out_dir.rglob(f"samples_{harness.TASK}_*.jsonl")]
    assert len(results) == 1 and len(samples) == 1
    metrics = results[0]["results"][harness.TASK]
    rows = [json.loads(line) for line in samples[0].read_text().splitlines() if line]
    rows.sort(key=lambda row: row["doc_id"])
    return metrics, [float(row["resps"][0][0]) for row in rows]


def test_lm_eval_reports_the_library_s_streamed_perplexity_of_the_memory_model(tmp_path):
    docs_dir = tmp_path / "docs" / "test"
    docs_dir.mkdir(parents=True)
    texts = documents()
    for i, text in enumerate(texts):
        (docs_dir / f"doc{i}.txt").write_text(text, encoding="utf-8")
    base_dir = write_tiny_model(
        tmp_path / "base", "llama", corpus=texts * 4, max_positions=POSITIONS
    )
    model = memory_model(base_dir, active=True)
    save(model, base_dir, tmp_path / "model")
    task = harness.write_task(tmp_path / "task", tmp_path / "docs", "test")
    assert task.name == f"{harness.TASK}.yaml"

    # the library's own evaluation: whole documents streamed in segments of 8, memory carried
    tokenizer = BPETokenizer.from_directory(tmp_path / "model")
    corpus = load_split(tmp_path / "docs", "test", tokenizer)
    assert min(corpus.doc_lengths) > POSITIONS
    ours = evaluate_lm(model, corpus, LMEvalConfig(batch_size=2))
    off = evaluate_lm(memory_model(base_dir, active=False), corpus, LMEvalConfig(batch_size=2))
    # the memory's reads change the NLL by far more than the tolerance of the checks below
    assert abs(off.nll_sum - ours.nll_sum) > 1e-4 * ours.nll_sum

    metrics, loglikelihoods = run_lm_eval(
        tmp_path / "model", tmp_path / "task", tmp_path / "out", tmp_path / "home"
    )
    # document by document: lm_eval's log-likelihood is minus the library's summed NLL
    assert len(loglikelihoods) == len(texts)
    for mine, theirs in zip(ours.doc_nll, loglikelihoods, strict=True):
        assert theirs == pytest.approx(-mine, rel=1e-6)
    words = sum(len(re.split(r"\s+", text)) for text in texts)  # lm_eval's word count
    assert ours.num_bytes == sum(len(text.encode("utf-8")) for text in texts)
    assert metrics["bits_per_byte,none"] == pytest.approx(ours.bits_per_byte, rel=1e-6)
    assert metrics["byte_perplexity,none"] == pytest.approx(2**ours.bits_per_byte, rel=1e-6)
    word_perplexity = math.exp(ours.nll_sum / words)
    assert metrics["word_perplexity,none"] == pytest.approx(word_perplexity, rel=1e-6)
    # and not the figure of the same model without its memory's reads
    assert metrics["bits_per_byte,none"] != pytest.approx(off.bits_per_byte, rel=1e-5)


def test_the_task_lists_the_documents_and_the_command_sets_the_library_s_prefix(tmp_path):
    folder = tmp_path / "docs" / "valid"
    folder.mkdir(parents=True)
    for name in ("b", "a", "c"):
        (folder / f"{name}.txt").write_text(f"text {name}\n", encoding="utf-8")
    path = harness.write_task(tmp_path / "task", tmp_path / "docs", "valid", 2, 100, "mine")
    task = json.loads(path.read_text())  # JSON is YAML
    assert path.name == "mine.yaml" and task["task"] == "mine"
    assert task["dataset_kwargs"]["data_files"] == {
        "valid": [str((folder / n).resolve()) for n in ("a.txt", "b.txt")]
    }
    assert task["test_split"] == "valid" and task["doc_to_target"] == "{{text[:100]}}"
    assert task["output_type"] == "loglikelihood_rolling"
    with pytest.raises(ValueError, match="split"):
        harness.write_task(tmp_path / "task", tmp_path / "docs", "dev")
    with pytest.raises(ValueError, match="max_docs"):
        harness.write_task(tmp_path / "task", tmp_path / "docs", "valid", 0)
    with pytest.raises(FileNotFoundError):
        harness.write_task(tmp_path / "task", tmp_path / "missing", "valid")
    model_dir = write_tiny_model(tmp_path / "model", "llama")
    eos = BPETokenizer.from_directory(model_dir).eos_id
    line = harness.command(model_dir, tmp_path / "task", "mine")
    args = line[line.index("--model_args") + 1]
    assert f"prefix_token_id={eos}," in args and "trust_remote_code=True" in args
    assert line[line.index("--tasks") + 1] == "mine"


def test_the_helper_refuses_inputs_lm_eval_or_the_file_system_would_misread(tmp_path):
    """A model folder whose path holds a comma would inject key=value pairs into the printed
    --model_args (e.g. another `pretrained=`, still with trust_remote_code=True): refused, as
    are quotes, brackets, whitespace and a path lm_eval converts to a number. A task name with
    a path in it would write outside the task folder: refused, nothing written. An ordinary
    folder's arguments read back, by lm_eval's own parsers, as exactly the four arguments."""
    from lm_eval._cli.utils import key_val_to_dict
    from lm_eval.utils import simple_parse_args_string

    folder = tmp_path / "docs" / "test"
    folder.mkdir(parents=True)
    (folder / "a.txt").write_text("text a\n", encoding="utf-8")
    model_dir = write_tiny_model(tmp_path / "models" / "tiny-1.0_x", "llama")
    hostile = tmp_path / "m,pretrained=evil"
    hostile.symlink_to(model_dir)
    for bad in (hostile, tmp_path / "m'q", tmp_path / "m[0]", tmp_path / "m x", "1.5", "true"):
        with pytest.raises(ValueError, match="cannot be passed in lm_eval's --model_args"):
            harness.command(bad, tmp_path / "task")
    line = harness.command(model_dir, tmp_path / "task")
    args = line[line.index("--model_args") + 1]
    eos = BPETokenizer.from_directory(model_dir).eos_id
    expected = {
        "pretrained": str(model_dir),
        "trust_remote_code": True,
        "prefix_token_id": eos,
        "max_length": harness.MAX_LENGTH,
    }
    assert key_val_to_dict(args) == expected and simple_parse_args_string(args) == expected
    task_dir = tmp_path / "tasks" / "here"
    for name in ("../x", str(tmp_path / "abs"), "", ".", "..", "a/b", "-x", ".hidden", "x" * 101):
        with pytest.raises(ValueError, match="the task's name must be"):
            harness.write_task(task_dir, tmp_path / "docs", "test", name=name)
        with pytest.raises(ValueError, match="the task's name must be"):
            harness.command(model_dir, task_dir, name)
    assert not (tmp_path / "tasks").exists() and not (tmp_path / "abs.yaml").exists()
    assert harness.write_task(task_dir, tmp_path / "docs", "test", name="mine-2.v1").is_file()
    with pytest.raises(SystemExit):
        harness.main([str(task_dir), "--data-dir", str(tmp_path / "docs"), "--name", "../up"])
    assert not (tmp_path / "tasks" / "up.yaml").exists()
