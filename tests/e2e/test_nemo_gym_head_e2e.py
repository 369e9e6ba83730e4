"""Each project's collector against the other's stack, through the other's head server.

One direction: NeMo Gym 0.7.0's own ``gym eval run --no-serve`` (its collector, run in NeMo Gym's
environment) pointed at the head of a polygym stack (``gym env start``, scripted model, both
example environments) collects every row with reward 1.0. The other: polygym's ``gym eval run
--no-serve --head-url`` pointed at the head of NeMo Gym's own stack, started by NeMo Gym's ``gym
env start`` (its ``openai_model`` aimed at polygym's scripted model, since NeMo Gym ships no model
server that needs no key) collects every row of NeMo Gym's ``example_single_tool_call`` data.

NeMo Gym runs in the environment of ``tests/nemo_gym_tools.py`` (built once, cached); its servers
reuse that environment through its own ``uv_venv_dir`` / ``skip_venv_if_present`` settings, so
nothing is installed. Everything listens on loopback.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

from polygym.jsonl import iter_jsonl
from polygym.net.child_port import port_for_a_child
from tests.conftest import ROOT, run_gym
from tests.nemo_gym_tools import nemo_gym_command, nemo_gym_env, run_nemo_gym, tools_python

pytestmark = [pytest.mark.e2e, pytest.mark.nemo_gym]

ENVIRONMENTS = ("example_single_tool_call", "example_multi_step")
NEMO_ENV = "example_single_tool_call"
NEMO_AGENT = f"{NEMO_ENV}_simple_agent"
NEMO_SERVER_FOLDERS = (
    f"resources_servers/{NEMO_ENV}",
    "responses_api_agents/simple_agent",
    "responses_api_models/openai_model",
    "environment_servers/legacy_agent",
)
"""The folders NeMo Gym's stack runs: the environment, its agent, the model and 0.7's relay."""
NEMO_READY_TIMEOUT_S = 240.0
"""NeMo Gym starts a Ray cluster and four processes; on a shared two-core machine that takes a while."""


@pytest.fixture(scope="module")
def ng_python() -> Path:
    return tools_python()


def site_packages(python: Path) -> Path:
    """Where NeMo Gym's wheel put its server folders in its environment."""
    [found] = (python.parent.parent / "lib").glob("python3.*/site-packages")
    return found


def rewards_by_agent(path: Path) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {}
    for row in iter_jsonl(path):
        found.setdefault(row["agent_ref"]["name"], []).append(row["reward"])
    return found


def test_nemo_gyms_collector_collects_from_a_polygym_stack(
    start_stack: Any, tmp_path: Path, ng_python: Path
) -> None:
    selectors = [arg for env in ENVIRONMENTS for arg in ("--resources-server", env)]
    stack = start_stack("--model-type", "scripted_model", *selectors, "--head-port", "0")
    head_port = stack.record["head_url"].rsplit(":", 1)[1]
    rows = [
        row
        for env in ENVIRONMENTS
        for row in iter_jsonl(ROOT / "resources_servers" / env / "data" / "example.jsonl")
    ]
    (tmp_path / "in.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    done = run_nemo_gym(
        ng_python,
        *("eval", "run", "--no-serve", "--input", "in.jsonl", "--output", "ng.jsonl"),
        *("++head_server.host=127.0.0.1", f"++head_server.port={head_port}"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    expected = {f"{env}_simple_agent": [1.0] * 5 for env in ENVIRONMENTS}
    assert rewards_by_agent(tmp_path / "ng.jsonl") == expected
    metrics = orjson.loads((tmp_path / "ng_aggregate_metrics.json").read_bytes())
    assert {entry["agent_ref"]["name"]: entry["agent_metrics"]["mean/reward"] for entry in metrics} == {
        agent: 1.0 for agent in expected
    }


class NemoGymStack:
    """NeMo Gym's own ``gym env start`` in its environment, stopped with every process it started."""

    def __init__(self, python: Path, cwd: Path, model_url: str) -> None:
        venvs = cwd / "venvs"
        for folder in NEMO_SERVER_FOLDERS:
            (venvs / folder).mkdir(parents=True)
            (venvs / folder / ".venv").symlink_to(python.parent.parent)
        self.head_url = f"http://127.0.0.1:{port_for_a_child('127.0.0.1')}"
        settings = {
            "policy_base_url": f"{model_url}/v1",
            "policy_api_key": "none",
            "policy_model_name": "scripted",
            "head_server.port": self.head_url.rsplit(":", 1)[1],
            "uv_venv_dir": str(venvs),
            "skip_venv_if_present": "true",
        }
        args = ["env", "start", "--resources-server", NEMO_ENV, "--model-type", "openai_model"]
        self.log = (cwd / "nemo_gym_stack.log").open("w+b")
        # NeMo Gym starts a Ray cluster and, given none, its servers join the machine's latest one
        # (named in Ray's temporary folder): under xdist that is another test's, even a simulated
        # node's. A folder of its own (short: Ray's socket paths are bounded) keeps it to its own.
        self.ray_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
        self.proc = subprocess.Popen(
            nemo_gym_command(python, *args, *(f"++{key}={value}" for key, value in settings.items())),
            cwd=cwd,
            env={**nemo_gym_env(), "RAY_TMPDIR": self.ray_dir},
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]

    def wait_ready(self) -> None:
        """Until its head lists all four servers and each accepts a connection (NeMo Gym's own test)."""
        deadline = time.monotonic() + NEMO_READY_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"NeMo Gym's gym env start exited:\n{self.output()}"
            urls = [i.get("url") for i in self._instances()]
            if len(urls) == len(NEMO_SERVER_FOLDERS) and all(map(_accepts, urls)):
                return
            time.sleep(0.5)
        raise AssertionError(f"NeMo Gym's stack not ready within {NEMO_READY_TIMEOUT_S}s:\n{self.output()}")

    def _instances(self) -> list[dict[str, Any]]:
        url = f"{self.head_url}/server_instances"
        with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(url, timeout=5) as reply:
            found = orjson.loads(reply.read())
            return found if isinstance(found, list) else []
        return []

    def stop(self) -> None:
        """Terminate the launcher and every process below it (its servers, its Ray cluster)."""
        with contextlib.suppress(psutil.Error):
            family = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
            for process in family:
                with contextlib.suppress(psutil.Error):
                    process.terminate()
            _, alive = psutil.wait_procs(family, timeout=15)
            for process in alive:
                with contextlib.suppress(psutil.Error):
                    process.kill()
        self.proc.wait(15)
        self.log.close()
        shutil.rmtree(self.ray_dir, ignore_errors=True)


def _accepts(url: Any) -> bool:
    """Whether ``url`` answers HTTP at all (any status: not every NeMo Gym server has ``GET /``)."""
    if not isinstance(url, str):
        return False
    try:
        urllib.request.urlopen(url, timeout=5).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


@pytest.fixture
def nemo_gym_stack(start_stack: Any, tmp_path: Path, ng_python: Path) -> Iterator[NemoGymStack]:
    model = start_stack("--model-type", "scripted_model", "--head-port", "0")
    stack = NemoGymStack(ng_python, tmp_path, model.server("policy_model")["url"])
    try:
        stack.wait_ready()
        yield stack
    finally:
        stack.stop()


def test_polygyms_collector_collects_from_a_nemo_gym_stack(
    nemo_gym_stack: NemoGymStack, tmp_path: Path, ng_python: Path
) -> None:
    data = site_packages(ng_python) / "resources_servers" / NEMO_ENV / "data" / "example.jsonl"
    rows = len(list(iter_jsonl(data)))
    done = run_gym(
        *("eval", "run", "--no-serve", "--head-url", nemo_gym_stack.head_url, "--agent", NEMO_AGENT),
        *("--input", str(data), "--output", "pg.jsonl"),
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert rewards_by_agent(tmp_path / "pg.jsonl") == {NEMO_AGENT: [1.0] * rows}
    for row in iter_jsonl(tmp_path / "pg.jsonl"):
        calls = [item for item in row["response"]["output"] if item["type"] == "function_call"]
        assert [call["name"] for call in calls] == ["get_weather"]
    assert list(iter_jsonl(tmp_path / "pg_failures.jsonl")) == []
    [entry] = orjson.loads((tmp_path / "pg_aggregate_metrics.json").read_bytes())
    perf = entry["perf_summary"]  # NeMo Gym's agent summarised polygym's ng_perf records
    assert perf["overall_observability_coverage"] == 1.0 and perf["token_observability_coverage"] == 1.0
    assert perf["mean_num_turns"] == 2.0 and perf["total_latency_p50_ms"] > 0
