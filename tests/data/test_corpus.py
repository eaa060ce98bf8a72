"""Data directory lookup, tokenizers and cached corpora (tmp corpora; real data tests marked)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inftyformer.data import (
    ByteTokenizer,
    TokenizedCorpus,
    default_data_dir,
    load_corpus,
    load_tokenizer,
    load_wikitext,
    resolve_data_dir,
    split_wikitext,
)
from inftyformer.data.corpus import flat_split_of, load_split, split_flat_folder
from inftyformer.data.paths import SPLITS
from inftyformer.data.tokenizer import split_for_encoding

BOOKS = {
    "b.txt": "Second book.\n\nIt has two paragraphs.\n",
    "a.txt": "First book — with non-ASCII: café, naïve, 日本.\n",
    "c.txt": "Third.\n",
}


def _make_corpus(root: Path, books: dict[str, str] = BOOKS) -> Path:
    for split in ("train", "valid", "test"):
        (root / split).mkdir(parents=True, exist_ok=True)
    for name, text in books.items():
        (root / "train" / name).write_text(text, encoding="utf-8")
    (root / "valid" / "v.txt").write_text("valid text\n", encoding="utf-8")
    return root


# ---------------------------------------------------------------- data directory


def test_default_data_dir_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("INFTYFORMER_DATA", str(tmp_path))
    assert default_data_dir() == tmp_path.resolve()
    assert resolve_data_dir(None) == tmp_path.resolve()
    missing = tmp_path / "nope"
    monkeypatch.setenv("INFTYFORMER_DATA", str(missing))
    assert default_data_dir() is None  # an explicit choice is not replaced by a fallback
    with pytest.raises(FileNotFoundError, match="nope"):
        resolve_data_dir(None)


def test_no_data_directory_names_each_place_once_and_the_ways_to_give_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from inftyformer.data import paths

    repo = tmp_path / "repo"
    repo.mkdir()
    monkeypatch.delenv("INFTYFORMER_DATA", raising=False)
    monkeypatch.setattr(paths, "_REPO_ROOT", repo)
    monkeypatch.chdir(repo)  # run from the repository root: both places are ../shared/data
    with pytest.raises(FileNotFoundError) as err:
        resolve_data_dir(None)
    message = str(err.value)
    expected = str((tmp_path / "shared" / "data").resolve())
    assert message.count(expected) == 1, message
    assert "--data-dir" in message and "$INFTYFORMER_DATA" in message
    monkeypatch.chdir(tmp_path)  # elsewhere: two different places, both named
    with pytest.raises(FileNotFoundError) as err:
        resolve_data_dir(None)
    assert expected in str(err.value) and str(tmp_path.parent / "shared" / "data") in str(err.value)
    monkeypatch.setenv("INFTYFORMER_DATA", str(tmp_path / "typo"))
    with pytest.raises(FileNotFoundError, match=r"\$INFTYFORMER_DATA is .*typo, which is not a"):
        resolve_data_dir(None)


def test_resolve_data_dir_explicit_path(tmp_path: Path) -> None:
    assert resolve_data_dir(str(tmp_path)) == tmp_path.resolve()
    with pytest.raises(FileNotFoundError, match="missing-dir"):
        resolve_data_dir(tmp_path / "missing-dir")
    with pytest.raises(TypeError, match="data_dir"):
        resolve_data_dir(3)  # type: ignore[arg-type]


# ---------------------------------------------------------------- tokenizers


def test_byte_tokenizer_round_trip() -> None:
    tok = load_tokenizer("bytes")
    assert (tok.vocab_size, tok.eos_id, tok.name) == (257, 256, "bytes")
    text = "naïve 日本"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8")) and max(ids) < 256
    assert tok.decode(ids + [tok.eos_id]) == text  # eos/padding is dropped on decode
    assert tok.encode_long(text) == ids


def test_load_tokenizer_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError, match="neither 'bytes', 'gpt2' nor"):
        load_tokenizer("sentencepiece")
    with pytest.raises(ValueError, match="tokenizer must be"):
        load_tokenizer("")
    monkeypatch.setenv("INFTYFORMER_DATA", str(tmp_path / "no-shared-data"))
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer("gpt2", tmp_path)


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("ab '\n\t.,1")), max_size=300))
def test_split_for_encoding_keeps_text_and_cuts_only_before_whitespace(text: str) -> None:
    pieces = split_for_encoding(text, target_chars=5)
    assert "".join(pieces) == text
    for left, right in zip(pieces, pieces[1:], strict=False):
        assert left[-1].isspace() and right[0].isspace() and not right[1].isspace()


# ---------------------------------------------------------------- corpus directories


def test_load_corpus_bytes(tmp_path: Path) -> None:
    root = _make_corpus(tmp_path / "corpus")
    corpus = load_corpus(
        root, "train", ByteTokenizer(), cache_dir=tmp_path / "cache", progress=False
    )
    assert corpus.doc_names == ("a", "b", "c")  # sorted by file name
    assert corpus.num_docs == 3 and len(corpus) == 3
    for i, name in enumerate(("a.txt", "b.txt", "c.txt")):
        raw = BOOKS[name].encode("utf-8")
        assert corpus.document(i).tolist() == list(raw)
        assert corpus.doc_bytes[i] == len(raw)
    assert corpus.tokens.dtype == np.uint16
    assert corpus.doc_offsets[0] == 0 and corpus.doc_offsets[-1] == corpus.num_tokens
    assert (corpus.vocab_size, corpus.eos_id, corpus.tokenizer_name) == (257, 256, "bytes")
    valid = load_corpus(root, "valid", ByteTokenizer(), cache_dir=tmp_path / "cache")
    assert valid.doc_names == ("v",) and valid.total_bytes == len("valid text\n")


def test_cache_is_reused_and_rebuilt_when_a_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _make_corpus(tmp_path / "corpus")
    cache = tmp_path / "cache"
    tok = ByteTokenizer()
    first = load_corpus(root, "train", tok, cache_dir=cache, progress=False)
    assert not first.from_cache
    assert sorted(p.suffix for p in cache.iterdir()) == [".json", ".npy"]  # no temp files left

    def no_tokenizing(text: str) -> list[int]:
        raise AssertionError("re-tokenised although the cache is valid")

    monkeypatch.setattr(tok, "encode_long", no_tokenizing)
    second = load_corpus(root, "train", tok, cache_dir=cache, progress=False)
    assert second.from_cache
    assert isinstance(second.tokens, np.memmap)
    np.testing.assert_array_equal(second.tokens, first.tokens)
    np.testing.assert_array_equal(second.doc_offsets, first.doc_offsets)
    assert second.doc_names == first.doc_names

    monkeypatch.undo()
    (root / "train" / "c.txt").write_text("Third, edited.\n", encoding="utf-8")
    third = load_corpus(root, "train", tok, cache_dir=cache, progress=False)
    assert not third.from_cache
    assert third.document(2).tolist() == list(b"Third, edited.\n")


def test_cache_key_depends_on_the_tokenizer(tmp_path: Path) -> None:
    class OtherBytes(ByteTokenizer):
        @property
        def identity(self) -> str:
            return "bytes-other"

        def encode(self, text: str) -> list[int]:
            return [min(b, 100) for b in text.encode("utf-8")]

    root = _make_corpus(tmp_path / "corpus")
    load_corpus(root, "train", ByteTokenizer(), cache_dir=tmp_path / "cache", progress=False)
    other = load_corpus(root, "train", OtherBytes(), cache_dir=tmp_path / "cache", progress=False)
    assert not other.from_cache and int(other.tokens.max()) <= 100


def test_env_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _make_corpus(tmp_path / "corpus")
    monkeypatch.setenv("INFTYFORMER_CACHE", str(tmp_path / "envcache"))
    load_corpus(root, "valid", ByteTokenizer(), progress=False)
    assert any((tmp_path / "envcache").glob("*.tokens.npy"))


def test_non_utf8_file_is_named(tmp_path: Path) -> None:
    root = _make_corpus(tmp_path / "corpus")
    (root / "train" / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.txt"):
        load_corpus(root, "train", ByteTokenizer(), cache_dir=tmp_path / "cache")


def test_missing_and_empty_directories(tmp_path: Path) -> None:
    tok, cache = ByteTokenizer(), tmp_path / "cache"
    with pytest.raises(FileNotFoundError, match="absent"):
        load_corpus(tmp_path / "absent", "train", tok, cache_dir=cache)
    (tmp_path / "empty" / "train").mkdir(parents=True)
    (tmp_path / "empty" / "train" / "notes.md").write_text("not a txt")
    with pytest.raises(ValueError, match="no .txt files"):
        load_corpus(tmp_path / "empty", "train", tok, cache_dir=cache)
    with pytest.raises(FileNotFoundError, match="valid"):
        load_corpus(tmp_path / "empty", "valid", tok, cache_dir=cache)
    with pytest.raises(ValueError, match="split"):
        load_corpus(tmp_path / "empty", "dev", tok, cache_dir=cache)
    with pytest.raises(TypeError, match="tokenizer"):
        load_corpus(tmp_path / "empty", "train", "bytes", cache_dir=cache)  # type: ignore[arg-type]


def test_tokenized_corpus_validation_and_wide_dtype() -> None:
    wide = TokenizedCorpus.from_documents([[0, 69999], [5]], vocab_size=70000, eos_id=0)
    assert wide.tokens.dtype == np.int32 and wide.document(0).tolist() == [0, 69999]
    with pytest.raises(ValueError, match="documents"):
        TokenizedCorpus.from_documents([[300]], vocab_size=257, eos_id=256)
    with pytest.raises(ValueError, match="doc_offsets"):
        TokenizedCorpus(
            tokens=np.zeros(3, np.uint16),
            doc_offsets=np.array([0, 2], np.int64),
            doc_bytes=np.zeros(1, np.int64),
            doc_names=("x",),
            vocab_size=257,
            eos_id=256,
        )


# ---------------------------------------------------------------- WikiText

WIKI = (
    " = First Article = \n"
    " Some text about it . \n"
    " = = A section = = \n"
    " More text . \n"
    " = = = Deeper = = = \n"
    " Deep text . \n"
    " = Second = \n"
    " Other text with = signs = inside . \n"
)


def test_split_wikitext_at_top_level_headings_only() -> None:
    docs = split_wikitext(WIKI)
    assert [title for title, _ in docs] == ["First Article", "Second"]
    assert "".join(body for _, body in docs) == WIKI
    assert " = = A section = = \n" in docs[0][1]


def test_load_wikitext(tmp_path: Path) -> None:
    (tmp_path / "wiki.valid.tokens").write_text(WIKI, encoding="utf-8")
    corpus = load_wikitext(tmp_path, "valid", ByteTokenizer(), cache_dir=tmp_path / "c")
    assert corpus.doc_names == ("First Article", "Second")
    assert corpus.total_bytes == len(WIKI.encode()) == corpus.num_tokens
    assert load_wikitext(tmp_path, "valid", ByteTokenizer(), cache_dir=tmp_path / "c").from_cache
    with pytest.raises(FileNotFoundError, match=r"wiki\.test\.tokens"):
        load_wikitext(tmp_path, "test", ByteTokenizer(), cache_dir=tmp_path / "c")


# ---------------------------------------------------------------- the shared data


@pytest.fixture
def data_dir(shared_data: Path) -> Path:
    return shared_data


def test_gpt2_tokenizer(data_dir: Path) -> None:
    tok = load_tokenizer("gpt2", data_dir)
    assert tok.encode("Hello world") == [15496, 995]
    assert (tok.vocab_size, tok.eos_id, tok.name) == (50257, 50256, "gpt2")
    assert tok.identity.startswith("gpt2-bpe:") and tok.identity == load_tokenizer("gpt2").identity
    tricky = "a  \n\n  b\n\n\nc 's\t\t d \n e'll  \n\n'''x  " * 50
    assert tok.encode_long(tricky) == tok.encode(tricky)
    assert tok.decode(tok.encode(tricky)) == tricky


def test_pg19_valid_loads(data_dir: Path, tmp_path: Path) -> None:
    tok = load_tokenizer("gpt2", data_dir)
    corpus = load_corpus(data_dir / "pg19-mini", "valid", tok, cache_dir=tmp_path, progress=False)
    # numbers from pg19-mini/README.md
    assert corpus.num_docs == 3 and corpus.num_tokens == 368_625
    assert corpus.total_bytes == 1_371_131 and corpus.doc_lengths.min() == 63_066
    text = (data_dir / "pg19-mini" / "valid" / f"{corpus.doc_names[0]}.txt").read_text("utf-8")
    assert corpus.document(0)[:200].tolist() == tok.encode(text[:2000])[:200]
    again = load_corpus(data_dir / "pg19-mini", "valid", tok, cache_dir=tmp_path, progress=False)
    assert again.from_cache and again.num_tokens == corpus.num_tokens


def test_wikitext_valid_articles(data_dir: Path, tmp_path: Path) -> None:
    corpus = load_wikitext(
        data_dir / "wikitext103-eval", "valid", ByteTokenizer(), cache_dir=tmp_path, progress=False
    )
    assert corpus.num_docs == 60  # the README's article count
    assert corpus.doc_names[0] == "Homarus gammarus"


# ---------------------------------------------------------------- a flat folder of documents
def test_flat_split_is_by_name_and_holds_out_about_one_in_twenty_each() -> None:
    names = [f"doc{i}.txt" for i in range(4000)]
    splits = [flat_split_of(n) for n in names]
    assert splits == [flat_split_of(n) for n in names]  # deterministic
    for split in ("valid", "test"):
        assert 0.04 < splits.count(split) / len(names) < 0.06
    # adding files never moves another: a file's split depends on its own name only
    big = split_flat_folder([Path(n) for n in names])
    small = split_flat_folder([Path(n) for n in names[:2000]])
    for split in SPLITS:
        assert set(small[split]) <= set(big[split])


def test_small_flat_folders_still_get_valid_and_test() -> None:
    files = [Path(f"{c}.txt") for c in "abc"]
    splits = split_flat_folder(files)
    assert sorted(len(v) for v in splits.values()) == [1, 1, 1]
    with pytest.raises(ValueError, match="at least 3 .txt files"):
        split_flat_folder(files[:2])


def test_load_split_reads_each_layout(tmp_path: Path) -> None:
    tok = ByteTokenizer()
    (tmp_path / "only-test" / "test").mkdir(parents=True)
    (tmp_path / "only-test" / "test" / "a.txt").write_text("abc", encoding="utf-8")
    assert load_split(tmp_path / "only-test", "test", tok).num_tokens == 3
    with pytest.raises(ValueError, match="no .txt files"):
        load_split(tmp_path / "only-test", "valid", tok)  # no valid/ and no flat files
    flat = tmp_path / "flat"
    flat.mkdir()
    for i in range(5):
        (flat / f"{i}.txt").write_text("x" * (i + 1), encoding="utf-8")
    whole = load_split(flat, "test", tok, whole=True)
    assert whole.num_docs == 5 and whole.num_tokens == 15
    parts = [load_split(flat, split, tok) for split in SPLITS]
    assert sum(p.num_docs for p in parts) == 5 and all(p.num_docs for p in parts)
    assert load_split(flat / "3.txt", "valid", tok).num_tokens == 4


def test_a_rewritten_cache_file_is_noticed_and_rebuilt(tmp_path: Path) -> None:
    root = _make_corpus(tmp_path / "corpus")
    cache = tmp_path / "cache"
    tok = ByteTokenizer()
    first = load_corpus(root, "train", tok, cache_dir=cache, progress=False)
    expected, fingerprint = np.array(first.tokens), first.fingerprint()  # first maps the file
    (tokens_file,) = cache.glob("*.tokens.npy")
    tampered = np.load(tokens_file).copy()
    tampered[:5] = (tampered[:5] + 1) % 256  # other ids, all in range: looks valid
    np.save(tokens_file, tampered)
    with pytest.warns(UserWarning, match="does not match the hash recorded beside it"):
        again = load_corpus(root, "train", tok, cache_dir=cache, progress=False)
    assert not again.from_cache  # tokenised again from the text
    np.testing.assert_array_equal(again.tokens, expected)
    assert again.fingerprint() == fingerprint
    third = load_corpus(root, "train", tok, cache_dir=cache, progress=False)  # repaired
    assert third.from_cache and third.fingerprint() == fingerprint


def test_the_fingerprint_follows_the_contents_not_the_counts(tmp_path: Path) -> None:
    tok = ByteTokenizer()
    root = _make_corpus(tmp_path / "corpus")
    before = load_corpus(root, "train", tok, use_cache=False, progress=False)
    path = sorted((root / "train").glob("*.txt"))[0]
    path.write_text(path.read_text().swapcase(), encoding="utf-8")  # same length, other text
    after = load_corpus(root, "train", tok, use_cache=False, progress=False)
    assert after.num_tokens == before.num_tokens and after.num_docs == before.num_docs
    assert after.fingerprint() != before.fingerprint()


def test_temporary_files_of_a_killed_writer_are_swept_when_the_cache_is_opened(
    tmp_path: Path,
) -> None:
    """A process killed while writing a cache entry leaves `.NAME.tokens.npy.tmpPID`: the next
    process to open the cache removes those whose process is gone, and keeps a live one's."""
    import os
    import subprocess

    from inftyformer.data import cache as corpus_cache

    child = subprocess.Popen(["true"])  # a process that has ended: its pid
    child.wait()
    dead = child.pid
    cache = tmp_path / "cache"
    cache.mkdir()
    stale = [cache / f".txtdir-train-abc.tokens.npy.tmp{dead}",
             cache / f".txtdir-train-abc.meta.json.tmp{dead}"]  # fmt: skip
    live = cache / f".txtdir-train-def.tokens.npy.tmp{os.getpid()}"
    other = cache / f".notes.txt.tmp{dead}"  # not the cache's: left alone
    for path in (*stale, live, other):
        path.write_bytes(b"half")
    root = _make_corpus(tmp_path / "corpus")
    load_corpus(root, "train", ByteTokenizer(), cache_dir=cache, progress=False)
    assert not any(p.exists() for p in stale)
    assert live.exists() and other.exists()
    assert cache in corpus_cache._swept
