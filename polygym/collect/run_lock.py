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
"""

from __future__ import annotations

import contextlib
import fcntl
import os
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
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
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


def _read_pid(fd: int) -> int | None:
    raw = os.pread(fd, PID_BYTES, 0).strip()
    return int(raw) if raw.isdigit() else None
