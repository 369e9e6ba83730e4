"""Throughput: rollouts/s, latency percentiles, CPU per rollout and peak RSS of the whole stack.

The two example environments behind simple_agent, with a model that answers after a fixed delay:
by default the scripted model served as an *external* endpoint (its own `gym env start` process)
behind `openai_model`, so the proxy hop is measured too; `--via scripted` puts the scripted model
inside the stack instead. The collector is `polygym.collect.rollouts.collect`, the engine of
`gym eval run`: `--collector inproc` hosts the stack in this process (what `gym eval run` does by
default), `--collector http` talks to a separate `gym env start` (what `--no-serve` does).
`--workers N` runs the stack as N inline copies, one process each (`gym eval run --workers N`);
`--backend ray` as Ray actors on a local cluster, or with `--simulate-nodes N` on N Ray nodes
simulated on this machine (`ray.cluster_utils.Cluster`, loopback), each environment with N
replicas spread over them (the nodes share this machine's cores: this measures the multi-node
machinery's cost, not more capacity).

Each cell runs ROLLOUTS rollouts or stops after --max-seconds, whichever is first (a cell at
concurrency 1 with 200 ms model latency would otherwise take half an hour).

    python benchmarks/throughput.py                        # the full grid
    python benchmarks/throughput.py --concurrency 64 --latency-ms 0
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.harness import GymStack, MemorySampler, cpu_seconds, percentile, print_table, write_json
from polygym.blend.mix import load_blend
from polygym.blend.spec import spec_from_flags
from polygym.collect.dataset import Materialization, load_jobs
from polygym.collect.rollouts import Limits, collect
from polygym.event_loop import run_async  # uvloop, as the gym command uses
from polygym.jsonl import write_jsonl
from polygym.net.client import ServerClient
from polygym.stack.catalog import selector_paths
from polygym.stack.config import load_config
from polygym.stack.launcher import Stack

ENVS = ("example_single_tool_call", "example_multi_step")
AGENTS = [f"{e}_simple_agent" for e in ENVS]


def mixed_input(path: Path) -> Path:
    """Both environments' example rows, each stamped with its agent (`gym data blend --order concat`)."""
    write_jsonl(load_blend(spec_from_flags(ENVS)).ordered("concat"), path)
    return path


def model_calls(rollout: dict[str, Any]) -> int:
    """Model turns in a rollout of the scripted policy (one call or one answer per turn)."""
    return sum(
        1 for item in rollout["response"]["output"] if item.get("type") in ("function_call", "message")
    )


@contextlib.contextmanager
def simulated_cluster(nodes: int | None) -> Iterator[str | None]:
    """The address of ``nodes`` Ray nodes started on this machine, all on loopback; None for none."""
    if not nodes:
        yield None
        return
    import ray
    from ray.cluster_utils import Cluster

    from polygym.stack.ray_backend import connect_cluster

    node: dict[str, Any] = {"num_cpus": 1, "node_ip_address": "127.0.0.1"}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    for _ in range(nodes - 1):
        cluster.add_node(**node)
    cluster.wait_for_nodes()
    connect_cluster(cluster.address)
    try:
        yield cluster.address
    finally:
        ray.shutdown()
        cluster.shutdown()


def stack_args(via: str, upstream: str | None, latency_ms: float) -> tuple[list[str], list[str]]:
    """(selectors, overrides) of the measured stack."""
    selectors = [a for e in ENVS for a in ("--resources-server", e)]
    if via == "openai":
        return ["--model-type", "openai_model", *selectors], [
            f"policy_base_url={upstream}",
            "policy_api_key=bench",
            "policy_model_name=scripted",
        ]
    return ["--model-type", "scripted_model", *selectors], [
        f"policy_model.responses_api_models.scripted_model.latency_ms={latency_ms}"
    ]


async def run_cell(
    client: ServerClient, jobs: list[Any], concurrency: int, max_seconds: float
) -> dict[str, Any]:
    latencies: list[float] = []
    calls: list[int] = []
    failures = 0
    began = time.perf_counter()
    async for result in collect(jobs, client, Limits(concurrency=concurrency, timeout_s=120)):
        if result.ok:
            latencies.append(result.latency_s)
            calls.append(model_calls(result.rollout))
        else:
            failures += 1
        if time.perf_counter() - began > max_seconds:
            break
    wall = time.perf_counter() - began
    return {"wall": wall, "latencies": latencies, "calls": calls, "failures": failures}


async def measure(
    args: argparse.Namespace, concurrency: int, latency_ms: float, state: Path
) -> dict[str, Any]:
    jobs_path = mixed_input(state / "input.jsonl")
    jobs = list(
        load_jobs(jobs_path, AGENTS, options=Materialization(num_repeats=max(1, args.rollouts // 10)))
    )
    upstream = None
    external: list[GymStack] = []
    if args.via == "openai":
        up = GymStack(
            [
                "--model-type",
                "scripted_model",
                f"policy_model.responses_api_models.scripted_model.latency_ms={latency_ms}",
            ],
            state / "up",
        )
        external.append(up)
        upstream = up.url_of("policy_model") + "/v1"
    selectors, overrides = stack_args(args.via, upstream, latency_ms)
    stack: Stack | None = None
    try:
        if args.collector == "http":
            workers = ["--workers", str(args.workers)] if args.workers else []
            served = GymStack([*selectors, "--backend", args.backend, *workers, *overrides], state / "stack")
            external.append(served)
            client = ServerClient(served.record["head_url"], pool_size=max(64, concurrency))
        else:
            rs = [e for e in ENVS]
            model = "openai_model" if args.via == "openai" else "scripted_model"
            config = load_config(selector_paths(rs, [model], []), overrides, env_files=[])
            replicas = dict.fromkeys(ENVS, args.simulate_nodes) if args.simulate_nodes else None
            stack = Stack(
                config,
                backend=args.backend,
                head_port=0,
                record=False,
                workers=args.workers,
                ray_address=args.ray_address,
                replicas=replicas,
            )
            await stack.start()
            client = stack.client or ServerClient(stack.head_url, pool_size=max(64, concurrency))
        pids = [os.getpid(), *[p for e in external for p in e.pids]]
        if stack is not None and not stack.client:
            pids += list(stack.backend.pids().values())  # type: ignore[union-attr]
        await run_cell(client, jobs[: min(len(jobs), 40)], min(concurrency, 16), 30)  # warm-up
        upstream_pids = external[0].pids if args.via == "openai" else []
        cpu_before, upstream_before = cpu_seconds(pids), cpu_seconds(upstream_pids)
        with MemorySampler(pids) as memory:
            cell = await run_cell(client, jobs, concurrency, args.max_seconds)
        cpu = cpu_seconds(pids) - cpu_before
        upstream_cpu = cpu_seconds(upstream_pids) - upstream_before
        if stack is None or client is not stack.client:
            await client.close()
    finally:
        if stack is not None:
            await stack.stop()
        for proc in external:
            proc.stop()
    done = len(cell["latencies"])
    calls = sum(cell["calls"]) / done if done else float("nan")
    rate = done / cell["wall"] if cell["wall"] else 0.0
    ideal = concurrency / (calls * latency_ms / 1000) if latency_ms else float("nan")
    return {
        "concurrency": concurrency,
        "latency_ms": latency_ms,
        "rollouts": done,
        "failures": cell["failures"],
        "rollouts_per_s": rate,
        "pct_of_ideal": 100 * rate / ideal if latency_ms else float("nan"),
        "p50_s": percentile(cell["latencies"], 50),
        "p95_s": percentile(cell["latencies"], 95),
        "p99_s": percentile(cell["latencies"], 99),
        "cpu_ms_per_rollout": 1000 * cpu / done if done else float("nan"),
        "of_which_endpoint_ms": 1000 * upstream_cpu / done if done else float("nan"),
        "peak_rss_mib": memory.peak / 2**20,
        "model_calls_per_rollout": calls,
        "load_1m_after": os.getloadavg()[0],
    }


def parse_list(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--concurrency", default="1,16,64,256,1024")
    parser.add_argument("--latency-ms", default="0,200")
    parser.add_argument("--via", choices=["openai", "scripted"], default="openai")
    parser.add_argument("--collector", choices=["inproc", "http"], default="inproc")
    parser.add_argument("--backend", choices=["inline", "subprocess", "ray"], default="inline")
    parser.add_argument("--workers", type=int, default=None, help="copies of the inline stack")
    parser.add_argument(
        "--simulate-nodes", type=int, default=None, help="--backend ray on N simulated local nodes"
    )
    parser.add_argument("--max-seconds", type=float, default=60.0)
    parser.add_argument("--name", default="throughput")
    args = parser.parse_args()
    if args.simulate_nodes and (args.backend != "ray" or args.collector != "inproc"):
        parser.error("--simulate-nodes needs --backend ray --collector inproc")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rows = []
    title = f"{args.name}: via={args.via} collector={args.collector} backend={args.backend}"
    title += f" workers={args.workers}" if args.workers else ""
    title += f" simulated nodes={args.simulate_nodes}" if args.simulate_nodes else ""
    with simulated_cluster(args.simulate_nodes) as args.ray_address:
        for latency in parse_list(args.latency_ms):
            for concurrency in parse_list(args.concurrency):
                with tempfile.TemporaryDirectory() as tmp:
                    row = run_async(measure(args, int(concurrency), latency, Path(tmp)))
                rows.append(row)
                print_table(title, [row])
    print_table(title, rows)
    write_json(args.name, {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
