"""Serve first, compute on demand: one worker thread indexes the runs and computes page numbers.

Reading a 1,000,000-rollout file takes tens of seconds and a comparison's bootstrap a few; none of
it may stand between ``gym view`` and its URL, nor block the event loop that serves the pages. So
every index refresh and every page's numbers run here, on one thread, one job at a time: an index
is only ever written by this thread, and a page's numbers are computed from a state no other job
is changing. A page asks for its numbers (``Worker.ask``); it gets them when they are ready for
the indexes' current state, else the last ones with a note that newer are on the way, else
nothing yet, and shows the worker's progress line instead (the page polls ``/progress.json``
and reloads). Results are kept per page and run, replaced when the runs grow.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from polygym.view.index import RunIndex

REFRESH_EVERY_S = 1.0
"""A run's files are read for new rows at most this often (a live run's pages poll every 2 s)."""


def state_of(indexes: Sequence[RunIndex]) -> tuple[tuple[int, int], ...]:
    return tuple((x.generation, len(x)) for x in indexes)


@dataclass
class Answer:
    value: Any
    """None: not computed yet."""
    stale: bool
    """The value is for fewer rows than the runs have now; a newer one is being computed."""


class Worker:
    def __init__(self, indexes: list[RunIndex]) -> None:
        self.indexes = indexes
        """Shared with the viewer, which appends the runs it finds (a training run's validations)."""
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]] = queue.SimpleQueue()
        # a daemon thread, not a ThreadPoolExecutor: Ctrl-C in the middle of reading a large run
        # must end the process now, not after the read (the executor's threads are joined at exit)
        threading.Thread(target=self._loop, name="gym-view-worker", daemon=True).start()
        self._lock = threading.Lock()
        self._results: dict[Hashable, tuple[Hashable, Any]] = {}
        self._pending: dict[Hashable, Future[Any]] = {}
        self._refreshed: dict[int, float] = {}
        self.activity = ""
        """What the worker is doing now, for progress lines."""

    def _loop(self) -> None:
        while True:
            future, job = self._jobs.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(job())
                except BaseException as exc:  # handed to the page that waits on it
                    future.set_exception(exc)

    def _submit(self, key: Hashable, job: Callable[[], Any]) -> Future[Any]:
        with self._lock:
            found = self._pending.get(key)
            if found is not None and not found.done():
                return found
            future: Future[Any] = Future()
            self._jobs.put((future, job))
            self._pending[key] = future
            return future

    def refresh(self, number: int) -> None:
        """Have run ``number``'s new rows read soon (at most every ``REFRESH_EVERY_S``)."""
        now = time.monotonic()
        if now - self._refreshed.get(number, -1e9) < REFRESH_EVERY_S:
            return
        self._refreshed[number] = now
        index = self.indexes[number]

        def job() -> None:
            self.activity = f"reading {index.source.name}"
            try:
                index.refresh()
            finally:
                self.activity = ""

        self._submit(("refresh", number), job)

    def ask(
        self,
        key: Hashable,
        runs: Sequence[int],
        what: str,
        compute: Callable[[], Any],
        extra: Hashable = None,
    ) -> Answer:
        """The numbers of page ``key`` over ``runs`` (computed by ``compute`` on this thread);
        ``extra``: anything else they depend on (a training run's log files' sizes)."""
        for number in runs:
            self.refresh(number)
        indexes = [self.indexes[n] for n in runs]
        state = (state_of(indexes), extra)
        held = self._results.get(key)
        if held is not None and held[0] == state:
            return Answer(held[1], False)

        def job() -> None:  # queued after the refreshes above: the runs are read to their end
            now = (state_of(indexes), extra)
            if (found := self._results.get(key)) is not None and found[0] == now:
                return
            self.activity = what
            try:
                self._results[key] = (now, compute())
            finally:
                self.activity = ""

        self._submit(("page", key), job)
        return Answer(held[1], True) if held is not None else Answer(None, False)

    def ready(self, key: Hashable) -> bool:
        """Whether page ``key`` has numbers to show (perhaps for fewer rows than there are now)."""
        return key in self._results

    def future(self, key: Hashable) -> Future[Any] | None:
        """The job computing page ``key``, if one is queued or running (to wait a moment on it)."""
        return self._pending.get(("page", key))

    def progress(self, runs: Sequence[int]) -> dict[str, Any]:
        """What a waiting page shows: each run's indexing and the worker's current job."""
        out = []
        for number in runs:
            index = self.indexes[number]
            done, total = index.progress()
            out.append(
                {
                    "run": index.source.name,
                    "rows": len(index),
                    "loaded": index.loaded,
                    "percent": round(100 * done / total) if total else 100,
                }
            )
        return {"runs": out, "activity": self.activity}
