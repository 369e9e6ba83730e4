"""``--workers N``: copies of the inline stack, one process each, on real loopback servers."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from polygym.blend.mix import load_blend
from polygym.blend.spec import spec_from_flags
from polygym.collect.run_files import RunFiles
from polygym.errors import ConfigError
from polygym.jsonl import iter_jsonl, write_jsonl
from polygym.net.client import ServerClient
from polygym.stack import records as stacks
from polygym.stack.launcher import Stack
from polygym.stack.placement import cores_available, parse_workers
from tests.conftest import gone, gym_command, row_keys, run_gym, wait_until
from tests.e2e.test_eval_e2e import SERVE
from tests.e2e.test_eval_guards_e2e import LATENCY, finish, start_run
from tests.e2e.test_stack_e2e import ENVS, SELECTORS, example_rows, two_env_config

pytestmark = pytest.mark.e2e

SINGLE = "example_single_tool_call"


async def poll(predicate: Any, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return bool(predicate())


async def released(client: ServerClient, stack: Stack, name: str) -> list[int]:
    """Sessions released by each replica of ``name``, pinged at its own URL."""
    counts = []
    for entry in (e for e in stack.servers() if e["name"] == name):
        reply = await client.request_url("GET", entry["url"] + "/")
        counts.append(reply.json()["sessions"]["released"])
    return counts


async def test_rollouts_spread_over_workers_and_a_dead_worker_leaves_the_registry() -> None:
    stack = Stack(two_env_config(), head_port=0, record=False, workers=2)
    await stack.start()
    client = ServerClient(stack.head_url)
    try:
        entries = stack.servers()
        assert len(entries) == 10 and stack.backend.name == "workers"
        assert sorted({e["replica"] for e in entries}) == [0, 1]
        pids = sorted({e["pid"] for e in entries})
        assert len(pids) == 2 and os.getpid() not in pids
        rows = [(env, row) for env in ENVS for row in example_rows(env)]
        results = await asyncio.gather(
            *(client.call(f"{env}_simple_agent", "/run", row) for env, row in rows)
        )
        assert [r.json()["reward"] for r in results] == [1.0] * 10
        for env in ENVS:
            per_worker = await released(client, stack, env)
            assert sum(per_worker) == 5 and all(count > 0 for count in per_worker), per_worker

        victim = next(e["pid"] for e in entries if e["replica"] == 1)
        os.kill(victim, signal.SIGKILL)
        failure = await asyncio.wait_for(stack.wait_failure(), 30)
        assert failure.name == "worker 1"
        assert f"pid {victim}" in failure.message and "killed by signal 9" in failure.message
        assert f"{SINGLE}[1]" in failure.message
        assert await poll(lambda: {e["replica"] for e in stack.servers()} == {0})
        again = await client.call(f"{SINGLE}_simple_agent", "/run", example_rows(SINGLE)[0])
        assert again.json()["reward"] == 1.0
    finally:
        await client.close()
        await stack.stop()
    assert await poll(lambda: all(gone(pid) for pid in pids))


def test_the_seed_flow_gives_the_same_rows_with_workers_auto(start_stack: Any, tmp_path: Any) -> None:
    stack = start_stack(*SELECTORS, "--workers", "auto")
    workers = cores_available()
    assert len(stack.record["servers"]) == 5 * workers
    rows = tmp_path / "rows.jsonl"
    rows.write_bytes(b"".join(orjson.dumps(r) + b"\n" for env in ENVS for r in example_rows(env)))
    out = tmp_path / "out.jsonl"
    run = subprocess.run(
        gym_command("eval", "run", "--no-serve", "--input", str(rows), "--output", str(out)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    results = [orjson.loads(line) for line in out.read_text().splitlines()]
    assert len(results) == 10 and all(r["reward"] == 1.0 for r in results)
    expected = [(f"{env}_simple_agent", 5 * e + i) for e, env in enumerate(ENVS) for i in range(5)]
    assert sorted((r["agent_ref"]["name"], r["_ng_task_index"]) for r in results) == sorted(expected)

    status = subprocess.run(
        gym_command("env", "status", "--json"), capture_output=True, text=True, timeout=60
    )
    assert status.returncode == 0, status.stderr
    [record] = orjson.loads(status.stdout)
    assert record["backend"] == "workers" and record["unexpected"] == []
    slots = {SINGLE, *(f"{SINGLE}[{i}]" for i in range(1, workers))}
    assert slots <= record["health"].keys() and len(record["health"]) == 5 * workers
    assert all(h.startswith("ok") for h in record["health"].values())
    assert all(record["in_flight"][slot] == 0 for slot in slots)
    table = subprocess.run(gym_command("env", "status"), capture_output=True, text=True, timeout=60)
    assert "in flight" in table.stdout and "node" in table.stdout and "127.0.0.1" in table.stdout

    pids = stack.child_pids()
    assert len(pids) == workers
    stack.stop()
    assert wait_until(lambda: all(gone(pid) for pid in pids), 30.0)


def test_workers_count() -> None:
    assert parse_workers(None) is None
    assert parse_workers("3") == 3
    assert parse_workers("auto") == cores_available() >= 1
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(ConfigError, match="--workers"):
            parse_workers(bad)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--workers", "2", "--backend", "subprocess"), "--workers needs --backend inline"),
        (
            ("--workers", "2", "--backend", "ray", "--replicas", "example_multi_step=2"),
            "--replicas and --workers do not go together",
        ),
        (("--workers", "none"), "--workers 'none': expected a number >= 1 or 'auto'"),
        (("--no-serve", "--workers", "2"), "--workers only applies to a stack this command starts"),
    ],
)
def test_workers_that_cannot_be_honoured_exit_2(args: tuple[str, ...], expected: str, tmp_path: Any) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_bytes(orjson.dumps(example_rows(SINGLE)[0]) + b"\n")
    selectors = () if "--no-serve" in args else SELECTORS
    run = subprocess.run(
        gym_command(
            "eval", "run", *selectors, *args, "--input", str(rows), "--output", str(tmp_path / "o.jsonl")
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert expected in run.stderr
    assert not (tmp_path / "o.jsonl").exists()


def test_env_start_refuses_workers_with_another_backend() -> None:
    run = subprocess.run(
        gym_command("env", "start", *SELECTORS, "--backend", "subprocess", "--workers", "2"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "--workers needs --backend inline" in run.stderr


def kill_mid_run_then_resume(
    placement: list[str], victim_of: Any, named: str, tmp_path: Path, latency_ms: int = 20
) -> tuple[list[dict[str, Any]], str]:
    """``gym eval run`` of 200 rollouts with ``placement``; SIGKILL ``victim_of(stack record)``
    once 10 rows are saved; check the contract of a replica lost mid-run, then that ``--resume``
    finishes exactly. ``named``: what stderr must say about the death; ``latency_ms``: each model
    call's, so that the run outlasts how long the death takes to be seen. Returns the first run's
    failures and its stderr (one line)."""
    data = tmp_path / "in.jsonl"
    write_jsonl(load_blend(spec_from_flags(ENVS)).ordered("shuffled"), data)
    out = tmp_path / "out.jsonl"
    args = [*SERVE, *placement, "--input", str(data), "--output", str(out)]
    args += ["--num-repeats", "20", "--concurrency", "8", f"{LATENCY}={latency_ms}"]
    run = start_run(*args, cwd=tmp_path)
    try:
        assert wait_until(lambda: any(r["pid"] == run.pid for r in stacks.list_stacks()), 60)
        [record] = [r for r in stacks.list_stacks() if r["pid"] == run.pid]
        victim = victim_of(record)
        assert wait_until(lambda: out.exists() and len(row_keys(out)) >= 10, 60)
        os.kill(victim, signal.SIGKILL)
        _, stderr = finish(run)
    finally:
        if run.poll() is None:
            finish(run, 5)
    said = " ".join(stderr.split())
    assert named.format(pid=victim) in said and "died during the run (its servers went on)" in said, said
    assert "rollouts of  were" not in said, said  # no server is down: no agent was stopped
    failures = list(iter_jsonl(RunFiles(out).failures)) if RunFiles(out).failures.exists() else []
    # Lost rollouts (cut on the dead replica, not saved by a retry on another) exit 1, and only they.
    assert run.returncode == (1 if failures else 0), said
    assert all(f["error_class"] for f in failures)
    done = row_keys(out)
    failed = {(f["_ng_task_index"], f["_ng_rollout_index"]) for f in failures}
    assert len(done) == len(set(done)) and failed.isdisjoint(done)
    assert len(done) + len(failed) == 200

    resumed = run_gym("eval", "run", *args, "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    done = row_keys(out)
    assert len(done) == len(set(done)) == 200
    return failures, said


def test_a_worker_killed_mid_run_is_named_and_resume_finishes_exactly(tmp_path: Path) -> None:
    kill_mid_run_then_resume(
        ["--workers", "2"],
        lambda record: next(s["pid"] for s in record["servers"] if s.get("replica") == 1),
        "worker 1 (pid {pid}",
        tmp_path,
    )
