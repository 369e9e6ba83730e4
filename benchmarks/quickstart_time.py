"""The quickstart's collection on the embedded model, timed from outside (issue #32).

What `bash quickstart.sh` runs after installing: `gym eval run` of the two example environments'
ten rows on `local_model`, with the stack started by the command itself. Per run, from outside
the processes:

- load: the model's start in a process of its own (weights found and checked, llama.cpp loaded,
  its helper endpoints answering), what `gym eval run` waits for before the first request;
- alone: `gym eval run --limit 1`, one single-tool-call rollout with nothing else running
  (command start -> its row written);
- first: the full run's command start -> its first rollout written;
- all: the full run's command start -> its last rollout written;
- the mean reward per agent, and the load average when the run began (the machine is shared:
  compare checkouts only within one invocation, which interleaves them: A, B, A, B).

    python -m benchmarks.quickstart_time                                   # this checkout, once
    python -m benchmarks.quickstart_time --repo ../main --repo . --rounds 2  # before/after, interleaved
    python -m benchmarks.quickstart_time -- policy_model.responses_api_models.local_model.n_threads=2

Each checkout runs with this interpreter and its own tree first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.harness import print_table, write_json
from benchmarks.seed_flow import RowWatch

ENVS = ("example_single_tool_call", "example_multi_step")
LOAD_SCRIPT = """
import asyncio, time
started = time.perf_counter()
from responses_api_models.local_model.app import LocalModel
async def main():
    server = LocalModel("policy_model", {"entrypoint": "app.py"})
    await server.startup()
    print(time.perf_counter() - started)
    await server.shutdown()
asyncio.run(main())
"""


def _env(repo: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}


def model_load(repo: Path) -> float:
    """Seconds from a fresh interpreter to the model answering (imports included)."""
    out = subprocess.run(
        [sys.executable, "-c", LOAD_SCRIPT],
        cwd=repo,
        env=_env(repo),
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def collect(repo: Path, rows: Path, output: Path, extra: list[str], limit: int | None) -> dict[str, Any]:
    """One `gym eval run` of ``rows`` on local_model; times of its first and last rollouts."""
    command = [sys.executable, "-m", "polygym", "eval", "run", "--model-type", "local_model"]
    for env in ENVS:
        command += ["--resources-server", env]
    command += ["--input", str(rows), "--output", str(output), "--overwrite", *extra]
    if limit:
        command += ["--limit", str(limit)]
    expected = limit or sum(1 for _ in rows.open())
    output.unlink(missing_ok=True)  # the watch must not see an earlier run's rows
    load_average = os.getloadavg()[0]
    with tempfile.TemporaryFile() as log, RowWatch(output, expected, interval_s=0.05) as watch:
        began = time.perf_counter()
        proc = subprocess.run(command, cwd=repo, env=_env(repo), stdout=log, stderr=subprocess.STDOUT)
        log.seek(0)
        tail = log.read().decode(errors="replace")[-2000:]
    if proc.returncode != 0 or watch.first is None or watch.last is None:
        raise RuntimeError(f"gym eval run exited {proc.returncode} with {watch.rows} rows:\n{tail}")
    rewards: dict[str, list[float]] = defaultdict(list)
    for line in output.open():
        row = json.loads(line)
        rewards[row["agent_ref"]["name"]].append(float(row["reward"]))
    return {
        "load_average": load_average,
        "first_s": watch.first - began,
        "all_s": watch.last - began,
        "rewards": {name: sum(r) / len(r) for name, r in sorted(rewards.items())},
    }


def blend(repo: Path, rows: Path) -> None:
    """The quickstart's mixed input: every example row of both environments, routed to its agent."""
    command = [sys.executable, "-m", "polygym", "data", "blend"]
    for env in ENVS:
        command += ["--env", env]
    command += ["--order", "concat", "--output", str(rows)]
    subprocess.run(command, cwd=repo, env=_env(repo), check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repo", action="append", type=Path, help="checkout to time (repeatable; default .)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of every checkout, interleaved")
    parser.add_argument("--no-alone", action="store_true", help="skip the one-rollout run")
    parser.add_argument("extra", nargs="*", help="passed to gym eval run (after --), e.g. config overrides")
    args = parser.parse_args()
    repos = [repo.resolve() for repo in args.repo or [Path(".")]]
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        rows = Path(scratch, "quickstart_input.jsonl")
        blend(repos[0], rows)
        for round_ in range(args.rounds):
            for repo in repos:
                run: dict[str, Any] = {"repo": str(repo), "round": round_, "load_s": model_load(repo)}
                if not args.no_alone:
                    alone = collect(repo, rows, Path(scratch, "alone.jsonl"), args.extra, limit=1)
                    run["alone_s"] = alone["first_s"]
                run.update(collect(repo, rows, Path(scratch, "out.jsonl"), args.extra, limit=None))
                print(json.dumps(run), flush=True)
                results.append(run)
    table = [
        {
            "checkout": Path(r["repo"]).name,
            "round": r["round"],
            "load avg": round(r["load_average"], 1),
            "model load s": round(r["load_s"], 1),
            "alone s": round(r["alone_s"], 1) if "alone_s" in r else None,
            "first rollout s": round(r["first_s"], 1),
            "all s": round(r["all_s"], 1),
            "rewards": " / ".join(f"{v:.1f}" for v in r["rewards"].values()),
        }
        for r in results
    ]
    print_table("quickstart on local_model", table)
    write_json("quickstart_time", {"extra": args.extra, "runs": results})


if __name__ == "__main__":
    main()
