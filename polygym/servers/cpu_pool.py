"""Running CPU-heavy verification off the event loop, with a hard time limit.

A verifier that parses math or runs code for a second blocks every other rollout served by the
same process if it runs on the event loop (DESIGN §4). Threads do not help (the GIL) and cannot be
stopped. A process pool can, if the pool kills the worker whose task overran its time limit and
replaces it — which is what ``pebble`` does, and ``concurrent.futures`` does not.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from pebble import ProcessPool

T = TypeVar("T")


class CpuTimeout(TimeoutError):
    """The offloaded call ran past its time limit; its worker process was killed."""


class CpuPool:
    """A lazily started pool of worker processes for one server."""

    def __init__(
        self,
        workers: int | None = None,
        max_tasks_per_worker: int = 1000,
        initializer: Callable[[], Any] | None = None,
    ) -> None:
        """``initializer`` runs once in each new worker: import heavy modules there (e.g. sympy)
        so the first verification on a fresh worker does not pay for them inside its time limit."""
        self.workers = workers or max(1, min(4, os.cpu_count() or 1))
        self.max_tasks_per_worker = max_tasks_per_worker
        self.initializer = initializer
        self._pool: ProcessPool | None = None

    def _ensure(self) -> ProcessPool:
        if self._pool is None:
            # forkserver: forking a process that runs an event loop and threads is unsafe.
            self._pool = ProcessPool(
                max_workers=self.workers,
                max_tasks=self.max_tasks_per_worker,
                initializer=self.initializer,
                context=multiprocessing.get_context("forkserver"),
            )
        return self._pool

    async def run(self, fn: Callable[..., T], *args: Any, timeout_s: float) -> T:
        """``fn(*args)`` in a worker process; raises CpuTimeout past ``timeout_s`` seconds.

        ``fn`` and its arguments must be picklable (a module-level function).
        """
        future = self._ensure().schedule(fn, args=args, timeout=timeout_s)
        try:
            return await asyncio.wrap_future(future)
        except FutureTimeout as exc:
            name = getattr(fn, "__name__", repr(fn))
            raise CpuTimeout(f"{name} exceeded {timeout_s:g}s and was stopped") from exc

    def close(self) -> None:
        if self._pool is not None:
            self._pool.stop()
            self._pool.join(timeout=5)
            self._pool = None
