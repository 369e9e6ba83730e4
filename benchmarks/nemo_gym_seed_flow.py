"""The seed flow under NeMo Gym 0.7.0: its `ng_run`, then its `ng_collect_rollouts` (issue #32).

`benchmarks/seed_flow.py` measures polygym's two commands; this measures NeMo Gym's own two doing
the same job the same way, so the two can be put side by side with a ratio:

- the policy is the same scripted model, served by its own polygym `gym env start` as an
  OpenAI-compatible endpoint at a fixed latency (`seed_flow.scripted_endpoint`);
- the stack is NeMo Gym's `ng_run` of the two tutorial environments' configs from NeMo Gym's wheel
  (`resources_servers/NAME/configs/NAME.yaml`: the resources server, its `simple_agent` and 0.7's
  `legacy_agent` environment server) and its `openai_model` config, `policy_base_url` at that
  endpoint. ng_run starts its head server, a local Ray cluster and one process per server;
- the collector is NeMo Gym's `ng_collect_rollouts` over NeMo Gym's example rows of those two
  folders, each stamped with its folder's agent (`agent_ref`), x `--repeats`, at `--concurrency`.

NeMo Gym runs in the environment polygym builds for NeMo Gym's servers (nemo-gym 0.7.0 on Python
3.13, `tests/nemo_gym_tools.tools_python`: built once, cached); ng_run's servers reuse it through
NeMo Gym's own settings `uv_venv_dir` (a folder of `.venv` links to it) and `skip_venv_if_present`,
so nothing is installed or downloaded. The head port is a free one (`port_for_a_child`).

Measured as seed_flow measures (its `timed_command` and the harness's samplers): start, window and
after from the rows the collector appends; CPU per rollout of the collector (wait4) and of ng_run's
whole process tree (its head, Ray and servers; Ray's part also apart); peak RSS of both.
`--with-polygym` runs seed_flow's cell in the same invocation, polygym before and after each NeMo
Gym run (P N P N P ... for `--rounds`), and prints the medians side by side with the ratio.

    python -m benchmarks.nemo_gym_seed_flow --with-polygym --concurrency 64 --latency-ms 0
    python -m benchmarks.nemo_gym_seed_flow --concurrency 16 --repeats 10        # NeMo Gym alone
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil

from benchmarks import seed_flow
from benchmarks.harness import MemorySampler, cpu_seconds, print_table, write_json
from benchmarks.throughput import ENVS
from polygym.jsonl import count_rows, iter_jsonl, write_jsonl
from polygym.net.child_port import port_for_a_child
from tests.nemo_gym_stack import NemoGymStack, site_packages, stack_settings
from tests.nemo_gym_tools import nemo_gym_env, tools_python

SERVER_FOLDERS = (
    *(f"resources_servers/{env}" for env in ENVS),
    "responses_api_agents/simple_agent",
    "responses_api_models/openai_model",
    "environment_servers/legacy_agent",
)
"""The server folders ng_run starts for the two configs: each environment, its agent, 0.7's relay
in front of the agent, and the model server."""
RAY_BINARIES = ("gcs_server", "raylet")
RAY_PACKAGE = "/site-packages/ray/"
COMPARED = (
    "start_s",
    "window_s",
    "window_rollouts_per_s",
    "after_s",
    "command_rollouts_per_s",
    "collector_cpu_ms_per_rollout",
    "stack_cpu_ms_per_rollout",
    "collector_peak_rss_mib",
    "stack_peak_rss_mib",
    "stack_ready_s",
    "model_calls_per_rollout",
    "mean_reward",
)


def nemo_gym_rows(root: Path, path: Path) -> Path:
    """NeMo Gym's example rows of the two folders, each stamped with its folder's agent (NeMo Gym's
    rows name none; its collector routes a row by ``agent_ref``)."""
    rows = [
        {**row, "agent_ref": {"type": "responses_api_agents", "name": f"{env}_simple_agent"}}
        for env in ENVS
        for row in iter_jsonl(root / "resources_servers" / env / "data" / "example.jsonl")
    ]
    write_jsonl(rows, path)
    return path


def config_files(root: Path) -> list[Path]:
    """The configs ng_run starts: each environment's own, and the openai_model's (policy_model)."""
    configs = [root / "resources_servers" / env / "configs" / f"{env}.yaml" for env in ENVS]
    return [*configs, root / "responses_api_models" / "openai_model" / "configs" / "openai_model.yaml"]


def ng_run_command(python: Path, model_url: str, head_port: int, state: Path) -> list[str]:
    """ng_run as a NeMo Gym user types it: the configs, the policy, the head, the shared venvs."""
    settings = stack_settings(python, SERVER_FOLDERS, model_url, head_port, state)
    configs = ",".join(map(str, config_files(site_packages(python))))
    return [str(python.parent / "ng_run"), f"+config_paths=[{configs}]", *settings]


def is_ray(proc: psutil.Process) -> bool:
    """Whether a process of ng_run's session is one of Ray's (its binaries, its Python modules, its
    workers, which rename themselves ``ray::...``) rather than NeMo Gym's head or a server."""
    try:
        words = [proc.name(), *proc.cmdline()[:3]]
    except psutil.Error:
        return False
    return any(w in RAY_BINARIES or w.startswith(("ray::", "ray-")) or RAY_PACKAGE in w for w in words)


def ray_pids(stack: NemoGymStack) -> list[int]:
    """The Ray processes of ng_run's session (with their children, through ``tree``)."""
    return [proc.pid for proc in stack.session() if is_ray(proc)]


def run_collector(
    python: Path, head_port: int, rows: Path, output: Path, concurrency: int, repeats: int
) -> dict[str, Any]:
    """`ng_collect_rollouts` as a NeMo Gym user types it, timed as seed_flow times `gym eval run`."""
    command = [
        str(python.parent / "ng_collect_rollouts"),
        *(f"+input_jsonl_fpath={rows}", f"+output_jsonl_fpath={output}"),
        *(f"+num_repeats={repeats}", f"+num_samples_in_parallel={concurrency}"),
        *("++head_server.host=127.0.0.1", f"++head_server.port={head_port}"),
    ]
    expected = repeats * count_rows(rows)
    return seed_flow.timed_command(command, nemo_gym_env(), output, expected, cwd=output.parent)


def measure(python: Path, concurrency: int, latency_ms: float, repeats: int, state: Path) -> dict[str, Any]:
    """One cell: a fresh endpoint and ng_run, one `ng_collect_rollouts` against them."""
    rows = nemo_gym_rows(site_packages(python), state / "input.jsonl")
    upstream = seed_flow.scripted_endpoint(latency_ms, state)
    stack: NemoGymStack | None = None
    try:
        (state / "stack").mkdir()
        head_port = port_for_a_child("127.0.0.1")
        command = ng_run_command(python, upstream.url_of("policy_model") + "/v1", head_port, state / "stack")
        stack = NemoGymStack(command, state / "stack", head_port)
        ray = ray_pids(stack)
        stack_cpu, ray_cpu = cpu_seconds(stack.pids), cpu_seconds(ray)
        endpoint_cpu = cpu_seconds(upstream.pids)
        with MemorySampler(stack.pids) as memory, MemorySampler(ray) as ray_memory:
            cell = run_collector(python, stack.head_port, rows, state / "out.jsonl", concurrency, repeats)
        stack_cpu = cpu_seconds(stack.pids) - stack_cpu
        ray_cpu = cpu_seconds(ray) - ray_cpu
        endpoint_cpu = cpu_seconds(upstream.pids) - endpoint_cpu
    finally:
        if stack is not None:
            stack.stop()
        upstream.stop()
    return {
        **seed_flow.cell_result(concurrency, latency_ms, cell, stack_cpu, memory.peak, endpoint_cpu),
        **seed_flow.rollout_work(state / "out.jsonl"),
        "stack_ready_s": stack.ready_s,
        "stack_ray_cpu_ms_per_rollout": 1000 * ray_cpu / cell["rows"],
        "stack_ray_peak_rss_mib": ray_memory.peak / 2**20,
    }


def side_by_side(polygym: list[dict[str, Any]], nemo_gym: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each compared column: every run's value, the medians, and NeMo Gym's median / polygym's."""
    table = []
    for column in COMPARED:
        ours, theirs = (statistics.median(r[column] for r in runs) for runs in (polygym, nemo_gym))
        table.append(
            {
                "metric": column,
                "polygym runs": " / ".join(f"{r[column]:.3g}" for r in polygym),
                "polygym": ours,
                "NeMo Gym runs": " / ".join(f"{r[column]:.3g}" for r in nemo_gym),
                "NeMo Gym": theirs,
                "NeMo Gym / polygym": theirs / ours if ours else float("nan"),
            }
        )
    return table


def run_cell(
    python: Path, concurrency: int, latency_ms: float, repeats: int, rounds: int, with_polygym: bool
) -> list[dict[str, Any]]:
    """NeMo Gym ``rounds`` times; with polygym, polygym before the first and after each of them."""

    def one(system: str) -> dict[str, Any]:
        load_before = os.getloadavg()[0]
        with tempfile.TemporaryDirectory(prefix="nemo-gym-seed-flow-") as state:
            if system == "polygym":
                result = seed_flow.measure(concurrency, latency_ms, repeats, Path(state))
            else:
                result = measure(python, concurrency, latency_ms, repeats, Path(state))
        row = {"system": system, "load_1m_before": load_before, **result}
        print_table(f"{system}, c={concurrency}, {latency_ms:g} ms", [row])
        return row

    order = ["NeMo Gym"] * rounds
    if with_polygym:
        order = ["polygym", *(s for _ in range(rounds) for s in ("NeMo Gym", "polygym"))]
    return [one(system) for system in order]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--concurrency", type=int, action="append", help="repeatable [64]")
    parser.add_argument("--latency-ms", type=float, action="append", help="repeatable [0]")
    parser.add_argument("--repeats", type=int, default=200, help="rollouts per example row [200]")
    parser.add_argument("--rounds", type=int, default=1, help="NeMo Gym runs per cell [1]")
    parser.add_argument(
        "--with-polygym", action="store_true", help="seed_flow's cell too, interleaved, and the ratio"
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped benchmark still stops its stacks
    python = tools_python()
    cells = []
    for latency_ms in args.latency_ms or [0.0]:
        for concurrency in args.concurrency or [64]:
            runs = run_cell(python, concurrency, latency_ms, args.repeats, args.rounds, args.with_polygym)
            print_table(f"seed flow, c={concurrency}, {latency_ms:g} ms: every run", runs)
            cell: dict[str, Any] = {"concurrency": concurrency, "latency_ms": latency_ms, "runs": runs}
            if args.with_polygym:
                ours = [r for r in runs if r["system"] == "polygym"]
                theirs = [r for r in runs if r["system"] == "NeMo Gym"]
                cell["side_by_side"] = side_by_side(ours, theirs)
                print_table(f"polygym and NeMo Gym 0.7.0, c={concurrency}, {latency_ms:g} ms (medians)",
                            cell["side_by_side"])  # fmt: skip
            cells.append(cell)
    write_json("nemo_gym_seed_flow", {"cells": cells})


if __name__ == "__main__":
    main()
