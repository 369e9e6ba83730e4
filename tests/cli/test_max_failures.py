"""A run whose rollouts failed exits 1 unless ``--max-failures`` allows it, and its last line says
how many failed and why: ``gym eval run``, its ``--blend`` runs and ``gym eval reverify`` alike."""

from __future__ import annotations

import socket
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner, Result

from polygym.cli import gym
from polygym.jsonl import iter_jsonl, write_jsonl
from tests.conftest import ROOT

EXAMPLE = ROOT / "resources_servers" / "example_single_tool_call" / "data" / "example.jsonl"
OPENAI = ("--model-type", "openai_model", "--resources-server", "example_single_tool_call")


def gym_run(*args: str) -> Result:
    return CliRunner().invoke(gym, list(args), catch_exceptions=False)


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


@pytest.fixture
def dead_url() -> str:
    """A URL nothing listens on: a port bound, then closed (never a guessed port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def dead_model_run(tmp_path: Path, dead_url: str, *extra: str) -> Result:
    return gym_run(
        "eval",
        "run",
        *OPENAI,
        "--input",
        str(EXAMPLE),
        "--output",
        str(tmp_path / "out.jsonl"),
        f"policy_base_url={dead_url}",
        "policy_api_key=sk-not-shown",
        "policy_model_name=m",
        "policy_model.responses_api_models.openai_model.max_attempts=1",
        "--overwrite",
        *extra,
    )


@pytest.mark.e2e
def test_a_dead_model_url_exits_1_naming_the_failure_class(tmp_path: Path, dead_url: str) -> None:
    result = dead_model_run(tmp_path, dead_url)
    assert result.exit_code == 1
    line = last_line(result.stderr)
    assert line.startswith("error: 5 of 5 rollouts failed (ConnectionRefused: 5): more than --max-failures 0")
    assert "sk-not-shown" not in result.output
    warned = f"warning: policy_model upstream {dead_url}/models unreachable (ConnectionRefused): its rollouts"
    assert warned in " ".join(result.stderr.split())


@pytest.mark.e2e
@pytest.mark.parametrize(("allowed", "code"), [("5", 0), ("4", 1), ("100%", 0), ("99%", 1)])
def test_failures_the_user_allowed_exit_0(tmp_path: Path, dead_url: str, allowed: str, code: int) -> None:
    """5 of 5 failed: a count of 5 or a rate of 100% allows it; 4, or 99%, does not (the boundary)."""
    result = dead_model_run(tmp_path, dead_url, "--max-failures", allowed)
    assert result.exit_code == code
    stream = result.stdout if code == 0 else result.stderr
    assert "5 of 5 rollouts failed (ConnectionRefused: 5): " in last_line(stream)
    if code == 0:
        assert last_line(result.stdout).endswith(f"within --max-failures {allowed}.")


@pytest.mark.e2e
def test_rows_routed_to_an_agent_that_cannot_serve_them_exit_1(tmp_path: Path) -> None:
    """Travel rows sent to the multiple-choice environment: its verifier refuses them (422)."""
    rows = [{k: v for k, v in row.items() if k != "agent_ref"} for row in iter_jsonl(EXAMPLE)]
    write_jsonl(rows, tmp_path / "in.jsonl")
    result = gym_run(
        "eval",
        "run",
        "--model-type",
        "scripted_model",
        "--resources-server",
        "mcqa",
        "--input",
        str(tmp_path / "in.jsonl"),
        "--output",
        str(tmp_path / "out.jsonl"),
    )
    assert result.exit_code == 1
    assert last_line(result.stderr).startswith(
        f"error: {len(rows)} of {len(rows)} rollouts failed (HTTP 422:"
    )


@pytest.mark.e2e
@pytest.mark.parametrize(("allowed", "code"), [("0", 1), ("50%", 1), ("100%", 0)])
def test_reverify_exits_1_when_rows_failed(tmp_path: Path, allowed: str, code: int) -> None:
    """Stored rollouts without the fields their verifier needs: every /verify is refused."""
    rows = [
        {
            "responses_create_params": {"input": "q"},
            "agent_ref": {"type": "responses_api_agents", "name": "mcqa_simple_agent"},
            "_ng_task_index": task,
            "_ng_rollout_index": 0,
            "response": {"id": f"r{task}", "output": []},
            "reward": 1.0,
        }
        for task in range(2)
    ]
    (tmp_path / "x.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    result = gym_run(
        "eval",
        "reverify",
        "--model-type",
        "scripted_model",
        "--resources-server",
        "mcqa",
        "--rollouts",
        str(tmp_path / "x.jsonl"),
        "--max-failures",
        allowed,
    )
    assert result.exit_code == code, result.output
    stream = result.stdout if code == 0 else result.stderr
    assert "2 of 2 rows failed (HTTP 422: 2)" in last_line(stream)


def test_a_bad_max_failures_exits_2_naming_it(tmp_path: Path) -> None:
    result = gym_run("eval", "run", "--input", "x", "--output", "y", "--max-failures", "5 %%")
    assert result.exit_code == 2
    assert "--max-failures" in result.stderr and "is not a percentage" in result.stderr


@pytest.mark.e2e
def test_reverify_names_the_lines_it_cannot_read_and_counts_them_failed(tmp_path: Path) -> None:
    """A stored run with a line of invalid UTF-8 and a duplicate: named, and the unreadable one fails."""
    rows = list(iter_jsonl(EXAMPLE))[:1]
    write_jsonl(rows, tmp_path / "in.jsonl")
    run = ["--model-type", "scripted_model", "--resources-server", "example_single_tool_call"]
    collected = gym_run(
        "eval", "run", *run, "--input", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "x.jsonl")
    )
    assert collected.exit_code == 0, collected.output
    stored = (tmp_path / "x.jsonl").read_bytes()
    (tmp_path / "x.jsonl").write_bytes(stored + stored + b'{"bad": "\xff"}\n')
    result = gym_run("eval", "reverify", *run, "--rollouts", str(tmp_path / "x.jsonl"))
    assert result.exit_code == 1, result.output
    assert "2 lines were not reverified (Duplicate: 1, InvalidUTF8: 1)" in result.stderr
    assert f"{tmp_path / 'x.jsonl'}:2: Duplicate" in result.stderr
    assert f"{tmp_path / 'x.jsonl'}:3: InvalidUTF8" in result.stderr
    assert "1 of 2 rows failed (InvalidUTF8: 1)" in last_line(result.stderr)
