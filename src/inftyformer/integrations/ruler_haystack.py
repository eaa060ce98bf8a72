"""RULER's essay-haystack needle tasks offline: the embedded books as the haystack.

lm_eval's `niah_single_2`, `niah_single_3`, `niah_multikey_1`, `niah_multivalue` and
`niah_multiquery` hide their needles in Paul Graham's essays (a Hugging Face Hub data set) and
split that text into sentences with nltk's punkt_tab model; both are downloaded at run time. The
`*_books` tasks of the folder `TASKS_DIR` (lm_eval's `--include_path`) are the same tasks, made by
lm_eval's own generator (`prepare_niah.generate_samples`: its template, needles, depths and
scoring), with two changes:

- the haystack is the novels the package carries (`data/austen`, public domain), joined in the
  order of `book_files` and split into words as lm_eval splits the essays;
- the sentences are split by a Punkt model that nltk's unsupervised trainer learns from those
  novels (made once, ~20 s, kept in the package's cache folder, `punkt_root`), which nltk finds
  on its data path where no punkt_tab of its own is installed (where one is, nltk's is used).

    lm_eval --include_path "$(python -m inftyformer.integrations.ruler_haystack)" \\
        --tasks niah_multikey_1_books --metadata '{"max_seq_lengths": [4096]}' ...
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from ..data.corpus import _split_files
from ..data.paths import EMBEDDED_CORPUS, SPLITS

TASKS_DIR = Path(__file__).parent / "ruler_tasks"
ENGLISH = "tokenizers/punkt_tab/english"  # where nltk's sent_tokenize looks for its model
PUNKT_FILES = ("collocations.tab", "sent_starters.txt", "abbrev_types.txt", "ortho_context.tab")

# each task's needles, as lm_eval's niah_utils makes its essay-haystack tasks
NEEDLES = {
    "niah_single_2": {"type_needle_k": "words", "type_needle_v": "numbers"},
    "niah_single_3": {"type_needle_k": "words", "type_needle_v": "uuids"},
    "niah_multikey_1": {"type_needle_k": "words", "type_needle_v": "numbers", "num_needle_k": 4},
    "niah_multivalue": {"type_needle_k": "words", "type_needle_v": "numbers", "num_needle_v": 4},
    "niah_multiquery": {"type_needle_k": "words", "type_needle_v": "numbers", "num_needle_q": 4},
}


def book_files(root: Path = EMBEDDED_CORPUS) -> list[Path]:
    """The novels in the haystack's order: split by split (train, valid, test), by file name,
    as the corpus loaders list them."""
    return [p for split in SPLITS for p in _split_files(root, split)]


def book_text(root: Path = EMBEDDED_CORPUS) -> str:
    return " ".join(p.read_text(encoding="utf-8") for p in book_files(root))


def haystack(text: str) -> list[str]:
    """`text` as lm_eval's essay haystack: every run of white space one space, split at it."""
    return re.sub(r"\s+", " ", text).split(" ")


def punkt_root(text: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """An nltk data folder whose `tokenizers/punkt_tab/english` is a Punkt model learned from
    `text` by nltk's unsupervised trainer: made the first time (the folder appears whole or not
    at all), found again by a hash of `text` and nltk's version."""
    import nltk
    from nltk.tabdata import TabEncoder
    from nltk.tokenize.punkt import PunktTrainer

    from .._files import atomic_path
    from ..data.cache import default_cache_dir

    key = hashlib.sha256(f"{nltk.__version__}\0{text}".encode()).hexdigest()[:16]
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    root = cache / f"punkt-{key}"
    if all((root / ENGLISH / f).is_file() for f in PUNKT_FILES):
        return root
    trainer = PunktTrainer()
    trainer.train(text, finalize=True)
    params, tab = trainer.get_params(), TabEncoder()
    contents = {
        "collocations.tab": tab.tups2tab(params.collocations),
        "sent_starters.txt": tab.set2txt(params.sent_starters),
        "abbrev_types.txt": tab.set2txt(params.abbrev_types),
        "ortho_context.tab": tab.ivdict2tab(params.ortho_context),
    }
    cache.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_path(root) as made:
            (made / ENGLISH).mkdir(parents=True)
            for name, content in contents.items():
                (made / ENGLISH / name).write_text(content, encoding="utf-8", newline="")
    except OSError:  # made meanwhile by another process: its folder holds the same model
        if not root.is_dir():
            raise
    return root


def find_punkt(root: Path) -> None:
    """`root` on nltk's data path, after its own folders (an installed punkt_tab comes first)."""
    import nltk

    if str(root) not in nltk.data.path:
        nltk.data.path.append(str(root))


def books_samples(
    task: str, text: str | None = None, cache_dir: str | os.PathLike | None = None, **kwargs
) -> dict:
    """lm_eval's data of `task` (a key of `NEEDLES`) with `text` (default: the books) as its
    haystack: 500 prompts of each of the metadata's `max_seq_lengths`, in the tokenizer of its
    `pretrained` (or `tokenizer`), as lm_eval's niah_utils makes them."""
    if task not in NEEDLES:
        raise ValueError(f"unknown task {task!r}; known: {', '.join(NEEDLES)}")
    text = book_text() if text is None else text
    find_punkt(punkt_root(text, cache_dir))  # before lm_eval's module looks for punkt_tab
    from lm_eval.tasks.ruler.common_utils import (
        DEFAULT_SEQ_LENGTHS,
        get_tokenizer,
        resolve_tokenizer_name,
    )
    from lm_eval.tasks.ruler.niah_utils import TEMPLATE, download_dataset
    from lm_eval.tasks.ruler.prepare_niah import generate_samples

    lengths = kwargs.pop("max_seq_lengths", DEFAULT_SEQ_LENGTHS)
    tokenizer = get_tokenizer(resolve_tokenizer_name(kwargs))
    words = haystack(text)
    return download_dataset(
        generate_samples(
            words,
            max_seq_length=length,
            template=TEMPLATE,
            type_haystack="essay",
            num_samples=500,
            TOKENIZER=tokenizer,
            **NEEDLES[task],
        )
        for length in lengths
    )


if __name__ == "__main__":
    print(TASKS_DIR)
