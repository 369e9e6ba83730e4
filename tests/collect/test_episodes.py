"""Materialized task rows: routed by taskset, sent as NeMo Gym 0.7's episode envelope, and the
environment server's reply (result or typed failure) recorded as NeMo Gym's collector records it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from polygym.collect.dataset import DatasetError, load_jobs
from polygym.collect.episodes import episode_record, episode_request
from polygym.collect.health import env_of
from polygym.collect.job_plan import Materialization
from polygym.collect.rollouts import collect, run_call
from polygym.collect.task_source import head_task_routes, task_routes
from polygym.jsonl import write_jsonl
from polygym.net.client import ServerClient
from polygym.net.listen import AppServer, bind_socket
from polygym.row import make_job

TASK_ID = {"taskset": "weather", "task_id": "t1"}
CONFIG: dict[str, Any] = {
    "weather_agent": {"responses_api_agents": {"simple_agent": {}}},
    "episodes": {"environment_servers": {"single_agent_turn": {"agent_server": {"name": "weather_agent"}}}},
    "environment_server_routes": {"weather": "episodes"},
}


def task(task_id: str = "t1", taskset: str = "weather", **task_input: Any) -> dict[str, Any]:
    return {"task_id": {"taskset": taskset, "task_id": task_id}, "task_input": task_input or {"q": 1}}


def test_the_envelope_carries_the_rollout_id_and_attempt_as_nemo_gym_derives_them() -> None:
    row = make_job(task(), "episodes", 4, 2).row
    assert row["_ng_environment_server"] == "episodes" and "agent_ref" not in row
    assert episode_request(row) == {
        "episode_id": {"rollout_id": "4-2", "attempt": 0},
        "task": {"task_id": TASK_ID, "task_input": {"q": 1}},
    }
    retried = {**row, "_ng_attempt_index": 3, "_ng_rollout_id": "r-9"}
    assert episode_request(retried)["episode_id"] == {"rollout_id": "r-9", "attempt": 3}


def test_a_reply_becomes_its_result_or_its_failure_stamped() -> None:
    ids = {"episode_id": {"rollout_id": "0-0", "attempt": 0}, "task_id": TASK_ID}
    result = episode_record({**ids, "result": {"reward": 1.0, "extra": "x"}}, "episodes", "single_agent_turn")
    assert result == {
        "reward": 1.0,
        "extra": "x",
        "_ng_task_id": TASK_ID,
        "_ng_environment_server": "episodes",
        "_ng_result_type": "single_agent_turn",
    }
    failure = {"failure_reason": "agent down", "terminal": True, "stage": "agent", "partial_response": None}
    record = episode_record({**ids, "failure": failure}, "episodes", "single_agent_turn")
    assert record["_ng_failure_class"] == "environment_server_failed" and "reward" not in record
    assert (record["_ng_failure_message"], record["_ng_failure_terminal"]) == ("agent down", True)
    assert record["_ng_failure_stage"] == "agent" and "_ng_failure_partial_response" not in record
    with pytest.raises(ValueError, match="reserved for rollout collection"):
        episode_record({**ids, "result": {"reward": 1.0, "_ng_task_index": 3}}, "episodes", None)
    assert episode_record({"reward": 0.5}, "episodes", None) == {"reward": 0.5}  # not an episode reply


def test_routes_come_from_environment_server_routes_and_name_the_servers_kind() -> None:
    routes = task_routes(CONFIG)
    assert routes.tasksets == {"weather": "episodes"}
    assert routes.result_types == {"episodes": "single_agent_turn"}
    assert "routes: weather -> episodes" in routes.why_no_route("nope")


def test_rows_are_routed_by_taskset_and_an_unrouted_one_is_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    write_jsonl([task("a"), task("b"), {"responses_create_params": {"input": "hi"}}], path)
    plan = load_jobs(path, ["weather_agent"], "weather_agent", routes=task_routes(CONFIG))
    assert [job.agent for job in plan] == ["episodes", "episodes", "weather_agent"]
    assert plan.result_types == {"episodes": "single_agent_turn"}
    write_jsonl([task("a"), task("b", taskset="other"), {"task_id": {"taskset": ""}, "task_input": []}], path)
    with pytest.raises(DatasetError) as refused:
        load_jobs(path, ["weather_agent"], routes=task_routes(CONFIG))
    problems = refused.value.problems
    assert any(
        p.startswith(f"{path}:2: task_id.taskset 'other': cannot route: no environment_server_routes")
        for p in problems
    )
    assert f"{path}:3: task_id.taskset: must be a non-empty string" in problems
    assert f"{path}:3: task_input: must be an object" in problems
    write_jsonl([task("a")], path)
    with pytest.raises(DatasetError, match="take no sampling overrides"):
        load_jobs(
            path, [], routes=task_routes(CONFIG), options=Materialization(sampling={"temperature": 0.5})
        )


def episode_server(seen: list[dict[str, Any]]) -> Starlette:
    """An environment server: reward 1.0 for task ``ok``, a typed failure (terminal for ``gone``)."""

    async def run(request: Request) -> JSONResponse:
        body = await request.json()
        seen.append(body)
        ids = {"episode_id": body["episode_id"], "task_id": body["task"]["task_id"]}
        name = body["task"]["task_id"]["task_id"]
        if name == "ok":
            return JSONResponse({**ids, "result": {"reward": 1.0}})
        failure = {"failure_reason": f"{name} failed", "terminal": name == "gone", "stage": "seed"}
        return JSONResponse({**ids, "failure": failure})

    return Starlette(routes=[Route("/run", run, methods=["POST"])])


async def test_collect_sends_episodes_and_files_typed_failures_with_their_terminal_mark() -> None:
    seen: list[dict[str, Any]] = []
    client = ServerClient()
    client.add_local("episodes", episode_server(seen))
    jobs = [make_job(task(name), "episodes", t, 0) for t, name in enumerate(["ok", "busy", "gone"])]
    call = run_call(client, {"episodes": "single_agent_turn"})
    results = sorted([r async for r in collect(jobs, client, call=call)], key=lambda r: r.job.task_index)
    assert {body["task"]["task_id"]["task_id"]: body["episode_id"]["rollout_id"] for body in seen} == {
        "ok": "0-0",
        "busy": "1-0",
        "gone": "2-0",
    }
    rollout = results[0].rollout
    assert rollout is not None and rollout["reward"] == 1.0 and env_of(rollout) == "episodes"
    assert (rollout["_ng_environment_server"], rollout["_ng_result_type"]) == (
        "episodes",
        "single_agent_turn",
    )
    assert rollout["_ng_task_index"] == 0 and "agent_ref" not in rollout
    for result, terminal in ((results[1], False), (results[2], True)):
        failure = result.failure
        assert result.rollout is None and failure is not None and "agent_ref" not in failure
        assert failure["error_class"] == "environment_server_failed" and "reward" not in failure
        assert failure["_ng_failure_terminal"] is terminal and failure["_ng_failure_stage"] == "seed"
        assert failure["_ng_environment_server"] == "episodes" and env_of(failure) == "episodes"
        assert failure["_ng_result_type"] == "single_agent_turn"


async def test_a_nemo_gym_head_gives_its_routes_through_its_global_config() -> None:
    """NeMo Gym's head serves no ``GET /config``: its ``/global_config_dict_yaml`` (YAML text as
    a JSON string) gives the routes, so ``--no-serve`` against NeMo Gym's own stack routes tasksets."""

    async def global_config(request: Request) -> JSONResponse:
        return JSONResponse(yaml.safe_dump(CONFIG))

    app = Starlette(routes=[Route("/global_config_dict_yaml", global_config, methods=["GET"])])
    server = AppServer(app, bind_socket())
    await server.start()
    client = ServerClient(head_url=server.url, pool_size=2)
    try:
        routes = await head_task_routes(client)
    finally:
        await client.close()
        await server.stop()
    assert (routes.tasksets, routes.result_types) == (
        {"weather": "episodes"},
        {"episodes": "single_agent_turn"},
    )
