"""Data: where the shared data lives, tokenizers, tokenised corpora (cached) and document-aware
streams of segments. Readers only: what a task does with the data lives in `inftyformer.tasks`."""

from .corpus import (
    TokenizedCorpus,
    default_cache_dir,
    is_wikitext_dir,
    load_corpus,
    load_split,
    load_wikitext,
    resolve_corpus_dir,
    split_wikitext,
    tokenize_documents,
)
from .paths import SPLITS, check_split, default_data_dir, resolve_data_dir
from .streams import DocumentStreams, StreamBatch
from .tokenizer import ByteTokenizer, GPT2Tokenizer, TextTokenizer, load_tokenizer

__all__ = [
    "SPLITS",
    "ByteTokenizer",
    "DocumentStreams",
    "GPT2Tokenizer",
    "StreamBatch",
    "TextTokenizer",
    "TokenizedCorpus",
    "check_split",
    "default_cache_dir",
    "default_data_dir",
    "is_wikitext_dir",
    "load_corpus",
    "load_split",
    "load_tokenizer",
    "load_wikitext",
    "resolve_corpus_dir",
    "resolve_data_dir",
    "split_wikitext",
    "tokenize_documents",
]
