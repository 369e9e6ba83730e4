"""Ray for NeMo Gym's servers (``stack.nemo_gym_ray``): which servers use it, read from their code,
and the cluster polygym starts for them."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from polygym.stack.backend import LaunchError
from polygym.stack.nemo_gym_ray import (
    FOLDER_PREFIX,
    RayCluster,
    ServerCode,
    declared_ray_enabled,
    ray_users,
    uses_ray,
)
from tests.conftest import gone, listening_hosts, wait_until
from tests.nemo_gym_wheel import nemo_gym_tree

GONE_TIMEOUT_S = 30.0
BASES = """\
from typing import ClassVar

from nemo_gym.base_resources_server import SimpleResourcesServer


class Quiet(SimpleResourcesServer):
    ray_enabled = False


class Loud(SimpleResourcesServer):
    ray_enabled: ClassVar[bool] = True


class Silent(SimpleResourcesServer):
    pass
"""


def server(root: Path, body: str, name: str = "tiny") -> ServerCode:
    """A NeMo Gym tree at ``root`` with shared base classes, and a server folder whose app.py is ``body``."""
    shared = root / "resources_servers" / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    (shared / "app.py").write_text(BASES)
    folder = root / "resources_servers" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "app.py").write_text(body)
    return ServerCode(folder / "app.py", (folder, root))


def served(cls: str, *lines: str) -> str:
    return "\n".join([*lines, "", 'if __name__ == "__main__":', f"    {cls}.run_webserver()", ""])


@pytest.mark.parametrize(
    ("body", "declared"),
    [
        (served("S", "class S:", "    ray_enabled = True"), True),
        (served("S", "class S:", "    ray_enabled = False"), False),
        (
            served(
                "S",
                "from nemo_gym.base_resources_server import SimpleResourcesServer",
                "class S(SimpleResourcesServer):",
                "    x = 1",
            ),
            None,
        ),
        (served("S", "class S:", "    ray_enabled = None"), None),
        (served("S", "class S:", "    ray_enabled = flag()"), None),
    ],
    ids=["true", "false", "undeclared", "none", "computed"],
)
def test_the_served_class_declares_it(tmp_path: Path, body: str, declared: bool | None) -> None:
    code = server(tmp_path, body)
    assert declared_ray_enabled(code) is declared
    assert uses_ray(code) is (declared is not False)  # NeMo Gym: undeclared means Ray is used


@pytest.mark.parametrize(
    ("body", "declared"),
    [
        (served("S", "from resources_servers.shared.app import Quiet", "class S(Quiet):", "    pass"), False),
        (
            served(
                "S",
                "from resources_servers.shared.app import Loud as Base",
                "class S(Base[int]):",
                "    pass",
            ),
            True,
        ),
        (
            served("S", "from resources_servers.shared.app import Silent", "class S(Silent):", "    pass"),
            None,
        ),
        (
            served(
                "S",
                "class A:",
                "    ray_enabled = False",
                "class B(A):",
                "    pass",
                "class S(B):",
                "    pass",
            ),
            False,
        ),
        (served("S", "from helpers import Loud", "class S(Loud):", "    pass"), True),
        (served("S", "from .helpers import Loud", "class S(Loud):", "    pass"), True),
        (
            served(
                "S", "import resources_servers.shared.app as shared", "class S(shared.Quiet):", "    pass"
            ),
            None,
        ),
    ],
    ids=["tree", "aliased-generic", "tree-undeclared", "same-module", "folder", "relative", "attribute"],
)
def test_a_base_class_declaration_is_inherited(tmp_path: Path, body: str, declared: bool | None) -> None:
    """Bases are followed into the NeMo Gym tree and the server's folder; NeMo Gym's own base
    classes (``nemo_gym.*``) declare nothing, and a base by attribute is not followed."""
    code = server(tmp_path, body)
    (code.entrypoint.parent / "helpers.py").write_text("class Loud:\n    ray_enabled = True\n")
    assert declared_ray_enabled(code) is declared


def test_only_the_served_class_counts(tmp_path: Path) -> None:
    quiet = served(
        "Quiet", "class Loud:", "    ray_enabled = True", "class Quiet:", "    ray_enabled = False"
    )
    assert declared_ray_enabled(server(tmp_path, quiet)) is False
    both = quiet + "else:\n    app = Loud.run_webserver()\n"
    assert declared_ray_enabled(server(tmp_path, both)) is True


def test_a_cycle_of_imports_ends(tmp_path: Path) -> None:
    code = server(tmp_path, served("S", "from resources_servers.tiny.app import S"))
    assert declared_ray_enabled(code) is None


def test_a_cluster_is_for_the_servers_that_use_ray_unless_the_config_names_one(tmp_path: Path) -> None:
    codes = {
        "loud": server(tmp_path, served("S", "class S:", "    ray_enabled = True"), "loud"),
        "quiet": server(tmp_path, served("S", "class S:", "    ray_enabled = False"), "quiet"),
        "silent": server(tmp_path, served("S", "class S:", "    pass"), "silent"),
    }
    assert ray_users(codes, {}) == ["loud", "silent"]
    assert ray_users(codes, {"ray_head_node_address": ""}) == [
        "loud",
        "silent",
    ]  # unset, as NeMo Gym reads it
    assert ray_users(codes, {"ray_head_node_address": "10.0.0.1:6379"}) == []


@pytest.mark.nemo_gym
def test_nemo_gym_0_7_0s_own_servers() -> None:
    """Read from the wheel: declared on the class, inherited across folders, or undeclared."""
    root = nemo_gym_tree()
    expected = {
        "environment_servers/single_agent_turn/app.py": None,
        "environment_servers/single_agent_turn_legacy/app.py": None,  # inherits single_agent_turn's
        "resources_servers/gpqa_diamond/app.py": False,  # inherits mcqa's
        "resources_servers/code_gen/app.py": True,
        "resources_servers/example_single_tool_call/app.py": False,
        "responses_api_agents/simple_agent/app.py": False,
        "responses_api_agents/langchain_deepagents_agent/reasoning_search_agent.py": False,
    }
    found = {}
    for entrypoint in expected:
        path = root / entrypoint
        found[entrypoint] = declared_ray_enabled(ServerCode(path, (path.parent, root)))
    assert found == expected


def loopback(host: str) -> bool:
    """127.0.0.1, ::1, or 127.0.0.1 as an IPv6 socket holds it (``::ffff:127.0.0.1``)."""
    address = ipaddress.ip_address(host)
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return (mapped or address).is_loopback


def fake_env(tmp_path: Path, script: str) -> Path:
    """An environment whose ``bin/python`` is ``script`` (a shell script)."""
    python = tmp_path / "env" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/sh\n{script}\n")
    python.chmod(0o755)
    return python.parent.parent


def test_a_cluster_that_cannot_start_is_a_loud_error_naming_its_servers(tmp_path: Path) -> None:
    env = fake_env(tmp_path, "echo 'ModuleNotFoundError: ray' >&2; exit 1")
    log = tmp_path / "ray.log"
    with pytest.raises(LaunchError) as failed, (tmp_path / "lease").open("w") as lease:
        asyncio.run(
            RayCluster.start(env, ["single_agent_turn", "code_gen"], dict(os.environ), log, lease.fileno())
        )
    message = str(failed.value)
    assert "Ray cluster that NeMo Gym server(s) single_agent_turn, code_gen use" in message
    assert "exited without an address" in message and "ModuleNotFoundError: ray" in message


@pytest.mark.ray
@pytest.mark.e2e  # a real Ray cluster: seconds, kept out of the quick tier
def test_the_cluster_listens_on_loopback_in_its_own_folder_and_dies_with_its_owner(tmp_path: Path) -> None:
    """Started with this interpreter's Ray: an address on 127.0.0.1, nothing listening elsewhere,
    its folder under /tmp. Its owner killed, closing it ends what is left of Ray's processes (its
    agents outlive the owner) and removes the folder; closed normally, the owner ends them all
    itself (``test_nemo_gym_environment_servers_e2e``)."""
    env = fake_env(tmp_path, f'exec {sys.executable} "$@"')

    async def scenario(lease: int) -> None:
        cluster = await RayCluster.start(env, ["loud"], dict(os.environ), tmp_path / "ray.log", lease)
        try:
            assert cluster.address.startswith("127.0.0.1:") and str(cluster.folder).startswith(FOLDER_PREFIX)
            hosts = listening_hosts(cluster.process.pid)
            assert hosts and all(loopback(host) for host in hosts), hosts
            ray_pids = [p.pid for p in psutil.Process(cluster.process.pid).children(recursive=True)]
            assert ray_pids
            os.kill(cluster.process.pid, signal.SIGKILL)
        finally:
            await cluster.close()
        assert wait_until(lambda: all(gone(pid) for pid in ray_pids), GONE_TIMEOUT_S)
        assert not cluster.folder.exists()

    with (tmp_path / "lease").open("w") as lease:
        asyncio.run(scenario(lease.fileno()))
