"""Startup and stop: `gym env start` to ready, and SIGTERM to exit, for 1, 2 and 8 environments.

Ready means the launcher has written its stack record, which it does after every server has
registered with the head server (what `gym env status` and `gym eval run --no-serve` rely on).
Eight environments are eight instances of the example environments under distinct names, from a
generated config. After stop, any process of the stack still alive is reported as left behind.

    python -m benchmarks.startup --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import yaml

from benchmarks.harness import GymStack, print_table, rss_bytes, write_json

SOURCES = ("example_single_tool_call", "example_multi_step")


def env_config(count: int, path: Path) -> Path:
    """COUNT environments (resources server + simple_agent each) cloned from the examples."""
    config = {}
    for i in range(count):
        impl = SOURCES[i % 2]
        name = f"{impl}_{i}" if count > 2 else impl
        config[name] = {"resources_servers": {impl: {"domain": "agent"}}}
        config[f"{name}_simple_agent"] = {
            "responses_api_agents": {
                "simple_agent": {
                    "resources_server": {"type": "resources_servers", "name": name},
                    "model_server": {"type": "responses_api_models", "name": "policy_model"},
                }
            }
        }
    path.write_text(yaml.safe_dump(config))
    return path


def measure(count: int, backend: str, tmp: Path) -> dict[str, float | int | str]:
    config = env_config(count, tmp / f"envs{count}.yaml")
    stack = GymStack(
        ["--model-type", "scripted_model", "--config", str(config), "--backend", backend], tmp / "state"
    )
    servers = len(stack.record["servers"])
    rss = rss_bytes(stack.pids)
    stop_s, left = stack.stop()
    return {
        "ready_s": stack.ready_s,
        "stop_s": stop_s,
        "servers": servers,
        "idle_rss_mib": rss / 2**20,
        "left_behind": len(left),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--envs", default="1,2,8")
    parser.add_argument("--backends", default="inline,subprocess")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for backend in args.backends.split(","):
        for count in (int(c) for c in args.envs.split(",")):
            runs = []
            for _ in range(args.repeat):
                with tempfile.TemporaryDirectory() as tmp:
                    runs.append(measure(count, backend, Path(tmp)))
            rows.append(
                {
                    "backend": backend,
                    "envs": count,
                    "servers": runs[0]["servers"],
                    "ready_s_median": statistics.median(r["ready_s"] for r in runs),
                    "ready_s_max": max(r["ready_s"] for r in runs),
                    "stop_s_median": statistics.median(r["stop_s"] for r in runs),
                    "stop_s_max": max(r["stop_s"] for r in runs),
                    "idle_rss_mib": statistics.median(r["idle_rss_mib"] for r in runs),
                    "left_behind": sum(r["left_behind"] for r in runs),
                }
            )
    print_table("startup: gym env start -> ready, SIGTERM -> exit", rows)
    write_json("startup", {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
