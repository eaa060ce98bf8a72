"""One run at a time in a run directory: a lock that a crashed run cannot leave behind.

Two `train` commands with the same `--out-dir` at once would write the same checkpoints: both
could finish with a folder mixing the two runs, or one could remove the other's pending files
(a run start tidies what a killed save left) or load the other's `best` of other shapes. So the
process that writes a run's checkpoints holds an exclusive `flock` on `DIR/.run.lock` from the
moment it opens the directory until its training ends, and a second one is refused at once,
naming the process that holds it.

The lock belongs to an open file, not to the file's existence: the operating system releases it
when its process ends, however it ends (kill -9, a crash, a power loss on a local disk), so no
stale lock ever needs removing by hand. The file stays (it is tiny and hidden); it holds the
holder's pid and start time only for the message. Platforms without `fcntl` (Windows) and file
systems that refuse locks (some network ones) run without it.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

LOCK_NAME = ".run.lock"


class RunLockedError(BlockingIOError):
    """Another process is training in this run directory (an OSError: the command line's one
    error path prints its message)."""


class RunLock:
    """An exclusive lock on a run directory (module docstring); `release` or the end of the
    process frees it."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOCK_NAME
        self._fd: int | None = None
        self._made: list[Path] = []  # the folders `acquire` created (removed by `abandon`)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RunLock:
        """Take the lock (creating the directory), or a RunLockedError naming the holder."""
        if self._fd is not None or fcntl is None:
            return self
        missing, folder = [], self.directory
        while not folder.exists() and folder != folder.parent:
            missing.append(folder)
            folder = folder.parent
        self.directory.mkdir(parents=True, exist_ok=True)
        self._made = missing
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return self  # a file system without locks (some network ones): run without
            raise RunLockedError(
                f"{self.directory} is in use by another training run ({self._holder()}): "
                "wait for it to finish (then --resume continues it), or choose another --out-dir"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Free the lock (the file stays: removing it could let two runs lock two files)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def abandon(self) -> None:
        """Release after a run that never started (refused settings, nothing to resume): the
        lock file and the folders `acquire` created go too, when nothing else is in them (the
        file is removed while still locked, so no other run can hold it)."""
        if self._fd is None:
            return
        if self._made:
            self.path.unlink(missing_ok=True)
        self.release()
        for folder in self._made:
            try:
                folder.rmdir()
            except OSError:
                break  # something else is there now: it stays, and so do its parents

    def _holder(self) -> str:
        try:
            holder = json.loads(self.path.read_text(encoding="utf-8"))
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder["since"])))
            return f"process {int(holder['pid'])} on {holder['host']}, since {since}"
        except (OSError, ValueError, KeyError, TypeError):
            return "a process that is starting"

    def __del__(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass


__all__ = ["LOCK_NAME", "RunLock", "RunLockedError"]
