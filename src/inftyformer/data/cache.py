"""The on-disk cache of tokenised corpora: ``$INFTYFORMER_CACHE`` or ``~/.cache/inftyformer``.

The key hashes the format version, the tokenizer identity, the reader, the split, every file name
and every file's contents, so a changed source file or tokenizer triggers a rebuild and an
unchanged one loads instantly. The hash of each token file is kept beside it (in its metadata): a
token file changed after it was written (e.g. rewritten with other, in-range ids) is noticed,
with a warning, and rebuilt. Files are written to a temporary name and moved into place with
``os.replace`` (readers never see half a file); the temporary files of a process killed while
writing (``.NAME.tokens.npy.tmpPID``) are removed when a later process opens the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

from .._files import atomic_path, remove_stale_temporaries_in, write_atomic
from .tokenized import TokenizedCorpus
from .tokenizer import TextTokenizer

CACHE_ENV_VAR = "INFTYFORMER_CACHE"
CACHE_FORMAT_VERSION = 2  # 2: the token file's hash in its metadata
CACHE_FILES = (".tokens.npy", ".meta.json")  # what an entry is (`_cache_paths`)
_swept: set[Path] = set()  # the cache folders this process has swept


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV_VAR)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "inftyformer"


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
    return cache_dir / f"{stem}{CACHE_FILES[0]}", cache_dir / f"{stem}{CACHE_FILES[1]}"


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
    with atomic_path(tokens_path) as tmp, open(tmp, "wb") as f:
        np.save(f, np.ascontiguousarray(corpus.tokens))
    meta["tokens_sha256"] = _file_sha256(tokens_path)  # a rewritten token file is noticed
    # The metadata goes last: its presence means the token file is complete.
    write_atomic(meta_path, json.dumps(meta))


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
    if directory not in _swept:  # once: what killed writers left (their process is gone)
        _swept.add(directory)
        remove_stale_temporaries_in(directory, CACHE_FILES)
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
