"""Dialogue metrics against values worked out by hand (the comments show the arithmetic).

The F1 tests need nothing beyond the package. The others need the `dialogue` extra (nltk,
rouge-score, sacrebleu) and the METEOR ones WordNet (`bash scripts/setup_dialogue.sh`): they skip,
saying so, when those are absent, except under CI (`CI` set), which installs them, where a
missing one fails the test instead of hiding behind a skip.
"""

import importlib
import os

import pytest

from inftyformer.metrics import (
    WordNetMissingError,
    dialogue_scores,
    meteor,
    normalize_answer,
    require_wordnet,
    unigram_f1,
)

IN_CI = bool(os.environ.get("CI"))


def _need(module: str):
    if IN_CI:
        return importlib.import_module(module)
    return pytest.importorskip(
        module, reason=f"{module} not installed (bash scripts/setup_dialogue.sh installs it)"
    )


@pytest.fixture
def libraries():
    """The three metric libraries (dialogue_scores computes every metric at once)."""
    for module in ("nltk", "rouge_score", "sacrebleu"):
        _need(module)


@pytest.fixture
def wordnet(libraries):
    try:
        return require_wordnet()
    except WordNetMissingError as error:
        if IN_CI:
            raise
        pytest.skip(f"WordNet not installed: {error}")


def _scores(predictions, references):
    return dialogue_scores(list(predictions), list(references))


# ----------------------------------------------------------------------------- F1 (no libraries)


def test_normalize_answer_squad_rules():
    # lower-case, punctuation deleted (not spaced: "don't" -> "dont"), a/an/the dropped,
    # whitespace squashed; "there" and "another" keep their letters (articles are whole words)
    assert normalize_answer("The cat sat.") == "cat sat"
    assert normalize_answer("  An  apple, a DAY; don't!  ") == "apple day dont"
    assert normalize_answer("There is another theme") == "there is another theme"
    assert normalize_answer("The. A, an!") == ""


def test_unigram_f1_hand_values():
    # "The cat sat." -> [cat, sat]; "a cat sat down" -> [cat, sat, down]: 2 shared,
    # P = 2/2 = 1, R = 2/3, F1 = 2 * 1 * 2/3 / (1 + 2/3) = 0.8
    assert unigram_f1("The cat sat.", "a cat sat down") == pytest.approx(0.8)
    # multiset: [cat, cat, cat] vs [cat]: 1 shared, P = 1/3, R = 1, F1 = (2/3) / (4/3) = 0.5
    assert unigram_f1("cat cat cat", "cat") == pytest.approx(0.5)
    # nothing shared, or nothing left after normalisation -> 0
    assert unigram_f1("dog", "cat") == 0.0
    assert unigram_f1("", "cat") == 0.0
    assert unigram_f1("the", "a") == 0.0
    assert unigram_f1("Cat sat", "the cat, sat") == pytest.approx(1.0)


def test_unigram_f1_rejects_non_strings():
    with pytest.raises(TypeError, match="prediction must be a str"):
        unigram_f1(None, "cat")
    with pytest.raises(TypeError, match="reference must be a str"):
        unigram_f1("cat", ["cat"])


# ------------------------------------------------------------------------------------ ROUGE


# ROUGE tokens (rouge-score): lower-cased, non-alphanumerics as spaces, Porter stems of tokens
# longer than 3 characters.
#   pair A: "The cats were sitting" -> [the, cat, were, sit]   ("cats" -> "cat" by stemming)
#           "the cat sat on the mat" -> [the, cat, sat, on, the, mat]
#     ROUGE-1: overlap {the, cat} = 2: P = 2/4, R = 2/6, F = 2 * 1/2 * 1/3 / (5/6) = 0.4
#              (without the stemmer "cats" != "cat": overlap 1, F = 0.2)
#     ROUGE-L: LCS "the cat" = 2: same P, R, F = 0.4
#   pair B: "mat the cat" vs the same reference
#     ROUGE-1: overlap {mat, the, cat} = 3: P = 3/3, R = 3/6, F = 2 * 1/2 / (3/2) = 2/3
#     ROUGE-L: LCS "the cat" = 2 ("mat" comes first here, last there): P = 2/3, R = 2/6,
#              F = 2 * 2/9 / 1 = 4/9
PAIR_A = ("The cats were sitting", "the cat sat on the mat")
PAIR_B = ("mat the cat", "the cat sat on the mat")


def test_rouge_f_measure_hand_values(wordnet):
    scores = _scores(*zip(PAIR_A, PAIR_B, strict=True))
    assert scores["rouge1"] == pytest.approx(100 * (0.4 + 2 / 3) / 2)  # 53.333...
    assert scores["rougeL"] == pytest.approx(100 * (0.4 + 4 / 9) / 2)  # 42.222...
    single = _scores([PAIR_A[0]], [PAIR_A[1]])
    assert single["rouge1"] == pytest.approx(40.0)
    assert single["rougeL"] == pytest.approx(40.0)


def test_rouge_authors_variant_is_recall(wordnet):
    # recalls: pair A R1 = 2/6, RL = 2/6; pair B R1 = 3/6, RL = 2/6
    scores = _scores(*zip(PAIR_A, PAIR_B, strict=True))
    assert scores["rouge1_authors"] == pytest.approx(100 * (1 / 3 + 1 / 2) / 2)  # 41.666...
    assert scores["rougeL_authors"] == pytest.approx(100 / 3)  # 33.333...
    # ... and that is what the authors' call computes: score(prediction, target)[name][0], the
    # precision of the swapped call, equals the recall of the documented score(target, prediction)
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True)
    for prediction, reference in (PAIR_A, PAIR_B):
        proper = scorer.score(reference, prediction)
        swapped = scorer.score(prediction, reference)
        for name in ("rouge1", "rougeL"):
            assert swapped[name][0] == pytest.approx(proper[name].recall)
            assert swapped[name][0] != pytest.approx(proper[name].fmeasure)


# ------------------------------------------------------------------------------------- BLEU


def test_bleu_identical_disjoint_and_one_substitution(wordnet):
    references = ["the cat sat on the mat", "a dog ran in the park today"]
    assert _scores(references, references)["bleu"] == pytest.approx(100.0)
    disjoint = ["one two three four five six", "seven eight nine ten eleven twelve"]
    assert _scores(disjoint, references)["bleu"] == 0.0
    # 8 words, the last replaced: n-gram precisions 7/8, 6/7, 5/6, 4/5 (every n-gram but those
    # holding the last word matches), equal lengths so no brevity penalty:
    # BLEU = (7/8 * 6/7 * 5/6 * 4/5) ** (1/4) = (1/2) ** (1/4) = 0.8409
    reference = "one two three four five six seven eight"
    prediction = "one two three four five six seven nine"
    assert _scores([prediction], [reference])["bleu"] == pytest.approx(100 * 0.5**0.25, abs=1e-9)


# ----------------------------------------------------------------------------------- METEOR


# nltk's METEOR (alpha 0.9, beta 3, gamma 0.5) with m matched unigrams, P = m / |prediction|,
# R = m / |reference|, c chunks (runs of matches contiguous in both):
#   Fmean = P R / (alpha P + (1 - alpha) R),  penalty = gamma (c / m) ** beta,
#   METEOR = Fmean (1 - penalty).
# Identical n-word sentences: P = R = 1, c = 1: METEOR = 1 - 0.5 / n**3 (not 1: the
# fragmentation penalty never vanishes); n = 4: 1 - 0.5 / 64 = 0.9921875.
def test_meteor_identical_sentences(wordnet):
    assert meteor("the car was fast", "the car was fast") == 0.9921875
    assert meteor("The Car was FAST", "the car was fast") == 0.9921875  # lower-cased
    seven = "hello there my friend how are you"
    assert meteor(seven, seven) == pytest.approx(1 - 0.5 / 7**3)  # 0.998542...
    assert _scores(["the car was fast"], ["the car was fast"])["meteor"] == 99.21875


def test_meteor_wordnet_synonym_beats_exact_only(wordnet):
    # "car" and "auto" share a WordNet synset (both are their own Porter stems, which is what
    # nltk looks up): all 4 words match in one chunk, as for identical sentences: 0.9921875.
    reference = "the auto was fast"
    assert meteor("the car was fast", reference) == 0.9921875
    # "bus" matches nothing: m = 3, P = R = 3/4, Fmean = 3/4, chunks [the] [was fast]: c = 2,
    # penalty = 0.5 (2/3)**3 = 4/27, METEOR = 3/4 * 23/27 = 23/36 = 0.638888...
    assert meteor("the bus was fast", reference) == pytest.approx(23 / 36)
    # nltk stems before the WordNet look-up: "movie" -> "movi" has no synsets, so the synonyms
    # movie/film do not match (the same 23/36 as no match)
    assert meteor("the movie was fast", "the film was fast") == pytest.approx(23 / 36)


def test_meteor_tokens_are_whitespace_words(wordnet):
    # "sat." (punctuation attached) is not "sat": m = 2 of 3, P = R = Fmean = 2/3, one chunk,
    # penalty = 0.5 (1/2)**3 = 1/16, METEOR = 2/3 * 15/16 = 0.625
    assert meteor("The cat sat.", "the cat sat") == pytest.approx(0.625)


def test_meteor_missing_wordnet_says_how_to_install(libraries, monkeypatch):
    import nltk.corpus
    from nltk.corpus.reader import WordNetCorpusReader
    from nltk.corpus.util import LazyCorpusLoader

    absent = LazyCorpusLoader("wordnet_not_installed_here", WordNetCorpusReader, None)
    monkeypatch.setattr(nltk.corpus, "wordnet", absent)
    with pytest.raises(WordNetMissingError, match="scripts/setup_dialogue.sh") as caught:
        dialogue_scores(["the cat"], ["the cat"])
    assert "wordnet-base" in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_missing_library_says_how_to_install(wordnet, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "sacrebleu", None)  # makes `import sacrebleu` fail
    with pytest.raises(ImportError, match=r"'sacrebleu'.*\.\[dialogue\]"):
        dialogue_scores(["the cat"], ["the cat"])


# ------------------------------------------------------------------------------ edge cases


def test_empty_prediction_scores_zero(wordnet):
    for empty in ("", "   "):
        scores = _scores([empty], ["the cat sat on the mat"])
        assert scores == {name: 0.0 for name in scores}
        assert meteor(empty, "the cat sat on the mat") == 0.0
    # averaged with a perfect example: half of each per-example maximum
    scores = _scores(["", "the car was fast"], ["the cat sat on the mat", "the car was fast"])
    assert scores["f1"] == pytest.approx(50.0)
    assert scores["rouge1"] == pytest.approx(50.0)
    assert scores["meteor"] == pytest.approx(100 * 0.9921875 / 2)


def test_keys_and_ranges(wordnet):
    scores = _scores(["a cat sat on a mat", "hello"], ["the cat sat on the mat", "hi there"])
    assert set(scores) == {
        "f1",
        "rouge1",
        "rougeL",
        "meteor",
        "bleu",
        "rouge1_authors",
        "rougeL_authors",
    }
    assert all(isinstance(value, float) and 0.0 <= value <= 100.0 for value in scores.values())
    # F1: [cat, sat, on, mat] on both sides: 1; [hello] vs [hi, there]: 0
    assert scores["f1"] == pytest.approx(50.0)


@pytest.mark.parametrize(
    ("predictions", "references", "error", "message"),
    [
        ([], [], ValueError, "empty"),
        (["a b"], ["a b", "c d"], ValueError, "1 predictions and 2 references"),
        (["a b"], [""], ValueError, r"references\[0\] is empty"),
        (["a b", "c"], ["a b", " \n"], ValueError, r"references\[1\] is empty"),
        (["a b", 3], ["a b", "c"], TypeError, r"predictions\[1\] must be a str, got int"),
        (["a b"], [None], TypeError, r"references\[0\] must be a str, got NoneType"),
        ("a b", ["a b"], TypeError, "predictions must be a list of str, got str"),
        (["a b"], {"a b"}, TypeError, "references must be a list of str, got set"),
    ],
)
def test_bad_input_raises_before_any_library(predictions, references, error, message):
    with pytest.raises(error, match=message):
        dialogue_scores(predictions, references)


def test_meteor_bad_input():
    with pytest.raises(TypeError, match="prediction must be a str"):
        meteor(["the", "cat"], "the cat")
    with pytest.raises(ValueError, match="reference is empty"):
        meteor("the cat", " ")
