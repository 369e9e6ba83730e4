"""The seed's flow exactly as a user runs it: `gym env start`, then `gym eval run --no-serve`.

The other benchmarks drive the collector in process (`polygym.collect.rollouts.collect`); this one
runs the two commands of the README's multi-environment flow as separate processes, so what the
`gym` command does around the collection (start-up, progress, health, metrics, the summary) is
measured too. The policy is the scripted model served by its own `gym env start` as an
OpenAI-compatible endpoint at a fixed latency, behind the stack's `openai_model`.

Per cell (concurrency x model latency), from outside the processes:

- start: `gym eval run` spawned -> its first rollout appended to the output file (start-up,
  reading and routing the rows, the stack check, and one rollout's latency);
- window: first -> last rollout appended; the rate is rollouts / window;
- after: last rollout appended -> the command exited (metrics, summaries, closing);
- CPU per rollout of the collector (the `gym eval run` process and its children, from wait4), of
  the stack (the `gym env start` tree) and of the scripted endpoint apart, over the whole command,
  and the cores each kept busy on average over the command (CPU / command time): on two cores,
  the process near one core is the bound;
- peak RSS of the collector (wait4's ru_maxrss) and of the stack (sampled).

    python -m benchmarks.seed_flow                                   # c = 64/256/1,024 x 0/200 ms
    python -m benchmarks.seed_flow --concurrency 64 --latency-ms 0 --repeats 200
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import GymStack, MemorySampler, cpu_seconds, print_table, write_json
from benchmarks.throughput import ENVS, mixed_input, model_calls, stack_args
from polygym.jsonl import count_rows, iter_jsonl


class RowWatch:
    """Times the first and last row appended to a JSONL file, reading only what was appended."""

    def __init__(self, path: Path, expected: int, interval_s: float = 0.005) -> None:
        self.path, self.expected, self.interval_s = path, expected, interval_s
        self.first: float | None = None
        self.last: float | None = None
        self.rows = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RowWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        offset = 0
        while not self._stop.is_set() and self.rows < self.expected:
            try:
                with self.path.open("rb") as handle:
                    handle.seek(offset)
                    chunk = handle.read()
            except FileNotFoundError:
                chunk = b""
            now = time.perf_counter()
            complete = chunk[: chunk.rfind(b"\n") + 1]
            if complete:
                offset += len(complete)
                self.rows += complete.count(b"\n")
                self.first = self.first or now
                self.last = now
            self._stop.wait(self.interval_s)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def timed_command(
    command: list[str], env: dict[str, str], output: Path, expected: int, cwd: Path | None = None
) -> dict[str, Any]:
    """Run a collector command to its end, timing its phases from the rows it appends to ``output``;
    its CPU and peak RSS (children included) come from wait4."""
    with tempfile.TemporaryFile() as log, RowWatch(output, expected) as watch:
        began = time.perf_counter()
        proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        ended = time.perf_counter()
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        tail = log.read().decode(errors="replace")[-2000:]
    if proc.returncode != 0 or watch.first is None or watch.last is None:
        raise RuntimeError(f"{command[0]} exited {proc.returncode} with {watch.rows} rows:\n{tail}")
    return {
        "rows": watch.rows,
        "start_s": watch.first - began,
        "window_s": watch.last - watch.first,
        "after_s": ended - watch.last,
        "command_s": ended - began,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mib": usage.ru_maxrss / 1024,
    }


def run_eval(
    head_url: str, rows: Path, output: Path, concurrency: int, repeats: int, state: Path
) -> dict[str, Any]:
    """`gym eval run --no-serve` as a user types it; phase times, CPU and peak RSS of the process."""
    command = [
        *(sys.executable, "-m", "polygym", "eval", "run", "--no-serve", "--head-url", head_url),
        *("--input", str(rows), "--output", str(output), "--overwrite"),
        *("--concurrency", str(concurrency), "--num-repeats", str(repeats)),
    ]
    env = {**os.environ, "POLYGYM_STATE_DIR": str(state)}
    return timed_command(command, env, output, repeats * count_rows(rows))


def scripted_endpoint(latency_ms: float, state: Path) -> GymStack:
    """The policy: the scripted model served by its own `gym env start` at a fixed latency, an
    OpenAI-compatible endpoint at ``url_of("policy_model") + "/v1"``."""
    return GymStack(
        ["--model-type", "scripted_model", "--head-port", "0",
         f"policy_model.responses_api_models.scripted_model.latency_ms={latency_ms}"],
        state / "up",
    )  # fmt: skip


def rollout_work(output: Path) -> dict[str, float]:
    """Model turns and reward per rollout written: the work per rollout depends on the rows and the
    policy, and a reward shows the rollouts were verified, so runs of different rows compare."""
    rows = list(iter_jsonl(output))
    return {
        "model_calls_per_rollout": sum(model_calls(row) for row in rows) / max(len(rows), 1),
        "mean_reward": sum(float(row.get("reward") or 0.0) for row in rows) / max(len(rows), 1),
    }


def cell_result(
    concurrency: int,
    latency_ms: float,
    cell: dict[str, Any],
    stack_cpu_s: float,
    stack_peak_rss: int,
    endpoint_cpu_s: float,
) -> dict[str, Any]:
    """One cell's row of the table, from the collector's timings and the stack's and endpoint's
    CPU and memory."""
    done, command_s = cell["rows"], cell["command_s"]
    return {
        "concurrency": concurrency,
        "latency_ms": latency_ms,
        "rollouts": done,
        "start_s": cell["start_s"],
        "window_s": cell["window_s"],
        "window_rollouts_per_s": done / cell["window_s"],
        "after_s": cell["after_s"],
        "command_rollouts_per_s": done / cell["command_s"],
        "collector_cpu_ms_per_rollout": 1000 * cell["cpu_s"] / done,
        "stack_cpu_ms_per_rollout": 1000 * stack_cpu_s / done,
        "endpoint_cpu_ms_per_rollout": 1000 * endpoint_cpu_s / done,
        "cores_collector_stack_endpoint": "/".join(
            f"{cpu / command_s:.2f}" for cpu in (cell["cpu_s"], stack_cpu_s, endpoint_cpu_s)
        ),
        "collector_peak_rss_mib": cell["peak_rss_mib"],
        "stack_peak_rss_mib": stack_peak_rss / 2**20,
        "load_1m_after": os.getloadavg()[0],
    }


def measure(concurrency: int, latency_ms: float, repeats: int, state: Path) -> dict[str, Any]:
    """One cell: a fresh endpoint and stack, one `gym eval run` against them."""
    rows = mixed_input(state / "input.jsonl")
    upstream = scripted_endpoint(latency_ms, state)
    stack: GymStack | None = None
    try:
        selectors, overrides = stack_args("openai", upstream.url_of("policy_model") + "/v1", latency_ms)
        stack = GymStack([*selectors, "--head-port", "0", *overrides], state / "stack")
        stack_cpu, endpoint_cpu = cpu_seconds(stack.pids), cpu_seconds(upstream.pids)
        with MemorySampler(stack.pids) as memory:
            cell = run_eval(
                stack.record["head_url"], rows, state / "out.jsonl", concurrency, repeats, state / "eval"
            )
        stack_cpu = cpu_seconds(stack.pids) - stack_cpu
        endpoint_cpu = cpu_seconds(upstream.pids) - endpoint_cpu
    finally:
        for proc in (stack, upstream):
            if proc is not None:
                proc.stop()
    return {
        **cell_result(concurrency, latency_ms, cell, stack_cpu, memory.peak, endpoint_cpu),
        **rollout_work(state / "out.jsonl"),
        "stack_ready_s": stack.ready_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--concurrency", type=int, action="append", help="repeatable [64, 256, 1024]")
    parser.add_argument("--latency-ms", type=float, action="append", help="repeatable [0, 200]")
    parser.add_argument("--repeats", type=int, default=200, help="rollouts per tutorial row [200]")
    args = parser.parse_args()
    results = []
    for latency_ms in args.latency_ms or [0.0, 200.0]:
        for concurrency in args.concurrency or [64, 256, 1024]:
            with tempfile.TemporaryDirectory() as state:
                results.append(measure(concurrency, latency_ms, args.repeats, Path(state)))
            print_table(f"seed flow ({' + '.join(ENVS)})", results[-1:])
    print_table("seed flow: every cell", results)
    write_json("seed_flow", {"cells": results})


if __name__ == "__main__":
    main()
