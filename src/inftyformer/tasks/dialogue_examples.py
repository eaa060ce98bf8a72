"""The dialogue task's examples as the model sees them, and its replies: an example laid out as
one call, padded batches, the document's memory and a reply generated from it
(`tasks.dialogue`).

The call (one, of at most ``segment_len`` tokens; a pretrained model's `window` of earlier
tokens is the document's, when it is streamed first)::

    [prefix] [history: whole turns, newest kept, <= max_context tokens] [reply prompt] [reply] [eot]

The loss covers the reply's tokens and its end-of-turn token only (targets −100 elsewhere; the
reply is cut to ``max_reply`` tokens, rarely needed: 99% of replies are shorter than 60 tokens).
The room kept for the reply is always ``max_reply`` tokens, so the prompt of an example is the
same whether its reply is scored (teacher forcing) or generated. ``placement`` puts the document

- ``"memory"``: into the long-term memory first: the document (a system message ``Document:
  ...`` in the chat format, ``Document: ...`` + end-of-text otherwise) is streamed through the
  model in segments of ``segment_len`` (no gradient: the memory is detached between calls
  anyway; the last segment waits and enters the memory at the start of the reply's call, inside
  its graph, so the CNN gate learns), then the call, whose prefix is the instruction's system
  message (chat) or nothing;
- ``"context"``: into the call, as much of it as fits: the prefix is a system message holding
  the instruction and then ``Document:`` with the document's first tokens, cut so that prefix +
  history + reply room = ``segment_len``;
- ``"none"``: nowhere (the call as for "memory", with an empty memory).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..data.cmu_dog import DialogueExample
from ..model_kinds import LanguageModel
from ..native.model import IGNORE_INDEX
from .chat import ChatFormat, SpeakerMarks

DOCUMENT_HEADER = "Document:\n"
SECTION_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class EncodedExample:
    """One example laid out for the model (module docstring).

    tokens      the call: prefix, history, reply prompt, reply, end of turn
    prompt_len  tokens[:prompt_len] is what generation continues (the reply starts there)
    memory      the document's tokens for the long-term memory (empty unless placement memory)
    """

    key: tuple  # the document the example is about (batches share one)
    tokens: tuple[int, ...]
    prompt_len: int
    memory: tuple[int, ...]
    reference: str
    conversation_id: str
    reply_index: int
    doc_id: int
    previous: str  # the last history turn, for reports

    @property
    def inputs(self) -> list[int]:
        return list(self.tokens[:-1])

    @property
    def targets(self) -> list[int]:
        """Aligned with inputs: position t predicts tokens[t + 1], scored on the reply only."""
        start = self.prompt_len - 1
        return [IGNORE_INDEX] * start + list(self.tokens[self.prompt_len :])


def document_key(example: DialogueExample) -> tuple:
    """Examples with equal keys have the same document (and, with sections, the same section)."""
    section = example.reply.section if len(example.document) == 1 else -1
    return (example.doc_id, section)


def lay_out(
    example: DialogueExample,
    fmt: SpeakerMarks | ChatFormat,
    document: list[int],
    memory: tuple[int, ...],
    segment_len: int,
    max_context: int,
    max_reply: int,
    placement: str,
) -> EncodedExample:
    """`example` as one call (module docstring): `document` the document's tokens for the
    context, `memory` those streamed into the memory first."""
    reply = example.reply
    history = [
        ("assistant" if t.speaker == reply.speaker else "user", t.text.strip())
        for t in example.history
    ]
    turns, prompt, content = fmt.dialogue(history, reply.text.strip())
    answer = content[: max_reply - 1] + [fmt.eot]
    if placement == "context":
        instruction = fmt.instruction + SECTION_SEPARATOR if fmt.instruction else ""
        head, tail = fmt.system_parts(instruction + DOCUMENT_HEADER)
        fixed = len(head) + len(tail)
    else:
        prefix = fmt.system(fmt.instruction)
        fixed = len(prefix)
    room = segment_len - len(prompt) - max_reply - fixed
    budget = min(max_context, room)
    if budget < 1:
        raise ValueError(
            f"segment_len {segment_len} leaves no room for the history "
            f"(prefix {fixed}, reply prompt {len(prompt)}, max_reply {max_reply} tokens)"
        )
    kept: list[int] = []
    for turn in reversed(turns):  # newest first, whole turns
        if len(kept) + len(turn) > budget:
            if not kept:  # not even the last turn fits: its end
                kept = turn[-budget:]
            break
        kept = turn + kept
    if placement == "context":
        prefix = head + document[: max(0, room - len(kept))] + tail
    tokens = prefix + kept + prompt + answer
    return EncodedExample(
        key=document_key(example),
        tokens=tuple(tokens),
        prompt_len=len(prefix) + len(kept) + len(prompt),
        memory=memory,
        reference=reply.text.strip(),
        conversation_id=example.conversation_id,
        reply_index=example.reply_index,
        doc_id=example.doc_id,
        previous=example.history[-1].text.strip() if example.history else "",
    )


def pad_batch(rows: Sequence[EncodedExample], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs [B, T], targets [B, T]) right-padded with `pad_id` and −100."""
    length = max(len(r.tokens) - 1 for r in rows)
    inputs = torch.full((len(rows), length), pad_id, dtype=torch.long)
    targets = torch.full((len(rows), length), IGNORE_INDEX, dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row.tokens) - 1
        inputs[i, :n] = torch.tensor(row.inputs)
        targets[i, :n] = torch.tensor(row.targets)
    return inputs, targets


@torch.no_grad()
def push_document(model: LanguageModel, tokens: Sequence[int], device: torch.device) -> Any:
    """The memory (batch 1) after streaming `tokens` through the model; None when empty."""
    if not tokens:
        return None
    return model.push(torch.tensor([list(tokens)], dtype=torch.long, device=device))


@torch.no_grad()
def generate_reply(
    model: LanguageModel,
    prompt: Sequence[int],
    state: Any,
    end_ids: Sequence[int],
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int,
) -> list[int]:
    """New tokens after `prompt` (batch 1), reading `state`, cut before the first of `end_ids`.
    Sampling is seeded with `seed` (torch's global generator is restored afterwards)."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # a pretrained model samples from the global generator
        generator = torch.Generator(device=device).manual_seed(seed)
        out, _ = model.generate(
            ids,
            max_new_tokens,
            temperature,
            top_p=top_p,
            state=state,
            generator=generator,
            end_ids=list(end_ids),
            with_state=False,
        )
        new = out[0].tolist()
    ends = set(end_ids)
    for i, token in enumerate(new):
        if token in ends:
            return new[:i]
    return new


def example_seed(seed: int, conversation_id: str, reply_index: int) -> int:
    """The sampling seed of one example (independent of sharding and order)."""
    return zlib.crc32(f"{seed}:{conversation_id}:{reply_index}".encode())


__all__ = [
    "EncodedExample",
    "document_key",
    "example_seed",
    "generate_reply",
    "lay_out",
    "pad_batch",
    "push_document",
]
