"""How often the cyclic garbage collector runs in a process that serves or collects rollouts.

CPython collects its youngest generation every 700 net allocations of container objects, and the
whole heap once the objects promoted since the last full collection pass a quarter of the old
generation. That suits a program whose live data is stable. A stack with many rollouts in flight
is the opposite case: each rollout's JSON (its input, every turn, the model's replies) lives for
seconds, long enough to be promoted, then dies by reference counting. Promotions come so fast that
full collections run several times a second, and each one walks every rollout in flight.

Measured with ``benchmarks/throughput.py`` at concurrency 1,024 and 200 ms model latency (inline
stack, one process for the collector and the stack): at the default thresholds, 26 full
collections took 3.9 s of a 10.5 s cell, and 3,400 younger ones another 1.0 s. With the youngest
threshold at 50,000, the same cell made 12 young collections and no full one (0.5 s together) and
ran in 6.1 s. Reference counting frees nearly all of a rollout: those collections found fewer than
1,000 cyclic objects in all, so memory stays where it was. Failures do make cycles (an exception's
traceback holds the frames that hold the request), so a failure storm was measured too: 20,000
rollouts of 100 KB rows at concurrency 1,024, every model call answered 400, peaked at 1,216 MiB
paced against 1,262 MiB at the default thresholds.

Only the youngest threshold is raised, and only upward: a process that already collects less often
(a trainer that tuned its own) keeps its setting, and one with the collector disabled stays so.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000
"""Net container allocations between two young collections (CPython's default: 700)."""


def pace_for_rollouts() -> None:
    """Collect the young generation every ``YOUNG_THRESHOLD`` allocations in this process.

    Called where a polygym process starts its event loop (the ``gym`` command, a server child, a
    Ray replica), not on import: a library user's own process keeps its settings.
    """
    young, middle, old = gc.get_threshold()
    if 0 < young < YOUNG_THRESHOLD:
        gc.set_threshold(YOUNG_THRESHOLD, middle, old)
