"""Corpora through Hugging Face `datasets`, offline, on small datasets written here in the formats
the hub and `save_to_disk` use: parquet folders split by file name, arrow files, a saved
DatasetDict, WikiText's one-line-per-row layout; tokenised once, then read from the cache."""

from __future__ import annotations

from pathlib import Path

import pytest

datasets = pytest.importorskip("datasets")

from inftyformer.data import ByteTokenizer  # noqa: E402
from inftyformer.data.corpus import load_split, text_layout  # noqa: E402
from inftyformer.data.hf_datasets import load_hf_split  # noqa: E402

BOOKS = {
    "train": [("Emma", "Emma Woodhouse, handsome.\n"), ("Persuasion", "Sir Walter — café.\n")],
    "validation": [("Sanditon", "A valid book.\n")],
    "test": [("Lady Susan", "A test book.\n"), ("The Watsons", "Another one.\n")],
}


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("INFTYFORMER_CACHE", str(tmp_path / "cache"))


def _dataset(rows: list[tuple[str, str]]):
    return datasets.Dataset.from_dict(
        {"title": [t for t, _ in rows], "text": [x for _, x in rows], "year": [1815] * len(rows)}
    )


def _parquet_folder(root: Path) -> Path:
    (root / "data").mkdir(parents=True)
    for split, rows in BOOKS.items():
        _dataset(rows).to_parquet(root / "data" / f"{split}-00000-of-00001.parquet")
    return root


def test_a_parquet_folder_is_read_by_split_one_row_one_document(tmp_path: Path):
    folder = _parquet_folder(tmp_path / "books")
    assert text_layout(folder)[0] == "dataset"
    tok = ByteTokenizer()
    for split, name in (("train", "train"), ("valid", "validation"), ("test", "test")):
        corpus = load_split(folder, split, tok)
        assert corpus.doc_names == tuple(t for t, _ in BOOKS[name])
        for i, (_, text) in enumerate(BOOKS[name]):
            assert bytes(corpus.document(i).tolist()) == text.encode("utf-8")
            assert int(corpus.doc_bytes[i]) == len(text.encode("utf-8"))


def test_tokenised_once_then_read_from_the_cache_and_rebuilt_when_a_file_changes(tmp_path: Path):
    folder = _parquet_folder(tmp_path / "books")
    first = load_split(folder, "test", ByteTokenizer())
    again = load_split(folder, "test", ByteTokenizer())
    assert not first.from_cache and again.from_cache
    assert again.fingerprint() == first.fingerprint()
    _dataset([("New", "Changed text.\n")]).to_parquet(
        folder / "data" / "test-00000-of-00001.parquet"
    )
    changed = load_split(folder, "test", ByteTokenizer())
    assert not changed.from_cache and changed.doc_names == ("New",)


def test_hf_names_go_through_load_dataset(tmp_path: Path):
    folder = _parquet_folder(tmp_path / "books")
    corpus = load_split(f"hf:{folder}", "valid", ByteTokenizer())
    assert corpus.doc_names == ("Sanditon",)


def test_arrow_files_and_save_to_disk_folders(tmp_path: Path):
    saved = tmp_path / "saved"
    datasets.DatasetDict({s: _dataset(r) for s, r in BOOKS.items()}).save_to_disk(str(saved))
    assert load_split(saved, "train", ByteTokenizer()).doc_names == ("Emma", "Persuasion")
    arrow = tmp_path / "arrow"
    arrow.mkdir()
    for split in ("train", "test"):
        (arrow / f"{split}.arrow").write_bytes(next((saved / split).glob("*.arrow")).read_bytes())
    assert load_split(arrow, "test", ByteTokenizer()).doc_names == ("Lady Susan", "The Watsons")


def test_wikitext_rows_are_lines_joined_into_articles(tmp_path: Path):
    lines = [
        " = Alpha = \n",
        " alpha text \n",
        " = = Sub = = \n",
        " more \n",
        " = Beta = \n",
        " b \n",
    ]
    folder = tmp_path / "wikitext-103-raw"
    (folder / "data").mkdir(parents=True)
    datasets.Dataset.from_dict({"text": lines}).to_parquet(folder / "data" / "test-0.parquet")
    corpus = load_hf_split(folder, "test", ByteTokenizer())
    assert corpus.doc_names == ("Alpha", "Beta")
    assert bytes(corpus.document(0).tolist()).decode() == "".join(lines[:4])


def test_errors_name_what_is_missing(tmp_path: Path):
    folder = _parquet_folder(tmp_path / "books")
    only_train = tmp_path / "only-train"
    (only_train / "data").mkdir(parents=True)
    _dataset(BOOKS["train"]).to_parquet(only_train / "data" / "train-0.parquet")
    with pytest.raises(ValueError, match=r"has no valid split \(its splits: train\)"):
        load_split(only_train, "valid", ByteTokenizer())
    no_text = tmp_path / "no-text"
    (no_text / "data").mkdir(parents=True)
    datasets.Dataset.from_dict({"body": ["x"]}).to_parquet(no_text / "data" / "test-0.parquet")
    with pytest.raises(ValueError, match=r"no 'text' column \(its columns: body\)"):
        load_split(no_text, "test", ByteTokenizer())
    with pytest.raises(ValueError, match="cannot read the dataset nobody/nothing .*cache"):
        load_split("hf:nobody/nothing", "train", ByteTokenizer())
    assert load_split(folder, "test", ByteTokenizer()).num_docs == 2  # the good one still reads


def test_a_split_in_two_formats_is_refused_naming_both_files(tmp_path: Path):
    """`datasets` reads one format of a folder and drops the other files without a word."""
    import json

    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "train.jsonl").write_text(json.dumps({"text": "from jsonl"}) + "\n")
    datasets.Dataset.from_dict({"text": ["from parquet"]}).to_parquet(folder / "train-0.parquet")
    with pytest.raises(ValueError, match=r"mixes formats .*train-0\.parquet, train\.jsonl"):
        load_split(folder, "train", ByteTokenizer())


def test_a_jsonl_rewritten_with_the_same_size_and_time_is_read_again(tmp_path: Path):
    import json
    import os

    folder = tmp_path / "books"
    folder.mkdir()
    path = folder / "train.jsonl"
    path.write_text(json.dumps({"title": "A", "text": "first text\n"}) + "\n")
    first = load_split(folder, "train", ByteTokenizer())
    times = os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns
    path.write_text(json.dumps({"title": "B", "text": "other text\n"}) + "\n")  # same size
    os.utime(path, ns=times)
    again = load_split(folder, "train", ByteTokenizer())
    assert first.doc_names == ("A",) and again.doc_names == ("B",) and not again.from_cache
    assert load_split(folder, "train", ByteTokenizer()).from_cache  # unchanged: the cache


def test_an_empty_saved_dataset_is_refused_naming_the_folder(tmp_path: Path):
    single = tmp_path / "single"
    datasets.Dataset.from_dict({"text": []}).save_to_disk(str(single))
    with pytest.raises(ValueError, match=f"train split of the dataset {single} .*holds no rows"):
        load_split(single, "train", ByteTokenizer())
    splits = tmp_path / "splits"
    datasets.DatasetDict(
        {"train": _dataset(BOOKS["train"]), "test": datasets.Dataset.from_dict({"text": []})}
    ).save_to_disk(str(splits))
    with pytest.raises(ValueError, match=f"test split of the dataset {splits / 'test'} .*no rows"):
        load_split(splits, "test", ByteTokenizer())
    assert load_split(splits, "train", ByteTokenizer()).num_docs == 2  # the other split reads


@pytest.mark.parametrize(
    ("name", "raw", "offset"),
    [("train.jsonl", b'{"text": "caf\xe9"}\n', 13), ("train.csv", b"text\ncaf\xe9\n", 8)],
)
def test_text_files_that_are_not_utf8_are_named_with_the_byte(tmp_path: Path, name, raw, offset):
    folder = tmp_path / "latin"
    folder.mkdir()
    (folder / name).write_bytes(raw)
    with pytest.raises(ValueError, match=rf"{folder / name} is not valid UTF-8 \(byte {offset}\)"):
        load_split(folder, "train", ByteTokenizer())


def test_a_corrupt_local_parquet_is_named_as_unreadable(tmp_path: Path):
    folder = tmp_path / "corrupt"
    folder.mkdir()
    (folder / "train-0.parquet").write_bytes(b"PAR1 not parquet at all PAR1")
    with pytest.raises(ValueError) as refused:
        load_split(folder, "train", ByteTokenizer())
    message = str(refused.value)
    assert f"{folder / 'train-0.parquet'} is not a readable parquet file" in message
    assert "cache" not in message and "hub" not in message
