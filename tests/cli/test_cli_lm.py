"""`inftyformer train lm` / `inftyformer evaluate` end to end on a tiny corpus, and clear errors."""

import json
import math
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inftyformer.cli import app
from inftyformer.native.model_config import ModelConfig
from inftyformer.tasks import LanguageModelTask, LMConfig, RunContext
from inftyformer.training import read_metrics

runner = CliRunner()

TINY = [
    "--model", "infty", "--tokenizer", "bytes", "--steps", "6", "--batch-size", "2",
    "--eval-every", "3", "--no-progress", "--threads", "1",
    "--set", "d_model=16", "--set", "n_layers=1", "--set", "n_heads=2", "--set", "d_ff=32",
    "--set", "segment_len=16", "--set", "mem_len=16", "--set", "num_basis=8",
    "--set", "num_samples=16", "--set", "dropout=0", "--set", "warmup_steps=2",
    "--set", "eval_batches=2", "--set", "log_every=1", "--set", "tensorboard=false",
]  # fmt: skip


def write_corpus(root: Path, docs_per_split=(3, 2, 2), seed=0) -> Path:
    rng = random.Random(seed)
    words = "the of memory book long short continuous said and ∞ é".split()
    for split, n in zip(("train", "valid", "test"), docs_per_split, strict=True):
        (root / split).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(20, 80)))
            (root / split / f"{i}.txt").write_text(text + "\n", encoding="utf-8")
    return root


@pytest.fixture()
def corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("INFTYFORMER_CACHE", str(tmp_path / "cache"))
    return write_corpus(tmp_path / "corpus")


def run(*args):
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def train_rows(out: Path) -> list[tuple[int, str, float]]:
    return [
        (r["step"], r["metric"], r["value"])
        for r in read_metrics(out)
        if r["split"] == "train" and r["metric"] == "loss"
    ]


@pytest.mark.slow
def test_train_lm_then_resume_matches_an_uninterrupted_run(corpus, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    code, out = run("train", "lm", "--data-dir", corpus, "-o", full, *TINY)
    assert code == 0, out
    assert "test ppl" in out
    results = json.loads((full / "results.json").read_text())
    assert results["metric"] == "ppl" and results["test"]["ppl"] > 1
    test_bytes = sum(len(p.read_bytes()) for p in (corpus / "test").glob("*.txt"))
    assert results["test"]["tokens"] == test_bytes  # bytes tokenizer: every byte scored once

    code, out = run("train", "lm", "--data-dir", corpus, "-o", part, *TINY, "--set", "halt_after=4")
    assert code == 0, out
    code, out = run("train", "lm", "-o", part, "--resume", "--no-progress", "--set", "halt_after=0")
    assert code == 0, out
    assert "resumed" in out
    assert train_rows(part) == train_rows(full)

    code, out = run("evaluate", full, "--json", tmp_path / "eval.json")
    assert code == 0, out
    assert "bpb" in out
    saved = json.loads((tmp_path / "eval.json").read_text())
    details = saved["details"]
    assert details["num_tokens"] == saved["metrics"]["tokens"] == test_bytes
    assert details["perplexity"] == pytest.approx(math.exp(details["loss"]))
    assert saved["metrics"]["ppl"] == pytest.approx(results["test"]["ppl"], rel=1e-6)
    assert sum(details["position"]["count"]) == test_bytes

    # a longer evaluation memory: same weights, more context
    code, out = run("evaluate", full, "--set", "mem_len=48", "--set", "num_samples=32")
    assert code == 0, out
    assert "mem_len=48" in out
    code, out = run("evaluate", full, "--set", "num_basis=16")
    assert code != 0 and "num_basis" in out


def test_missing_data_dir_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("INFTYFORMER_CACHE", str(tmp_path / "cache"))
    code, out = run("train", "lm", "--data-dir", tmp_path / "nope", "-o", tmp_path / "r", *TINY)
    assert code != 0
    assert "not found" in out and "nope" in out
    assert not (tmp_path / "r").exists()


def test_empty_data_dir_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("INFTYFORMER_CACHE", str(tmp_path / "cache"))
    (tmp_path / "empty").mkdir()
    code, out = run("train", "lm", "--data-dir", tmp_path / "empty", "-o", tmp_path / "r", *TINY)
    assert code != 0 and "no .txt files in" in out and "empty" in out
    for split in ("train", "valid", "test"):
        (tmp_path / "empty" / split).mkdir()
    code, out = run("train", "lm", "--data-dir", tmp_path / "empty", "-o", tmp_path / "r", *TINY)
    assert code != 0 and "no .txt files" in out


def test_non_utf8_file_is_a_clear_error(corpus, tmp_path):
    (corpus / "train" / "bad.txt").write_bytes(b"caf\xe9 latin-1 text\n")
    code, out = run("train", "lm", "--data-dir", corpus, "-o", tmp_path / "r", *TINY)
    assert code != 0
    assert "bad.txt" in out and "UTF-8" in out


def test_missing_tokenizer_file_is_a_clear_error(corpus, tmp_path):
    args = [a if a != "bytes" else str(tmp_path / "missing.json") for a in TINY]
    code, out = run("train", "lm", "--data-dir", corpus, "-o", tmp_path / "r", *args)
    assert code != 0 and "missing.json" in out and "tokenizer.json file" in out


def test_gpt2_tokenizer_not_found_names_the_places_tried(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("INFTYFORMER_DATA", str(tmp_path / "no-shared-data"))
    args = [a if a != "bytes" else "gpt2" for a in TINY]
    code, out = run("train", "lm", "--data-dir", corpus, "-o", tmp_path / "r", *args)
    assert code != 0 and "GPT-2 tokenizer file not found" in out


@pytest.mark.slow
def test_evaluate_on_a_wikitext_directory(corpus, tmp_path):
    out_dir = tmp_path / "run"
    code, out = run(
        "train", "lm", "--data-dir", corpus, "-o", out_dir, *TINY, "--set", "test_batches=0"
    )
    assert code == 0, out
    wiki = tmp_path / "wiki"
    wiki.mkdir()
    text = " = Alpha = \n first article text \n = = Part = = \n more \n = Beta = \n second one \n"
    (wiki / "wiki.test.tokens").write_text(text, encoding="utf-8")
    code, out = run("evaluate", out_dir, "--data-dir", wiki, "--json", tmp_path / "w.json")
    assert code == 0, out
    details = json.loads((tmp_path / "w.json").read_text())["details"]
    assert details["num_docs"] == 2
    assert details["num_bytes"] == details["num_tokens"] == len(text.encode("utf-8"))


def test_pg19_mini_loads_with_the_shared_tokenizer(shared_data):
    config = LMConfig(data_dir=str(shared_data), tokenizer="gpt2")
    assert LanguageModelTask.model_overrides(config) == {"vocab_size": 50257}
    model_cfg = ModelConfig.preset("cpu-small", vocab_size=50257)
    task = LanguageModelTask(config, model_cfg, RunContext(batch_size=2, seed=0))
    assert task.tokenizer.vocab_size == 50257
    assert task.split("test").num_docs == 3
    assert task.split("test").total_bytes == 1_283_952


def test_inspection_stream_is_the_start_of_a_long_enough_document(corpus):
    config = LMConfig(data_dir=str(corpus), tokenizer="bytes")
    model = ModelConfig(vocab_size=257, d_model=16, n_layers=1, n_heads=2, segment_len=8)
    task = LanguageModelTask(config, model, RunContext(batch_size=1, seed=0))
    docs = [(corpus / "test" / f"{i}.txt").read_bytes() for i in range(2)]
    stream = task.inspection_stream("test", 30)
    first = next(d for d in docs if len(d) + 1 >= 30)  # +1: the beginning-of-document id
    assert stream.tolist() == [task.tokenizer.eos_id] + list(first[:29])
    longest = max(docs, key=len)
    assert stream.new_tensor(list(longest)).equal(task.inspection_stream("test", 10**6)[1:])


def test_an_empty_test_split_is_refused_before_training(corpus, tmp_path):
    for f in (corpus / "test").glob("*.txt"):
        f.write_text("")  # the test split holds no text
    code, out = run("train", "lm", "--data-dir", corpus, "-o", tmp_path / "r", *TINY)
    assert code != 0 and "test split" in out and "holds no text" in out
    assert "step 3" not in out  # not a single step was trained (nor evaluated)
    assert not (tmp_path / "r" / "last").exists()


def test_resume_refuses_training_data_whose_contents_changed(corpus, tmp_path):
    part = tmp_path / "part"
    code, out = run("train", "lm", "--data-dir", corpus, "-o", part, *TINY, "--set", "halt_after=3")
    assert code == 0, out
    first = sorted((corpus / "train").glob("*.txt"))[0]
    text = first.read_text()
    first.write_text(text.replace("the", "THE"))  # same files, same count, other contents
    resume = ["train", "lm", "-o", part, "--resume", "--no-progress", "--set", "halt_after=0"]
    code, out = run(*resume)
    assert code == 2 and "contents of the train data changed since step 3" in out, out
    code, out = run(*resume, "--allow-changes")  # accepted when asked, and recorded
    assert code == 0 and "note: the train data changed since step 3" in out, out
    meta = json.loads((part / "last.json").read_text())
    assert any("data.train" in entry["changes"] for entry in meta["history"])
    first.write_text(text)  # the original text: the recorded fingerprint moved with the run
    code, out = run(*resume)
    assert code == 2 and "contents of the train data changed" in out


def test_resume_with_unchanged_data_is_accepted(corpus, tmp_path):
    part = tmp_path / "part"
    code, out = run("train", "lm", "--data-dir", corpus, "-o", part, *TINY, "--set", "halt_after=3")
    assert code == 0, out
    for f in (corpus / "valid").glob("*.txt"):  # rewritten with the same bytes: the same data
        f.write_bytes(f.read_bytes())
    code, out = run("train", "lm", "-o", part, "--resume", "--no-progress", "--set", "halt_after=0")
    assert code == 0 and "resumed" in out, out
