"""The Ray backend on a real cluster: three Ray nodes simulated on this machine (loopback).

One cluster serves the whole module (starting one costs seconds); every test stops what it started
and checks that no replica process is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import ipaddress
import socketserver
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest

from polygym.collect.rollouts import Limits, Result, collect
from polygym.net.client import ServerCallError, ServerClient
from polygym.row import make_job
from polygym.stack.backend import LaunchError
from polygym.stack.config import ConfigError, ServerSpec
from polygym.stack.launcher import Stack
from tests.conftest import gone, gym_command, listening_hosts, wait_until
from tests.e2e.test_stack_e2e import ENVS, SELECTORS, example_rows, two_env_config
from tests.stack.test_workers import kill_mid_run_then_resume

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from polygym.stack.ray_backend import CONNECT_TIMEOUT_S, Replica, check_reachable, connect_cluster  # noqa: E402
from polygym.stack.ray_spread import TOKEN_CPU  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

NODES = 3
MULTI = "example_multi_step"
LOOPBACK_NODE: dict[str, Any] = {"num_cpus": 1, "node_ip_address": "127.0.0.1"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    sim = Cluster(initialize_head=True, head_node_args={**LOOPBACK_NODE, "include_dashboard": False})
    for _ in range(NODES - 1):
        sim.add_node(**LOOPBACK_NODE)
    connect_cluster(sim.address)
    every_node_schedulable(sim)
    yield sim
    ray.shutdown()
    sim.shutdown()


def every_node_schedulable(sim: Any) -> None:
    """Wait until SPREAD reaches every node: alive in the GCS is not enough, the scheduler's view
    of a new node's resources comes later (until then SPREAD puts everything on the head)."""
    sim.wait_for_nodes()

    def spread_reaches_every_node() -> bool:
        probes = [node_of.options(scheduling_strategy="SPREAD").remote() for _ in range(NODES)]
        return len(set(ray.get(probes, timeout=30))) == NODES

    assert wait_until(spread_reaches_every_node, 60, interval_s=0.2), ray.nodes()


@ray.remote(num_cpus=TOKEN_CPU)  # a task that reserves nothing lands on a random node (ray_spread)
def node_of() -> str:
    return str(ray.get_runtime_context().get_node_id())


def ray_stack(cluster: Any, **kwargs: Any) -> Stack:
    return Stack(
        two_env_config(), backend="ray", head_port=0, record=False, ray_address=cluster.address, **kwargs
    )


async def solve_all(client: ServerClient) -> list[float]:
    """Every example row of both environments, at once (each in its own session), in row order."""

    async def reward(env: str, row: dict[str, Any]) -> float:
        return float((await client.call(f"{env}_simple_agent", "/run", row)).json()["reward"])

    return list(await asyncio.gather(*(reward(env, row) for env in ENVS for row in example_rows(env))))


async def wait_for(predicate: Any, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.1)
    return bool(predicate())


async def collected(results: AsyncIterator[Result]) -> list[Result]:
    return [result async for result in results]


def replicas_of(stack: Stack, name: str) -> list[dict[str, Any]]:
    return [entry for entry in stack.servers() if entry["name"] == name]


async def test_replicas_spread_over_nodes_and_sessions_stay_on_their_replica(cluster: Any) -> None:
    stack = ray_stack(cluster, replicas={MULTI: NODES})
    await stack.start()
    client = ServerClient(stack.head_url)
    pids: list[int] = []
    try:
        replicas = replicas_of(stack, MULTI)
        assert [r["replica"] for r in replicas] == [0, 1, 2]
        alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
        assert len(alive) == NODES
        assert {r["node_id"] for r in replicas} == alive  # one replica on each node, every time
        assert len({r["url"] for r in replicas}) == NODES
        pids = [entry["pid"] for entry in stack.servers()]
        # Every row needs its session's state on every call: a call routed to another replica fails.
        assert await solve_all(client) == [1.0] * 10
        sessions = [(await client.request_url("GET", r["url"] + "/")).json()["sessions"] for r in replicas]
        assert sum(s["released"] for s in sessions) == 5
        assert all(s["active"] == 0 for s in sessions)
    finally:
        await client.close()
        await stack.stop()
    assert wait_until(lambda: all(gone(pid) for pid in pids), 30.0)


async def test_copies_of_the_whole_stack_spread_over_nodes(cluster: Any) -> None:
    """``--workers 3`` on Ray: three actors, each serving every server (one replica of each), one
    per node; a copy's servers share its process, so the calls of a rollout stay in it."""
    stack = ray_stack(cluster, workers=NODES)
    await stack.start()
    client = ServerClient(stack.head_url)
    pids: list[int] = []
    try:
        names = list(two_env_config().servers)
        copies: dict[int, set[tuple[int, str]]] = {}
        for entry in stack.servers():
            copies.setdefault(entry["replica"], set()).add((entry["pid"], entry["node_id"]))
        assert sorted(copies) == [0, 1, 2]
        assert all(len(copy) == 1 for copy in copies.values()), copies  # one process per copy
        alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
        assert {node for copy in copies.values() for _, node in copy} == alive
        assert all(len(replicas_of(stack, name)) == NODES for name in names)
        pids = [pid for copy in copies.values() for pid, _ in copy]
        assert await solve_all(client) == [1.0] * 10
    finally:
        await client.close()
        await stack.stop()
    assert wait_until(lambda: all(gone(pid) for pid in pids), 30.0)


@pytest.mark.parametrize(
    ("whole_stack", "name", "label"),
    [
        (True, "copy 0", "copy 0 of the stack (serving math)"),
        (False, "math", "server 'math' replica 0"),
    ],
)
def test_a_copy_of_a_one_server_stack_is_named_as_a_copy(whole_stack: bool, name: str, label: str) -> None:
    spec = ServerSpec("math", "resources_servers", "math", {}, "test", Path("."))
    replica = Replica([spec], 0, None, {}, max_restarts=1, whole_stack=whole_stack)
    assert (replica.name, replica.label) == (name, label)


async def test_a_killed_copy_is_named_and_every_server_of_it_serves_again(cluster: Any) -> None:
    stack = ray_stack(cluster, workers=2)
    await stack.start()
    client = ServerClient(stack.head_url)
    try:
        before = {e["name"]: e["url"] for e in stack.servers() if e["replica"] == 1}
        victim = next(r for r in stack.backend.replicas if r.index == 1)  # type: ignore[attr-defined]
        ray.kill(victim.actor, no_restart=False)
        death = await asyncio.wait_for(stack.backend.wait_death(), 60)  # type: ignore[attr-defined]
        assert death.name == "copy 1" and death.servers_down == ()
        assert death.message.startswith(f"copy 1 of the stack (serving {', '.join(before)}) on node")
        again = await wait_for(
            lambda: (
                {e["name"] for e in stack.servers() if e["replica"] == 1 and e.get("restarts") == 1}
                == set(before)
            )
        )
        assert again, stack.servers()
        assert all(e["url"] != before[e["name"]] for e in stack.servers() if e["replica"] == 1)
        assert await solve_all(client) == [1.0] * 10
    finally:
        await client.close()
        await stack.stop()


def test_copies_refuse_what_a_copy_cannot_hold() -> None:
    config = two_env_config()
    config.servers["policy_model"].config["num_gpus"] = 1
    with pytest.raises(ConfigError, match="server 'policy_model' asks for num_gpus: --workers copies"):
        Stack(config, backend="ray", head_port=0, record=False, workers=2)
    with pytest.raises(ConfigError, match="--replicas and --workers do not go together"):
        Stack(two_env_config(), backend="ray", record=False, workers=2, replicas={MULTI: 2})


async def test_a_killed_replica_is_named_restarted_and_serves_again(cluster: Any) -> None:
    stack = ray_stack(cluster, replicas={MULTI: 2})
    await stack.start()
    client = ServerClient(stack.head_url)
    try:
        first = replicas_of(stack, MULTI)[1]
        victim = next(r for r in stack.backend.replicas if r.name == MULTI and r.index == 1)  # type: ignore[attr-defined]
        ray.kill(victim.actor, no_restart=False)
        assert await wait_for(
            lambda: any(
                r.get("restarts") == 1 and r["url"] != first["url"] for r in replicas_of(stack, MULTI)
            )
        ), stack.servers()
        assert gone(first["pid"])
        assert await solve_all(client) == [1.0] * 10
    finally:
        await client.close()
        await stack.stop()


async def test_a_replica_past_its_restarts_is_a_named_failure(cluster: Any) -> None:
    config = two_env_config()
    config.servers[MULTI].config["max_restarts"] = 0
    stack = Stack(config, backend="ray", head_port=0, record=False, ray_address=cluster.address)
    await stack.start()
    try:
        victim = next(r for r in stack.backend.replicas if r.name == MULTI)  # type: ignore[attr-defined]
        ray.kill(victim.actor, no_restart=True)
        failure = await asyncio.wait_for(stack.wait_failure(), 60)
        assert failure.name == MULTI
        assert f"server '{MULTI}' replica 0 on node 127.0.0.1" in failure.message
        assert "died; it is not restarted (max_restarts: 0)" in failure.message
        assert MULTI not in {e["name"] for e in stack.servers()}
        client = ServerClient(stack.head_url)
        try:
            with pytest.raises(ServerCallError):
                await client.call(f"{MULTI}_simple_agent", "/run", example_rows(MULTI)[0])
        finally:
            await client.close()
    finally:
        await stack.stop()


async def active_sessions(client: ServerClient, url: str) -> int:
    return int((await client.request_url("GET", url + "/")).json()["sessions"]["active"])


async def death_of(stack: Stack, text: str) -> bool:
    """Wait for a death whose message holds ``text`` among those the backend reports."""
    while text not in (await stack.backend.wait_death()).message:  # type: ignore[attr-defined]
        pass
    return True


async def test_a_removed_node_fails_only_its_rollouts_and_its_replica_restarts_elsewhere(
    cluster: Any,
) -> None:
    config = two_env_config()
    config.servers["policy_model"].config["latency_ms"] = 250  # rollouts of ~1 s: in flight when it goes
    stack = Stack(
        config, backend="ray", head_port=0, record=False, ray_address=cluster.address, replicas={MULTI: NODES}
    )
    await stack.start()
    client = ServerClient(stack.head_url)
    nodes = {node.node_id: node for node in cluster.worker_nodes}
    try:
        served = len(stack.servers())
        target = next(r for r in replicas_of(stack, MULTI) if r["node_id"] in nodes)
        rows = enumerate(example_rows(MULTI))
        jobs = [make_job(row, f"{MULTI}_simple_agent", task, i) for task, row in rows for i in range(6)]
        results = asyncio.ensure_future(collected(collect(jobs, client, Limits(concurrency=len(jobs)))))
        deadline = time.monotonic() + 30
        while await active_sessions(client, target["url"]) == 0:  # rollouts in flight on its node
            assert time.monotonic() < deadline and not results.done(), "no rollout reached the replica"
            await asyncio.sleep(0.05)
        cluster.remove_node(nodes[target["node_id"]])

        done = await asyncio.wait_for(results, 120)  # no hang
        failures = [r.failure for r in done if r.failure is not None]
        assert failures and len(done) == len(jobs), [r.failure for r in done]
        assert all(f["error_class"] for f in failures), failures
        named = f"server '{MULTI}' replica {target['replica']} on node 127.0.0.1 ({target['node_id'][:12]})"
        assert await asyncio.wait_for(death_of(stack, named), 60)
        assert await wait_for(lambda: len(stack.servers()) == served, 90), stack.servers()
        [again] = [r for r in replicas_of(stack, MULTI) if r["replica"] == target["replica"]]
        assert again["restarts"] == 1 and again["node_id"] != target["node_id"], (again, target)
        assert await solve_all(client) == [1.0] * 10
    finally:
        await client.close()
        await stack.stop()
        cluster.add_node(**LOOPBACK_NODE)
        every_node_schedulable(cluster)


def test_a_replica_killed_mid_run_is_named_and_resume_finishes_exactly(cluster: Any, tmp_path: Any) -> None:
    kill_mid_run_then_resume(
        ["--backend", "ray", "--ray-address", cluster.address, "--replicas", f"{MULTI}=2"],
        lambda record: next(s["pid"] for s in record["servers"] if s["name"] == MULTI and s["replica"] == 1),
        f"server '{MULTI}' replica 1 on node 127.0.0.1",
        tmp_path,
    )


def gpu_stack(cluster: Any, num_gpus: int) -> Stack:
    """Both environments, with a policy model that asks for ``num_gpus`` per replica."""
    config = two_env_config()
    config.servers["policy_model"].config["num_gpus"] = num_gpus
    return Stack(config, backend="ray", head_port=0, record=False, ray_address=cluster.address)


async def test_a_gpu_model_server_runs_in_a_placement_group_on_the_gpu_node(cluster: Any) -> None:
    gpu_node = cluster.add_node(num_cpus=0, num_gpus=1, node_ip_address="127.0.0.1")  # logical GPU
    try:
        assert wait_until(lambda: ray.cluster_resources().get("GPU") == 1, 60)
        stack = gpu_stack(cluster, 1)
        await stack.start()
        client = ServerClient(stack.head_url)
        try:
            [model] = replicas_of(stack, "policy_model")
            assert model["node_id"] == gpu_node.node_id
            groups = stack.backend.groups  # type: ignore[attr-defined]
            assert list(groups) == ["policy_model"]  # servers without GPUs are placed as before
            group = groups["policy_model"]
            table = ray.util.placement_group_table(group)
            assert table["state"] == "CREATED" and table["bundles"] == {0: {"GPU": 1.0}}
            assert table["bundles_to_node_id"] == {0: gpu_node.node_id}
            assert await solve_all(client) == [1.0] * 10
        finally:
            await client.close()
            await stack.stop()
        assert wait_until(lambda: ray.util.placement_group_table(group)["state"] == "REMOVED", 30)
    finally:
        cluster.remove_node(gpu_node)


async def test_gpus_no_node_has_fail_at_once_naming_the_server(cluster: Any) -> None:
    began = time.monotonic()
    with pytest.raises(LaunchError) as failed:
        await gpu_stack(cluster, 8).start()
    assert time.monotonic() - began < 30
    assert "server 'policy_model' asks for 1 replica(s) of {'GPU': 8.0}" in str(failed.value)
    assert "no node of the Ray cluster has that much (at most: GPU" in str(failed.value)
    assert all(g["state"] == "REMOVED" for g in ray.util.placement_group_table().values())


async def test_cpus_no_node_has_fail_at_once_naming_the_server(cluster: Any) -> None:
    config = two_env_config()
    config.servers[MULTI].config["num_cpus"] = 4  # every node has 1
    began = time.monotonic()
    with pytest.raises(LaunchError) as failed:
        await Stack(config, backend="ray", head_port=0, record=False, ray_address=cluster.address).start()
    assert time.monotonic() - began < 30
    assert f"server '{MULTI}' asks for 1 replica(s) of {{'CPU': 4.0}}" in str(failed.value)
    assert "no node of the Ray cluster has that much (at most: CPU 1)" in str(failed.value)


@pytest.mark.parametrize("placement", [("--replicas", f"{MULTI}=2"), ("--workers", "2")])
def test_the_seed_flow_runs_unchanged_on_ray(
    cluster: Any, start_stack: Any, tmp_path: Any, placement: tuple[str, str]
) -> None:
    stack = start_stack(*SELECTORS, "--backend", "ray", "--ray-address", cluster.address, *placement)
    assert len([s for s in stack.record["servers"] if s["name"] == MULTI]) == 2
    status = subprocess.run(gym_command("env", "status"), capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert "restarts" in status.stdout and "node" in status.stdout
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
    pids = stack.child_pids()
    stack.stop()
    assert wait_until(lambda: all(gone(pid) for pid in pids), 30.0)


@pytest.mark.parametrize(
    "args",
    [
        ("--replicas", f"{MULTI}=2"),
        ("--ray-address", "127.0.0.1:1"),
        ("--backend", "ray", "--replicas", "nosuch=2"),
        ("--backend", "ray", "--replicas", f"{MULTI}=0"),
    ],
)
def test_placement_that_cannot_be_honoured_exits_2(args: tuple[str, ...], tmp_path: Any) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_bytes(orjson.dumps(example_rows(MULTI)[0]) + b"\n")
    run = subprocess.run(
        gym_command(
            "eval", "run", *SELECTORS, *args, "--input", str(rows), "--output", str(tmp_path / "o.jsonl")
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert ("replicas" in run.stderr) or ("ray" in run.stderr)


@pytest.mark.parametrize("command", ["env start", "eval run"])
def test_an_unreachable_cluster_address_exits_2_naming_it(command: str, tmp_path: Any) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_bytes(orjson.dumps(example_rows(MULTI)[0]) + b"\n")
    io = ("--input", str(rows), "--output", str(tmp_path / "o.jsonl"))
    args = [*command.split(), *SELECTORS, "--backend", "ray", "--ray-address", "127.0.0.1:1"]
    began = time.monotonic()
    run = subprocess.run(
        gym_command(*args, *(io if command == "eval run" else ())),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert "--ray-address 127.0.0.1:1: no Ray cluster answers there" in " ".join(run.stderr.split())
    assert time.monotonic() - began < 30


class TlsAlert(socketserver.BaseRequestHandler):
    """What a TLS server sends to a client that does not open with a handshake: an alert record."""

    def handle(self) -> None:
        self.request.recv(64)
        self.request.sendall(bytes([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x46]))


@contextlib.contextmanager
def listening(kind: str) -> Iterator[str]:
    """HOST:PORT of a loopback server that is not Ray: a web server, one that hangs up at once, or
    a TLS server."""
    if kind == "web":
        server: Any = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    else:
        server = socketserver.ThreadingTCPServer(
            ("127.0.0.1", 0), TlsAlert if kind == "tls" else socketserver.BaseRequestHandler
        )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.mark.parametrize(
    ("kind", "heard"),
    [
        ("web", "it answered b'"),
        ("hangs up", "closed the connection without a word"),
        ("tls", "a TLS record; if the cluster uses TLS, set RAY_USE_TLS=1"),
    ],
)
def test_an_address_that_answers_but_is_not_ray_is_refused_at_once(kind: str, heard: str) -> None:
    with listening(kind) as address:
        began = time.monotonic()
        with pytest.raises(ConfigError) as refused:
            check_reachable(address, "--ray-address")
    message = str(refused.value)
    assert f"--ray-address {address}: something listens there but it is not a Ray cluster" in message
    assert heard in message and time.monotonic() - began < CONNECT_TIMEOUT_S


def test_a_real_cluster_passes_the_check(cluster: Any) -> None:
    check_reachable(cluster.address, "--ray-address")


def test_placement_options_are_refused_when_joining(tmp_path: Any) -> None:
    run = subprocess.run(
        gym_command("eval", "run", "--no-serve", "--replicas", f"{MULTI}=2", "--input", "x", "--output", "y"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "--replicas only applies to a stack this command starts" in run.stderr


def test_a_local_cluster_and_its_replicas_stay_on_loopback(
    start_stack: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing set by the user: Ray's own switch for this stays at its default.
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    stack = start_stack(*SELECTORS, "--backend", "ray", "--replicas", f"{MULTI}=2")
    servers = stack.record["servers"]
    assert len(servers) == 6
    assert {urlsplit(s["url"]).hostname for s in servers} == {"127.0.0.1"}, servers
    assert {s["node_ip"] for s in servers} == {"127.0.0.1"}
    hosts = listening_hosts(stack.proc.pid)  # Ray's own processes too
    ips = [ipaddress.ip_address(host) for host in hosts]
    assert ips and all((getattr(ip, "ipv4_mapped", None) or ip).is_loopback for ip in ips), hosts
