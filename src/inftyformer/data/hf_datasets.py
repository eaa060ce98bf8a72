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
folders, every data file's name and contents (as the .txt corpora are: a file rewritten with
the same size and time is noticed). A hub dataset's key is its name, configuration and split:
clear the cache (``$INFTYFORMER_CACHE``) to read a new revision.

A local folder is checked before `datasets` reads it, so that its errors name the file: a split
of files in two formats (``train.jsonl`` beside ``train-0.parquet``: `datasets` would read one
format and drop the other without a word) is refused, as are a JSON-lines or CSV file that is
not UTF-8 (its byte offset), a parquet file that cannot be opened, and a saved split of no rows.
"""

from __future__ import annotations

import codecs
import hashlib
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
TEXT_SUFFIXES = (".jsonl", ".csv")  # data files read as UTF-8 text


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
    if Path(source).is_dir():  # a local folder: nothing to do with the hub or its cache
        return f"cannot read the dataset folder {source} ({type(err).__name__}: {first})"
    return (
        f"cannot read the dataset {source} ({type(err).__name__}: {first}); a hub dataset must "
        "be in the Hugging Face cache when the hub cannot be reached (HF_DATASETS_OFFLINE=1)"
    )


def _rows(source: str, config: str | None, split: str, saved: bool) -> Iterator[dict]:
    """The rows of `split`, streamed."""
    import datasets

    if saved:  # save_to_disk: a DatasetDict folder or a single Dataset's
        yield from _saved_rows(Path(source), split)
        return
    name = _dataset_split(source, config, split)
    try:
        stream = datasets.load_dataset(source, config, split=name, streaming=True)
        yield from stream
    except Exception as err:  # noqa: BLE001
        raise ValueError(_unreadable(source, err)) from None


def _saved_rows(folder: Path, split: str) -> Iterator[dict]:
    """The rows of `split` of a folder written by ``save_to_disk`` (only that split is loaded);
    a split of no rows is refused by name (`datasets` fails on it with an IndexError)."""
    import datasets

    listing = folder / SAVED_MARKERS[0]
    if listing.is_file():  # a DatasetDict: one folder per split
        try:
            splits = [str(n) for n in json.loads(listing.read_text(encoding="utf-8"))["splits"]]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{listing} is not a dataset's list of splits ({err})") from None
        names = [n for n in SPLIT_NAMES[split] if n in splits]
        if not names:
            raise ValueError(
                f"dataset {folder} has no {split} split (its splits: {', '.join(splits)})"
            )
        folder = folder / names[0]
    empty = f"the {split} split of the dataset {folder} (written by save_to_disk) holds no rows"
    try:
        state = json.loads((folder / SAVED_MARKERS[1]).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read the saved dataset {folder} ({err})") from None
    if isinstance(state, dict) and state.get("_data_files") == []:
        raise ValueError(empty)
    try:
        loaded = datasets.load_from_disk(str(folder))
    except Exception as err:  # noqa: BLE001 - datasets raises many kinds
        raise ValueError(_unreadable(str(folder), err)) from None
    if len(loaded) == 0:
        raise ValueError(empty)
    yield from loaded.to_iterable_dataset()


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
    """What the cache key hashes: the source's name and, for a folder, each data file's name
    and the hash of its contents (JSON-lines and CSV files checked to be UTF-8 on the way)."""
    if folder is None:
        return [(source, b"hub")]
    files = [*data_files(folder), *(folder / m for m in SAVED_MARKERS if (folder / m).is_file())]
    return [(p.relative_to(folder).as_posix(), _contents_hash(p)) for p in sorted(files)]


def _contents_hash(path: Path) -> bytes:
    """The SHA-256 of `path`'s bytes; a JSON-lines or CSV file that is not UTF-8 is refused,
    naming the file and the byte offset."""
    digest = hashlib.sha256()
    decoder = codecs.getincrementaldecoder("utf-8")() if path.suffix in TEXT_SUFFIXES else None
    offset = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
            if decoder is not None:
                offset = _decoded(decoder, block, offset, path)
    if decoder is not None:
        _decoded(decoder, b"", offset, path, final=True)
    return digest.digest()


def _decoded(decoder, block: bytes, offset: int, path: Path, final: bool = False) -> int:
    """Feed `block` (at byte `offset` of `path`) to the UTF-8 `decoder`; the next offset."""
    held = len(decoder.getstate()[0])  # bytes of a character cut at the last block's end
    try:
        decoder.decode(block, final)
    except UnicodeDecodeError as err:
        at = offset - held + err.start
        raise ValueError(f"{path} is not valid UTF-8 (byte {at}): {err.reason}") from None
    return offset + len(block)


def _check_folder(folder: Path, split: str) -> None:
    """Refuse a split whose files are in more than one format (`datasets` reads one and drops
    the others), naming them, and a parquet file that cannot be opened, naming it."""
    import datasets.data_files as found

    try:
        patterns = found.get_data_patterns(str(folder))
        by_split = found.DataFilesDict.from_local_or_remote(patterns, base_path=str(folder))
    except Exception:  # noqa: BLE001 - no files it knows: `load_dataset` says what is wrong
        return
    names = [n for n in SPLIT_NAMES[split] if n in by_split]
    files = [Path(f) for f in by_split[names[0]]] if names else []
    files = [f for f in files if f.suffix in DATA_SUFFIXES]
    formats = sorted({f.suffix for f in files})
    if len(formats) > 1:
        shown = ", ".join(f.relative_to(folder).as_posix() for f in sorted(files))
        raise ValueError(
            f"the {split} split of the dataset folder {folder} mixes formats "
            f"({', '.join(formats)}: {shown}); `datasets` would read one format only: keep one "
            "format per split"
        )
    for path in files:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            try:
                pq.ParquetFile(path).close()
            except Exception as err:  # noqa: BLE001 - pyarrow raises several kinds
                first = (str(err).splitlines() or [type(err).__name__])[0]
                raise ValueError(
                    f"{path} is not a readable parquet file ({type(err).__name__}: {first})"
                ) from None


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
    if folder is not None and not saved:
        _check_folder(folder, split)

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
