"""The dialogue task's settings (`DialogueConfig`) and their checks: what the document is
(grounding), where it goes (placement), speakers, the reply's call, evaluation and sampling.
The task (`dialogue.py`, whose docstring says what each setting does) reads them."""

from __future__ import annotations

from dataclasses import dataclass

from .._checks import check_positive_int, check_range
from .base import TaskConfig
from .chat import SPEAKER_FORMATS

PLACEMENTS = ("memory", "context", "none")
GROUNDINGS = ("full", "section")


@dataclass(frozen=True)
class DialogueConfig(TaskConfig):
    """Settings of the dialogue task (module docstring)."""

    data_dir: str | None = None  # the cmu-dog folder or a data root holding it
    tokenizer: str = "gpt2"  # bytes, gpt2, a tokenizer.json, or a model directory
    grounding: str = "full"  # the whole document, or the section in view
    placement: str = "memory"  # where the document goes: memory, context, none
    other_document: bool = False  # control: another movie's document instead
    speaker_format: str = "auto"  # chat template when the tokenizer has one, else marks
    instruction: str | None = None  # system message (chat); None: DEFAULT_INSTRUCTION (chat)
    min_history: int = 3  # earlier turns an example needs (3: from the fourth utterance)
    merge_turns: bool = False  # join consecutive turns of one speaker
    max_context: int = 256  # history tokens kept in the reply's call
    max_reply: int = 64  # reply tokens (end of turn included) scored; room kept in the call
    eval_examples: int | None = 64  # fixed subset of the evaluation split; None: all
    generate: bool = True  # evaluation generates replies (else teacher forcing only)
    top_p: float = 0.9  # nucleus sampling: the smallest set of tokens with this mass
    temperature: float = 1.0  # 0: greedy
    max_new_tokens: int = 50  # the longest generated reply
    seed: int = 0  # the evaluation subset and the sampling

    def __post_init__(self) -> None:
        if self.data_dir is not None and (not isinstance(self.data_dir, str) or not self.data_dir):
            raise TypeError(f"data_dir must be a non-empty string or None, got {self.data_dir!r}")
        if not isinstance(self.tokenizer, str) or not self.tokenizer:
            raise ValueError(f"tokenizer must be a non-empty string, got {self.tokenizer!r}")
        for name, allowed in (
            ("grounding", GROUNDINGS),
            ("placement", PLACEMENTS),
            ("speaker_format", SPEAKER_FORMATS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}"
                )
        if self.instruction is not None and not isinstance(self.instruction, str):
            raise TypeError(f"instruction must be a str or None, got {self.instruction!r}")
        for name in ("other_document", "merge_turns", "generate"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        check_positive_int("min_history", self.min_history)
        check_positive_int("max_context", self.max_context)
        check_positive_int("max_reply", self.max_reply, minimum=2)
        check_positive_int("max_new_tokens", self.max_new_tokens)
        check_positive_int("seed", self.seed, minimum=0)
        if self.eval_examples is not None:
            check_positive_int("eval_examples", self.eval_examples)
        check_range("top_p", self.top_p, 0.0, 1.0, low_open=True)
        check_range("temperature", self.temperature, 0.0)
        if self.max_new_tokens > self.max_reply:
            raise ValueError(
                f"max_new_tokens ({self.max_new_tokens}) must be <= max_reply "
                f"({self.max_reply}), the room the call keeps for the reply"
            )


__all__ = ["GROUNDINGS", "PLACEMENTS", "DialogueConfig"]
