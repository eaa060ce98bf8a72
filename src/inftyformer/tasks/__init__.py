"""Tasks (data only): the sorting generator, long-document corpora and document-aware batching.

Imports nothing from models, training or the CLI.
"""

from .batching import DocumentStreams, StreamBatch
from .corpus import (
    TokenizedCorpus,
    default_cache_dir,
    load_corpus,
    load_wikitext,
    split_wikitext,
    tokenize_documents,
)
from .data_dir import default_data_dir, resolve_data_dir
from .sorting import (
    IGNORE_INDEX,
    NUM_SYMBOLS,
    NUM_TARGETS,
    PAD,
    SEP,
    SORTING_VOCAB,
    SortingConfig,
    SortingDataset,
    chance_accuracy,
    sample_symbols,
    segment_bounds,
    sorting_batch,
    sorting_example,
    sorting_targets,
)
from .tokenizer import ByteTokenizer, GPT2Tokenizer, TextTokenizer, load_tokenizer

__all__ = [
    "IGNORE_INDEX",
    "NUM_SYMBOLS",
    "NUM_TARGETS",
    "PAD",
    "SEP",
    "SORTING_VOCAB",
    "ByteTokenizer",
    "DocumentStreams",
    "GPT2Tokenizer",
    "SortingConfig",
    "SortingDataset",
    "StreamBatch",
    "TextTokenizer",
    "TokenizedCorpus",
    "chance_accuracy",
    "default_cache_dir",
    "default_data_dir",
    "load_corpus",
    "load_tokenizer",
    "load_wikitext",
    "resolve_data_dir",
    "sample_symbols",
    "segment_bounds",
    "sorting_batch",
    "sorting_example",
    "sorting_targets",
    "split_wikitext",
    "tokenize_documents",
]
