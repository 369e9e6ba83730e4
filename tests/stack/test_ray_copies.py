"""``--backend ray --workers N``: copies of the whole stack as Ray actors, one of which dies mid-run.

Before, a copy killed mid-run stayed in the head's registry for about a second, refusing every
connection with nothing in flight, so the collector's "least outstanding" rule sent it every
rollout (and every retry): 144 rollouts failed in two seconds while the other copy served, and
the environment was quarantined. The live copies now take its share (``net.replicas`` passes a
replica that refused over), and the death says whether Ray restarts it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import gone, gym_command, wait_until
from tests.e2e.test_stack_e2e import SELECTORS
from tests.stack.test_workers import kill_mid_run_then_resume

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from polygym.stack.config import ServerSpec  # noqa: E402
from polygym.stack.ray_backend import RayBackend, Replica  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

LOOPBACK_NODE: dict[str, Any] = {"num_cpus": 1, "node_ip_address": "127.0.0.1"}


@pytest.fixture(scope="module")
def cluster() -> Any:
    sim = Cluster(initialize_head=True, head_node_args={**LOOPBACK_NODE, "include_dashboard": False})
    sim.add_node(**LOOPBACK_NODE)
    sim.wait_for_nodes()
    yield sim
    sim.shutdown()


def test_a_copy_killed_mid_run_loses_nothing_and_resume_finishes_exactly(
    cluster: Any, tmp_path: Path
) -> None:
    failures, said = kill_mid_run_then_resume(
        ["--backend", "ray", "--ray-address", cluster.address, "--workers", "2"],
        lambda record: next(s["pid"] for s in record["servers"] if s["replica"] == 1),
        "copy 1 of the stack (serving policy_model,",
        tmp_path,
    )
    # The live copy took the dead copy's share: no rollout failed, none was quarantined.
    assert failures == [], failures
    assert "died; Ray restarts it (restart 1 of 3)" in said, said
    assert "no rollout was lost" in said and "quarantined" not in said, said


def test_a_node_killed_mid_run_loses_nothing_and_resume_finishes_exactly(
    cluster: Any, tmp_path: Path
) -> None:
    """SIGKILL of the raylet of the worker node holding a copy (what killing Ray's dashboard agent
    does to its node: the raylet exits with it): the copy on the other node serves every rollout,
    and Ray restarts the lost copy there."""
    raylets = {node.node_id: node.all_processes["raylet"][0].process.pid for node in cluster.worker_nodes}

    def raylet_under_a_copy(record: dict[str, Any]) -> int:
        return next(raylets[s["node_id"]] for s in record["servers"] if s["node_id"] in raylets)

    try:
        failures, said = kill_mid_run_then_resume(
            ["--backend", "ray", "--ray-address", cluster.address, "--workers", "2"],
            raylet_under_a_copy,
            "of the stack (serving policy_model,",
            tmp_path,
            latency_ms=200,  # a node's death is seen in seconds, not milliseconds
        )
    finally:
        for node in list(cluster.worker_nodes):
            if node.node_id in raylets:
                cluster.remove_node(node, allow_graceful=False)
        cluster.add_node(**LOOPBACK_NODE)
        cluster.wait_for_nodes()
    assert failures == [], failures
    assert "died; Ray restarts it (restart 1 of 3)" in said and "no rollout was lost" in said, said


def spec() -> ServerSpec:
    return ServerSpec("math", "resources_servers", "math", {}, "test", Path("."))


@pytest.mark.parametrize(
    ("max_restarts", "restarts", "fate"),
    [
        (3, 0, "died; Ray restarts it (restart 1 of 3)."),
        (3, 2, "died; Ray restarts it (restart 3 of 3)."),
        (3, 3, "died; it is not restarted (all 3 restarts used)."),
        (0, 0, "died; it is not restarted (max_restarts: 0)."),
    ],
)
def test_a_death_says_whether_ray_restarts_the_copy(max_restarts: int, restarts: int, fate: str) -> None:
    copy = Replica([spec()], 1, None, {"log_path": "/nonexistent/copy-1.log"}, max_restarts, whole_stack=True)
    copy.restarts = restarts
    said = RayBackend().describe_death(copy)
    assert said.startswith(f"copy 1 of the stack (serving math) on node ? (?), pid ? {fate}\n"), said


def test_stopping_a_ray_stack_prints_one_line_and_exits_0(start_stack: Any) -> None:
    """``ray.init`` took over SIGTERM: ``gym env stop`` printed Ray's stack dump and traceback,
    and the launcher could end ``Aborted`` (134)."""
    stack = start_stack(*SELECTORS, "--backend", "ray", "--workers", "2")
    pids = stack.child_pids()
    stop = subprocess.run(
        gym_command("env", "stop", "--stack", stack.record["stack_id"]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert stop.returncode == 0, stop.stderr
    assert stack.wait() == 0, stack.output()
    after_ready = stack.output().split("Press Ctrl-C to stop.", 1)[1]
    assert re.fullmatch(r"\s*stopped \d+ servers in \d+\.\d\ds\s*", after_ready), after_ready
    assert wait_until(lambda: all(gone(pid) for pid in pids), 30.0)
