"""The tokenised corpus: `TokenizedCorpus` (one flat token array plus document offsets, UTF-8
byte counts for bits per byte, and names), tokenising documents in memory, and the
transformations evaluation applies to a corpus (a beginning-of-document token, documents cut to
a prefix, bytes per token id). Reading corpora from disk is `corpus.py`, its cache `cache.py`."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._progress import progress as show_progress
from .tokenizer import TextTokenizer


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


# --------------------------------------------------------------------------- tokenising in memory


def _check_tokenizer(tokenizer: object) -> TextTokenizer:
    if not isinstance(tokenizer, TextTokenizer):
        raise TypeError(
            "tokenizer must be a TextTokenizer (see load_tokenizer), "
            f"got {type(tokenizer).__name__}"
        )
    return tokenizer


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
        total=int(doc_bytes.sum()),
        unit="B",
        unit_scale=True,
        desc=desc,
        enabled=progress,
        leave=False,  # in a log: a line only while it takes long (its result follows)
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
