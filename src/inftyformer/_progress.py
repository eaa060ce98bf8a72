"""Progress bars that do not flood a log: a tqdm bar on a terminal; elsewhere (a file, a pipe, a
job log) one plain line every `every` updates and one at the end, instead of a stream of
carriage-return redraws. A terminal that reports no size (0 columns: a pty opened by `script`,
some CI runners, a tmux pane at start-up) gets a bar of a fixed width: tqdm would draw nothing."""

from __future__ import annotations

import io
import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TextIO

from tqdm import tqdm


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or not a real stream
        return False


TRANSIENT_SECONDS = 30.0  # in a log, a transient bar's lines come at most this often
FALLBACK_COLUMNS = 80  # the bar's width on a terminal that reports 0 columns


def _columns(stream: TextIO) -> int:
    """The terminal's width in columns; 0 when it reports none (or cannot be asked)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        return 0


class LineProgress:
    """The part of tqdm's interface the package uses, written as whole lines:
    ``desc: 40/600 (7%) 0:12 elapsed, 02:48 left, 3.33 it/s, loss=2.1``."""

    disable = False

    def __init__(
        self,
        iterable: Iterable[Any] | None = None,
        *,
        total: int | None = None,
        initial: int = 0,
        desc: str | None = None,
        unit: str = "it",
        unit_scale: bool = False,
        every: int | None = None,
        file: TextIO | None = None,
        min_seconds: float = 0.0,
        final: bool = True,
    ) -> None:
        self.iterable = iterable
        # a line at most every `min_seconds`; `final`: one at the end (a transient bar's
        # counterpart in a log has none: its result follows)
        self.min_seconds, self.final = min_seconds, final
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.total = total
        self.n = self.last_shown = self.start_n = initial
        self.desc = desc or ""
        self.unit, self.unit_scale = unit, unit_scale
        # about 20 lines over the whole run unless told otherwise
        self.every = max(1, every if every is not None else (total or 2000) // 20)
        self.file = file if file is not None else sys.stderr
        self.postfix = ""
        self.start = self.last_time = time.perf_counter()
        self.closed = False

    def _amount(self, value: float) -> str:
        return tqdm.format_sizeof(value) if self.unit_scale else f"{value:.4g}"

    def line(self) -> str:
        elapsed = time.perf_counter() - self.start
        rate = (self.n - self.start_n) / elapsed if elapsed > 0 else 0.0
        done = self._amount(self.n)
        if self.total:
            done += f"/{self._amount(self.total)} ({100 * self.n / self.total:.0f}%)"
        text = f"{self.desc}: " if self.desc else ""
        text += f"{done} {tqdm.format_interval(elapsed)} elapsed, "
        if self.total and rate > 0 and self.n < self.total:  # the ETA, at the rate so far
            text += f"{tqdm.format_interval((self.total - self.n) / rate)} left, "
        unit = self.unit.strip()  # tqdm's units may start with a space (" docs")
        if 0 < rate < 1 and not self.unit_scale:  # slow steps: "281 s/it", not "0.003554 it/s"
            text += f"{1 / rate:.3g} s/{unit}"
        else:
            text += f"{self._amount(rate)} {unit}/s"
        return text + (f", {self.postfix}" if self.postfix else "")

    def _show(self) -> None:
        self.file.write(self.line() + "\n")
        self.file.flush()
        self.last_shown = self.n

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.n - self.last_shown >= self.every:
            if self.min_seconds:
                now = time.perf_counter()
                if now - self.last_time < self.min_seconds:
                    return
                self.last_time = now
            self._show()

    def set_postfix(self, values: Mapping[str, Any] | None = None, refresh: bool = True) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in (values or {}).items())

    def close(self) -> None:
        if self.final and not self.closed and self.n != self.last_shown:
            self._show()
        self.closed = True

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable or ():
            yield item
            self.update(1)
        self.close()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def progress(
    iterable: Iterable[Any] | None = None,
    *,
    enabled: bool = True,
    every: int | None = None,
    file: TextIO | None = None,
    **kwargs: Any,
) -> Any:
    """A tqdm bar when `file` (default stderr) is a terminal; a `LineProgress` writing one line
    every `every` updates (default: about 20 lines in all) when it is not; a disabled tqdm (no
    output) when not `enabled`. A transient bar (leave=False) writes to a log only every
    `TRANSIENT_SECONDS` and not at its end. `kwargs` are tqdm's (total, initial, desc, unit,
    unit_scale, leave, dynamic_ncols). On a terminal of 0 columns (it reports no size) the bar is
    `FALLBACK_COLUMNS` wide, or $COLUMNS if set."""
    stream = file if file is not None else sys.stderr
    if enabled and _is_terminal(stream) and _columns(stream) == 0:
        kwargs.pop("dynamic_ncols", None)  # it would ask the terminal again and get 0
        columns = os.environ.get("COLUMNS", "")
        kwargs["ncols"] = (
            int(columns) if columns.isdigit() and int(columns) > 0 else FALLBACK_COLUMNS
        )
    if not enabled or _is_terminal(stream):
        return tqdm(iterable, disable=not enabled, file=stream, **kwargs)
    names = ("total", "initial", "desc", "unit", "unit_scale")
    known = {k: kwargs[k] for k in names if k in kwargs}
    if kwargs.get("leave") is False:  # a transient bar (an evaluation inside a run): in a log,
        # a line only when it takes long, none at the end (its result is printed next)
        known.update(min_seconds=TRANSIENT_SECONDS, final=False)
    return LineProgress(iterable, every=every, file=stream, **known)


__all__ = ["LineProgress", "progress"]
