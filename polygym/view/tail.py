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
CHUNK = 4 * 1024 * 1024


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
        """Yield every complete line after the last one read (blank lines are passed over).

        The file is read in ``CHUNK`` blocks and split here: a million ``readline`` calls cost
        more than the JSON parsing of the lines they return."""
        size = self.size()
        if size < self.offset:
            self.offset, self._skipping = 0, False
            self.generation += 1
        if size == self.offset:
            return
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            pending, start = b"", self.offset  # start: where ``pending`` begins in the file
            while chunk := handle.read(CHUNK):
                data = pending + chunk if pending else chunk
                at = 0
                while (end := data.find(b"\n", at)) >= 0:
                    raw, begins, at = data[at : end + 1], start + at, end + 1
                    self.offset = begins + len(raw)
                    if self._skipping:
                        self._skipping = False
                    elif len(raw) > self.max_line + 1:
                        self.skipped += 1
                    elif not raw.isspace():
                        yield Line(begins, raw)
                pending, start = data[at:], start + at
                if len(pending) > self.max_line:  # a line too long to keep: skip it whole
                    self._skip_long(start + len(pending))
                    pending, start = b"", start + len(pending)
            # a partial last line stays unread: read again once it is complete

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
