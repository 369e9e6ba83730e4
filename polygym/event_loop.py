"""The event loop every polygym process runs on: uvloop when installed (faster HTTP), else
asyncio's, with the garbage collector paced for rollouts in flight (``polygym.gc_pace``).

One entry for the ``gym`` command and for the processes the launcher starts (``polygym.stack.serve``),
so they all run the same loop at the same pace.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from polygym.gc_pace import pace_for_rollouts

T = TypeVar("T")


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a new loop in this thread and return its result."""
    pace_for_rollouts()
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
