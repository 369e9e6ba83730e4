"""NeMo Gym's own stack as a child process, for the tests and benchmarks that run against it.

The test that points polygym's collector at NeMo Gym's stack (``tests/e2e/test_nemo_gym_head_e2e.py``)
and the benchmark that times NeMo Gym's seed flow (``benchmarks/nemo_gym_seed_flow.py``) start it
the same way: NeMo Gym's launcher (``gym env start`` or ``ng_run``) in its environment, every
server venv a link to that one environment (nothing installed), in a session of its own so that
everything it starts is stopped with it. NeMo Gym starts a Ray cluster and, given none, its servers
join the machine's latest one (named in Ray's temporary folder): under xdist that is another test's,
even a simulated node's, so each stack gets a Ray folder of its own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import psutil

from tests.nemo_gym_tools import nemo_gym_env

READY_TIMEOUT_S = 300.0
"""NeMo Gym starts Ray and a process per server; on a loaded two-core machine that takes a while."""
STOP_TIMEOUT_S = 60.0


def site_packages(python: Path) -> Path:
    """Where NeMo Gym's wheel is installed in its environment (its configs, data and servers)."""
    [found] = (python.parent.parent / "lib").glob("python3.*/site-packages")
    return found


def stack_settings(
    python: Path, folders: Iterable[str], model_url: str, head_port: int, state: Path
) -> list[str]:
    """NeMo Gym's overrides for a stack on loopback: the policy at ``model_url`` (OpenAI-compatible,
    with ``/v1``), the head at ``head_port``, and a ``uv_venv_dir`` whose venv for each server folder
    is a link to NeMo Gym's one environment."""
    venvs = state / "venvs"
    for folder in folders:
        (venvs / folder).mkdir(parents=True)
        (venvs / folder / ".venv").symlink_to(python.parent.parent)
    settings = {
        "policy_base_url": model_url,
        "policy_api_key": "none",
        "policy_model_name": "scripted",
        "head_server.host": "127.0.0.1",
        "head_server.port": head_port,
        "uv_venv_dir": venvs,
        "skip_venv_if_present": "true",
    }
    return [f"++{key}={value}" for key, value in settings.items()]


class NemoGymStack:
    """NeMo Gym's launcher running ``command`` in ``state``; ready when its head answers ``/readyz``
    (NeMo Gym marks it once every server and the model endpoint answer); stopped as a user stops it
    (SIGINT: the launcher stops its servers and its Ray cluster), then whatever is left of its
    session is killed."""

    def __init__(self, command: list[str], state: Path, head_port: int) -> None:
        self.head_port = head_port
        self.head_url = f"http://127.0.0.1:{head_port}"
        self.ray_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths are bounded
        self.log = (state / "nemo_gym_stack.log").open("w+b")
        self.began = time.perf_counter()
        self.proc = subprocess.Popen(
            command,
            cwd=state,
            env={**nemo_gym_env(), "RAY_TMPDIR": self.ray_dir},
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.ready_s = time.perf_counter() - self.began

    @property
    def pids(self) -> list[int]:
        return [self.proc.pid]

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"NeMo Gym's launcher exited {self.proc.returncode}:\n{self.output()}")
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(f"{self.head_url}/readyz", timeout=5),
            ):
                return
            time.sleep(0.2)
        raise RuntimeError(f"NeMo Gym's stack not ready within {READY_TIMEOUT_S:.0f} s:\n{self.output()}")

    def session(self) -> list[psutil.Process]:
        """The launcher's process tree and every other process of its session (one that left the tree)."""
        found: dict[int, psutil.Process] = {}
        with contextlib.suppress(psutil.Error):
            launcher = psutil.Process(self.proc.pid)
            found = {p.pid: p for p in [launcher, *launcher.children(recursive=True)]}
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if os.getsid(proc.pid) == self.proc.pid:
                    found.setdefault(proc.pid, proc)
        return list(found.values())

    def stop(self) -> None:
        members = self.session()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(STOP_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for proc in members:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        self.proc.wait(STOP_TIMEOUT_S)
        self.log.close()
        shutil.rmtree(self.ray_dir, ignore_errors=True)
