"""Long-document corpora, tokenised once and cached on disk.

A corpus is a directory with ``train/``, ``valid/`` and ``test/`` subfolders of UTF-8 ``.txt``
files (the pg19-mini layout); one file is one document, documents are sorted by file name.
WikiText-103's ``wiki.{split}.tokens`` files are read by :func:`load_wikitext`, one article (split
at top-level headings `` = Title = ``) per document.

The result is a :class:`TokenizedCorpus`: one flat token array (a read-only numpy memmap when it
comes from the cache) plus document offsets, UTF-8 byte counts (for bits per byte) and names.

The corpus itself (and tokenising in memory) is `tokenized.py`; the cache `cache.py`.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Sequence
from pathlib import Path

from .._files import MAX_TEXT_BYTES
from .cache import CACHE_ENV_VAR, CACHE_FORMAT_VERSION, _cached, default_cache_dir  # noqa: F401
from .paths import EMBEDDED_CORPUS, EMBEDDED_SOURCE, SPLITS, check_split, resolve_data_dir
from .tokenized import (  # noqa: F401  (re-exported: the corpus's old home)
    TokenizedCorpus,
    _check_tokenizer,
    token_byte_lengths,
    token_dtype,
    tokenize_documents,
    truncate_documents,
    with_bos,
)
from .tokenizer import TextTokenizer
from .wikitext import split_wikitext

CORPUS_SUBDIR = "pg19-mini"  # the default corpus, inside the data directory


def _decode(raw: bytes, source: Path) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{source} is not valid UTF-8 (byte {err.start}): {err.reason}") from None


def _split_files(root: str | Path, split: str) -> list[Path]:
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"corpus directory not found: {root}")
    folder = root / split
    if not folder.is_dir():
        raise FileNotFoundError(f"split folder not found: {folder} (expected {root}/{split}/*.txt)")
    files = sorted(p for p in folder.glob("*.txt") if p.is_file())
    if not files:
        raise ValueError(f"no .txt files in {folder}")
    return files


# --------------------------------------------------------------------------- public loaders


def load_corpus(
    root: str | Path,
    split: str,
    tokenizer: TextTokenizer,
    cache_dir: str | Path | None = None,
    progress: bool = True,
    use_cache: bool = True,
) -> TokenizedCorpus:
    """Tokenise ``<root>/<split>/*.txt`` (one file = one document, sorted by name), cached.

    Raises FileNotFoundError for a missing root or split folder, ValueError for a split without
    .txt files or a file that is not UTF-8 (naming the file).
    """
    split = check_split(split)
    _check_tokenizer(tokenizer)
    files = _split_files(root, split)
    sources = [(p.name, p.read_bytes()) for p in files]

    def build() -> TokenizedCorpus:
        texts = [_decode(raw, path) for (_, raw), path in zip(sources, files, strict=True)]
        names = [p.stem for p in files]
        return tokenize_documents(texts, names, tokenizer, progress, desc=f"tokenizing {split}")

    return _cached("txtdir", split, tokenizer, sources, build, cache_dir, use_cache)


def load_wikitext(
    root: str | Path,
    split: str,
    tokenizer: TextTokenizer,
    cache_dir: str | Path | None = None,
    progress: bool = True,
    use_cache: bool = True,
) -> TokenizedCorpus:
    """Tokenise ``<root>/wiki.<split>.tokens`` (WikiText-103), one article per document, cached.

    The text is used as is (no detokenisation; ``<unk>`` stays a literal string).
    """
    split = check_split(split)
    _check_tokenizer(tokenizer)
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"WikiText directory not found: {root}")
    path = root / f"wiki.{split}.tokens"
    if not path.is_file():
        raise FileNotFoundError(f"WikiText file not found: {path}")
    raw = path.read_bytes()
    sources = [(path.name, raw)]

    def build() -> TokenizedCorpus:
        articles = split_wikitext(_decode(raw, path))
        if not articles:
            raise ValueError(f"no articles found in {path}")
        titles = [title for title, _ in articles]
        texts = [body for _, body in articles]
        return tokenize_documents(texts, titles, tokenizer, progress, desc=f"tokenizing {split}")

    return _cached("wikitext", split, tokenizer, sources, build, cache_dir, use_cache)


# --------------------------------------------------------------------------- finding corpora
def resolve_corpus_dir(data_dir: str | Path | None) -> Path:
    """The corpus directory (with ``train/``) designated by `data_dir`: the directory itself, or
    its ``pg19-mini/`` subfolder; None means the default data directory."""
    root = resolve_data_dir(data_dir)
    for candidate in (root, root / CORPUS_SUBDIR):
        if (candidate / "train").is_dir():
            return candidate
    raise FileNotFoundError(
        f"{root} is not a corpus directory: expected {root}/train/*.txt (with valid/ and test/) "
        f"or a data root with {CORPUS_SUBDIR}/"
    )


def is_wikitext_dir(path: Path) -> bool:
    return any(Path(path).glob("wiki.*.tokens"))


# --------------------------------------------------------------------------- a user's own text
STDIN = "-"
HELD_OUT_EVERY = 20  # a flat folder: 1 file in 20 (by name) is held out for valid, 1 for test


def flat_split_of(name: str) -> str:
    """The split a file of a flat folder of documents belongs to: the first byte of the SHA-256
    of its file name, modulo 20: 0 → valid, 1 → test, anything else → train. Deterministic, and
    adding or removing a file never moves another."""
    bucket = hashlib.sha256(name.encode("utf-8")).digest()[0] % HELD_OUT_EVERY
    return {0: "valid", 1: "test"}.get(bucket, "train")


def split_flat_folder(files: Sequence[Path]) -> dict[str, list[Path]]:
    """Files of a flat folder by split (:func:`flat_split_of`). A folder too small for a split to
    be drawn gets one all the same: the train file(s) whose name hashes lowest move to an empty
    valid, then an empty test split. Needs at least 3 files."""
    if len(files) < 3:
        raise ValueError(
            f"a flat folder needs at least 3 .txt files to hold out valid and test documents, "
            f"found {len(files)}; add files or use train/, valid/ and test/ subfolders"
        )
    splits: dict[str, list[Path]] = {name: [] for name in SPLITS}
    for path in files:
        splits[flat_split_of(path.name)].append(path)
    for name in ("valid", "test"):
        if not splits[name]:
            lowest = min(splits["train"], key=lambda p: hashlib.sha256(p.name.encode()).digest())
            splits["train"].remove(lowest)
            splits[name].append(lowest)
    return {name: sorted(paths) for name, paths in splits.items()}


def _load_files(
    files: Sequence[Path], reader: str, split: str, tokenizer: TextTokenizer, progress: bool
) -> TokenizedCorpus:
    sources = [(p.name, p.read_bytes()) for p in files]

    def build() -> TokenizedCorpus:
        texts = [_decode(raw, path) for (_, raw), path in zip(sources, files, strict=True)]
        names = [p.stem for p in files]
        return tokenize_documents(texts, names, tokenizer, progress, desc=f"tokenizing {split}")

    return _cached(reader, split, tokenizer, sources, build, None, True)


def load_split(
    source: str | Path,
    split: str,
    tokenizer: TextTokenizer,
    progress: bool = False,
    whole: bool = False,
) -> TokenizedCorpus:
    """Split `split` of whatever layout `source` has:

    - a corpus directory: ``<source>/<split>/*.txt`` (only that split needs to exist), or the
      corpus inside a data root (``<source>/pg19-mini/``);
    - WikiText-103: ``<source>/wiki.<split>.tokens``, one article per document;
    - a flat folder of ``.txt`` files (one file, one document): the files of `split` by
      :func:`flat_split_of`, or every file with ``whole=True`` (evaluating a user's documents);
    - a single text file: one document (whatever the split);
    - ``"-"``: standard input, one document;
    - ``"builtin:austen"``: the corpus the package carries (``austen/PROVENANCE.md``);
    - a Hugging Face dataset: ``hf:NAME[:CONFIG]`` or a folder of parquet/arrow/JSON-lines/CSV
      files or one written by ``save_to_disk`` (:mod:`inftyformer.data.hf_datasets`).

    Text must be UTF-8 (the error names the file); an empty result is an error.
    """
    check_split(split)
    layout, root = text_layout(source, split)
    if layout == "stdin":
        raw = sys.stdin.buffer.read(MAX_TEXT_BYTES + 1)  # a stream may never end (/dev/zero)
        if len(raw) > MAX_TEXT_BYTES:
            raise ValueError(
                f"standard input holds more than {MAX_TEXT_BYTES / 2**20:g} MiB, more than is "
                "read from it: save the text to files and pass their folder or file"
            )
        text = _decode(raw, Path("<stdin>"))
        if not text.strip():
            raise ValueError("standard input holds no text")
        return tokenize_documents([text], ["stdin"], tokenizer, progress)
    if layout == "file":
        if not root.read_bytes().strip():
            raise ValueError(f"{root} holds no text")
        return _load_files([root], "file", "all", tokenizer, progress)
    if layout == "wikitext":
        return load_wikitext(root, split, tokenizer, progress=progress)
    if layout == "dataset":
        from .hf_datasets import load_hf_split

        return load_hf_split(
            source if str(source).startswith("hf:") else root, split, tokenizer, progress
        )
    if layout == "corpus":
        return load_corpus(root, split, tokenizer, progress=progress)
    files = sorted(p for p in root.glob("*.txt") if p.is_file())
    if not whole:
        files = split_flat_folder(files)[split]
    return _load_files(files, "flat" if whole else f"flat-{split}", split, tokenizer, progress)


def text_layout(source: str | Path, split: str = "train") -> tuple[str, Path]:
    """Which layout `source` has (see :func:`load_split`) and where: ("stdin" | "file" |
    "wikitext" | "corpus" | "flat" | "dataset", path). Cheap: lists folders, reads no text.
    Raises FileNotFoundError / ValueError naming what is missing."""
    if str(source) == STDIN:
        return "stdin", Path(STDIN)
    if str(source) == EMBEDDED_SOURCE:
        return "corpus", EMBEDDED_CORPUS
    if str(source).startswith("hf:"):
        return "dataset", Path(str(source))
    if str(source).startswith("builtin:"):
        raise ValueError(f"unknown built-in corpus {source!r}: the one there is {EMBEDDED_SOURCE}")
    path = Path(source).expanduser()
    if path.is_file():
        return "file", path
    if not path.is_dir():
        raise FileNotFoundError(f"data not found: {path} (a folder, a .txt file or - for stdin)")
    if is_wikitext_dir(path):
        return "wikitext", path
    from .hf_datasets import is_dataset_folder

    for root in (path, path / CORPUS_SUBDIR):
        if (root / split).is_dir() and any((root / split).glob("*.txt")):
            return "corpus", root
    if is_dataset_folder(path):
        return "dataset", path
    for root in (path, path / CORPUS_SUBDIR):
        if (root / split).is_dir():
            return "corpus", root
    if any(p.is_file() for p in path.glob("*.txt")):
        return "flat", path
    subfolders = ", ".join(sorted(p.name for p in path.iterdir() if p.is_dir())) or "none"
    raise ValueError(
        f"no .txt files in {path} (expected {path}/{split}/*.txt, wiki.{split}.tokens, or .txt "
        f"files, one per document; subfolders: {subfolders})"
    )
