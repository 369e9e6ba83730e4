"""Scale: 10,000 rollouts in flight at once; memory over time must stay flat.

Runs `gym eval run`'s engine (stack in this process, or ``--workers N`` copies of it, one process
each, as replicas; outputs streamed to files) with concurrency 10,000 over ROLLOUTS rollouts of the
two example environments, the scripted model answering after --latency-ms. RSS of the whole
process tree is sampled every 0.5 s; the report compares the RSS when the first quarter of the
run had passed with the RSS at the end: a leak shows as growth. ``--minutes M`` ends the run
after M minutes however many rollouts are left (the run is interrupted as Ctrl-C would, and is
resumable), and adds the RSS at every whole minute, so "flat over a 5-minute run" is a reading,
not a hope.

    python -m benchmarks.scale --rollouts 40000 --concurrency 10000
    python -m benchmarks.scale --rollouts 1000000 --concurrency 10000 --workers 2 --minutes 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from benchmarks.harness import MemorySampler, print_table, write_json
from benchmarks.throughput import AGENTS, ENVS, mixed_input
from polygym.collect.dataset import Materialization, load_jobs
from polygym.collect.eval_run import run_eval
from polygym.collect.rollouts import Limits
from polygym.collect.run_files import RunFiles
from polygym.event_loop import run_async  # uvloop, as the gym command uses
from polygym.jsonl import count_rows
from polygym.net.client import ServerClient
from polygym.stack.catalog import selector_paths
from polygym.stack.config import load_config
from polygym.stack.launcher import Stack


async def run(
    rollouts: int, concurrency: int, latency_ms: float, tmp: Path, workers: int | None, minutes: float | None
) -> dict[str, object]:
    overrides = [f"policy_model.responses_api_models.scripted_model.latency_ms={latency_ms}"]
    config = load_config(selector_paths(list(ENVS), ["scripted_model"], []), overrides, env_files=[])
    stack = Stack(config, backend="inline", head_port=0, record=False, workers=workers)
    await stack.start()
    # interleaved (abcabc): the same mix of both environments all run long, so memory over time
    # compares like with like (row by row, the heavier multi-step rows would all come last)
    options = Materialization(num_repeats=rollouts // 10, interleave=True)
    jobs = load_jobs(mixed_input(tmp / "in.jsonl"), AGENTS, options=options)
    # --workers: the copies are other processes, reached over HTTP like any replica set
    client = stack.client or ServerClient(stack.head_url, pool_size=concurrency)
    try:
        with MemorySampler([os.getpid()], interval_s=0.5) as memory:
            began = time.perf_counter()
            files = RunFiles(tmp / "out.jsonl")
            collecting = run_eval(
                client,
                jobs,
                files,
                Limits(concurrency=concurrency, timeout_s=600),
                progress_interval_s=30,
            )
            try:
                summary = await (asyncio.wait_for(collecting, minutes * 60) if minutes else collecting)
                succeeded, failed = summary.succeeded, summary.failed
            except TimeoutError:  # --minutes passed: what was written is what finished
                succeeded, failed = count_rows(files.output), count_rows(files.failures)
            wall = time.perf_counter() - began
    finally:
        if client is not stack.client:
            await client.close()
        await stack.stop()
    series = memory.series
    quarter = series[len(series) // 4][1] if series else 0
    half = series[len(series) // 2][1] if series else 0
    end = series[-1][1] if series else 0
    return {
        "rollouts": succeeded,
        "failures": failed,
        "concurrency": concurrency,
        "latency_ms": latency_ms,
        "wall_s": wall,
        "rollouts_per_s": succeeded / wall,
        "rss_25pct_mib": quarter / 2**20,
        "rss_50pct_mib": half / 2**20,
        "rss_end_mib": end / 2**20,
        "peak_rss_mib": memory.peak / 2**20,
        "growth_25pct_to_end_pct": 100 * (end - quarter) / quarter if quarter else float("nan"),
        "rss_each_minute_mib": each_minute(series),
        "series": [(t, round(v / 2**20, 1)) for t, v in series],
    }


def each_minute(series: list[tuple[float, int]]) -> list[int]:
    """RSS (MiB) at the first sample of every whole minute after the first."""
    out: dict[int, int] = {}
    for t, value in series:
        if int(t // 60) >= 1:
            out.setdefault(int(t // 60), round(value / 2**20))
    return list(out.values())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=40000)
    parser.add_argument("--concurrency", type=int, default=10000)
    parser.add_argument("--latency-ms", type=float, default=500.0)
    parser.add_argument("--workers", type=int, default=None, help="copies of the inline stack (replicas)")
    parser.add_argument("--minutes", type=float, default=None, help="end the run after this long")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        row = run_async(
            run(args.rollouts, args.concurrency, args.latency_ms, Path(tmp), args.workers, args.minutes)
        )
    print_table(
        "scale: rollouts in flight, memory over time", [{k: v for k, v in row.items() if k != "series"}]
    )
    write_json("scale", {"args": vars(args), **row})


if __name__ == "__main__":
    main()
