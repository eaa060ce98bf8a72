"""Corpora through Hugging Face `datasets`: a `load_dataset` name (``hf:NAME`` or
``hf:NAME:CONFIG``, e.g. ``hf:deepmind/pg19`` or ``hf:Salesforce/wikitext:wikitext-103-raw-v1``;
read from the Hugging Face cache, offline with ``HF_DATASETS_OFFLINE=1``) or a local folder of
parquet, arrow, JSON-lines or CSV files (split by file name as `load_dataset` does:
``train-*.parquet``, ``data/validation-*.arrow``, …) or written by ``save_to_disk``.

One row is one document, its ``text`` column; WikiText's rows are lines, so they are joined and
cut into articles at its top-level headings (`split_wikitext`), as its files are. The split
``valid`` is the dataset's ``validation`` (or ``valid``/``dev``).

Streamed and tokenised once: rows are read one by one (``streaming=True``: a hub dataset is never
downloaded whole, a local one never held in memory) and tokenised as they come; the tokens go to
the corpus cache (`cache.py`), keyed by the source, the split, the tokenizer and, for local
folders, every data file's name, size and modification time. A hub dataset's key is its name,
configuration and split: clear the cache (``$INFTYFORMER_CACHE``) to read a new revision.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .._progress import progress as show_progress
from .cache import _cached
from .tokenized import TokenizedCorpus, token_dtype
from .tokenizer import TextTokenizer
from .wikitext import split_wikitext

HF_PREFIX = "hf:"
TEXT_COLUMN = "text"
TITLE_COLUMNS = ("title", "short_book_title", "name", "id")  # a document's name, if present
# our split -> the dataset's names for it, in order of preference
SPLIT_NAMES = {"train": ("train",), "valid": ("validation", "valid", "dev"), "test": ("test",)}
DATA_SUFFIXES = (".parquet", ".arrow", ".jsonl", ".csv")
SAVED_MARKERS = ("dataset_dict.json", "state.json")  # a folder written by save_to_disk


def data_files(folder: Path) -> list[Path]:
    """The data files `load_dataset` would read in `folder`: at its top or one folder down
    (``data/train-00000-of-00001.parquet``, ``train/part-0.arrow``)."""
    found = [*folder.glob("*"), *folder.glob("*/*")]
    return sorted(p for p in found if p.suffix in DATA_SUFFIXES and p.is_file())


def is_dataset_folder(folder: Path) -> bool:
    """Whether `folder` holds a dataset for `datasets` (saved, or parquet/arrow/json/csv files)
    rather than .txt documents."""
    if any((folder / name).is_file() for name in SAVED_MARKERS):
        return True
    return not any(folder.glob("*.txt")) and bool(data_files(folder))


def _dataset_split(source: str, config: str | None, split: str) -> str:
    """The dataset's name of our `split` (train/valid/test), or a ValueError naming its splits."""
    import datasets

    try:
        names = datasets.get_dataset_split_names(source, config)
    except Exception as err:  # noqa: BLE001 - datasets raises many kinds (offline, missing, …)
        raise ValueError(_unreadable(source, err)) from None
    for name in SPLIT_NAMES[split]:
        if name in names:
            return name
    raise ValueError(f"dataset {source} has no {split} split (its splits: {', '.join(names)})")


def _unreadable(source: str, err: Exception) -> str:
    first = (str(err).splitlines() or [type(err).__name__])[0]
    return (
        f"cannot read the dataset {source} ({type(err).__name__}: {first}); a hub dataset must "
        "be in the Hugging Face cache when the hub cannot be reached (HF_DATASETS_OFFLINE=1)"
    )


def _rows(source: str, config: str | None, split: str, saved: bool) -> Iterator[dict]:
    """The rows of `split`, streamed."""
    import datasets

    if saved:  # save_to_disk: a DatasetDict folder or a single Dataset's
        loaded = datasets.load_from_disk(source)
        if isinstance(loaded, datasets.DatasetDict):
            names = [n for n in SPLIT_NAMES[split] if n in loaded]
            if not names:
                raise ValueError(
                    f"dataset {source} has no {split} split (its splits: {', '.join(loaded)})"
                )
            loaded = loaded[names[0]]
        yield from loaded.to_iterable_dataset()
        return
    name = _dataset_split(source, config, split)
    try:
        stream = datasets.load_dataset(source, config, split=name, streaming=True)
    except Exception as err:  # noqa: BLE001
        raise ValueError(_unreadable(source, err)) from None
    yield from stream


def _documents(rows: Iterator[dict], source: str, wikitext: bool) -> Iterator[tuple[str, str]]:
    """(name, text) of each document: a row, or for WikiText an article of joined lines."""
    if wikitext:
        yield from split_wikitext("".join(_text(row, source) for row in rows))
        return
    for i, row in enumerate(rows):
        title = next((str(row[c]) for c in TITLE_COLUMNS if row.get(c) is not None), str(i))
        yield title, _text(row, source)


def _text(row: dict, source: str) -> str:
    if TEXT_COLUMN not in row:
        raise ValueError(
            f"dataset {source} has no {TEXT_COLUMN!r} column (its columns: {', '.join(row)})"
        )
    text = row[TEXT_COLUMN]
    if not isinstance(text, str):
        raise ValueError(f"dataset {source}: the {TEXT_COLUMN!r} column holds no text")
    return text


def _key_sources(source: str, folder: Path | None) -> list[tuple[str, bytes]]:
    """What the cache key hashes: the source's name and, for a folder, each data file's name,
    size and modification time (cheap: the files are not read)."""
    if folder is None:
        return [(source, b"hub")]
    files = [*data_files(folder), *(folder / m for m in SAVED_MARKERS if (folder / m).is_file())]
    return [
        (
            p.relative_to(folder).as_posix(),
            json.dumps([p.stat().st_size, p.stat().st_mtime_ns]).encode(),
        )
        for p in sorted(files)
    ]


def load_hf_split(
    source: str | Path, split: str, tokenizer: TextTokenizer, progress: bool = False
) -> TokenizedCorpus:
    """Split `split` (train/valid/test) of a dataset (``hf:NAME[:CONFIG]`` or a local dataset
    folder, see the module docstring), tokenised once and cached."""
    spec = str(source)
    folder = None if spec.startswith(HF_PREFIX) else Path(spec).expanduser().resolve()
    if folder is None:
        name, _, config = spec[len(HF_PREFIX) :].partition(":")
        config_name: str | None = config or None
        if not name:
            raise ValueError(f"name a dataset after {HF_PREFIX} (e.g. hf:deepmind/pg19)")
    else:
        name, config_name = str(folder), None
    saved = folder is not None and any((folder / m).is_file() for m in SAVED_MARKERS)
    wikitext = "wikitext" in name.lower()

    def build() -> TokenizedCorpus:
        dtype = token_dtype(tokenizer.vocab_size)
        arrays, names, nbytes = [], [], []
        rows = _rows(name, config_name, split, saved)
        bar = show_progress(desc=f"tokenizing {split}", unit=" docs", enabled=progress, leave=False)
        with bar:
            for title, text in _documents(rows, spec, wikitext):
                arrays.append(np.asarray(tokenizer.encode_long(text), dtype=dtype))
                names.append(title)
                nbytes.append(len(text.encode("utf-8")))
                bar.update(1)
        if not arrays:
            raise ValueError(f"the {split} split of {spec} holds no documents")
        lengths = np.array([a.size for a in arrays], dtype=np.int64)
        return TokenizedCorpus(
            tokens=np.concatenate(arrays),
            doc_offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            doc_bytes=np.asarray(nbytes, dtype=np.int64),
            doc_names=tuple(names),
            vocab_size=tokenizer.vocab_size,
            eos_id=tokenizer.eos_id,
            tokenizer_name=tokenizer.name,
        )

    reader = "hf-" + (config_name or "default")
    sources = [(f"{name}:{config_name}:{TEXT_COLUMN}", b"")] + _key_sources(spec, folder)
    return _cached(reader, split, tokenizer, sources, build, None, True)


__all__ = ["HF_PREFIX", "data_files", "is_dataset_folder", "load_hf_split"]
