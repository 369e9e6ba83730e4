"""CPU-pool fairness: how long an ordinary verification waits while slow ones hold the workers.

A policy under RL learns to write answers that take longest to grade. This starts SLOW calls
(each busy for --slow-s seconds) on a pool of --workers, then one ordinary call, and reports the
ordinary call's latency with the overflow lane on (the default) and off (plain FIFO, the old pool).

    python -m benchmarks.cpu_pool --workers 2 --slow 6 --slow-s 3
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time

from benchmarks.harness import print_table, write_json
from polygym.servers.cpu_pool import CpuPool


async def ordinary_latency(pool: CpuPool, slow: int, slow_s: float) -> float:
    """Seconds from the ordinary call's submission to its result, with SLOW calls queued first."""
    await pool.run(math.factorial, 1, timeout_s=60)  # workers spawned: spawn time is not measured
    began = time.perf_counter()
    pending = [asyncio.ensure_future(pool.run(time.sleep, slow_s, timeout_s=60)) for _ in range(slow)]
    await asyncio.sleep(0)
    await pool.run(math.factorial, 2000, timeout_s=60)
    latency = time.perf_counter() - began
    await asyncio.gather(*pending)
    return latency


async def main(args: argparse.Namespace) -> None:
    rows = []
    for label, slow_workers in (("overflow lane (default)", None), ("fifo (slow_workers=0)", 0)):
        pool = CpuPool(workers=args.workers, slow_after_s=args.slow_after_s, slow_workers=slow_workers)
        try:
            latency = await ordinary_latency(pool, args.slow, args.slow_s)
        finally:
            pool.close()
        rows.append(
            {"pool": label, "workers": args.workers, "slow_calls": args.slow, "ordinary_s": round(latency, 2)}
        )
    print_table("ordinary verification latency behind slow ones", rows)
    write_json("cpu_pool", {"rows": rows})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slow", type=int, default=5)
    parser.add_argument("--slow-s", type=float, default=3.0)
    parser.add_argument("--slow-after-s", type=float, default=1.0)
    asyncio.run(main(parser.parse_args()))
