"""The work ``gym eval run`` does around the metrics file, at 100,000 rollouts.

After the collection window the collector writes ``_aggregate_metrics.json``: per agent, the
environment's own metrics (NeMo Gym's ``/aggregate_metrics``, which takes every rollout as
``verify_responses``), latency percentiles and health counts. This benchmark times that work on
synthetic rollouts shaped like the tutorial's (a tool call, its output, an answer), in process:

- during: what the collector adds per result for it (the reduced rollout spooled for the body,
  the health monitor's observation), in microseconds per rollout;
- after: from the last result to the metrics file written, less the answering environment's time
  (``environment_s``: ``polygym.metrics`` over the decoded body, what a polygym environment
  computes; in its own process in a real run) and the request bodies' size;
- peak: the most memory the collector's side held at once (tracemalloc, a separate pass in which
  the environment does not decode), against the size of the output file the rollouts fill;
- for a run of its own rollouts only (``live``: kept as they arrived) and for a resumed run, whose
  earlier rollouts are read back from the file (``files``).

    python -m benchmarks.aggregation                 # 100,000 rollouts
    python -m benchmarks.aggregation --rollouts 10000
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import orjson

from benchmarks.harness import print_table, write_json
from polygym import metrics
from polygym.collect.eval_run import MetricsInputs, RunSummary, write_aggregate_metrics
from polygym.collect.health import env_of
from polygym.collect.run_files import RunFiles
from polygym.jsonl import write_jsonl
from polygym.net.client import Reply, ServerClient

AGENTS = ("example_single_tool_call_simple_agent", "example_multi_step_simple_agent")
TOOL = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "A city name."}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def rollout(index: int) -> dict[str, Any]:
    """One verified rollout as the tutorial's environments write it (about 1.5 KB of JSON)."""
    output = [
        {
            "type": "function_call",
            "call_id": f"c{index}",
            "name": "get_weather",
            "arguments": '{"city": "Oslo"}',
        },
        {"type": "function_call_output", "call_id": f"c{index}", "output": '{"weather": "cold, 3 C"}'},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is cold."}]},
    ]
    return {
        "agent_ref": {"type": "responses_api_agents", "name": AGENTS[index % len(AGENTS)]},
        "responses_create_params": {"input": [{"role": "user", "content": "Weather?"}], "tools": [TOOL]},
        "response": {"id": f"r{index}", "status": "completed", "output": output,
                     "usage": {"input_tokens": 220, "output_tokens": 30, "total_tokens": 250}},
        "reward": float(index % 3 != 0),
        "_ng_task_index": index // 8 % 1000,
        "_ng_rollout_index": index % 8 + 8 * (index // 8000),
    }  # fmt: skip


class PolygymEnvironment:
    """Answers ``/aggregate_metrics`` as a polygym environment does, from the encoded body; its
    time is kept apart (``seconds``), and ``compute=False`` answers without decoding, so that the
    memory pass counts the collector's request body, not the environment's copy of it."""

    def __init__(self, compute: bool = True) -> None:
        self.compute, self.seconds, self.body_bytes = compute, 0.0, 0

    async def call(self, name: str, path: str, body: dict[str, Any], **_: Any) -> Reply:
        began = time.perf_counter()
        encoded = orjson.dumps(body)  # what the HTTP client sends
        self.body_bytes += len(encoded)
        answer = metrics.aggregate(orjson.loads(encoded)["verify_responses"] if self.compute else [])
        self.seconds += time.perf_counter() - began
        return Reply(200, orjson.dumps(metrics.nemo_shape(answer)))


def live_run(files: RunFiles, count: int, env: PolygymEnvironment) -> Callable[[], Any]:
    """Feed ``count`` rollouts as the collector does; returns the post-window step."""
    summary = RunSummary(total=count, skipped=0)
    inputs = MetricsInputs()
    for index in range(count):
        row = rollout(index)
        summary.health.observe(row)
        inputs.rollout(env_of(row), row)
    client = cast(ServerClient, env)
    return lambda: write_aggregate_metrics(files, client, summary, inputs)


def resumed_run(files: RunFiles, count: int, env: PolygymEnvironment) -> Callable[[], Any]:
    """The same rollouts already in the output file (a resumed run reads them back)."""
    write_jsonl((rollout(i) for i in range(count)), files.output)
    client = cast(ServerClient, env)
    return lambda: write_aggregate_metrics(files, client, RunSummary(total=count, skipped=count))


def measure(mode: str, count: int, folder: Path) -> dict[str, Any]:
    files = RunFiles(folder / f"{mode}.jsonl")
    write_jsonl([], files.failures)
    prepare = live_run if mode == "live" else resumed_run
    env = PolygymEnvironment()
    began = time.perf_counter()
    after = prepare(files, count, env)
    during = time.perf_counter() - began
    began = time.perf_counter()
    asyncio.run(after())
    after_s = time.perf_counter() - began - env.seconds
    tracemalloc.start()
    asyncio.run(prepare(files, count, PolygymEnvironment(compute=False))())
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    file_size = sum(len(orjson.dumps(rollout(i))) + 1 for i in range(count))
    return {
        "mode": mode,
        "rollouts": count,
        "during_us_per_rollout": 1e6 * during / count if mode == "live" else 0.0,
        "after_s": after_s,
        "environment_s": env.seconds,
        "body_mib": env.body_bytes / 2**20,
        "peak_mib": peak / 2**20,
        "output_file_mib": file_size / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=100_000, help="rollouts in the run [100000]")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        results = [measure(mode, args.rollouts, Path(folder)) for mode in ("live", "files")]
    print_table("metrics file after the window", results)
    write_json("aggregation", {"cells": results})


if __name__ == "__main__":
    main()
