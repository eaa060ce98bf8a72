"""How a dialogue's turns are written for the model (the dialogue task's speaker formats).

Speakers. The speaker who writes the reply is always the one the model speaks for:

- a tokenizer with a chat template (a Hugging Face model directory with ``chat_template.jinja``
  or a ``chat_template`` in ``tokenizer_config.json``, e.g. SmolLM2's ChatML): the reply's
  speaker is ``assistant``, the other ``user``; the call opens with a system message holding
  ``instruction``; the end of a turn is the tokenizer's ``eos_token`` (``<|im_end|>``);
- otherwise (GPT-2 BPE, bytes): every turn is ``"A: text"`` (the other speaker) or ``"B: text"``
  (the reply's speaker) followed by the end-of-text id, which ends a turn.

``speaker_format`` forces one of them ("chat" / "marks"; default "auto").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..data import TextTokenizer

SPEAKER_FORMATS = ("auto", "chat", "marks")
DEFAULT_INSTRUCTION = (
    "You are chatting with another person about a movie. Reply with one short message."
)
MARKS = {"user": "A", "assistant": "B"}  # speaker marks: the other speaker, the reply's speaker


def _model_directory(spec: str) -> Path | None:
    """The directory a tokenizer spec points into (a model directory or a tokenizer.json's)."""
    if spec in ("bytes", "gpt2"):
        return None
    path = Path(spec).expanduser()
    return path if path.is_dir() else path.parent


def _tokenizer_config(directory: Path | None) -> dict[str, Any]:
    path = None if directory is None else directory / "tokenizer_config.json"
    if path is None or not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def _token_text(value: Any) -> str | None:
    """A special token of tokenizer_config.json: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def find_chat_template(directory: Path | None) -> str | None:
    """The chat template of a Hugging Face model directory: ``chat_template.jinja``, else the
    ``chat_template`` of ``tokenizer_config.json`` (a string, or the one named "default")."""
    if directory is None:
        return None
    path = directory / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    template = _tokenizer_config(directory).get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) and template else None


class SpeakerMarks:
    """``"A: text"`` / ``"B: text"`` turns, each followed by the end-of-text id (`eot`)."""

    name = "marks"

    def __init__(self, tokenizer: TextTokenizer, instruction: str) -> None:
        self.tokenizer = tokenizer
        self.eot = tokenizer.eos_id
        self.instruction = instruction

    def system(self, content: str) -> list[int]:
        """A free-standing text: its tokens and the end of text (nothing when empty)."""
        return self.tokenizer.encode(content) + [self.eot] if content else []

    def system_parts(self, head: str) -> tuple[list[int], list[int]]:
        """(tokens before, tokens after) a truncatable text that follows `head`."""
        return self.tokenizer.encode(head), [self.eot]

    def dialogue(
        self, history: Sequence[tuple[str, str]], reply: str
    ) -> tuple[list[list[int]], list[int], list[int]]:
        """(tokens of each history turn, the reply prompt, the reply's tokens without its end
        of turn) for history [(role, text)] and the reply's text."""
        encode = self.tokenizer.encode
        turns = [encode(f"{MARKS[role]}: {text}") + [self.eot] for role, text in history]
        return turns, encode(f"{MARKS['assistant']}:"), encode(" " + reply)


class ChatFormat:
    """A tokenizer's chat template (Jinja, rendered as Hugging Face renders it). Each message's
    tokens are the difference between the rendering of the conversation up to it and up to the
    one before (the template must render conversations prefix by prefix: checked)."""

    name = "chat"

    def __init__(self, tokenizer: TextTokenizer, template: str, config: dict, instruction: str):
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        self.template = env.from_string(template)
        self.special = {
            k: t for k in ("bos_token", "eos_token") if (t := _token_text(config.get(k)))
        }
        eot = self.special.get("eos_token")
        if eot is None:
            raise ValueError("a chat template needs an eos_token in tokenizer_config.json")
        ids = tokenizer.encode(eot)
        if len(ids) != 1:
            raise ValueError(f"the end-of-turn token {eot!r} is not one token: {ids}")
        self.tokenizer, self.eot, self.eot_text = tokenizer, ids[0], eot
        self.instruction = instruction

    def render(self, messages: list[dict[str, str]], generation_prompt: bool = False) -> str:
        return self.template.render(
            messages=messages, add_generation_prompt=generation_prompt, **self.special
        )

    def _suffix(self, longer: str, shorter: str, what: str) -> str:
        if not longer.startswith(shorter):
            raise ValueError(
                f"the chat template does not render conversations prefix by prefix ({what})"
            )
        return longer[len(shorter) :]

    def system(self, content: str) -> list[int]:
        return self.tokenizer.encode(self.render([{"role": "system", "content": content}]))

    def system_parts(self, head: str) -> tuple[list[int], list[int]]:
        marker = "\x00DOCUMENT\x00"
        text = self.render([{"role": "system", "content": head + marker}])
        before, found, after = text.partition(marker)
        if not found:
            raise ValueError("the chat template does not keep a system message's text as is")
        return self.tokenizer.encode(before), self.tokenizer.encode(after)

    def dialogue(
        self, history: Sequence[tuple[str, str]], reply: str
    ) -> tuple[list[list[int]], list[int], list[int]]:
        messages = [{"role": "system", "content": self.instruction}]
        previous = self.render(messages)
        turns = []
        for role, text in history:
            messages.append({"role": role, "content": text})
            rendered = self.render(messages)
            turns.append(self.tokenizer.encode(self._suffix(rendered, previous, "a turn")))
            previous = rendered
        prompt = self._suffix(self.render(messages, True), previous, "the generation prompt")
        full = self.render([*messages, {"role": "assistant", "content": reply}])
        rest = self._suffix(self._suffix(full, previous, "the reply"), prompt, "the reply")
        if not rest.startswith(reply) or not rest[len(reply) :].startswith(self.eot_text):
            raise ValueError(
                f"the chat template does not render a reply as its text then {self.eot_text!r}"
            )
        return turns, self.tokenizer.encode(prompt), self.tokenizer.encode(reply)


def speaker_format(
    tokenizer: TextTokenizer, spec: str, choice: str = "auto", instruction: str | None = None
) -> SpeakerMarks | ChatFormat:
    """The chat template of the tokenizer's model directory when it has one (or `choice` is
    "chat"), else speaker marks. `instruction` None: the default system message (chat) or
    none (marks)."""
    directory = _model_directory(spec)
    template = find_chat_template(directory)
    if choice == "chat" and template is None:
        raise ValueError(f"speaker_format 'chat': the tokenizer {spec!r} has no chat template")
    if template is not None and choice != "marks":
        text = DEFAULT_INSTRUCTION if instruction is None else instruction
        return ChatFormat(tokenizer, template, _tokenizer_config(directory), text)
    return SpeakerMarks(tokenizer, instruction or "")


__all__ = [
    "DEFAULT_INSTRUCTION",
    "MARKS",
    "SPEAKER_FORMATS",
    "ChatFormat",
    "SpeakerMarks",
    "find_chat_template",
    "speaker_format",
]
