"""Metrics for generated dialogue replies: unigram F1, ROUGE-1/L, METEOR and BLEU (paper §4.3).

The ∞-former paper reports, on CMU-DoG, F1, ROUGE-1, ROUGE-L and METEOR of generated replies
against the human replies (Table 3). :func:`dialogue_scores` computes them, plus corpus BLEU, all
in percent (0–100) like the paper's tables, each per-example metric averaged over examples.

What each metric is (and where the authors' evaluation script differs):

- **F1**: unigram F1 between the bags of words of prediction and reference after the SQuAD
  normalisation (:func:`normalize_answer`); see :func:`unigram_f1`.
- **ROUGE-1 / ROUGE-L**: F-measure from the ``rouge-score`` package with Porter stemming,
  called as documented, ``RougeScorer.score(target, prediction)``. The authors' script calls
  ``score(prediction, target)`` and keeps element 0 of the returned ``Score(precision, recall,
  fmeasure)``: the *precision of the swapped call*, which is overlap / |reference| = the
  **recall** of the proper call (ROUGE-1 counts overlapping unigrams, ROUGE-L the longest common
  subsequence; both are symmetric in the two texts, so swapping the arguments swaps precision and
  recall). The paper's ROUGE numbers are therefore recalls; they are reported here as
  ``rouge1_authors`` / ``rougeL_authors`` for comparison, never as ROUGE.
- **METEOR**: nltk's ``meteor_score([reference_tokens], prediction_tokens)`` with its defaults
  (alpha 0.9, beta 3, gamma 0.5; exact, Porter-stem and WordNet-synonym matching). Tokens are
  the whitespace-separated words (``str.split``), lower-cased by nltk's default ``preprocess``:
  this is what nltk did itself with the raw strings the authors passed (before nltk 3.6.6 made
  pre-tokenised input compulsory), so punctuation stays attached to words ("sat." ≠ "sat").
  nltk looks WordNet synonyms up for the Porter *stems* of the words left unmatched, so a synonym
  counts only when both words are their own stems (car/auto, kid/child match; movie/film do not,
  "movie" stems to "movi"). WordNet must be installed locally (``scripts/setup_dialogue.sh``);
  nothing is downloaded at run time.
- **BLEU**: ``sacrebleu.corpus_bleu(predictions, [references]).score`` with sacreBLEU's defaults
  (13a tokenisation, exponential smoothing, case-sensitive): one corpus-level score.

The authors' script also dropped the last token of every reference before scoring; references
are scored whole here.

Input rules: ``predictions`` and ``references`` are equally long, non-empty lists (or tuples) of
``str``. A reference must contain a non-space character (a ValueError names the first that does
not). An empty or all-space prediction is a valid output of a model and scores 0 on every
per-example metric (F1, ROUGE, METEOR); in BLEU it is an empty hypothesis (no n-gram matches,
only the brevity penalty sees its length).

The metric libraries (``pip install -e ".[dialogue]"``) are imported inside the functions that
use them, so importing this module needs none of them.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Sequence

__all__ = [
    "BLEU_ORDER",
    "SETUP_COMMAND",
    "bleu_from_statistics",
    "bleu_statistics",
    "WordNetMissingError",
    "dialogue_scores",
    "meteor",
    "normalize_answer",
    "require_wordnet",
    "unigram_f1",
]

SETUP_COMMAND = "bash scripts/setup_dialogue.sh"
"""Installs the metric libraries and WordNet (run from the repository root)."""

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


class WordNetMissingError(RuntimeError):
    """nltk cannot find the WordNet database that METEOR needs."""


def normalize_answer(text: str) -> str:
    """The SQuAD normalisation: lower-case, drop punctuation, drop the articles a/an/the, squash
    whitespace (in that order; punctuation is deleted, not replaced: "don't" -> "dont").

    >>> normalize_answer("The cat sat.")
    'cat sat'
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    text = text.lower().translate(_PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def unigram_f1(prediction: str, reference: str) -> float:
    """Unigram F1 in [0, 1] between the normalised prediction and reference (SQuAD's F1).

    With c = the number of shared tokens (multiset intersection), precision = c / |prediction|,
    recall = c / |reference|, F1 = 2·P·R / (P + R); 0 when nothing is shared (in particular when
    either side is empty after normalisation).
    """
    if not isinstance(prediction, str):
        raise TypeError(f"prediction must be a str, got {type(prediction).__name__}")
    if not isinstance(reference, str):
        raise TypeError(f"reference must be a str, got {type(reference).__name__}")
    predicted = normalize_answer(prediction).split()
    expected = normalize_answer(reference).split()
    shared = sum((Counter(predicted) & Counter(expected)).values())
    if shared == 0:
        return 0.0
    precision = shared / len(predicted)
    recall = shared / len(expected)
    return 2 * precision * recall / (precision + recall)


def _import(module: str):
    """Import a metric library, or say how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"the dialogue metrics need {module.split('.')[0]!r}: install them with "
            f'`pip install -e ".[dialogue]"` or `{SETUP_COMMAND}` (also sets up WordNet)'
        ) from error


def require_wordnet():
    """nltk's WordNet reader, loaded; WordNetMissingError (saying how to install it) if absent."""
    corpus = _import("nltk.corpus")
    try:
        corpus.wordnet.ensure_loaded()
    except (LookupError, OSError, ValueError) as error:
        # LookupError: not found (nltk's message suggests a download, which we never do);
        # OSError / ValueError: found but unreadable (a file missing, a symlink nltk refuses)
        found = "" if isinstance(error, LookupError) else f" ({type(error).__name__}: {error})"
        data_path = ", ".join(_import("nltk.data").path)
        raise WordNetMissingError(
            f"METEOR needs the WordNet database, which nltk cannot load from its data path "
            f"({data_path}){found}. Install it, with no download at run time, by "
            f"`{SETUP_COMMAND}` (Debian packages wordnet-base and wordnet-sense-index, copied "
            "to /usr/local/share/nltk_data/corpora/wordnet, or to $NLTK_DATA if set)."
        ) from None
    return corpus.wordnet


def _meteor_tokens(text: str) -> list[str]:
    # whitespace words; nltk lower-cases them (its default preprocess=str.lower)
    return text.split()


def meteor(prediction: str, reference: str) -> float:
    """METEOR in [0, 1] of one prediction against one reference (see the module docstring)."""
    for name, text in (("prediction", prediction), ("reference", reference)):
        if not isinstance(text, str):
            raise TypeError(f"{name} must be a str, got {type(text).__name__}")
    if not reference.strip():
        raise ValueError("reference is empty: it must contain a word")
    return _meteor_scores([prediction], [reference])[0]


def _meteor_scores(predictions: Sequence[str], references: Sequence[str]) -> list[float]:
    wordnet = require_wordnet()
    meteor_score = _import("nltk.translate.meteor_score").meteor_score
    scores = []
    for prediction, reference in zip(predictions, references, strict=True):
        hypothesis = _meteor_tokens(prediction)
        if not hypothesis:
            scores.append(0.0)
            continue
        scores.append(float(meteor_score([_meteor_tokens(reference)], hypothesis, wordnet=wordnet)))
    return scores


def _check_inputs(predictions: Sequence[str], references: Sequence[str]) -> None:
    for name, texts in (("predictions", predictions), ("references", references)):
        if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
            raise TypeError(f"{name} must be a list of str, got {type(texts).__name__}")
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"{name}[{index}] must be a str, got {type(text).__name__}")
    if len(predictions) != len(references):
        raise ValueError(
            f"predictions and references must be equally long, got {len(predictions)} "
            f"predictions and {len(references)} references"
        )
    if not predictions:
        raise ValueError("predictions and references are empty: nothing to score")
    for index, reference in enumerate(references):
        if not reference.strip():
            raise ValueError(
                f"references[{index}] is empty: every reference must contain a word "
                "(leave out examples whose reply has no text)"
            )


def _mean_percent(values: Sequence[float]) -> float:
    return 100.0 * sum(values) / len(values)


def dialogue_scores(predictions: list[str], references: list[str]) -> dict[str, float]:
    """F1, ROUGE-1/L (F-measure), METEOR and corpus BLEU of `predictions` against `references`.

    Returns percentages (0–100): ``f1``, ``rouge1``, ``rougeL``, ``meteor`` (means over examples),
    ``bleu`` (corpus-level sacreBLEU) and ``rouge1_authors``, ``rougeL_authors`` (the ROUGE
    *recall* the ∞-former authors' script reports as ROUGE; see the module docstring).
    Raises TypeError / ValueError on malformed input, ImportError when a metric library is
    missing and WordNetMissingError when WordNet is (both say how to install them).
    """
    _check_inputs(predictions, references)
    rouge_scorer = _import("rouge_score.rouge_scorer")
    sacrebleu = _import("sacrebleu")
    meteor_scores = _meteor_scores(predictions, references)

    scorer = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True)
    f1, rouge1, rouge_l, rouge1_recall, rouge_l_recall = [], [], [], [], []
    for prediction, reference in zip(predictions, references, strict=True):
        f1.append(unigram_f1(prediction, reference))
        if not prediction.strip():
            for values in (rouge1, rouge_l, rouge1_recall, rouge_l_recall):
                values.append(0.0)
            continue
        rouge = scorer.score(reference, prediction)  # score(target, prediction)
        rouge1.append(rouge["rouge1"].fmeasure)
        rouge_l.append(rouge["rougeL"].fmeasure)
        # = scorer.score(prediction, reference)[name][0], the authors' call (module docstring)
        rouge1_recall.append(rouge["rouge1"].recall)
        rouge_l_recall.append(rouge["rougeL"].recall)

    bleu = sacrebleu.corpus_bleu(list(predictions), [list(references)]).score
    return {
        "f1": _mean_percent(f1),
        "rouge1": _mean_percent(rouge1),
        "rougeL": _mean_percent(rouge_l),
        "meteor": _mean_percent(meteor_scores),
        "bleu": float(bleu),
        "rouge1_authors": _mean_percent(rouge1_recall),
        "rougeL_authors": _mean_percent(rouge_l_recall),
    }


# corpus BLEU from statistics that add up over shards (the dialogue task's evaluation)
BLEU_ORDER = 4


def _sacrebleu():
    try:
        from sacrebleu.metrics import BLEU
    except ImportError as error:
        raise ImportError(
            f"the dialogue metrics need sacrebleu: `pip install -e '.[dialogue]'` or "
            f"`{SETUP_COMMAND}`"
        ) from error
    return BLEU


def bleu_statistics(predictions: list[str], references: list[str]) -> dict[str, float]:
    """sacreBLEU's sufficient statistics of a corpus (its defaults: 13a tokens, 4-grams): matching
    and total n-grams per order, hypothesis and reference lengths. They add up over corpora."""
    score = _sacrebleu()().corpus_score(list(predictions), [list(references)])
    stats = {"bleu_sys_len": float(score.sys_len), "bleu_ref_len": float(score.ref_len)}
    for n in range(BLEU_ORDER):
        stats[f"bleu_correct_{n + 1}"] = float(score.counts[n])
        stats[f"bleu_total_{n + 1}"] = float(score.totals[n])
    return stats


def bleu_from_statistics(sums: dict[str, float]) -> float:
    """Corpus BLEU (percent; exponential smoothing, as `sacrebleu.corpus_bleu`) from summed
    statistics; NaN when nothing was generated."""
    if not sums.get("bleu_ref_len"):
        return math.nan
    return float(
        _sacrebleu()
        .compute_bleu(
            correct=[int(sums[f"bleu_correct_{n + 1}"]) for n in range(BLEU_ORDER)],
            total=[int(sums[f"bleu_total_{n + 1}"]) for n in range(BLEU_ORDER)],
            sys_len=int(sums["bleu_sys_len"]),
            ref_len=int(sums["bleu_ref_len"]),
            smooth_method="exp",
        )
        .score
    )
