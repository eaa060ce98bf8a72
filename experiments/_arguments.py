"""Argument types of the experiments' command lines: a bad value is argparse's one-line
`error: argument --limit: …` (exit 2), never a traceback from deep inside a run."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """A whole number ≥ 1 (--limit, --batch-size, --threads, --max-gen-toks)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_ints(text: str) -> list[int]:
    """Whole numbers ≥ 1 separated by commas (--lengths 4096,8192)."""
    items = [x.strip() for x in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers separated by commas")
    try:
        return [positive_int(x) for x in items]
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: {err}") from None


__all__ = ["positive_int", "positive_ints"]
