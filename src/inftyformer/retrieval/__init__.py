"""Training-free retrieval of exact past blocks on a pretrained rotary causal LM: the base reads
its first tokens (the sink), the past blocks its queries choose and a window of recent tokens.

    config.py   RetrievalConfig (no transformers import)
    scorers.py  a stored block's score under the call's queries, and the choice
    model.py    RetrievalLM: the base's attention over [sink; chosen blocks; window; call]
    state.py    RetrievalState: explicit, per batch row; how a call writes it
    store.py    the stored blocks' keys and values, on disk
    decode.py   one-token calls on a context turned once
    ask.py      DocumentReader (read a document once, ask it) and Chat (`inftyformer ask`/`chat`)
    prompts.py  the chat template cut into the turns a memory reads; the stop tokens
    session.py  a memory saved to a folder and loaded again
    pipeline.py RetrievalQuestionPipeline: a transformers pipeline, task "inftyformer-ask"

    from inftyformer.retrieval import RetrievalLM
    model = RetrievalLM(base)                       # the default preset

    from inftyformer.retrieval import register_pipeline
    register_pipeline()                             # transformers.pipeline("inftyformer-ask", …)
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "RetrievalConfig": "config",
    "RetrievalLM": "model",
    "RetrievalOutput": "model",
    "RetrievalQuestionPipeline": "pipeline",
    "RetrievalState": "state",
    "register_pipeline": "pipeline",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:  # imported on first use: the config needs no transformers
    import importlib

    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
