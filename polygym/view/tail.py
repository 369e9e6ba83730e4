"""Reading a JSON Lines file that is still being appended to, one complete line at a time.

A run being collected grows line by line, and its last line may be half written. ``JsonlTail``
remembers the byte offset after the last complete line, so each ``read_new`` costs only the new
bytes; a partial last line is left for the next read. A line longer than ``max_line`` bytes is
skipped whole (a runaway model output must not take the viewer's memory), and a file that got
shorter than what was read (``--overwrite`` started the run over) is read again from the start,
with ``generation`` counting such restarts so that an index knows to drop its rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MAX_LINE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Line:
    offset: int
    raw: bytes


class JsonlTail:
    """The complete lines appended to ``path`` since the previous read."""

    def __init__(self, path: Path, max_line: int = MAX_LINE_BYTES) -> None:
        self.path = path
        self.max_line = max_line
        self.offset = 0
        self.generation = 0
        self.skipped = 0
        """Lines skipped for being longer than ``max_line``."""
        self._skipping = False

    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def read_new(self) -> Iterator[Line]:
        """Yield every complete line after the last one read (blank lines are passed over)."""
        size = self.size()
        if size < self.offset:
            self.offset, self._skipping = 0, False
            self.generation += 1
        if size == self.offset:
            return
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            while True:
                start = handle.tell()
                raw = handle.readline(self.max_line + 1)
                if not raw.endswith(b"\n"):
                    if len(raw) > self.max_line:
                        self._skip_long(start + len(raw))
                        continue
                    return  # a partial last line: read again once it is complete
                self.offset = start + len(raw)
                if self._skipping:
                    self._skipping = False
                    continue
                if raw.strip():
                    yield Line(start, raw)

    def _skip_long(self, offset: int) -> None:
        if not self._skipping:
            self.skipped += 1
        self._skipping = True
        self.offset = offset


def read_at(path: Path, offset: int, length: int) -> bytes:
    """The bytes of one line found earlier (the index keeps offsets, not rows)."""
    with path.open("rb") as handle:
        handle.seek(offset)
        return handle.read(length)
