"""`inftyformer.retrieval.pipeline`: the transformers pipeline "inftyformer-ask" reads a context
into the retrieval memory and answers with `DocumentReader`: with a window holding the whole
stream its answer is the base's own greedy `generate`; a list of questions reads the context
once and answers each as asking it alone would; bad input is refused by name."""

import pytest
import torch
from ask_models import DOCUMENT, NEW, QUESTION, SMALL, TEXT, WHOLE, count_reads, python_answer

from inftyformer.retrieval import RetrievalConfig, RetrievalQuestionPipeline, register_pipeline
from inftyformer.retrieval.ask import DocumentReader
from inftyformer.retrieval.model import RetrievalLM

QUESTIONS = [QUESTION, "who wrote the letter?", "what did the signal say about the book?"]


@pytest.fixture(scope="module")
def ask(chat_dir):
    """The pipeline as a user builds it: registered, then `transformers.pipeline(task, …)`."""
    from transformers import pipeline

    return pipeline(register_pipeline(), model=str(chat_dir), device="cpu")


def config(settings: dict) -> RetrievalConfig:
    return RetrievalConfig.from_preset("retrieval", **settings)


def tokens(pipe, context, question, settings=SMALL, **options):
    """The answer's token ids (each answer's, for a list of questions or contexts)."""
    options = {"max_new_tokens": NEW, "retrieval_config": config(settings), **options}
    out = pipe(context, question=question, return_tokens=True, **options)
    return [o["tokens"] for o in out] if isinstance(out, list) else out["tokens"]


def test_the_task_is_registered_once_and_builds_the_pipeline(ask):
    from transformers.pipelines import PIPELINE_REGISTRY

    entry = PIPELINE_REGISTRY.supported_tasks["inftyformer-ask"]
    assert entry["impl"] is RetrievalQuestionPipeline
    assert register_pipeline() == "inftyformer-ask"
    assert PIPELINE_REGISTRY.supported_tasks["inftyformer-ask"] is entry  # not registered again
    assert isinstance(ask, RetrievalQuestionPipeline)
    assert ask.device == torch.device("cpu") and ask.model.device == torch.device("cpu")


def test_a_window_holding_the_stream_answers_as_the_bases_own_greedy_generate(ask, chat_dir):
    """Everything read sits at its true distance: the answer's tokens are the base's greedy
    continuation of the same chat-templated prompt (no retrieval, a fresh copy of the base)."""
    from transformers import AutoModelForCausalLM

    document = TEXT * 2
    out = ask(
        document,
        question=QUESTION,
        retrieval_config=config(WHOLE),
        max_new_tokens=NEW,
        return_tokens=True,
    )
    reader = DocumentReader(RetrievalLM(ask.model, config(WHOLE)), ask.tokenizer)
    prompt = reader.document_tokens(document) + reader.question_tokens(QUESTION)
    assert len(prompt) + NEW < WHOLE["window"]
    assert ask.tokenizer.decode(prompt).endswith(QUESTION + "<|im_end|>\n<|im_start|>assistant\n")
    base = AutoModelForCausalLM.from_pretrained(str(chat_dir), dtype=torch.float32).eval()
    generated = base.generate(
        torch.tensor([prompt]),
        max_new_tokens=NEW,
        do_sample=False,
        eos_token_id=sorted(reader.stop),
        pad_token_id=0,
    )
    expected = generated[0, len(prompt) :].tolist()
    assert len(expected) == NEW  # no stop token: a whole answer compared
    assert out == {
        "answer": ask.tokenizer.decode(expected, skip_special_tokens=True),
        "tokens": expected,
    }


def test_the_default_is_greedy_and_the_preset_is_document_readers(ask, chat_dir):
    """No sampling options: DocumentReader's greedy answer; no preset: DocumentReader's
    "retrieval", whose context (17 blocks of 64 and a window of 960) the tiny base's 512
    positions cannot hold: both refuse it alike."""
    expected, _ = python_answer(chat_dir)  # preset "retrieval" with SMALL on top
    assert tokens(ask, DOCUMENT, QUESTION) == expected
    too_long = r"the context \(2111 positions\) and a segment \(256\) pass the base's 512"
    with pytest.raises(ValueError, match=too_long):
        DocumentReader.from_base(chat_dir)
    with pytest.raises(ValueError, match=too_long):
        ask(DOCUMENT, question=QUESTION)


def test_several_questions_read_the_context_once_and_answer_as_alone(ask, monkeypatch):
    """A list of questions: one reading of the context, then each question and its answer
    (all but the last token read); the answers are those of asking each question alone, with
    a window of 32 (most of the context in the store, questions' blocks joining it)."""
    alone = [tokens(ask, DOCUMENT, q) for q in QUESTIONS]
    read = count_reads(monkeypatch)
    assert tokens(ask, DOCUMENT, QUESTIONS) == alone
    assert all(len(answer) == NEW for answer in alone)  # none stopped early
    reader = DocumentReader(RetrievalLM(ask.model, config(SMALL)), ask.tokenizer)
    asked = [len(reader.question_tokens(q)) + NEW - 1 for q in QUESTIONS]
    assert read[0] == len(reader.document_tokens(DOCUMENT)) + sum(asked)
    read[0] = 0
    assert tokens(ask, DOCUMENT, tuple(QUESTIONS[:1])) == alone[:1]  # a tuple is a list
    assert read[0] == len(reader.document_tokens(DOCUMENT)) + asked[0]


def test_a_list_of_contexts_is_a_list_of_their_answers(ask):
    other = "said the signal. " * 9
    both = tokens(ask, [DOCUMENT, other], QUESTION)
    assert both == [tokens(ask, DOCUMENT, QUESTION), tokens(ask, other, QUESTION)]
    assert both[0] != both[1]  # each its own context's


def test_options_of_the_construction_hold_unless_a_call_changes_them(chat_dir, ask):
    from transformers import pipeline

    short = pipeline(
        "inftyformer-ask",
        model=str(chat_dir),
        device="cpu",
        max_new_tokens=3,
        retrieval_config=config(SMALL),
    )
    first = short(DOCUMENT, question=QUESTION, return_tokens=True)["tokens"]
    assert len(first) == 3
    # a call's temperature 0 keeps the construction's max_new_tokens and retrieval_config (the
    # default preset would not fit the tiny base)
    assert short(DOCUMENT, question=QUESTION, temperature=0.0, return_tokens=True)["tokens"] == (
        first
    )
    longer = short(DOCUMENT, question=QUESTION, max_new_tokens=5, return_tokens=True)["tokens"]
    assert longer == tokens(ask, DOCUMENT, QUESTION, max_new_tokens=5)
    assert longer[:3] == first and len(longer) == 5


@pytest.mark.parametrize(
    "context, options, error, message",
    [
        ("", {"question": QUESTION}, ValueError, "context is empty"),
        ("  \n", {"question": QUESTION}, ValueError, "context is empty"),
        (3, {"question": QUESTION}, TypeError, "context must be text, got int"),
        ([], {"question": QUESTION}, ValueError, "the list of contexts is empty"),
        (DOCUMENT, {}, ValueError, "no question: pass question="),
        (DOCUMENT, {"question": 7}, TypeError, "question must be text or a list of texts, got int"),
        (DOCUMENT, {"question": [QUESTION, None]}, TypeError, "got NoneType"),
        (DOCUMENT, {"question": []}, ValueError, "the list of questions is empty"),
        (DOCUMENT, {"question": " "}, ValueError, "question is empty"),
        (
            DOCUMENT,
            {"question": QUESTION, "preset": "nope"},
            ValueError,
            "unknown retrieval preset 'nope'",
        ),
        (
            DOCUMENT,
            {"question": QUESTION, "preset": "window", "retrieval_config": config(SMALL)},
            ValueError,
            "a preset or a retrieval_config, not both",
        ),
        (
            DOCUMENT,
            {"question": QUESTION, "retrieval_config": {"window": 8}},
            TypeError,
            "retrieval_config must be a RetrievalConfig, got dict",
        ),
        (DOCUMENT, {"question": QUESTION, "top_k": 2}, TypeError, "unknown option(s) top_k"),
        (DOCUMENT, {"question": QUESTION, "batch_size": 2}, ValueError, "batch_size must be 1"),
        (
            DOCUMENT,
            {"question": QUESTION, "max_new_tokens": 0},
            ValueError,
            "max_new_tokens must be ≥ 1, got 0",
        ),
        (
            DOCUMENT,
            {"question": QUESTION, "temperature": -1.0},
            ValueError,
            "temperature must be ≥ 0",
        ),
    ],
)
def test_bad_input_is_refused_by_name_before_reading(
    ask, monkeypatch, context, options, error, message
):
    read = count_reads(monkeypatch)
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        ask(context, **options)
    assert read[0] == 0


def test_an_unknown_preset_at_construction_and_a_missing_tokenizer_are_refused(chat_dir, ask):
    from transformers import pipeline

    with pytest.raises(ValueError, match="unknown retrieval preset 'nope'"):
        pipeline("inftyformer-ask", model=ask.model, tokenizer=ask.tokenizer, preset="nope")
    with pytest.raises(ValueError, match="needs the base's tokenizer"):
        RetrievalQuestionPipeline(model=ask.model, device="cpu")
