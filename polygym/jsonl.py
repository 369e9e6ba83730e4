"""JSON Lines files: the one reader and writer of datasets, rollouts, failures and logs.

Two ways of reading, because two kinds of file are read:

- Input a user wrote (datasets): every non-blank line must parse. ``numbered_lines`` gives each
  raw line with its number so a checker can say ``file:line: problem``; ``read_jsonl`` raises.
- Output polygym appends while it runs (rollouts, failures, step logs): a ``kill -9`` can leave a
  torn last line. ``iter_jsonl`` skips it (and any line that is not an object) so that a resumed
  run or a report reads what was finished; ``truncate_torn_tail`` cuts it before appending again.

Writers encode with orjson (numpy scalars allowed: token ids and log-probs come from tensors), one
object a line. ``JsonlAppender`` flushes after every write, so a crash loses nothing finished.
``readable=True`` writes what ``json.dumps`` writes instead (spaced separators, non-ASCII kept):
the format of the shipped datasets, which people read and diff, and which their generators must
reproduce byte for byte.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import orjson


def encode_line(row: Any) -> bytes:
    """One JSONL line: ``row`` as compact JSON and a newline."""
    return orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"


def encode_jsonl(rows: Iterable[Any]) -> bytes:
    """The bytes of a JSONL file holding ``rows`` (what resume compares against the file on disk)."""
    return b"".join(encode_line(row) for row in rows)


def _readable_line(row: Any) -> bytes:
    return (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")


def write_jsonl(rows: Iterable[Any], path: Path, *, readable: bool = False) -> int:
    """Write ``rows`` to ``path`` (replacing it, creating its folder); returns how many were written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    encode = _readable_line if readable else encode_line
    written = 0
    with path.open("wb") as handle:
        for row in rows:
            handle.write(encode(row))
            written += 1
    return written


class JsonlAppender:
    """Appends lines to a file, flushing each batch so that what was written survives a crash."""

    def __init__(self, path: Path) -> None:
        self._handle: IO[bytes] = path.open("ab")

    def write(self, row: Any) -> None:
        self._handle.write(encode_line(row))
        self._handle.flush()

    def write_all(self, rows: Iterable[Any]) -> None:
        """Several lines in one write (a step's jobs, a step's log lines)."""
        self._handle.write(encode_jsonl(rows))
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def append_jsonl(rows: Iterable[Any], path: Path) -> None:
    """Append ``rows`` to ``path`` and flush (for callers that add a few lines now and then)."""
    with JsonlAppender(path) as appender:
        appender.write_all(rows)


def numbered_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """The non-blank raw lines of ``path`` with their 1-based line numbers (for ``file:line`` messages)."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if raw.strip():
                yield number, raw


def read_jsonl(path: Path) -> list[Any]:
    """Every value of a file a user wrote; blank lines are skipped, a malformed one raises ValueError."""
    values = []
    for number, raw in numbered_lines(path):
        try:
            values.append(orjson.loads(raw))
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: invalid JSON: {exc}") from exc
    return values


def count_rows(path: Path) -> int:
    """Non-blank lines of ``path``, without parsing them (sizes for plans and reports)."""
    return sum(1 for _ in numbered_lines(path))


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The complete object lines of a file polygym appends to; a torn last line and a missing file
    give nothing, unparsable lines are skipped."""
    if not path.exists():
        return
    with path.open("rb") as handle:
        for raw in handle:
            if not raw.endswith(b"\n"):
                break
            try:
                data = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if isinstance(data, dict):
                yield data


def truncate_torn_tail(path: Path) -> None:
    """Cut a partial last line (a write interrupted by ``kill -9``) so that appends start clean."""
    if path.stat().st_size == 0:
        return
    with path.open("rb+") as handle:
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) == b"\n":
            return
        handle.truncate(path.read_bytes().rfind(b"\n") + 1)
