"""A NeMo Gym environment's fork server (``stack.nemo_gym_forkserver``), with a stand-in nemo_gym.

A forked server must be what ``python app.py`` in its folder would be; each test compares the two
(``fork=False`` starts every server as a fresh interpreter) or checks what the stack relies on:
exit codes, signals, no server outliving its stack, NeMo Gym's refusal reasons.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from polygym.stack import nemo_gym_forks, nemo_gym_forkserver, nemo_gym_server
from polygym.stack.nemo_gym_forks import ConfigRefused, ForkServer
from polygym.stack.nemo_gym_server import refusal_text

REPORT = """\
import sys
preloaded = "csv" in sys.modules
import json, os
import nemo_gym
x: int = 1
report = {
    "name": __name__, "file": __file__, "argv": sys.argv, "cwd": os.getcwd(), "path": sys.path,
    "config_path": os.environ.get("NEMO_GYM_CONFIG_PATH"), "leads_session": os.getsid(0) == os.getpid(),
    "preloaded": preloaded, "stdin": sys.stdin.read(), "hf_home": os.environ.get("HF_HOME"),
    "working_dir": str(nemo_gym.WORKING_DIR), "annotations": repr(__annotations__),
    "main_is_mp_main": sys.modules.get("__mp_main__", sys.modules["__main__"]) is sys.modules["__main__"],
    "lease": os.readlink(f"/proc/self/fd/{os.environ['LEASE_FD']}"),
}
print("serving", flush=True)
with open("report.json", "w") as out:
    json.dump(report, out)
"""


def stand_in(root: Path) -> Path:
    """A nemo_gym package whose import has effects of its own that belong to each server (as
    0.7.0's has: a working directory, a cache variable), whose base module imports a dependency
    (``csv``), and whose parser refuses a config holding ``refuse`` as NeMo Gym 0.7.0 refuses one (a
    warning printed, then an exception that appends the whole config)."""
    package = root / "nemo_gym"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(  # import effects of NeMo Gym 0.7.0's, which are each server's
        "import os\nfrom pathlib import Path\nWORKING_DIR = Path.cwd()\n"
        "os.environ.setdefault('HF_HOME', str(WORKING_DIR / 'cache'))\n"
    )
    (package / "server_utils.py").write_text("import csv\nprint('a banner an import prints')\n")
    (package / "global_config.py").write_text(
        "import sys\n"
        "from omegaconf import OmegaConf\n"
        "class GlobalConfigDictParserConfig:\n"
        "    def __init__(self, initial_global_config_dict, **kw): self.given = initial_global_config_dict\n"
        "class GlobalConfigDictParser:\n"
        "    def parse(self, config):\n"
        "        if 'refuse' not in config.given:\n"
        "            return OmegaConf.merge(config.given, {'dry_run': False})\n"
        "        print('almost-server tiny: datasets.0.license: Input should be a valid string',\n"
        "              file=sys.stderr)\n"
        "        dump = '\\n'.join(f'dumped_key_{i}: value' for i in range(200))\n"
        "        raise ValueError('1 almost-server(s) found.\\nFound global config dict yaml:\\n' + dump)\n"
    )
    return root


def environment(root: Path) -> Path:
    """A "virtual environment" whose python is this one (it has omegaconf)."""
    env = root / "env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (env / "bin" / "python").chmod(0o755)
    return env


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    folder = tmp_path / "resources_servers" / "tiny"
    folder.mkdir(parents=True)
    (folder / "app.py").write_text(REPORT)
    return {
        "fake": stand_in(tmp_path / "fake"),
        "env": environment(tmp_path),
        "folder": folder,
        "tmp": tmp_path,
    }


async def fork_server(world: dict[str, Path], fork: bool) -> ForkServer:
    """The fork server, holding a stand-in for the environment's lease (``stack.env_cache``)."""
    env = {**os.environ, "PYTHONPATH": str(world["fake"])}
    lease = os.open(world["tmp"] / "env.lock", os.O_RDWR | os.O_CREAT)
    try:
        return await ForkServer.start(world["env"], world["tmp"] / "forkserver.log", env, fork, lease)
    finally:
        os.close(lease)  # the fork server has its own copy


@pytest.fixture
async def forks(world: dict[str, Path]) -> AsyncIterator[ForkServer]:
    server = await fork_server(world, fork=True)
    yield server
    await server.close()


def server_env(world: dict[str, Path], forks: ForkServer) -> dict[str, str]:
    python_path = os.pathsep.join([str(world["folder"]), str(world["fake"])])
    lease = str(forks.lease_fd)
    return {**os.environ, "PYTHONPATH": python_path, "NEMO_GYM_CONFIG_PATH": "tiny", "LEASE_FD": lease}


async def report_of(forks: ForkServer, world: dict[str, Path], name: str = "tiny") -> dict[str, Any]:
    log = world["tmp"] / f"{name}.{forks.process.pid}.log"
    server = await forks.spawn(name, "app.py", str(world["folder"]), server_env(world, forks), log)
    assert await server.wait() == 0, log.read_text()
    assert "serving" in log.read_text()
    report = json.loads((world["folder"] / "report.json").read_text())
    (world["folder"] / "report.json").unlink()
    return report


async def test_a_forked_server_sees_what_a_fresh_interpreter_sees(
    world: dict[str, Path], forks: ForkServer
) -> None:
    forked = await report_of(forks, world)
    fresh_server = await fork_server(world, fork=False)
    try:
        fresh = await report_of(fresh_server, world)
    finally:
        await fresh_server.close()
    assert forked.pop("preloaded") is True and fresh.pop("preloaded") is False
    assert forked == fresh
    assert forked["name"] == "__main__" and forked["argv"] == ["app.py"] and forked["stdin"] == ""
    assert forked["file"] == str(world["folder"] / "app.py") and forked["cwd"] == str(world["folder"])
    assert forked["path"][:3] == [str(world["folder"]), str(world["folder"]), str(world["fake"])]
    assert forked["config_path"] == "tiny" and forked["leads_session"] is True
    assert forked["working_dir"] == str(world["folder"]) and forked["hf_home"] == str(
        world["folder"] / "cache"
    )
    assert forked["annotations"] == "{'x': <class 'int'>}" and forked["main_is_mp_main"] is True
    assert forked["lease"] == str(world["tmp"] / "env.lock")  # the environment stays in use
    assert "a banner an import prints" in (world["tmp"] / "forkserver.log").read_text()
    learnt = json.loads((world["env"] / nemo_gym_forks.DEPENDENCIES_FILE).read_text())
    assert "csv" in learnt and not any(name.split(".")[0] == "nemo_gym" for name in learnt)


async def test_a_folder_module_an_import_already_took_gets_a_fresh_interpreter(
    world: dict[str, Path], forks: ForkServer
) -> None:
    """The stand-in's preload imported the standard ``csv``; the folder's own ``csv.py`` must be
    the one its server imports, as in a fresh interpreter, so that server is not forked."""
    (world["folder"] / "csv.py").write_text("OURS = True\n")
    assert (await report_of(forks, world))["preloaded"] is False


async def test_exits_are_reported_as_a_child_process_reports_them(
    world: dict[str, Path], forks: ForkServer
) -> None:
    cases = {
        "exits_3": ("import sys\nsys.exit(3)\n", 3),
        "raises": ("raise RuntimeError('boom from the server')\n", 1),
        "killed": ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", -signal.SIGKILL),
    }
    for name, (code, returncode) in cases.items():
        (world["folder"] / f"{name}.py").write_text(code)
        log = world["tmp"] / f"{name}.log"
        server = await forks.spawn(name, f"{name}.py", str(world["folder"]), server_env(world, forks), log)
        assert await server.wait() == returncode, name
        assert server.returncode == returncode
    assert "RuntimeError: boom from the server" in (world["tmp"] / "raises.log").read_text()


async def test_closing_the_fork_server_ends_its_servers(world: dict[str, Path]) -> None:
    """When the stack goes (or its launcher is killed, which closes the pipe), no server is left."""
    (world["folder"] / "forever.py").write_text(
        "import pathlib, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "pathlib.Path('deaf').touch()\nwhile True:\n    time.sleep(1)\n"
    )
    forks = await fork_server(world, fork=True)
    server = await forks.spawn(
        "forever", "forever.py", str(world["folder"]), server_env(world, forks), world["tmp"] / "f.log"
    )
    deadline = time.monotonic() + 60
    while not (world["folder"] / "deaf").exists():  # until it ignores SIGTERM
        assert server.returncode is None and time.monotonic() < deadline
        await asyncio.sleep(0.05)
    await forks.close()
    assert await server.wait() == -signal.SIGKILL  # it ignored SIGTERM
    with pytest.raises(ProcessLookupError):
        os.kill(server.pid, 0)


async def test_a_dead_fork_server_leaves_no_server_and_says_so(
    world: dict[str, Path], forks: ForkServer
) -> None:
    (world["folder"] / "forever.py").write_text("import time\nwhile True:\n    time.sleep(1)\n")
    server = await forks.spawn(
        "forever", "forever.py", str(world["folder"]), server_env(world, forks), world["tmp"] / "f.log"
    )
    forks.process.kill()
    assert await server.wait() == -signal.SIGKILL
    with pytest.raises(nemo_gym_server.LaunchError, match=r"fork server in .* died"):
        await forks.spawn(
            "again", "app.py", str(world["folder"]), server_env(world, forks), world["tmp"] / "a.log"
        )


async def test_nemo_gyms_refusal_reason_is_shown_not_what_it_logged_before(forks: ForkServer) -> None:
    assert (await forks.resolve({"a": 1})).strip() == "a: 1\ndry_run: false"
    with pytest.raises(ConfigRefused) as refused:
        await forks.resolve({"refuse": True})
    shown = refusal_text(str(refused.value))
    assert "tiny: datasets.0.license: Input should be a valid string" in shown
    assert "ValueError: 1 almost-server(s) found." in shown
    assert "dumped_key" not in shown


def test_the_two_ends_agree_on_what_they_share() -> None:
    assert nemo_gym_forkserver.REFUSAL_MARK == nemo_gym_server.REFUSAL_MARK
    assert nemo_gym_forkserver.STOP_GRACE_S == nemo_gym_forks.STOP_GRACE_S


async def test_a_server_that_cannot_start_is_named_and_the_others_go_on(world: dict[str, Path]) -> None:
    forks = await fork_server(world, fork=False)
    try:
        with pytest.raises(
            nemo_gym_server.LaunchError, match="'gone' could not be started: FileNotFoundError"
        ):
            await forks.spawn(
                "gone",
                "app.py",
                str(world["tmp"] / "nowhere"),
                server_env(world, forks),
                world["tmp"] / "g.log",
            )
        assert (await report_of(forks, world))["config_path"] == "tiny"
    finally:
        await forks.close()
