"""The embedded default corpus (Jane Austen's novels, `data/austen/`): its files are the ones its
provenance lists, and the text tasks fall back on it, saying so, only when no data is found."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inftyformer.cli import app
from inftyformer.data import ByteTokenizer, load_tokenizer
from inftyformer.data import paths as data_paths
from inftyformer.data.corpus import load_split, text_layout
from inftyformer.data.paths import (
    EMBEDDED_CORPUS,
    EMBEDDED_SOURCE,
    embedded_fallback_note,
    training_source,
)

ROW = re.compile(
    r"^\| (train|valid|test) \| `([^`]+)` \| [^|]+ \| ([\d,]+) \| `([0-9a-f]{64})` \|$"
)


def _listed() -> list[tuple[str, str, int, str]]:
    text = (EMBEDDED_CORPUS / "PROVENANCE.md").read_text(encoding="utf-8")
    rows = [ROW.match(line) for line in text.splitlines()]
    return [(m[1], m[2], int(m[3].replace(",", "")), m[4]) for m in rows if m]


def test_the_files_are_the_ones_the_provenance_lists_and_a_few_mb_in_all():
    listed = _listed()
    assert [split for split, *_ in listed] == ["train"] * 4 + ["valid", "test"]
    on_disk = sorted(
        p.relative_to(EMBEDDED_CORPUS).as_posix() for p in EMBEDDED_CORPUS.rglob("*.txt")
    )
    assert on_disk == sorted(name for _, name, _, _ in listed)
    for split, name, size, digest in listed:
        data = (EMBEDDED_CORPUS / name).read_bytes()
        assert name.startswith(split + "/")
        assert (len(data), hashlib.sha256(data).hexdigest()) == (size, digest), name
        data.decode("utf-8")  # UTF-8, as every corpus
    assert 3e6 < sum(size for _, _, size, _ in listed) < 5e6


def test_the_embedded_source_reads_as_a_corpus():
    assert text_layout(EMBEDDED_SOURCE) == ("corpus", EMBEDDED_CORPUS)
    test = load_split(EMBEDDED_SOURCE, "test", ByteTokenizer())
    assert test.doc_names == ("persuasion",)
    text = (EMBEDDED_CORPUS / "test" / "persuasion.txt").read_bytes()
    assert test.num_tokens == len(text) and bytes(test.document(0).tolist()) == text
    with pytest.raises(ValueError, match="builtin:austen"):
        text_layout("builtin:dickens")


@pytest.fixture
def no_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A machine without the data directory: the repository and the current folder elsewhere."""
    repo = tmp_path / "repo"
    repo.mkdir()
    monkeypatch.delenv(data_paths.DATA_ENV_VAR, raising=False)
    monkeypatch.setattr(data_paths, "_REPO_ROOT", repo)
    monkeypatch.chdir(repo)
    monkeypatch.setenv("INFTYFORMER_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_no_data_directory_falls_back_on_the_embedded_corpus_and_says_so(no_data: Path):
    assert training_source(None) == EMBEDDED_SOURCE
    note = embedded_fallback_note(None)
    assert note is not None and EMBEDDED_SOURCE in note
    assert str((no_data / "shared" / "data").resolve()) in note  # where it looked
    assert embedded_fallback_note(str(no_data)) is None  # data given: no fallback, no note
    assert training_source(str(no_data)) == no_data.resolve()


def test_a_data_directory_or_an_explicit_choice_is_never_replaced(
    no_data: Path, monkeypatch: pytest.MonkeyPatch
):
    (no_data / "shared" / "data").mkdir(parents=True)
    assert training_source(None) == (no_data / "shared" / "data").resolve()
    assert embedded_fallback_note(None) is None
    monkeypatch.setenv(data_paths.DATA_ENV_VAR, str(no_data / "typo"))
    with pytest.raises(FileNotFoundError, match="typo"):
        training_source(None)


def test_without_data_the_gpt2_tokenizer_error_blames_the_missing_data(no_data: Path):
    with pytest.raises(FileNotFoundError) as err:
        load_tokenizer("gpt2")
    message = str(err.value)
    assert message.startswith("no data directory found (looked for ")
    assert "--tokenizer bytes" in message and "--data-dir" in message


def test_train_lm_without_data_blames_the_data_then_trains_on_the_embedded_books(no_data: Path):
    runner = CliRunner()
    result = runner.invoke(app, ["train", "lm", "--steps", "1"])
    assert result.exit_code != 0
    assert result.output.startswith("error: no data directory found"), result.output
    out = no_data / "run"
    args = ["train", "lm", "--tokenizer", "bytes", "--steps", "1", "--eval-every", "1"]
    args += ["--set", "max_tokens=64", "--set", "max_docs=1", "--out-dir", str(out)]
    args += ["--set", "d_model=16", "--set", "n_layers=1", "--set", "segment_len=16"]
    result = runner.invoke(app, [*args, "--no-progress"])
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert first.startswith("no data directory found") and EMBEDDED_SOURCE in first
    assert "test ppl" in result.output
    # the estimate counts the test's calls: 1 document of 64 tokens + its start, in segments of 16
    assert "time estimate: step 1 took " in result.output
    assert "the end-of-run test (5 calls)" in result.output
