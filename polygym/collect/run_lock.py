"""One run writes an output at a time: an exclusive lock next to it, held for the whole run.

Two ``gym eval run --resume`` on one output each read the same finished keys, each run the same
missing jobs, and each append them: 400 jobs became 744 rows. Resume is only exact if nobody else
appends meanwhile, so a run takes ``X_run.lock`` (``fcntl.flock``, exclusive, non-blocking) before
it touches any of the files and keeps it until it has written its metrics. The second run is
refused at once, naming the first run's pid, instead of waiting: the user decides.

Why ``flock`` and not "create the file if absent": the kernel drops the lock when its holder dies,
``kill -9`` included, so a crashed run never leaves a stale lock that blocks its own ``--resume``.
The lock file is never deleted (deleting it would let a third run lock a fresh file while a
second still holds the old one); it holds the pid of the run that holds it, for the message.

The lock is opened with ``O_NOFOLLOW`` and must be a regular file: it is truncated and written,
so a symlink planted at ``X_run.lock`` (pointing at a user's file) would otherwise have that file
emptied; a symlink, FIFO or directory there is refused by name instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from pathlib import Path
from types import TracebackType

from polygym.collect.run_files import RunFileError, RunFiles

PID_BYTES = 32


class OutputBusyError(RunFileError):
    """Another run holds the output's lock."""


class RunLock:
    """Context manager holding ``files.lock`` exclusively; raises ``OutputBusyError`` when held elsewhere."""

    def __init__(self, files: RunFiles) -> None:
        self.files = files
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        path = self.files.lock
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = _open_regular(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"pid {holder}" if holder else "pid unknown"
            raise OutputBusyError(
                f"{self.files.output} is being written by another run ({who}); "
                "wait for it or choose another --output"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the last descriptor releases the lock


def _open_regular(path: Path) -> int:
    """The lock file opened read-write (created if absent), never through a symlink and never
    anything but a regular file (a FIFO would block the open: ``O_NONBLOCK`` until checked)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if path.is_symlink():
            raise RunFileError(
                f"{path}: is a symlink; the run lock must be a regular file (remove it)"
            ) from None
        raise RunFileError(f"{path}: cannot open the run lock: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RunFileError(f"{path}: is not a regular file; the run lock must be one")
    os.set_blocking(fd, True)
    return fd


def _read_pid(fd: int) -> int | None:
    raw = os.pread(fd, PID_BYTES, 0).strip()
    return int(raw) if raw.isdigit() else None
