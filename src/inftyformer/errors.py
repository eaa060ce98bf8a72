"""The command line's one error path.

One error path: every command runs inside `user_errors`, which turns the failures a user can
cause or meet (bad settings, missing or corrupt files, a full or read-only disk, a diverged run,
running out of memory) into one line ``error: …`` on stderr and an exit code (2; 3 for a diverged
run; 130 when interrupted). Anything else is a bug and keeps its traceback; ``--debug`` (or
``INFTYFORMER_DEBUG=1``) shows the traceback of every error.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import typer

EXIT_USAGE = 2  # a user's mistake or the machine's state: bad input, missing file, full disk ...
EXIT_DIVERGED = 3  # training diverged (a NaN or infinite loss or gradient)
EXIT_INTERRUPTED = 130  # Ctrl-C / SIGTERM (a checkpoint was saved)
DEBUG_ENV = "INFTYFORMER_DEBUG"


def _debugging(ctx: typer.Context | None) -> bool:
    if os.environ.get(DEBUG_ENV, "").strip().lower() in {"1", "true", "yes", "on"}:
        return True
    obj = ctx.find_root().obj if ctx is not None else None
    return bool(isinstance(obj, dict) and obj.get("debug"))


class CommandError(Exception):
    """A failure a command describes itself (message and exit code)."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def check_output_file(path: Path, option: str) -> None:
    """Refuse an output file that cannot be written before any work is done: a directory, a
    parent that is a file, a place without write permission. Creates missing parents."""
    if path.is_dir():
        raise ValueError(f"{option} {path} is a directory; give a file name, e.g. {path}/out.json")
    parent = path.parent
    existing = parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{option} {path}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK):
        raise ValueError(f"{option} {path}: no permission to write in {existing}")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"{option} {path}: cannot create {parent} ({err.strerror})") from None


def os_message(err: OSError, where: str) -> str:
    """One line for an operating-system error: what failed on which file, and the fix."""
    target = f" {err.filename}" if err.filename else ""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        place = f" to write{target}" if target else ""
        return f"no space left on the device{place}: free some space or {where}"
    if err.errno == errno.EFBIG:
        return (
            f"file too large:{target or ' ' + str(err)}: the file-size limit of this process "
            f"(ulimit -f) or of the file system was reached; raise the limit or {where}"
        )
    if err.errno == errno.EROFS:
        return f"cannot write{target}: the file system is read-only; {where}"
    if err.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied:{target or ' ' + str(err)}; {where}"
    if isinstance(err, IsADirectoryError):
        return f"{err.filename} is a directory, a file was expected"
    if isinstance(err, (FileNotFoundError, FileExistsError, NotADirectoryError)) and (
        err.strerror is None
    ):
        return str(err)  # raised by this package with its own message
    if err.strerror and err.filename:
        return f"{err.strerror}: {err.filename}"
    return str(err) or type(err).__name__


def describe_error(err: BaseException, where: str = "choose another location") -> tuple[str, int]:
    """(one-line message, exit code) for an error a user can cause or meet; raises `err` again
    when it is a bug (those keep their traceback)."""
    import sys

    if isinstance(err, CommandError):
        return str(err), err.code
    if isinstance(err, OSError):
        return os_message(err, where), EXIT_USAGE
    if isinstance(err, ValueError | TypeError):  # a mistake in the input, the commonest error
        return str(err), EXIT_USAGE
    # the kinds of torch and the trainer: an error can only be one if they were imported (an
    # argument error that comes first is reported without importing them)
    torch = sys.modules.get("torch")
    if "inftyformer.training" in sys.modules:
        from .training import CheckpointError, DivergedError

        if isinstance(err, DivergedError):
            return str(err), EXIT_DIVERGED
        if isinstance(err, CheckpointError):
            return str(err), EXIT_USAGE
    if isinstance(err, (MemoryError, getattr(torch, "OutOfMemoryError", MemoryError))):
        return (
            "out of memory: try a smaller --batch-size, a shorter sequence or a smaller model",
            EXIT_USAGE,
        )
    if isinstance(err, RuntimeError) and "can't allocate memory" in str(err):
        first = str(err).splitlines()[0]
        return f"out of memory ({first}): try a smaller --batch-size or model", EXIT_USAGE
    raise err


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is and handled like Ctrl-C: `finally` blocks and
    context managers clean up (temporary files and folders), then one line and exit 130."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated("terminated (SIGTERM): stopped, temporary files removed")


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """While a command runs, SIGTERM raises `Terminated` (a KeyboardInterrupt) instead of
    killing the process on the spot. Training installs its own handler inside (a clean stop
    with a checkpoint) and restores this one after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _is_native_panic(err: BaseException) -> bool:
    """A panic of a Rust extension (pyo3's PanicException, e.g. from the tokenizers library):
    a BaseException, so `except Exception` does not see it."""
    return type(err).__name__ == "PanicException"


def user_errors(where: str = "choose another location") -> Callable[[Callable], Callable]:
    """Decorator of every command: see the module docstring. `where` completes the message of
    a write that failed (full or read-only disk, no permission), e.g. "choose another --out-dir"."""

    def decorate(command: Callable) -> Callable:
        @functools.wraps(command)
        def run(*args: Any, _typer_ctx: typer.Context | None = None, **kwargs: Any) -> Any:
            try:
                with _sigterm_as_interrupt():
                    return command(*args, **kwargs)
            except (typer.Exit, typer.Abort):
                raise
            except KeyboardInterrupt as err:  # Ctrl-C, and SIGTERM (`Terminated`)
                if _debugging(_typer_ctx):
                    raise
                typer.echo(str(err) or "interrupted", err=True)
                raise typer.Exit(EXIT_INTERRUPTED) from None
            except Exception as err:  # noqa: BLE001 - sorted into user errors and bugs below
                if _debugging(_typer_ctx):
                    raise
                message, code = describe_error(err, where)
                typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
                raise typer.Exit(code) from None
            except BaseException as err:  # a Rust library's panic; SystemExit keeps its meaning
                if isinstance(err, (SystemExit, GeneratorExit)) or _debugging(_typer_ctx):
                    raise
                if not _is_native_panic(err):
                    raise
                first = (str(err).strip().splitlines() or [""])[0]
                typer.secho(
                    f"error: a native library failed ({type(err).__name__}: {first}); the input "
                    "it was reading (a tokenizer file, a text) may be malformed — --debug shows "
                    "where",
                    err=True,
                    fg=typer.colors.RED,
                )
                raise typer.Exit(EXIT_USAGE) from None

        # typer hands the context (for --debug) to a parameter annotated typer.Context
        signature = inspect.signature(command, eval_str=True)
        extra = inspect.Parameter(
            "_typer_ctx", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=typer.Context
        )
        run.__signature__ = signature.replace(parameters=[*signature.parameters.values(), extra])
        run.__annotations__ = {**command.__annotations__, "_typer_ctx": typer.Context}
        return run

    return decorate
