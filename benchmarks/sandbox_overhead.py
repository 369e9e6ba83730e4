"""code_exec sandbox overhead: per-submission latency for each isolation and enforcement.

Every submission pays for its isolation (namespaces: unshare, a tmpfs root, two forks) and for its
whole-submission limits (a cgroup made and removed per run, or a 20 ms process-tree poll). This
runs the same small submission --runs times, one at a time, under each combination available on
this machine and prints the median and p95 latency of ``Sandbox.run``.

    python -m benchmarks.sandbox_overhead --runs 30
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from benchmarks.harness import percentile, print_table, write_json
from resources_servers.code_exec.sandbox import Sandbox, SandboxConfig, SandboxSetupError

CODE = "def f(x):\n    return sum(range(x))\n"
INPUTS = [{"args": [i * 1000]} for i in range(10)]


async def latencies(sandbox: Sandbox, runs: int) -> list[float]:
    """Seconds per ``run`` (after the startup probe, which is not counted)."""
    await sandbox.start()
    measured = []
    for _ in range(runs):
        began = time.perf_counter()
        result = await sandbox.run(CODE, "f", INPUTS)
        measured.append(time.perf_counter() - began)
        assert result.status == "ok", result.status
    return measured


async def main(args: argparse.Namespace) -> None:
    rows: list[dict[str, Any]] = []
    for isolation in ("namespaces", "basic"):
        for enforcement in ("cgroup", "process_tree"):
            sandbox = Sandbox(
                SandboxConfig.model_validate({"isolation": isolation, "enforcement": enforcement})
            )
            try:
                measured = await latencies(sandbox, args.runs)
            except SandboxSetupError as exc:
                rows.append({"isolation": isolation, "enforcement": enforcement, "median_ms": f"n/a: {exc}"})
                continue
            rows.append(
                {
                    "isolation": isolation,
                    "enforcement": sandbox.enforcement,
                    "runs": args.runs,
                    "median_ms": round(percentile(measured, 50) * 1000, 1),
                    "p95_ms": round(percentile(measured, 95) * 1000, 1),
                }
            )
    print_table("code_exec sandbox: latency per submission (10 calls each)", rows)
    write_json("sandbox_overhead", {"rows": rows})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=30)
    asyncio.run(main(parser.parse_args()))
