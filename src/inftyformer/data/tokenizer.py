"""Tokenizers behind one small interface: GPT-2 byte-level BPE (from the shared
``gpt2-tokenizer/tokenizer.json``) and a plain UTF-8 byte tokenizer.

Both expose ``encode``, ``encode_batch``, ``decode``, ``vocab_size``, ``eos_id``, ``name`` and
``identity`` (a stable string that changes whenever the token ids could change; used in cache keys).
"""

from __future__ import annotations

import hashlib
import json
import re
from abc import ABC, abstractmethod
from pathlib import Path

from .paths import default_data_dir, looked_for

GPT2_SUBDIR = "gpt2-tokenizer"
GPT2_EOS = "<|endoftext|>"

# Chunk boundaries for batch encoding: just before the last character of a whitespace run of length
# >= 2 that is followed by a non-space. GPT-2's pre-tokenizer regex never lets a piece cross such a
# point (the run minus its last character is one piece, the last character starts the next), so
# encoding the chunks separately gives exactly the ids of encoding the whole text.
_CHUNK_BOUNDARY = re.compile(r"(?<=\s)\s(?=\S)")


def split_for_encoding(text: str, target_chars: int = 16384) -> list[str]:
    """Cut `text` at safe boundaries into pieces of about `target_chars` characters (or more)."""
    pieces: list[str] = []
    start = 0
    for match in _CHUNK_BOUNDARY.finditer(text):
        if match.start() - start >= target_chars:
            pieces.append(text[start : match.start()])
            start = match.start()
    pieces.append(text[start:])
    return pieces


class TextTokenizer(ABC):
    """Common interface of the tokenizers used by the corpora."""

    name: str
    vocab_size: int
    eos_id: int

    @abstractmethod
    def encode(self, text: str) -> list[int]: ...

    @abstractmethod
    def decode(self, ids: list[int]) -> str: ...

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def encode_long(self, text: str) -> list[int]:
        """Encode a long text quickly; same ids as :meth:`encode`."""
        return self.encode(text)

    @property
    @abstractmethod
    def identity(self) -> str:
        """Stable identity for cache keys: equal identities give equal ids for every text."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size})"


class ByteTokenizer(TextTokenizer):
    """UTF-8 bytes 0..255 plus one end-of-text / padding id 256 (vocab 257)."""

    name = "bytes"
    vocab_size = 257
    eos_id = 256

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        data = bytes(int(i) for i in ids if 0 <= int(i) < 256)
        return data.decode("utf-8", errors="replace")

    @property
    def identity(self) -> str:
        return "bytes-utf8-v1"


class BPETokenizer(TextTokenizer):
    """A Hugging Face ``tokenizer.json`` (via `tokenizers`), with `eos_token` as the end-of-text
    id that separates documents. No special tokens are added when encoding."""

    def __init__(self, tokenizer_file: str | Path, eos_token: str, name: str = "bpe") -> None:
        from tokenizers import Tokenizer

        path = Path(tokenizer_file)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        self.path, self.name = path, name
        self._identity = f"{name}:" + hashlib.sha256(path.read_bytes()).hexdigest()
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as err:  # noqa: BLE001 - the tokenizers library raises plain Exception
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ValueError(
                f"{path} is not a tokenizer file the tokenizers library can read ({first}); "
                "pass --tokenizer bytes, gpt2, or a path to a tokenizer.json"
            ) from None
        eos = self._tok.token_to_id(eos_token)
        if eos is None:
            raise ValueError(f"{path} has no {eos_token} token")
        self.eos_id = int(eos)
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))

    @classmethod
    def from_directory(cls, directory: str | Path) -> BPETokenizer:
        """The tokenizer of a Hugging Face model directory (``tokenizer.json``); documents are
        separated by ``<|endoftext|>`` when the vocabulary has it, else by the model's end-of-
        sequence token (``tokenizer_config.json``)."""
        directory = Path(directory)
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {directory}")
        eos = GPT2_EOS
        config = directory / "tokenizer_config.json"
        if config.is_file():
            named = json.loads(config.read_text(encoding="utf-8")).get("eos_token")
            vocab = json.loads(path.read_text(encoding="utf-8")).get("added_tokens", [])
            if named and GPT2_EOS not in {t.get("content") for t in vocab}:
                eos = named if isinstance(named, str) else named.get("content", GPT2_EOS)
        return cls(path, eos, name=f"hf-{directory.name}")

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    @property
    def identity(self) -> str:
        return self._identity


class GPT2Tokenizer(BPETokenizer):
    """GPT-2 byte-level BPE (vocab 50257, eos ``<|endoftext|>`` = 50256)."""

    def __init__(self, tokenizer_file: str | Path) -> None:
        if not Path(tokenizer_file).is_file():
            raise FileNotFoundError(f"GPT-2 tokenizer file not found: {tokenizer_file}")
        super().__init__(tokenizer_file, GPT2_EOS, name="gpt2")
        self._identity = self._identity.replace("gpt2:", "gpt2-bpe:", 1)

    def encode_long(self, text: str) -> list[int]:
        """GPT-2's pre-tokenizer never merges across the chunk boundaries of
        `split_for_encoding`, so the chunks can be encoded in one parallel batch."""
        ids: list[int] = []
        for piece in self.encode_batch(split_for_encoding(text)):
            ids.extend(piece)
        return ids


def load_tokenizer(spec: str, near: str | Path | None = None) -> TextTokenizer:
    """The one tokenizer loader. `spec`:

    - ``"bytes"``: UTF-8 bytes (vocabulary 257: 256 bytes and an end-of-text id);
    - ``"gpt2"``: the shared GPT-2 BPE, ``gpt2-tokenizer/tokenizer.json`` looked for in `near`,
      its parent, then the default data directory;
    - a path to a GPT-2-style ``tokenizer.json``;
    - a Hugging Face model directory (its ``tokenizer.json``: :meth:`BPETokenizer.from_directory`).
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"tokenizer must be 'bytes', 'gpt2' or a path, got {spec!r}")
    if spec == "bytes":
        return ByteTokenizer()
    if spec == "gpt2":
        roots: list[Path] = []
        if near is not None:
            roots += [Path(near), Path(near).parent]
        shared = default_data_dir()
        if shared is not None:
            roots.append(shared)
        tried = [root / GPT2_SUBDIR / "tokenizer.json" for root in roots]
        if not tried:  # the data is what is missing: say so first
            raise FileNotFoundError(
                f"no data directory found (looked for {looked_for()}), and the GPT-2 tokenizer "
                f"(--tokenizer gpt2) is read from it ({GPT2_SUBDIR}/tokenizer.json): give "
                "--data-dir DIR of a data directory that holds it, or choose --tokenizer bytes, "
                "--tokenizer PATH/tokenizer.json, or --base-model DIR (the model's tokenizer)"
            )
        for path in tried:
            if path.is_file():
                return GPT2Tokenizer(path)
        raise FileNotFoundError(
            "GPT-2 tokenizer file not found (tried "
            + (", ".join(str(p) for p in tried) or "no data directory")
            + "); pass --tokenizer PATH/tokenizer.json or --tokenizer bytes"
        )
    path = Path(spec).expanduser()
    if path.is_dir():
        return BPETokenizer.from_directory(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"tokenizer {spec!r} is neither 'bytes', 'gpt2' nor an existing tokenizer.json file"
        )
    return GPT2Tokenizer(path)
