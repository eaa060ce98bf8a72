"""The text around a document, a question and the turns of a conversation (`retrieval/ask.py`),
and the tokens an answer stops at.

A conversation is cut into the pieces a model reads one after the other, found by rendering
the tokenizer's chat template around marker strings and cutting at them:

    start       before the first user message (a system prompt, a begin-of-text token, the
                user turn's opening: "<|im_start|>user\\n")
    after_user  what ends a user message and opens the assistant's answer (the template's
                generation prompt: "<|im_end|>\\n<|im_start|>assistant\\n")
    between     what ends an answer and opens the next user message

A document is asked as the start of one user message whose end is the question:

    start + DOCUMENT + "\\n\\n" + QUESTION + after_user

so the memory reads the document before it knows the question (the read memory is saved once
and asked any number of questions), an instruction-tuned model meets the common shape of its
training (a pasted text, then what to do with it, in one message), and the question sits right
before the answer: its queries, the last of the stream, choose the past blocks the answer reads
(`RetrievalLM.forward`'s `reselect`). A tokenizer without a chat template (a base model) reads
``DOCUMENT\\n\\nQuestion: QUESTION\\nAnswer:``, and a conversation ``User: …\\nAssistant:``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

JOIN = "\n\n"  # between the document and the question, in one user message
_MARKS = ("@@inftyformer-user-1@@", "@@inftyformer-answer-1@@", "@@inftyformer-user-2@@")


@dataclass(frozen=True)
class TurnFormat:
    """The pieces of a conversation's text (module doc); `templated`: the tokenizer's chat
    template made them; `question`: what opens a question after a document."""

    start: str
    after_user: str
    between: str
    question: str = JOIN
    templated: bool = False

    @classmethod
    def of(cls, tokenizer: Any) -> TurnFormat:
        """The tokenizer's chat template cut at the markers, or the plain format."""
        if not getattr(tokenizer, "chat_template", None):
            return cls("User: ", "\nAssistant:", "\nUser: ")
        user, answer, again = _MARKS
        one = _render(tokenizer, [("user", user)])
        start, after_user = _cut(one, user)
        three = _render(tokenizer, [("user", user), ("assistant", answer), ("user", again)])
        start_three, rest = _cut(three, user)
        between = _cut(_cut(rest, answer)[1], again)[0]
        if start_three != start:
            raise ValueError(
                "the chat template opens a one-turn and a longer conversation differently; "
                "its turns cannot be read one after the other"
            )
        return cls(start, after_user, between, JOIN, templated=True)

    def plain_document(self) -> TurnFormat:
        """The plain format of a question asked after a document (no chat template)."""
        if self.templated:
            return self
        return TurnFormat("", "\nAnswer:", "\n\nQuestion: ", "\n\nQuestion: ", templated=False)


def _render(tokenizer: Any, turns: list[tuple[str, str]]) -> str:
    messages = [{"role": role, "content": content} for role, content in turns]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not isinstance(text, str):
        raise ValueError(f"the chat template rendered {type(text).__name__}, not text")
    return text


def _cut(text: str, mark: str) -> tuple[str, str]:
    if text.count(mark) != 1:
        raise ValueError(
            "the chat template changes or repeats a message's text; its turns cannot be cut "
            "into the pieces a memory reads one after the other"
        )
    before, after = text.split(mark)
    return before, after


def encode(tokenizer: Any, text: str) -> list[int]:
    """The tokens of a piece of text; special tokens written in it (a template's
    "<|im_start|>") are read as such, none are added (the template writes its own)."""
    # (verbose=False: a document longer than the model's positions is what the memory is for)
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def begin_tokens(tokenizer: Any, format: TurnFormat) -> list[int]:
    """What a stream starts with before `format.start`: a plain format gets the tokenizer's
    begin-of-text token where it adds one (a template writes its own)."""
    if format.templated:
        return []
    return [t for t in tokenizer("", add_special_tokens=True)["input_ids"]]


def stop_tokens(tokenizer: Any, base: Any = None) -> set[int]:
    """The end-of-sequence tokens an answer stops at: the tokenizer's and the base's
    generation config's (an int or a list)."""
    ids: set[int] = set()
    sources = [getattr(tokenizer, "eos_token_id", None)]
    config = getattr(base, "generation_config", None)
    sources.append(getattr(config, "eos_token_id", None))
    for value in sources:
        if value is None:
            continue
        ids.update(int(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
    return ids


__all__ = ["JOIN", "TurnFormat", "begin_tokens", "encode", "stop_tokens"]
