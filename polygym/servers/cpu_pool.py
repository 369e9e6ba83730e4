"""Running CPU-heavy verification off the event loop, with a hard time limit.

A verifier that parses math or runs code for a second blocks every other rollout served by the
same process if it runs on the event loop (DESIGN §4). Threads do not help (the GIL) and cannot be
stopped. A process pool can, if the pool kills the worker whose task overran its time limit and
replaces it — which is what ``pebble`` does, and ``concurrent.futures`` does not.

Fairness: verification times are long-tailed, and a policy under RL learns to write the answers
that take longest to parse. With a plain FIFO pool, ``workers`` slow answers occupy every worker
and each ordinary answer waits behind them for up to ``timeout_s`` per round (measured: six slow
answers delayed a normal one by 33 s). So the pool admits at most ``workers`` calls at once, and a
call still running after ``slow_after_s`` counts as slow. When every main worker is stuck on a slow
call, the next callers go to an *overflow lane* of ``slow_workers`` processes, started only then.
As long as fewer than ``workers + slow_workers`` calls are slow at once, an ordinary call waits
about ``slow_after_s`` behind them instead of whole rounds of ``timeout_s``; slow calls still finish
(or time out) where they run. Beyond that bound the pool is FIFO again: without preemption (which
would make a reward depend on load) no pool of fixed size can do better. The cost is the overflow
processes, which share the cores while slow calls run.
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


class _Lane:
    """One pebble pool and the calls running on it; ``slow`` counts those past ``slow_after_s``."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.pool: ProcessPool | None = None
        self.busy = 0
        self.slow = 0

    def close(self) -> None:
        if self.pool is not None:
            self.pool.stop()
            self.pool.join(timeout=5)
            self.pool = None


class CpuPool:
    """A lazily started pool of worker processes for one server, with a slow lane."""

    def __init__(
        self,
        workers: int | None = None,
        max_tasks_per_worker: int = 1000,
        initializer: Callable[[], Any] | None = None,
        slow_after_s: float = 1.0,
        slow_workers: int | None = None,
    ) -> None:
        """``initializer`` runs once in each new worker: import heavy modules there (e.g. sympy)
        so the first verification on a fresh worker does not pay for them inside its time limit.

        ``slow_workers`` (default: ``2 * workers``) is the size of the overflow lane, started only
        the first time every main worker is busy with a slow call; 0 turns it off (plain FIFO).
        """
        if slow_after_s <= 0:
            raise ValueError(f"slow_after_s must be > 0, got {slow_after_s}")
        self.workers = workers or max(1, min(4, os.cpu_count() or 1))
        slow_workers = 2 * self.workers if slow_workers is None else slow_workers
        if slow_workers < 0:
            raise ValueError(f"slow_workers must be >= 0, got {slow_workers}")
        self.slow_workers = slow_workers
        self.slow_after_s = slow_after_s
        self.max_tasks_per_worker = max_tasks_per_worker
        self.initializer = initializer
        self._main = _Lane(self.workers)
        self._overflow = _Lane(slow_workers)
        self._changed: asyncio.Condition | None = None

    def _pool(self, lane: _Lane) -> ProcessPool:
        if lane.pool is None:
            # forkserver: forking a process that runs an event loop and threads is unsafe.
            lane.pool = ProcessPool(
                max_workers=lane.size,
                max_tasks=self.max_tasks_per_worker,
                initializer=self.initializer,
                context=multiprocessing.get_context("forkserver"),
            )
        return lane.pool

    def _free_lane(self) -> _Lane | None:
        """The main lane when it has a free worker; the overflow lane only when every main worker
        is stuck on a slow call (a fast one will free its worker soon, so waiting is cheaper)."""
        if self._main.busy < self._main.size:
            return self._main
        if self._main.slow == self._main.size and self._overflow.busy < self._overflow.size:
            return self._overflow
        return None

    async def run(self, fn: Callable[..., T], *args: Any, timeout_s: float) -> T:
        """``fn(*args)`` in a worker process; raises CpuTimeout past ``timeout_s`` seconds.

        ``fn`` and its arguments must be picklable (a module-level function). The time limit counts
        from when a worker starts the call, not from when it was queued.
        """
        if self._changed is None:
            self._changed = asyncio.Condition()
        changed = self._changed
        async with changed:
            while (lane := self._free_lane()) is None:
                await changed.wait()
            lane.busy += 1
        marked_slow = False
        try:
            result = asyncio.wrap_future(self._pool(lane).schedule(fn, args=args, timeout=timeout_s))
            done, _ = await asyncio.wait({result}, timeout=self.slow_after_s)
            if not done:
                async with changed:
                    lane.slow += 1
                    marked_slow = True
                    changed.notify_all()
            return await self._outcome(result, fn, timeout_s)
        finally:
            async with changed:
                lane.busy -= 1
                lane.slow -= marked_slow
                changed.notify_all()

    @staticmethod
    async def _outcome(result: asyncio.Future[T], fn: Callable[..., T], timeout_s: float) -> T:
        try:
            return await result
        except FutureTimeout as exc:
            name = getattr(fn, "__name__", repr(fn))
            raise CpuTimeout(f"{name} exceeded {timeout_s:g}s and was stopped") from exc

    @property
    def running(self) -> bool:
        """Whether any worker processes exist (they start at the first call, end at ``close``)."""
        return self._main.pool is not None or self._overflow.pool is not None

    def close(self) -> None:
        self._main.close()
        self._overflow.close()
