"""Whole files or nothing: every file the library writes goes through `atomic_path` (or
`write_atomic`, for bytes or text already in memory).

    with atomic_path(path) as tmp:    # write tmp (a name beside path: same file system)
        save(tmp)                     # on success tmp replaces path (os.replace), on any error
                                      # or interruption tmp is removed and path stays as it was

A reader never sees half a file, and a kill leaves at most a hidden `.NAME.tmpPID` beside it
(the checkpoint's clean-up removes those of its own files). `durable=True` also flushes the
data to the disk (fsync of the file and its directory) before the replace returns.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def naming(path: str | os.PathLike) -> Iterator[None]:
    """Writes inside the block that fail with an operating-system error naming no file (a
    write past the file-size limit: `[Errno 27] File too large`; a full disk on `write`) raise
    it again naming `path`, so that the one line a user reads says which file."""
    try:
        yield
    except OSError as err:
        if err.filename is not None or err.errno is None:
            raise
        raise type(err)(err.errno, err.strerror or os.strerror(err.errno), str(path)) from err


def temporary_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Remove the temporary files or folders `atomic_path(path)` left when its process was
    killed (`.NAME.tmpPID` of a process that no longer runs); returns what was removed."""
    path = Path(path)
    return _remove_stale(path.parent, lambda name: name == path.name)


def remove_stale_temporaries_in(
    directory: str | os.PathLike, endings: tuple[str, ...]
) -> list[Path]:
    """Remove what `atomic_path` left in `directory` for any file whose name ends with one of
    `endings` when its process was killed (`.NAME.tmpPID` of a process that no longer runs,
    e.g. a corpus cache's ``.KEY.tokens.npy.tmp4242``); returns what was removed."""
    return _remove_stale(Path(directory), lambda name: name.endswith(endings))


_TEMPORARY = re.compile(r"\.(?P<name>.+)\.tmp(?P<pid>[0-9]+)")


def _remove_stale(directory: Path, wanted: Callable[[str], bool]) -> list[Path]:
    removed: list[Path] = []
    if not directory.is_dir():
        return removed
    for candidate in directory.iterdir():
        found = _TEMPORARY.fullmatch(candidate.name)
        if found is None or not wanted(found["name"]) or _running(int(found["pid"])):
            continue
        if candidate.is_dir() and not candidate.is_symlink():
            shutil.rmtree(candidate, ignore_errors=True)
        else:
            candidate.unlink(missing_ok=True)
        removed.append(candidate)
    return removed


def remove_stale_folders(
    parent: str | os.PathLike, prefix: str, may_remove: Callable[[Path], bool] | None = None
) -> list[Path]:
    """Remove the folders `PREFIXPID-…` in `parent` that a process left when it was killed
    (PID no longer runs, and `may_remove(folder)` agrees, e.g. its lock is free); returns what
    was removed. A folder whose name holds no pid is left: nothing says whose it is."""
    removed = []
    try:
        candidates = list(Path(parent).iterdir())
    except OSError:
        return removed
    for candidate in candidates:
        pid = candidate.name[len(prefix) :].split("-", 1)[0]
        if not candidate.name.startswith(prefix) or not pid.isdigit() or _running(int(pid)):
            continue
        if candidate.is_symlink() or not candidate.is_dir():
            continue
        if may_remove is None or may_remove(candidate):
            shutil.rmtree(candidate, ignore_errors=True)
            removed.append(candidate)
    return removed


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # someone else's process (or a name we cannot judge): leave it
    return True


# The most a text option (--prompt-file, inspect --text) reads: far beyond any prompt (a novel is
# ~1 MB), small enough that a wrong file is refused instead of filling the memory.
MAX_TEXT_BYTES = 64 * 2**20


def read_user_text(path: str | os.PathLike, option: str, limit: int = MAX_TEXT_BYTES) -> str:
    """The UTF-8 text of a file a user named with `option`. Refused with a ValueError naming the
    option and the file: something that is not a regular file (a FIFO, a device such as
    /dev/zero, a socket: reading might never end or never return), more than `limit` bytes
    (also when a file grows while it is read), bytes that are not UTF-8."""
    path = Path(path)
    mode = os.stat(path).st_mode  # FileNotFoundError / PermissionError name the file
    if stat.S_ISDIR(mode):
        raise ValueError(f"{option} {path} is a directory; give a text file")
    if not stat.S_ISREG(mode):
        kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a device or socket"
        raise ValueError(
            f"{option} {path} is {kind}, not a regular file: it may never end; save the text "
            "to a file first"
        )
    too_long = ValueError(
        f"{option} {path} holds more than {limit / 2**20:g} MiB, more than {option} reads; "
        "give a shorter text (or evaluate a corpus with evaluate --data-dir)"
    )
    if os.stat(path).st_size > limit:
        raise too_long
    with open(path, "rb") as f:
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise too_long
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{option} {path} is not UTF-8 text (byte {err.start})") from None


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(directory: Path) -> None:
    """Flush a directory's entries (a replace or a new file) to the disk, where the platform
    allows it."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | os.PathLike, *, durable: bool = False) -> Iterator[Path]:
    """A temporary path to write `path`'s new content to (a file, or a directory the block
    creates); it replaces `path` when the block ends without an exception."""
    path = Path(path)
    tmp = temporary_name(path)
    try:
        with naming(path):
            yield tmp
            if durable and tmp.is_file():
                fsync_file(tmp)
            os.replace(tmp, path)
            if durable:
                fsync_dir(path.parent)
    finally:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists() or tmp.is_symlink():
            tmp.unlink()


def write_atomic(path: str | os.PathLike, data: bytes | str, *, durable: bool = False) -> None:
    """Write `data` (text as UTF-8) to `path`, whole or not at all. Something that exists and
    is not a regular file (/dev/stdout, a pipe) is written to directly, never replaced."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if path.exists() and not path.is_file():
        with open(path, "wb") as f:
            f.write(raw)
        return
    with atomic_path(path, durable=durable) as tmp:
        tmp.write_bytes(raw)


__all__ = [
    "atomic_path",
    "MAX_TEXT_BYTES",
    "fsync_dir",
    "naming",
    "read_user_text",
    "remove_stale_folders",
    "remove_stale_temporaries",
    "remove_stale_temporaries_in",
    "temporary_name",
    "write_atomic",
]
