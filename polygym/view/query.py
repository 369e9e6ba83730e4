"""Which rows the rollout list shows: filters read from the query string, then one page of them.

Filters work on the index's columns (fast on 100,000 rows). Text search looks for the words in the
rows' raw JSON lines on disk: the query is JSON-escaped first, so a quote or a newline matches as
the file writes it, and case is ignored for ASCII letters. Each file is scanned once per distinct
search (lowercased chunk by chunk, see ``_positions``) and the match positions are mapped to rows
by their offsets; the latest searches are cached, so paging through results costs nothing more.

Every value is bounded and checked: a bad one is a ``QueryError`` (HTTP 400) that names it.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import orjson

from polygym.view.index import RunIndex

PER_PAGE = 50
MAX_PER_PAGE = 500
MAX_TEXT_QUERY = 200
STATUSES = ("", "ok", "failed")
_SEARCH_CACHE = 16
CHUNK = 16 * 1024 * 1024


class QueryError(ValueError):
    """A filter value that cannot be used; the message names the parameter."""


@dataclass(frozen=True)
class RowFilter:
    env: str = ""
    status: str = ""
    failure_class: str = ""
    reward_min: float | None = None
    reward_max: float | None = None
    text: str = ""
    task: str = ""
    """A task key: the repeats of one task."""
    step: int | None = None

    def params(self) -> dict[str, str]:
        """The non-empty filters, as query parameters (for paging links)."""
        out = {
            "env": self.env,
            "status": self.status,
            "class": self.failure_class,
            "min": "" if self.reward_min is None else f"{self.reward_min:g}",
            "max": "" if self.reward_max is None else f"{self.reward_max:g}",
            "q": self.text,
            "task": self.task,
            "step": "" if self.step is None else str(self.step),
        }
        return {k: v for k, v in out.items() if v}


def _float(params: Mapping[str, str], name: str) -> float | None:
    value = params.get(name, "").strip()
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        raise QueryError(f"{name}: not a number: {value[:40]!r}") from None
    if number != number or abs(number) == float("inf"):
        raise QueryError(f"{name}: must be a finite number")
    return number


def _int(params: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    value = params.get(name, "").strip()
    if not value:
        return default
    if not value.lstrip("-").isdigit() or len(value) > 12:
        raise QueryError(f"{name}: not a whole number: {value[:40]!r}")
    number = int(value)
    if not low <= number <= high:
        raise QueryError(f"{name}: must be between {low} and {high}")
    return number


def parse_filter(params: Mapping[str, str]) -> RowFilter:
    status = params.get("status", "")
    if status not in STATUSES:
        raise QueryError(f"status: one of ok, failed (got {status[:40]!r})")
    text = params.get("q", "")
    if len(text) > MAX_TEXT_QUERY:
        raise QueryError(f"q: at most {MAX_TEXT_QUERY} characters")
    step = _int(params, "step", -1, -1, 10**9)
    return RowFilter(
        env=params.get("env", ""),
        status=status,
        failure_class=params.get("class", ""),
        reward_min=_float(params, "min"),
        reward_max=_float(params, "max"),
        text=text.strip(),
        task=params.get("task", "")[:64],
        step=None if step < 0 else step,
    )


def parse_page(params: Mapping[str, str]) -> tuple[int, int]:
    """(page number from 1, rows per page)."""
    return _int(params, "page", 1, 1, 10**7), _int(params, "per_page", PER_PAGE, 1, MAX_PER_PAGE)


_searches: OrderedDict[tuple[str, int, int, str], set[int]] = OrderedDict()


def _positions(path: Path, needle: bytes) -> Iterator[int]:
    """Offsets of ``needle`` (lowercase) in ``path`` read in lowercased chunks: ``bytes.lower`` and
    ``find`` run at memory speed, where a case-insensitive regular expression is several times slower."""
    overlap = len(needle) - 1
    with path.open("rb") as handle:
        base, carry = 0, b""
        while chunk := handle.read(CHUNK):
            data = carry + chunk.lower()
            at = data.find(needle)
            while at >= 0:
                yield base + at
                at = data.find(needle, at + 1)
            carry = data[len(data) - overlap :] if overlap else b""
            base += len(data) - len(carry)


def _matches_in(index: RunIndex, which: int, needle: bytes) -> set[int]:
    rows = [i for i in range(len(index)) if index.file[i] == which]
    path = index.source.rollouts if which == 0 else index.source.failures
    if not rows or not path.exists():
        return set()
    starts = [index.offset[i] for i in rows]
    found: set[int] = set()
    for position in _positions(path, needle):
        at = bisect.bisect_right(starts, position) - 1
        if at >= 0 and position < starts[at] + index.length[rows[at]]:
            found.add(rows[at])
    return found


def text_matches(index: RunIndex, text: str) -> set[int]:
    """Rows whose raw line contains ``text`` (ASCII case ignored), cached per index state."""
    key = (str(index.source.rollouts), index.generation, len(index), text.lower())
    if key in _searches:
        _searches.move_to_end(key)
        return _searches[key]
    needle = orjson.dumps(text)[1:-1].lower()
    found = _matches_in(index, 0, needle) | _matches_in(index, 1, needle)
    _searches[key] = found
    while len(_searches) > _SEARCH_CACHE:
        _searches.popitem(last=False)
    return found


def select(index: RunIndex, flt: RowFilter) -> list[int]:
    """Row numbers passing every filter, in file order."""
    rows: range | list[int] = range(len(index))
    if flt.env:
        code = index.envs.index(flt.env) if flt.env in index.envs else -1
        rows = [i for i in rows if index.env[i] == code]
    if flt.status:
        want = flt.status == "failed"
        rows = [i for i in rows if index.failed[i] == want]
    if flt.failure_class:
        code = index.classes.index(flt.failure_class) if flt.failure_class in index.classes else -2
        rows = [i for i in rows if index.failure_class[i] == code]
    if flt.reward_min is not None:
        low = flt.reward_min
        rows = [i for i in rows if not index.failed[i] and index.reward[i] >= low]
    if flt.reward_max is not None:
        high = flt.reward_max
        rows = [i for i in rows if not index.failed[i] and index.reward[i] <= high]
    if flt.task:
        code = index.task_keys.index(flt.task) if flt.task in index.task_keys else -2
        rows = [i for i in rows if index.task_code[i] == code]
    if flt.step is not None:
        rows = [i for i in rows if index.step[i] == flt.step]
    if flt.text:
        found = text_matches(index, flt.text)
        rows = [i for i in rows if i in found]
    return list(rows)


@dataclass(frozen=True)
class Page:
    rows: list[int]
    number: int
    per_page: int
    total: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.per_page))


def page_of(rows: list[int], number: int, per_page: int) -> Page:
    """Page ``number`` (past the end: the last page)."""
    pages = max(1, -(-len(rows) // per_page))
    number = min(number, pages)
    start = (number - 1) * per_page
    return Page(rows[start : start + per_page], number, per_page, len(rows))
