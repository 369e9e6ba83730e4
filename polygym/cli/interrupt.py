"""Ctrl-C and SIGTERM for long CLI commands: cancel the work, let it clean up, then say so.

A collection interrupted by a signal must stop cleanly and leave a resumable run (DESIGN §5).
Python's default SIGINT raises ``KeyboardInterrupt`` wherever the loop happens to be, which can
skip ``finally`` blocks in other tasks; SIGTERM kills outright. Both are turned into a cancel of
the one task doing the work, whose ``finally`` blocks flush files and stop the stack, and the
caller gets ``Interrupted`` to print how to resume.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """The work was cancelled by SIGINT (Ctrl-C) or SIGTERM."""


async def until_interrupted(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` as a task that SIGINT/SIGTERM cancel; raise ``Interrupted`` once it has unwound."""
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    signalled = False

    def cancel() -> None:
        nonlocal signalled
        signalled = True
        task.cancel()

    for sig in SIGNALS:
        loop.add_signal_handler(sig, cancel)
    try:
        return await task
    except asyncio.CancelledError:
        if signalled:
            raise Interrupted from None
        raise
    finally:
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)
