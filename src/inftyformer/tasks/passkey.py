"""A passkey probe for a pretrained causal LM with (or without) long-term memory.

A five-digit number is hidden at a chosen depth in filler text; at the end the model is asked for
it. The text is streamed in segments of L tokens, so the base model sees only the last segment:
when the key lies further back than that, only the memory can bring it back. Accuracy is the
share of exact matches of the generated digits (greedy), by the key's distance from the end.

    prompt = intro + filler… + "The pass key is 12345. Remember it. 12345 is the pass key." +
             filler… + question        (the question and its answer prefix end the text)
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

import torch

INTRO = (
    "There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the pass key.\n"
)
FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "\nWhat is the pass key? The pass key is"


@dataclass(frozen=True)
class PasskeyExample:
    ids: list[int]  # the whole prompt
    key: str  # the five digits
    distance: int  # tokens from the end of the needle to the end of the prompt


def make_example(tokenizer: Any, total_tokens: int, distance: int, seed: int) -> PasskeyExample:
    """A prompt of about `total_tokens` tokens whose needle ends `distance` tokens (or a little
    more: whole filler sentences) before the end. `tokenizer`: encode(text) -> ids."""
    key = f"{random.Random(seed).randrange(10_000, 100_000)}"
    intro, needle = tokenizer.encode(INTRO), tokenizer.encode(NEEDLE.format(key=key))
    filler, question = tokenizer.encode(FILLER), tokenizer.encode(QUESTION)
    after = max(0, -(-(distance - len(question)) // len(filler)))  # filler sentences after
    before = max(
        0, (total_tokens - len(intro) - len(needle) - len(question)) // len(filler) - after
    )
    ids = intro + filler * before + needle + filler * after + question
    return PasskeyExample(ids, key, len(filler) * after + len(question))


def answer_of(text: str) -> str:
    """The first run of digits in a generated continuation ('' when there is none)."""
    match = re.search(r"\d+", text)
    return match.group(0) if match else ""


@torch.no_grad()
def passkey_accuracy(
    model: Any,
    tokenizer: Any,
    distances: list[int],
    samples: int,
    total_tokens: int,
    max_new_tokens: int = 8,
) -> dict[int, dict[str, Any]]:
    """{distance: {"accuracy", "answers", "keys", "distance_tokens"}} for `model` (a
    `PretrainedMemoryLM`, with or without memory: its `generate` streams all but the last
    segment of the prompt through the memory and continues the rest greedily)."""
    was_training = model.training
    model.eval()
    results = {}
    try:
        for distance in distances:
            answers, keys, actual = [], [], []
            for i in range(samples):
                example = make_example(tokenizer, total_tokens, distance, seed=1_000 * distance + i)
                prompt = torch.tensor([example.ids])
                new, _ = model.generate(prompt, max_new_tokens, temperature=0.0)
                answers.append(answer_of(tokenizer.decode(new[0].tolist())))
                keys.append(example.key)
                actual.append(example.distance)
            hits = sum(a == k for a, k in zip(answers, keys, strict=True))
            results[distance] = {
                "accuracy": hits / samples,
                "answers": answers,
                "keys": keys,
                "distance_tokens": actual,
            }
    finally:
        model.train(was_training)
    return results


__all__ = ["PasskeyExample", "answer_of", "make_example", "passkey_accuracy"]
