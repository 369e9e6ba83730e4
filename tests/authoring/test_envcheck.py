"""`gym env check`: every shipped environment conforms, and broken ones are caught, quickly."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import pytest

from polygym.authoring import check as envcheck
from polygym.authoring.check import FAIL, PASS, SKIP, check_env
from polygym.stack.catalog import list_implementations
from tests.conftest import ROOT, gym_command

pytestmark = pytest.mark.e2e

SHIPPED = list_implementations("resources_servers")


@pytest.mark.parametrize("env", SHIPPED)
def test_every_shipped_environment_passes(env: str) -> None:
    report = check_env(env)
    assert report.ok, report.summary()
    names = [r.name for r in report.results]
    for required in ("liveness", "verify: wrong rollouts", "verify: bad input", "sessions released"):
        assert report.result(required).status == PASS, report.summary()
    assert names[-1] == "shutdown"


# ------------------------------------------------------------------------------------ broken envs

BASE_APP = '''
from __future__ import annotations

import asyncio
import random

from pydantic import BaseModel, field_validator

from polygym.protocol import VerifyRequest, VerifyResponse, message_item
from polygym.servers.resources import ResourcesServer, tool


class LookupRequest(BaseModel):
    key: str
    # VALIDATOR


class Probe(ResourcesServer):
    @tool
    async def lookup(self, body: LookupRequest) -> dict:
        """Look up a key."""
        return {"value": len(body.key)}

    async def verify(self, body: VerifyRequest) -> VerifyResponse:
        reward = 1.0 if body.response.output_text() == "right" else 0.0
        # VERIFY
        return VerifyResponse(**body.model_dump(), reward=reward)

    @classmethod
    def example_solution(cls, row):
        return [message_item("right")]

    # EXTRA
'''

BREAKAGES = {
    "fine": {},
    "raises": {"# VERIFY": "raise RuntimeError('verifier exploded')"},
    "out_of_range": {"# VERIFY": "reward = reward + 1.5"},
    "nan": {"# VERIFY": "reward = float('nan')"},
    "tool_500": {
        "# VALIDATOR": (
            "@field_validator('key', mode='before')\n"
            "    @classmethod\n"
            "    def _strip(cls, value):\n"
            "        return value.strip()  # AttributeError (a 500) on a non-string"
        )
    },
    "hangs": {"# VERIFY": "await asyncio.sleep(3600)"},
    "random": {"# VERIFY": "reward = random.random()"},
    "bad_solution": {'message_item("right")': 'message_item("wrong")'},
    "no_solution": {'return [message_item("right")]': "return None"},  # the base's default answer
    "startup_fails": {"# EXTRA": "async def startup(self):\n        raise RuntimeError('no database')"},
}


def write_env(root: Path, case: str, reward_range: list[float] | None = None) -> Path:
    """An environment folder ``root/resources_servers/<unique name>`` with one breakage applied."""
    name = f"probe_{case}_{uuid.uuid4().hex[:8]}"  # unique: the loader caches modules by name
    env_dir = root / "resources_servers" / name
    (env_dir / "configs").mkdir(parents=True)
    (env_dir / "data").mkdir()
    source = BASE_APP
    for marker, replacement in BREAKAGES[case].items():
        source = source.replace(marker, replacement)
    (env_dir / "app.py").write_text(source)
    extra = f"      reward_range: {reward_range}\n" if reward_range else ""
    (env_dir / "configs" / f"{name}.yaml").write_text(
        f"{name}:\n  resources_servers:\n    {name}:\n      entrypoint: app.py\n{extra}"
        f"{name}_simple_agent:\n  responses_api_agents:\n    simple_agent:\n      entrypoint: app.py\n"
        f"      resources_server: {{type: resources_servers, name: {name}}}\n"
        f"      model_server: {{type: responses_api_models, name: policy_model}}\n"
        f"      datasets:\n      - {{name: example, type: example, jsonl_fpath: data/example.jsonl}}\n"
    )
    rows = [{"responses_create_params": {"input": f"question {i}"}, "topic": i} for i in range(2)]
    (env_dir / "data" / "example.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return env_dir


def statuses(report: envcheck.EnvReport) -> dict[str, str]:
    return {r.name: r.status for r in report.results}


def test_a_well_behaved_probe_passes_every_check(tmp_path: Path) -> None:
    report = check_env(write_env(tmp_path, "fine"))
    assert report.ok, report.summary()
    assert report.result("verify: correct rollout").detail == "rewards 1, 1"
    assert report.result("verify: correct beats wrong").status == PASS
    assert report.result("tool lookup: call").detail == '{"key":"example"} -> HTTP 200'


def test_a_verify_that_raises_is_reported(tmp_path: Path) -> None:
    report = check_env(write_env(tmp_path, "raises"))
    assert not report.ok
    failed = report.result("verify: wrong rollouts")
    assert failed.status == FAIL
    assert "HTTP 500" in failed.detail and "verifier exploded" in failed.detail
    assert report.result("sessions released").status == PASS  # the agent-side release still works


def test_a_reward_out_of_range_is_reported(tmp_path: Path) -> None:
    report = check_env(write_env(tmp_path, "out_of_range"))
    detail = report.result("verify: wrong rollouts").detail
    assert report.result("verify: wrong rollouts").status == FAIL
    assert "reward 1.5 outside reward_range [0, 1]" in detail
    assert "reward 2.5 outside" in report.result("verify: correct rollout").detail


def test_reward_range_comes_from_the_config(tmp_path: Path) -> None:
    report = check_env(write_env(tmp_path, "out_of_range", reward_range=[0.0, 3.0]))
    assert report.ok, report.summary()
    assert "reward_range [0, 3]" in report.result("config").detail


def test_a_nan_reward_is_reported(tmp_path: Path) -> None:
    report = check_env(write_env(tmp_path, "nan"))
    assert "reward is not a finite number" in report.result("verify: wrong rollouts").detail


def test_a_tool_that_500s_on_bad_input_is_reported(tmp_path: Path) -> None:
    report = check_env(write_env(tmp_path, "tool_500"))
    assert report.result("tool lookup: call").status == PASS
    failed = report.result("tool lookup: bad input")
    assert failed.status == FAIL
    assert "wrong type for 'key': expected a 4xx, got HTTP 500" in failed.detail
    assert [r.name for r in report.failures()] == ["tool lookup: bad input"]


def test_a_verify_that_hangs_is_a_quick_timeout(tmp_path: Path) -> None:
    began = time.perf_counter()
    report = check_env(write_env(tmp_path, "hangs"), timeout_s=0.3)
    elapsed = time.perf_counter() - began
    failed = report.result("verify: wrong rollouts")
    assert failed.status == FAIL
    assert "no reply within 0.3s (timeout)" in failed.detail
    # One timeout, not one per call: later verifies are not attempted, and the server still stops.
    assert report.result("verify: deterministic").status == SKIP
    assert report.result("shutdown").status == PASS
    assert elapsed < 8, f"took {elapsed:.1f}s"


def test_a_random_verify_is_not_deterministic(tmp_path: Path) -> None:
    report = check_env(write_env(tmp_path, "random"))
    assert report.result("verify: deterministic").status == FAIL
    assert "same input, rewards" in report.result("verify: deterministic").detail


def test_a_solution_that_earns_no_more_than_garbage_is_reported(tmp_path: Path) -> None:
    report = check_env(write_env(tmp_path, "bad_solution"))
    failed = report.result("verify: correct beats wrong")
    assert failed.status == FAIL
    assert "row 0: correct 0 <= wrong 0" in failed.detail


def test_a_server_that_cannot_start_is_reported_and_stopped(tmp_path: Path) -> None:
    report = check_env(write_env(tmp_path, "startup_fails"), timeout_s=2)
    assert [r.name for r in report.results] == ["config", "dataset", "start"]
    assert report.result("start").status == FAIL
    assert "no database" in report.result("start").detail


def test_unusable_dataset_rows_are_reported_and_skipped(tmp_path: Path) -> None:
    env_dir = write_env(tmp_path, "fine")
    with (env_dir / "data" / "example.jsonl").open("a") as handle:
        handle.write('{"oops": \n{"responses_create_params": {"tools": []}}\n')
    report = check_env(env_dir, max_rows=4)
    dataset = report.result("dataset")
    assert dataset.status == FAIL
    assert ":3: (row): invalid JSON" in dataset.detail
    assert ":4: responses_create_params.input: missing" in dataset.detail
    assert "4 rows, checking 2" in dataset.detail
    assert report.result("verify: correct rollout").detail == "rewards 1, 1"  # the good rows still run


def test_an_unknown_name_suggests_the_closest(tmp_path: Path) -> None:
    report = check_env("example_single_tool_cal")
    assert report.results[0].status == FAIL
    assert "Did you mean 'example_single_tool_call'?" in report.results[0].detail


def test_cli_json_and_exit_codes(tmp_path: Path) -> None:
    broken = write_env(tmp_path, "raises")
    done = subprocess.run(
        gym_command("env", "check", broken.name, "--json", "--rows", "1"),
        cwd=tmp_path,  # a user folder in the working directory is found by name
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    report = orjson.loads(done.stdout)
    assert report["ok"] is False and report["env"] == broken.name
    failed = {c["name"]: c for c in report["checks"] if c["status"] == "fail"}
    assert set(failed) == {"verify: wrong rollouts", "verify: correct rollout"}
    assert "row 0, empty output" in failed["verify: wrong rollouts"]["detail"]

    table = subprocess.run(
        gym_command("env", "check", "example_single_tool_call"), cwd=ROOT, capture_output=True, text=True
    )
    assert table.returncode == 0, table.stdout + table.stderr
    assert "sessions released" in table.stdout and "example_single_tool_call: ok" in table.stdout

    typo = subprocess.run(gym_command("env", "check", "exmple_multi_step"), capture_output=True, text=True)
    assert typo.returncode == 2
    assert "Did you mean 'example_multi_step'?" in typo.stderr


# ------------------------------------------------------------------------------- example solution


def test_without_an_example_solution_the_correct_rollout_checks_are_skipped(tmp_path: Path) -> None:
    report = check_env(write_env(tmp_path, "no_solution"))
    assert report.ok, report.summary()
    skipped = report.result("verify: correct rollout")
    assert skipped.status == SKIP and "override `@classmethod example_solution" in skipped.detail
    assert report.result("verify: correct beats wrong").status == SKIP
    deterministic = report.result("verify: deterministic").detail
    assert deterministic == "row 0 (garbage answer) verified twice: identical results"


# ------------------------------------------------------------------------------------ class input


def test_check_env_takes_a_shipped_server_class() -> None:
    from resources_servers.example_single_tool_call.app import ExampleSingleToolCall

    report = check_env(ExampleSingleToolCall, max_rows=1)
    assert report.ok, report.summary()
    assert report.env == "example_single_tool_call"
    assert report.directory == str(ROOT / "resources_servers" / "example_single_tool_call")


def test_check_env_takes_a_class_loaded_from_a_users_folder(tmp_path: Path) -> None:
    """A class imported by path (as a scaffolded test does) is checked as its folder."""
    import importlib.util

    env_dir = write_env(tmp_path, "bad_solution")
    spec = importlib.util.spec_from_file_location(f"{env_dir.name}_under_test", env_dir / "app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(TypeError, match="cannot find the folder of Probe"):
        check_env(module.Probe)  # not in sys.modules: no file to go by
    sys.modules[spec.name] = module
    try:
        report = check_env(module.Probe)
    finally:
        del sys.modules[spec.name]
    assert report.directory == str(env_dir.resolve())
    assert report.result("verify: correct beats wrong").status == FAIL
