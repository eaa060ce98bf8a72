"""A transformers pipeline that answers questions on a long context with the retrieval memory:
the context is read once into a `RetrievalLM` memory on the pipeline's model, then each
question is asked from that memory (`ask.DocumentReader`: the chat template, greedy answers
that stop at the end-of-sequence tokens).

    from transformers import pipeline
    from inftyformer.retrieval import RetrievalConfig, register_pipeline

    register_pipeline()                                   # the task "inftyformer-ask"
    ask = pipeline("inftyformer-ask", model="models/smollm2-135m", device="cpu")
    ask(book, question="Who wrote the letter?")           # {"answer": "…"}
    ask(book, question=["Who?", "When?"])                 # [{"answer": …}, …]: book read once
    ask(book, question="Who?", preset="streaming", max_new_tokens=64)  # a baseline
    ask(book, question="Who?", retrieval_config=RetrievalConfig.from_preset("retrieval",
                                                                            window=448))

Options, at the pipeline's construction or per call (a call's replace the construction's):
`question` (a text or a list of texts), `max_new_tokens` (256), `temperature` (0: greedy) and
`generator`, `preset` (default "retrieval") or `retrieval_config` (a `RetrievalConfig`; not
`config`, which transformers' `pipeline()` takes as the model's own config), `return_tokens`
(each answer's token ids too, under "tokens"). A list of contexts gives a list of their
results, each context read on its own. The model runs on the pipeline's device (`device=`;
transformers moves it there). A bad option is refused before the context is read.

Why a registration function and not registration on import: importing the package must not
change transformers' task table; the user who wants the task asks for it, once.
"""

from __future__ import annotations

from typing import Any

from transformers import AutoModelForCausalLM, Pipeline
from transformers.pipelines import PIPELINE_REGISTRY

from .ask import DEFAULT_PRESET, DocumentReader, check_answer_options
from .config import RetrievalConfig
from .model import RetrievalLM

TASK = "inftyformer-ask"
_ANSWER_OPTIONS = ("max_new_tokens", "temperature", "generator")
# passed on to the pipeline by transformers' `pipeline()` though not an option of ours
_FACTORY_OPTIONS = ("local_files_only",)


class RetrievalQuestionPipeline(Pipeline):
    """Answer questions on a long context with the retrieval memory (module doc)."""

    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_video_processor = False
    _load_feature_extractor = False

    def __init__(self, model: Any, tokenizer: Any = None, **kwargs: Any) -> None:
        if tokenizer is None:
            raise ValueError("the pipeline needs the base's tokenizer (tokenizer=…)")
        super().__init__(model=model, tokenizer=tokenizer, **kwargs)

    def __call__(self, context: Any, question: Any = None, **kwargs: Any) -> Any:
        """{"answer": text} for `question` on `context` (a list of them for a list of
        questions, the context read once); options: module doc."""
        batch = kwargs.get("batch_size", self._batch_size)
        if batch not in (None, 1):
            raise ValueError(
                f"the pipeline reads one context at a time: batch_size must be 1, got {batch!r}"
            )
        if isinstance(context, list | tuple) and not context:
            raise ValueError("no context: the list of contexts is empty")
        if isinstance(context, tuple):
            context = list(context)
        return super().__call__(context, question=question, **kwargs)

    def _sanitize_parameters(
        self,
        question: Any = None,
        preset: str | None = None,
        retrieval_config: RetrievalConfig | None = None,
        return_tokens: bool | None = None,
        **options: Any,
    ) -> tuple[dict, dict, dict]:
        """The options (module doc) for `preprocess`, `_forward` and `postprocess`; the
        retrieval's settings are resolved and the answer's options checked here, so a bad one
        is refused before any reading."""
        unknown = sorted(set(options) - set(_ANSWER_OPTIONS) - set(_FACTORY_OPTIONS))
        if unknown:
            known = ("question", "preset", "retrieval_config", "return_tokens", *_ANSWER_OPTIONS)
            raise TypeError(
                f"unknown option(s) {', '.join(unknown)}; the pipeline takes {', '.join(known)}"
            )
        pre, forward, post = {}, {}, {}
        if question is not None:
            pre["question"] = question
        if preset is not None or retrieval_config is not None:
            forward["retrieval"] = retrieval_settings(preset, retrieval_config)
        answer = {k: v for k, v in options.items() if k in _ANSWER_OPTIONS}
        check_answer_options(**{k: v for k, v in answer.items() if k != "generator"})
        forward.update(answer)
        if return_tokens is not None:
            post["return_tokens"] = bool(return_tokens)
        return pre, forward, post

    def preprocess(self, context: Any, question: Any = None) -> dict[str, Any]:
        """The context and the questions, checked (nothing is read yet)."""
        if not isinstance(context, str):
            raise TypeError(f"context must be text, got {type(context).__name__}")
        if not context.strip():
            raise ValueError("context is empty: there is nothing to read")
        return {
            "context": context,
            "questions": questions_of(question),
            "many": isinstance(question, list | tuple),
        }

    def _forward(
        self,
        inputs: dict[str, Any],
        retrieval: RetrievalConfig | None = None,
        **answer: Any,
    ) -> dict[str, Any]:
        """Read the context once into a memory on the pipeline's model, answer each question
        from it (`DocumentReader`; `answer`: max_new_tokens, temperature, generator); the
        memory's store is closed after."""
        config = retrieval or RetrievalConfig.from_preset(DEFAULT_PRESET)
        reader = DocumentReader(RetrievalLM(self.model, config).eval(), self.tokenizer)
        try:
            reader.read(inputs["context"])
            tokens = [reader.answer_tokens(q, **answer) for q in inputs["questions"]]
        finally:
            if reader.state is not None:
                reader.state.store.close()
        return {"tokens": tokens, "many": inputs["many"]}

    def postprocess(self, outputs: dict[str, Any], return_tokens: bool = False) -> Any:
        """{"answer": text} per question (the tokens decoded as `DocumentReader.ask` decodes
        them), with "tokens" when `return_tokens`; one dict for one question."""
        results = []
        for tokens in outputs["tokens"]:
            result = {"answer": self.tokenizer.decode(tokens, skip_special_tokens=True)}
            if return_tokens:
                result["tokens"] = list(tokens)
            results.append(result)
        return results if outputs["many"] else results[0]


def retrieval_settings(
    preset: str | None, retrieval_config: RetrievalConfig | None
) -> RetrievalConfig:
    """The memory's settings: `retrieval_config`, or the preset `preset` (not both)."""
    if preset is not None and retrieval_config is not None:
        raise ValueError("give a preset or a retrieval_config, not both")
    if retrieval_config is not None:
        if not isinstance(retrieval_config, RetrievalConfig):
            raise TypeError(
                f"retrieval_config must be a RetrievalConfig, got {type(retrieval_config).__name__}"
            )
        return retrieval_config
    if not isinstance(preset, str):
        raise TypeError(f"preset must be a preset's name, got {preset!r}")
    return RetrievalConfig.from_preset(preset)


def questions_of(question: Any) -> list[str]:
    """`question` (a text or a list of texts) as a list of texts, each checked."""
    if question is None:
        raise ValueError("no question: pass question=… (a text or a list of texts)")
    many = isinstance(question, list | tuple)
    items = list(question) if many else [question]
    if many and not items:
        raise ValueError("no question: the list of questions is empty")
    for q in items:
        if not isinstance(q, str):
            raise TypeError(f"question must be text or a list of texts, got {type(q).__name__}")
        if not q.strip():
            raise ValueError(f"question is empty: {q!r}")
    return items


def register_pipeline() -> str:
    """Register `RetrievalQuestionPipeline` with transformers under the task "inftyformer-ask"
    (for `transformers.pipeline(TASK, model=…)`, which loads the model as a causal LM); a
    second call changes nothing. The task's name."""
    known = PIPELINE_REGISTRY.supported_tasks.get(TASK)
    if known is None or known.get("impl") is not RetrievalQuestionPipeline:
        PIPELINE_REGISTRY.register_pipeline(
            TASK,
            pipeline_class=RetrievalQuestionPipeline,
            pt_model=AutoModelForCausalLM,
            type="text",
        )
    return TASK


__all__ = ["TASK", "RetrievalQuestionPipeline", "register_pipeline"]
