"""Scale: 10,000 rollouts in flight at once; memory over time must stay flat.

Runs `gym eval run`'s engine (stack in this process, outputs streamed to files) with concurrency
10,000 over ROLLOUTS rollouts of the two example environments, the scripted model answering after
--latency-ms. RSS of the whole process is sampled every 0.5 s; the report compares the RSS when
the first quarter of rollouts had finished with the RSS at the end: a leak shows as growth.

    python -m benchmarks.scale --rollouts 40000 --concurrency 10000
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from benchmarks.harness import MemorySampler, print_table, write_json
from benchmarks.throughput import AGENTS, ENVS, mixed_input
from polygym.cli.base import run_async  # uvloop, as the gym command uses
from polygym.collect.dataset import Materialization, load_jobs
from polygym.collect.eval_run import run_eval
from polygym.collect.rollouts import Limits
from polygym.collect.run_files import RunFiles
from polygym.stack.catalog import selector_paths
from polygym.stack.config import load_config
from polygym.stack.launcher import Stack


async def run(rollouts: int, concurrency: int, latency_ms: float, tmp: Path) -> dict[str, object]:
    overrides = [f"policy_model.responses_api_models.scripted_model.latency_ms={latency_ms}"]
    config = load_config(selector_paths(list(ENVS), ["scripted_model"], []), overrides, env_files=[])
    stack = Stack(config, backend="inline", head_port=0, record=False)
    await stack.start()
    jobs = load_jobs(
        mixed_input(tmp / "in.jsonl"), AGENTS, options=Materialization(num_repeats=rollouts // 10)
    )
    assert stack.client is not None
    try:
        with MemorySampler([os.getpid()], interval_s=0.5) as memory:
            began = time.perf_counter()
            summary = await run_eval(
                stack.client,
                jobs,
                RunFiles(tmp / "out.jsonl"),
                Limits(concurrency=concurrency, timeout_s=600),
                progress_interval_s=30,
            )
            wall = time.perf_counter() - began
    finally:
        await stack.stop()
    series = memory.series
    quarter = series[len(series) // 4][1] if series else 0
    half = series[len(series) // 2][1] if series else 0
    end = series[-1][1] if series else 0
    return {
        "rollouts": summary.succeeded,
        "failures": summary.failed,
        "concurrency": concurrency,
        "latency_ms": latency_ms,
        "wall_s": wall,
        "rollouts_per_s": summary.succeeded / wall,
        "rss_25pct_mib": quarter / 2**20,
        "rss_50pct_mib": half / 2**20,
        "rss_end_mib": end / 2**20,
        "peak_rss_mib": memory.peak / 2**20,
        "growth_25pct_to_end_pct": 100 * (end - quarter) / quarter if quarter else float("nan"),
        "series": [(t, round(v / 2**20, 1)) for t, v in series],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=40000)
    parser.add_argument("--concurrency", type=int, default=10000)
    parser.add_argument("--latency-ms", type=float, default=500.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        row = run_async(run(args.rollouts, args.concurrency, args.latency_ms, Path(tmp)))
    print_table(
        "scale: rollouts in flight, memory over time", [{k: v for k, v in row.items() if k != "series"}]
    )
    write_json("scale", {"args": vars(args), **row})


if __name__ == "__main__":
    main()
