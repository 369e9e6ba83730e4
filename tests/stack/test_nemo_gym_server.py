"""NeMo Gym's process contract, the parts that need no environment: detection, inputs, config."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import pytest

from polygym.errors import ConfigError
from polygym.net.child_port import port_for_a_child
from polygym.stack import nemo_gym_server
from polygym.stack.backend import LaunchError
from polygym.stack.catalog import NEMO_GYM_ROOT_ENV_VAR
from polygym.stack.config import ServerSpec, StackConfig, load_config
from polygym.stack.head import Registry
from polygym.stack.nemo_gym_ray import ray_users
from polygym.stack.nemo_gym_server import (
    global_config,
    is_nemo_gym_server,
    nemo_gym_package,
    server_overrides,
    server_requirements,
)


def nemo_tree(root: Path) -> Path:
    """A minimal unpacked NeMo Gym wheel: dist-info, one resources server, the wheel beside it."""
    info = root / "nemo_gym-9.9.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Name: nemo-gym\nVersion: 9.9.0\nRequires-Python: >=3.13.14\n")
    (root.parent / "nemo_gym-9.9.0-py3-none-any.whl").write_bytes(b"not really a wheel")
    server = root / "resources_servers" / "tiny"
    (server / "configs").mkdir(parents=True)
    (server / "app.py").write_text("from nemo_gym.base_resources_server import SimpleResourcesServer\n")
    (server / "requirements.txt").write_text("-e nemo-gym[dev] @ ../../\n# a comment\nrich\n\n")
    (server / "configs" / "tiny.yaml").write_text(
        "tiny:\n  resources_servers:\n    tiny:\n      entrypoint: app.py\n"
    )
    return root


def spec(directory: Path, **config: object) -> ServerSpec:
    return ServerSpec(
        "tiny", "resources_servers", "tiny", {"entrypoint": "app.py", **config}, "test", directory
    )


def test_a_folder_importing_nemo_gym_is_nemo_gyms_and_polygyms_are_not(tmp_path: Path) -> None:
    root = nemo_tree(tmp_path / "ng")
    assert is_nemo_gym_server(spec(root / "resources_servers" / "tiny"))
    shipped = Path(__file__).resolve().parents[2] / "resources_servers" / "example_single_tool_call"
    assert not is_nemo_gym_server(spec(shipped))
    assert is_nemo_gym_server(spec(shipped, nemo_gym=True))


def test_any_folder_of_nemo_gyms_own_tree_is_nemo_gyms(tmp_path: Path) -> None:
    """A library folder (``sec_local_index``: its entrypoint imports no ``nemo_gym``) under a root
    that holds the nemo_gym package is NeMo Gym's; the same folder in another tree is not."""
    root = nemo_tree(tmp_path / "ng")
    library = root / "resources_servers" / "library"
    library.mkdir()
    (library / "search.py").write_text("import sqlite3\n")
    assert not is_nemo_gym_server(spec(library, entrypoint="search.py"))  # no nemo_gym package here
    (root / "nemo_gym").mkdir()
    (root / "nemo_gym" / "__init__.py").write_text("")
    assert is_nemo_gym_server(spec(library, entrypoint="search.py"))


def test_a_nemo_gym_folder_with_no_server_to_run_is_refused_naming_it(tmp_path: Path) -> None:
    root = nemo_tree(tmp_path / "ng")
    folder = root / "resources_servers" / "tiny"
    with pytest.raises(ConfigError) as refused:
        nemo_gym_server.NemoGymServers([spec(folder, description="Not a standalone server.")])
    assert refused.value.exit_code == 2
    assert str(refused.value.problems) == str(
        [
            f"tiny: NeMo Gym's folder {folder} has no server to run: its entrypoint app.py starts nothing "
            "(it only defines classes, functions and values): a library other servers import, not a "
            "server (its config says: Not a standalone server.)"
        ]
    )
    starts = [
        'import nemo_gym\n\nif __name__ == "__main__":\n    run()\n',
        "import nemo_gym\nif ('__main__' == __name__):\n    run()\n",
        '"""A server started unguarded."""\nfrom nemo_gym import x\nx.run_webserver()\n',
    ]
    for text in starts:
        (folder / "app.py").write_text(text)
        assert nemo_gym_server.NemoGymServers([spec(folder)]).specs == [spec(folder)], text
    (folder / "app.py").write_text(
        '"""Helpers."""\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\nA: int = 1\n'
    )
    with pytest.raises(ConfigError):
        nemo_gym_server.NemoGymServers([spec(folder)])


def test_an_entrypoint_elsewhere_is_nemo_gyms_when_its_folder_is(tmp_path: Path) -> None:
    """legal_agent_bench's agent: the harbor_agent folder run from a bridge beside the environment."""
    root = nemo_tree(tmp_path / "ng")
    bridge = root / "resources_servers" / "bench" / "bridge.py"
    bridge.parent.mkdir()
    bridge.write_text("from resources_servers.tiny.app import SimpleResourcesServer\n")
    elsewhere = {"entrypoint": "../bench/bridge.py"}
    assert is_nemo_gym_server(spec(root / "resources_servers" / "tiny", **elsewhere))
    shipped = Path(__file__).resolve().parents[2] / "resources_servers" / "example_single_tool_call"
    assert not is_nemo_gym_server(spec(shipped, **elsewhere))


def test_requirements_drop_the_checkout_line_as_ng_run_does(tmp_path: Path) -> None:
    root = nemo_tree(tmp_path / "ng")
    assert server_requirements(spec(root / "resources_servers" / "tiny")) == ("rich",)


PYPROJECT = """\
[project]
name = "tiny"
dependencies = ["nemo-gym[dev]", "Nemo_Gym>=0.7", "human-eval-infilling", "rich>=13"]

[tool.uv.sources]
nemo-gym = { path = "../..", editable = true }
"""


def test_a_pyproject_folder_is_built_from_its_dependencies_less_nemo_gym(tmp_path: Path) -> None:
    """As NeMo Gym's ng_run installs such a folder outside a checkout (``--no-sources``)."""
    folder = nemo_tree(tmp_path / "ng") / "resources_servers" / "tiny"
    (folder / "requirements.txt").unlink()
    (folder / "pyproject.toml").write_text(PYPROJECT)
    assert server_requirements(spec(folder)) == ("human-eval-infilling", "rich>=13")
    (folder / "requirements.txt").write_text("rich\n")
    with pytest.raises(ConfigError, match=r"both requirements\.txt and pyproject\.toml"):
        server_requirements(spec(folder))


def test_the_wheel_beside_an_unpacked_tree_is_what_gets_installed(tmp_path: Path) -> None:
    root = nemo_tree(tmp_path / "ng")
    package = nemo_gym_package(root, None)
    assert package.install == str(tmp_path / "nemo_gym-9.9.0-py3-none-any.whl")
    assert package.requires_python == ">=3.13.14" and len(package.digest) == 64
    (tmp_path / "nemo_gym-9.9.0-py3-none-any.whl").unlink()
    assert nemo_gym_package(root, None).install == "nemo-gym==9.9.0"
    assert nemo_gym_package(root, "nemo-gym==0.7.0").install == "nemo-gym==0.7.0"


def test_a_root_that_says_nothing_about_nemo_gym_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nemo_gym_package"):
        nemo_gym_package(tmp_path, None)


def test_the_childs_config_has_every_address_and_the_head_and_no_polygym_keys(tmp_path: Path) -> None:
    root = nemo_tree(tmp_path / "ng")
    config = StackConfig(
        servers={"tiny": spec(root / "resources_servers" / "tiny", nemo_gym=True)},
        globals={"nemo_gym_python": "3.13", "policy_model_name": "m"},
        sources=[],
    )
    child = global_config(config, {"tiny": ("127.0.0.1", 4321)}, "http://127.0.0.1:11000")
    assert child == {
        "policy_model_name": "m",
        "tiny": {"resources_servers": {"tiny": {"entrypoint": "app.py", "host": "127.0.0.1", "port": 4321}}},
        "head_server": {"host": "127.0.0.1", "port": 11000},
    }


@pytest.fixture
def named_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A NeMo Gym tree that only a config's ``nemo_gym_root`` names; the working directory is ``tmp_path``."""
    root = nemo_tree(tmp_path / "ng")
    monkeypatch.delenv(NEMO_GYM_ROOT_ENV_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    return root


def test_a_config_finds_nemo_gym_servers_under_the_root_it_names(tmp_path: Path, named_root: Path) -> None:
    root = named_root
    stack = tmp_path / "stack.yaml"
    stack.write_text(
        f"nemo_gym_root: {root}\ntiny:\n  resources_servers:\n    tiny:\n      entrypoint: app.py\n"
    )
    loaded = load_config([stack], env_files=[])
    assert loaded.servers["tiny"].directory == root / "resources_servers" / "tiny"
    assert loaded.warnings == []  # nemo_gym_root is used by this stack


def test_a_ray_head_node_address_the_user_sets_reaches_the_servers_and_no_cluster_is_started(
    tmp_path: Path, named_root: Path
) -> None:
    """NeMo Gym's key, used by this stack's NeMo Gym server (which declares no ``ray_enabled``)."""
    stack = tmp_path / "stack.yaml"
    server = "tiny:\n  resources_servers:\n    tiny:\n      entrypoint: app.py\n"
    stack.write_text(f"nemo_gym_root: {named_root}\n{server}")
    loaded = load_config([stack], env_files=[])
    codes = {"tiny": nemo_gym_server.server_code(loaded.servers["tiny"])}
    assert ray_users(codes, loaded.globals) == ["tiny"]
    stack.write_text(f"nemo_gym_root: {named_root}\nray_head_node_address: 10.0.0.1:6379\n{server}")
    loaded = load_config([stack], env_files=[])
    assert loaded.warnings == []
    assert ray_users(codes, loaded.globals) == []
    child = global_config(loaded, {"tiny": ("127.0.0.1", 4321)}, "http://127.0.0.1:11000")
    assert child["ray_head_node_address"] == "10.0.0.1:6379"


def test_nemo_gym_true_without_a_root_says_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(NEMO_GYM_ROOT_ENV_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    stack = tmp_path / "stack.yaml"
    stack.write_text("a:\n  responses_api_agents:\n    simple_agent:\n      nemo_gym: true\n")
    with pytest.raises(ConfigError, match="--nemo-gym-root"):
        load_config([stack], env_files=[])


def test_a_nemo_gym_server_may_name_below_its_fields_a_server_another_config_brings(
    tmp_path: Path, named_root: Path
) -> None:
    """NeMo Gym checks a server's own fields only (ns_tools' verifiers.math_with_judge starts)."""
    root = named_root
    ref = "{type: resources_servers, name: math_with_judge}"
    nested = tmp_path / "nested.yaml"
    nested.write_text(
        f"nemo_gym_root: {root}\ntiny:\n  resources_servers:\n    tiny:\n      verifiers:\n        m: {ref}\n"
    )
    loaded = load_config([nested], env_files=[])
    assert loaded.warnings == [
        "tiny.resources_servers.tiny.verifiers.m: unknown resources_servers server 'math_with_judge' "
        f"(from {nested.name}). Known: tiny (NeMo Gym starts it; its calls to 'math_with_judge' will fail)"
    ]
    field = tmp_path / "field.yaml"
    field.write_text(
        f"nemo_gym_root: {root}\ntiny:\n  resources_servers:\n    tiny:\n      verifier: {ref}\n"
    )
    with pytest.raises(ConfigError, match="unknown resources_servers server 'math_with_judge'"):
        load_config([field], env_files=[])  # a field of its own: NeMo Gym refuses it too
    shipped = tmp_path / "shipped.yaml"
    shipped.write_text(
        f"e:\n  resources_servers:\n    example_single_tool_call:\n      verifiers:\n        m: {ref}\n"
    )
    with pytest.raises(ConfigError, match="unknown resources_servers server 'math_with_judge'"):
        load_config([shipped], env_files=[])  # polygym's own servers: every reference checked


async def test_a_server_that_never_listens_is_named_with_what_its_log_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """competitive_coding_challenges waits at start for a sandbox service: its log says where."""
    monkeypatch.setattr(nemo_gym_server, "READY_TIMEOUT_S", 0.3)
    (tmp_path / "app.py").write_text('if __name__ == "__main__":\n    pass\n')
    servers = nemo_gym_server.NemoGymServers([spec(tmp_path)])
    servers.logs["tiny"] = tmp_path / "tiny.log"
    with servers.logs["tiny"].open("wb") as log, socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        servers.procs["tiny"] = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "print('pre-loading metadata (~27 GB)', flush=True); import sys; sys.stdin.read()",
            stdin=asyncio.subprocess.PIPE,
            stdout=log,
        )
        try:
            with pytest.raises(LaunchError) as refused:
                await servers._wait_listening(Registry(), {"tiny": closed.getsockname()})
        finally:
            servers.procs["tiny"].kill()
            await servers.procs["tiny"].wait()
    assert "not listening after 0.3s: tiny" in str(refused.value)
    assert "pre-loading metadata (~27 GB)" in str(refused.value)


async def test_a_server_is_registered_once_its_own_process_listens(tmp_path: Path) -> None:
    """Listening is enough (the kernel queues connections before the server's loop accepts them)."""
    (tmp_path / "app.py").write_text('if __name__ == "__main__":\n    pass\n')
    servers = nemo_gym_server.NemoGymServers([spec(tmp_path)])
    port = port_for_a_child("127.0.0.1")
    code = (
        "import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen();"
        "print('listening', flush=True); sys.stdin.read()"
    )
    servers.procs["tiny"] = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, str(port), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    registry = Registry()
    try:
        assert servers.procs["tiny"].stdout is not None
        assert await servers.procs["tiny"].stdout.readline() == b"listening\n"
        await asyncio.wait_for(servers._wait_listening(registry, {"tiny": ("127.0.0.1", port)}), 30)
    finally:
        servers.procs["tiny"].kill()
        await servers.procs["tiny"].wait()
    entry = registry.entries["tiny"]
    assert (entry["url"], entry["pid"], entry["nemo_gym"]) == (
        f"http://127.0.0.1:{port}",
        servers.procs["tiny"].pid,
        True,
    )


def test_overrides_beside_requirements_are_read_as_ng_run_reads_them(tmp_path: Path) -> None:
    folder = nemo_tree(tmp_path / "ng") / "resources_servers" / "tiny"
    assert server_overrides(spec(folder)) == ()
    (folder / "overrides.txt").write_text("# forced\npycountry\n\ntorch==2.11.0 ; sys_platform == 'never'\n")
    assert server_overrides(spec(folder)) == ("pycountry", "torch==2.11.0 ; sys_platform == 'never'")
    (folder / "requirements.txt").unlink()  # with a pyproject.toml, ng_run passes no --override
    (folder / "pyproject.toml").write_text("[project]\nname = 'tiny'\ndependencies = []\n")
    assert server_overrides(spec(folder)) == ()
