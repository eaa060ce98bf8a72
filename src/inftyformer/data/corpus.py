"""Long-document corpora, tokenised once and cached on disk.

A corpus is a directory with ``train/``, ``valid/`` and ``test/`` subfolders of UTF-8 ``.txt``
files (the pg19-mini layout); one file is one document, documents are sorted by file name.
WikiText-103's ``wiki.{split}.tokens`` files are read by :func:`load_wikitext`, one article (split
at top-level headings `` = Title = ``) per document.

The result is a :class:`TokenizedCorpus`: one flat token array (a read-only numpy memmap when it
comes from the cache) plus document offsets, UTF-8 byte counts (for bits per byte) and names.

Cache: ``$INFTYFORMER_CACHE`` or ``~/.cache/inftyformer``; the key hashes the format version, the
tokenizer identity, the reader, the split, every file name and every file's contents, so a changed
source file or tokenizer triggers a rebuild and an unchanged one loads instantly. The hash of each
token file is kept beside it (in its metadata): a token file changed after it was written (e.g.
rewritten with other, in-range ids) is noticed, with a warning, and rebuilt. Files are written
to a temporary name and moved into place with ``os.replace`` (readers never see half a file).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .._files import MAX_TEXT_BYTES, atomic_path
from .._progress import progress as show_progress
from .paths import SPLITS, check_split, resolve_data_dir
from .tokenizer import TextTokenizer

CACHE_ENV_VAR = "INFTYFORMER_CACHE"
CACHE_FORMAT_VERSION = 2  # 2: the token file's hash in its metadata
CORPUS_SUBDIR = "pg19-mini"  # the default corpus, inside the data directory

# WikiText top-level heading: " = Title = " (sub-headings look like " = = Sub = = ").
_WIKITEXT_TITLE = re.compile(r"^ = ([^=].*) = $")


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV_VAR)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "inftyformer"


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab <= 65536), else int32."""
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.int32)


@dataclass(frozen=True)
class TokenizedCorpus:
    """Documents as one flat token array.

    tokens: [num_tokens] (uint16 or int32);
        document i is ``tokens[doc_offsets[i]:doc_offsets[i + 1]]``.
    doc_offsets: [num_docs + 1] int64, starts at 0, ends at num_tokens.
    doc_bytes: [num_docs] int64, UTF-8 bytes of each source document (bits-per-byte denominators).
    """

    tokens: np.ndarray
    doc_offsets: np.ndarray
    doc_bytes: np.ndarray
    doc_names: tuple[str, ...]
    vocab_size: int
    eos_id: int
    tokenizer_name: str = ""
    from_cache: bool = False

    def __post_init__(self) -> None:
        if self.tokens.ndim != 1:
            raise ValueError(f"tokens must be 1-D, got shape {self.tokens.shape}")
        offsets = self.doc_offsets
        if offsets.ndim != 1 or offsets.shape[0] < 1:
            raise ValueError("doc_offsets must be 1-D with at least one entry")
        if offsets[0] != 0 or offsets[-1] != self.tokens.shape[0]:
            raise ValueError("doc_offsets must start at 0 and end at len(tokens)")
        if np.any(np.diff(offsets) < 0):
            raise ValueError("doc_offsets must be non-decreasing")
        num_docs = offsets.shape[0] - 1
        if self.doc_bytes.shape != (num_docs,):
            raise ValueError(f"doc_bytes must have shape ({num_docs},), got {self.doc_bytes.shape}")
        if len(self.doc_names) != num_docs:
            raise ValueError(f"doc_names must have {num_docs} entries, got {len(self.doc_names)}")
        if not 0 <= self.eos_id < self.vocab_size:
            raise ValueError(f"eos_id must be in [0, vocab_size), got {self.eos_id}")

    def fingerprint(self) -> str:
        """A hash of the contents (tokens, document boundaries, byte counts, tokenizer): two
        corpora with the same counts but other text differ. Recorded by a run to notice changed
        data on resume."""
        digest = hashlib.sha256()
        for array in (self.tokens, self.doc_offsets, self.doc_bytes):
            digest.update(np.ascontiguousarray(array).tobytes())
        digest.update(self.tokenizer_name.encode())
        return digest.hexdigest()[:32]

    @classmethod
    def from_documents(
        cls,
        documents: Sequence[Sequence[int]],
        vocab_size: int,
        eos_id: int,
        names: Sequence[str] | None = None,
        doc_bytes: Sequence[int] | None = None,
        tokenizer_name: str = "",
    ) -> TokenizedCorpus:
        """An in-memory corpus from token lists (doc_bytes default to the token counts)."""
        dtype = token_dtype(vocab_size)
        arrays = [np.asarray(d, dtype=np.int64) for d in documents]
        for i, a in enumerate(arrays):
            if a.ndim != 1 or (a.size and (a.min() < 0 or a.max() >= vocab_size)):
                raise ValueError(f"documents[{i}] must be 1-D ids in [0, {vocab_size})")
        lengths = np.array([a.size for a in arrays], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        tokens = np.concatenate(arrays).astype(dtype) if arrays else np.zeros(0, dtype)
        names = tuple(names) if names is not None else tuple(str(i) for i in range(len(arrays)))
        nbytes = np.asarray(doc_bytes if doc_bytes is not None else lengths, dtype=np.int64)
        return cls(tokens, offsets, nbytes, names, vocab_size, eos_id, tokenizer_name)

    @property
    def num_docs(self) -> int:
        return self.doc_offsets.shape[0] - 1

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def doc_lengths(self) -> np.ndarray:
        return np.diff(self.doc_offsets)  # [num_docs]

    @property
    def total_bytes(self) -> int:
        return int(self.doc_bytes.sum())

    def document(self, index: int) -> np.ndarray:
        """Token ids of document `index` as int64 [length]."""
        if not 0 <= index < self.num_docs:
            raise IndexError(f"document index {index} out of range [0, {self.num_docs})")
        start, end = int(self.doc_offsets[index]), int(self.doc_offsets[index + 1])
        return np.asarray(self.tokens[start:end], dtype=np.int64)

    def subset(self, indices: Sequence[int]) -> TokenizedCorpus:
        """The documents `indices`, in that order (an in-memory copy)."""
        return TokenizedCorpus.from_documents(
            [self.document(i) for i in indices],
            vocab_size=self.vocab_size,
            eos_id=self.eos_id,
            names=[self.doc_names[i] for i in indices],
            doc_bytes=[int(self.doc_bytes[i]) for i in indices],
            tokenizer_name=self.tokenizer_name,
        )

    def __len__(self) -> int:
        return self.num_docs


# --------------------------------------------------------------------------- reading sources


def _check_tokenizer(tokenizer: object) -> TextTokenizer:
    if not isinstance(tokenizer, TextTokenizer):
        raise TypeError(
            "tokenizer must be a TextTokenizer (see load_tokenizer), "
            f"got {type(tokenizer).__name__}"
        )
    return tokenizer


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


def tokenize_documents(
    texts: Sequence[str],
    names: Sequence[str],
    tokenizer: TextTokenizer,
    progress: bool = False,
    desc: str = "tokenizing",
) -> TokenizedCorpus:
    """Tokenise documents in memory (no cache). Long texts are encoded in safe chunks."""
    _check_tokenizer(tokenizer)
    if len(texts) != len(names):
        raise ValueError(f"texts and names must have equal lengths, got {len(texts)}/{len(names)}")
    dtype = token_dtype(tokenizer.vocab_size)
    doc_bytes = np.array([len(t.encode("utf-8")) for t in texts], dtype=np.int64)
    arrays: list[np.ndarray] = []
    with show_progress(
        total=int(doc_bytes.sum()), unit="B", unit_scale=True, desc=desc, enabled=progress
    ) as bar:
        for text, nbytes in zip(texts, doc_bytes, strict=True):
            arrays.append(np.asarray(tokenizer.encode_long(text), dtype=dtype))
            bar.update(int(nbytes))
    lengths = np.array([a.size for a in arrays], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.concatenate(arrays) if arrays else np.zeros(0, dtype)
    return TokenizedCorpus(
        tokens=tokens,
        doc_offsets=offsets,
        doc_bytes=doc_bytes,
        doc_names=tuple(names),
        vocab_size=tokenizer.vocab_size,
        eos_id=tokenizer.eos_id,
        tokenizer_name=tokenizer.name,
    )


# --------------------------------------------------------------------------- the cache


def _cache_key(reader: str, split: str, tokenizer: TextTokenizer, sources: list[tuple]) -> str:
    payload = {
        "format": CACHE_FORMAT_VERSION,
        "reader": reader,
        "split": split,
        "tokenizer": tokenizer.identity,
        "sources": [[name, hashlib.sha256(raw).hexdigest()] for name, raw in sources],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


def _cache_paths(cache_dir: Path, reader: str, split: str, key: str) -> tuple[Path, Path]:
    stem = f"{reader}-{split}-{key}"
    return cache_dir / f"{stem}.tokens.npy", cache_dir / f"{stem}.meta.json"


def _atomic_write(path: Path, write) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        write(f)


def _save_cache(corpus: TokenizedCorpus, tokens_path: Path, meta_path: Path) -> None:
    tokens_path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "format": CACHE_FORMAT_VERSION,
        "dtype": corpus.tokens.dtype.str,
        "num_tokens": corpus.num_tokens,
        "doc_offsets": [int(v) for v in corpus.doc_offsets],
        "doc_bytes": [int(v) for v in corpus.doc_bytes],
        "doc_names": list(corpus.doc_names),
        "vocab_size": corpus.vocab_size,
        "eos_id": corpus.eos_id,
        "tokenizer_name": corpus.tokenizer_name,
    }
    _atomic_write(tokens_path, lambda f: np.save(f, np.ascontiguousarray(corpus.tokens)))
    meta["tokens_sha256"] = _file_sha256(tokens_path)  # a rewritten token file is noticed
    # The metadata goes last: its presence means the token file is complete.
    _atomic_write(meta_path, lambda f: f.write(json.dumps(meta).encode()))


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _load_cache(tokens_path: Path, meta_path: Path) -> TokenizedCorpus | None:
    if not (tokens_path.is_file() and meta_path.is_file()):
        return None
    try:
        meta = json.loads(meta_path.read_text())
        if meta.get("format") != CACHE_FORMAT_VERSION:
            return None
        if meta.get("tokens_sha256") != _file_sha256(tokens_path):
            warnings.warn(
                f"the corpus cache {tokens_path} does not match the hash recorded beside it "
                "(changed or corrupted since it was written): tokenising again",
                stacklevel=4,
            )
            return None
        tokens = np.load(tokens_path, mmap_mode="r")
        if tokens.shape != (meta["num_tokens"],) or tokens.dtype.str != meta["dtype"]:
            return None
        return TokenizedCorpus(
            tokens=tokens,
            doc_offsets=np.asarray(meta["doc_offsets"], dtype=np.int64),
            doc_bytes=np.asarray(meta["doc_bytes"], dtype=np.int64),
            doc_names=tuple(meta["doc_names"]),
            vocab_size=int(meta["vocab_size"]),
            eos_id=int(meta["eos_id"]),
            tokenizer_name=str(meta["tokenizer_name"]),
            from_cache=True,
        )
    except (OSError, ValueError, KeyError):
        return None  # unreadable or stale entry: rebuild


def _cached(
    reader: str,
    split: str,
    tokenizer: TextTokenizer,
    sources: list[tuple[str, bytes]],
    build,
    cache_dir: str | Path | None,
    use_cache: bool,
) -> TokenizedCorpus:
    if not use_cache:
        return build()
    directory = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    key = _cache_key(reader, split, tokenizer, sources)
    tokens_path, meta_path = _cache_paths(directory, reader, split, key)
    hit = _load_cache(tokens_path, meta_path)
    if hit is not None:
        return hit
    corpus = build()
    try:
        _save_cache(corpus, tokens_path, meta_path)
    except OSError as err:
        warnings.warn(f"could not write corpus cache in {directory}: {err}", stacklevel=3)
        return corpus
    loaded = _load_cache(tokens_path, meta_path)
    # Same data, now memory-mapped; from_cache=False records that this call tokenised.
    return replace(loaded, from_cache=False) if loaded is not None else corpus


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


def split_wikitext(text: str) -> list[tuple[str, str]]:
    """(title, article text) pairs, split at top-level headings `` = Title = ``.

    Text before the first heading (if any, and not blank) becomes a document titled "".
    """
    docs: list[tuple[str, list[str]]] = []
    for line in text.splitlines(keepends=True):
        match = _WIKITEXT_TITLE.match(line.rstrip("\r\n"))
        if match is not None:
            docs.append((match.group(1).strip(), [line]))
        elif docs:
            docs[-1][1].append(line)
        elif line.strip():
            docs.append(("", [line]))
    return [(title, "".join(lines)) for title, lines in docs]


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


# --------------------------------------------------------------------------- transformations
def with_bos(corpus: TokenizedCorpus) -> TokenizedCorpus:
    """`corpus` with a beginning-of-document token (``corpus.eos_id``) before every non-empty
    document. Streaming the result scores every original token exactly once (as the target of the
    position before it); ``doc_bytes`` and names are unchanged."""
    offsets = np.asarray(corpus.doc_offsets, dtype=np.int64)  # [D + 1]
    lengths = np.diff(offsets)  # [D]
    nonempty = lengths > 0
    tokens = np.insert(np.asarray(corpus.tokens), offsets[:-1][nonempty], corpus.eos_id)
    new_offsets = np.concatenate([[0], np.cumsum(lengths + nonempty)]).astype(np.int64)
    return TokenizedCorpus(
        tokens=tokens.astype(corpus.tokens.dtype, copy=False),
        doc_offsets=new_offsets,
        doc_bytes=np.asarray(corpus.doc_bytes, dtype=np.int64),
        doc_names=corpus.doc_names,
        vocab_size=corpus.vocab_size,
        eos_id=corpus.eos_id,
        tokenizer_name=corpus.tokenizer_name,
    )


def truncate_documents(
    corpus: TokenizedCorpus,
    max_tokens: int | None = None,
    max_docs: int | None = None,
    token_bytes: np.ndarray | None = None,
) -> TokenizedCorpus:
    """The first `max_docs` documents, each cut to its first `max_tokens` tokens (a prefix: it
    still starts at the document's beginning). ``doc_bytes`` of a cut document is recomputed
    exactly from `token_bytes` ([vocab] UTF-8 bytes per token id, see
    :func:`token_byte_lengths`), which is required whenever a document is actually cut."""
    docs = corpus.num_docs if max_docs is None else min(int(max_docs), corpus.num_docs)
    if docs < 1:
        raise ValueError(f"max_docs must be >= 1, got {max_docs}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    arrays, nbytes = [], []
    for i in range(docs):
        doc = corpus.document(i)
        if max_tokens is not None and doc.size > max_tokens:
            if token_bytes is None:
                raise ValueError("token_bytes is needed to count the bytes of a cut document")
            doc = doc[:max_tokens]
            nbytes.append(int(np.asarray(token_bytes)[doc].sum()))
        else:
            nbytes.append(int(corpus.doc_bytes[i]))
        arrays.append(doc)
    return TokenizedCorpus.from_documents(
        arrays,
        vocab_size=corpus.vocab_size,
        eos_id=corpus.eos_id,
        names=corpus.doc_names[:docs],
        doc_bytes=nbytes,
        tokenizer_name=corpus.tokenizer_name,
    )


def token_byte_lengths(tokenizer: Any) -> np.ndarray:
    """[vocab] int64: UTF-8 bytes that each token id stands for (0 for special tokens).

    Byte tokenizer: 1 for ids 0..255. GPT-2 byte-level BPE: each character of a token's string is
    one byte (the byte-to-unicode map), so the length of the string is the byte count.
    """
    vocab = int(tokenizer.vocab_size)
    out = np.zeros(vocab, dtype=np.int64)
    if getattr(tokenizer, "name", "") == "bytes":
        out[: min(256, vocab)] = 1
        return out
    inner = getattr(tokenizer, "_tok", None)
    if inner is None:
        raise TypeError(f"cannot count bytes per token for {tokenizer!r}")
    special = {int(i) for i in [tokenizer.eos_id]}
    for i in range(vocab):
        piece = inner.id_to_token(i)
        if piece is not None and i not in special:
            out[i] = len(piece)
    return out


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
    - ``"-"``: standard input, one document.

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
    if layout == "corpus":
        return load_corpus(root, split, tokenizer, progress=progress)
    files = sorted(p for p in root.glob("*.txt") if p.is_file())
    if not whole:
        files = split_flat_folder(files)[split]
    return _load_files(files, "flat" if whole else f"flat-{split}", split, tokenizer, progress)


def text_layout(source: str | Path, split: str = "train") -> tuple[str, Path]:
    """Which layout `source` has (see :func:`load_split`) and where: ("stdin" | "file" |
    "wikitext" | "corpus" | "flat", path). Cheap: lists folders, reads no text. Raises
    FileNotFoundError / ValueError naming what is missing."""
    if str(source) == STDIN:
        return "stdin", Path(STDIN)
    path = Path(source).expanduser()
    if path.is_file():
        return "file", path
    if not path.is_dir():
        raise FileNotFoundError(f"data not found: {path} (a folder, a .txt file or - for stdin)")
    if is_wikitext_dir(path):
        return "wikitext", path
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
