"""Which rows a reverify plans, how it calls an environment, and how it counts the changes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from polygym.collect.reverify import (
    Item,
    ReverifyError,
    ReverifySettings,
    Verifier,
    check_inputs,
    classify,
    diff_path,
    plan_reverify,
    resources_by_agent,
    reverified_path,
    unsupported_servers,
    verify_payload,
)
from polygym.collect.rollouts import Limits, Result, collect
from polygym.collect.task_source import task_routes
from polygym.jsonl import write_jsonl
from polygym.net.client import ServerCallError
from polygym.row import Job
from polygym.servers.judge import JUDGE_FAILED

AGENT = {"type": "responses_api_agents", "name": "a"}


def rollout(task: int, reward: float = 1.0, **extra: Any) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": "q"},
        "agent_ref": AGENT,
        "_ng_task_index": task,
        "_ng_rollout_index": 0,
        "response": {"output": [], "id": f"r{task}"},
        "reward": reward,
        **extra,
    }


def test_paths_sit_next_to_the_rollouts() -> None:
    assert reverified_path(Path("d/x.jsonl")) == Path("d/x_reverified.jsonl")
    assert diff_path(Path("d/x_reverified.jsonl")) == Path("d/x_reverify_diff.json")
    assert diff_path(Path("d/other.jsonl")) == Path("d/other_reverify_diff.json")


def test_output_may_not_be_a_file_of_the_run(tmp_path: Path) -> None:
    for name in ("x.jsonl", "x_failures.jsonl", "x_aggregate_metrics.json"):
        with pytest.raises(ReverifyError, match="never overwrites"):
            ReverifySettings(tmp_path / "x.jsonl", output=tmp_path / name).files()


def test_full_plan_verifies_every_row_with_its_old_reward(tmp_path: Path) -> None:
    write_jsonl([rollout(0, 0.5), rollout(1, 1.0)], tmp_path / "x.jsonl")
    plan = plan_reverify(tmp_path / "x.jsonl", failed_only=False)
    assert [(i.job.key, i.verify, i.old_reward) for i in plan.items] == [
        ((0, 0), True, 0.5),
        ((1, 0), True, 1.0),
    ]
    assert plan_reverify(tmp_path / "x.jsonl", failed_only=False, limit=1).items[0].job.key == (0, 0)


def test_failed_only_takes_judge_failed_rows_and_failures_with_a_response(tmp_path: Path) -> None:
    write_jsonl(
        [rollout(0), rollout(1, 0.0, error_class=JUDGE_FAILED), rollout(2, 0.0, judge_failed=True)],
        tmp_path / "x.jsonl",
    )
    write_jsonl(
        [
            {"agent_ref": AGENT, "error_class": JUDGE_FAILED, "row": rollout(3)},
            {
                "agent_ref": AGENT,
                "error_class": "Timeout",
                "row": {"responses_create_params": {"input": "q"}},
            },
            {"agent_ref": AGENT, "error_class": JUDGE_FAILED, "row": rollout(1)},  # already planned: once
        ],
        tmp_path / "x_failures.jsonl",
    )
    plan = plan_reverify(tmp_path / "x.jsonl", failed_only=True)
    assert [(i.job.key[0], i.verify, i.old_reward) for i in plan.items] == [
        (0, False, 1.0),
        (1, True, None),
        (2, True, None),
        (3, True, None),
    ]
    assert plan.no_response == 1
    assert plan.fingerprint(True) != plan.fingerprint(False)
    limited = plan_reverify(tmp_path / "x.jsonl", failed_only=True, limit=1).items
    assert [(i.job.key[0], i.verify) for i in limited] == [(0, False), (1, True)]  # carried rows stay


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"agent_ref": AGENT, "_ng_task_index": 0, "_ng_rollout_index": 0}, "field response: missing"),
        ({**rollout(0), "agent_ref": None}, "field agent_ref"),
        ({**rollout(0), "_ng_task_index": "0"}, "_ng_task_index"),
    ],
)
def test_bad_rows_are_named_by_file_and_row(tmp_path: Path, row: dict[str, Any], message: str) -> None:
    write_jsonl([rollout(5), row], tmp_path / "x.jsonl")
    with pytest.raises(ReverifyError, match=rf"x.jsonl:2: .*{message}"):
        plan_reverify(tmp_path / "x.jsonl", failed_only=False)


def test_unreadable_and_duplicate_lines_are_counted_and_named(tmp_path: Path) -> None:
    """Nothing is skipped in silence: each line not reverified is named by file:line with why."""
    path = tmp_path / "x.jsonl"
    good = orjson.dumps(rollout(0)) + b"\n"
    path.write_bytes(
        good
        + b"{not json\n"
        + b'{"a": "\xff"}\n'
        + b"[1, 2]\n"
        + good
        + orjson.dumps(rollout(1))
        + b"\n"
        + b'{"cut'
    )
    plan = plan_reverify(path, failed_only=False)
    assert [i.job.key for i in plan.items] == [(0, 0), (1, 0)]
    assert [(d.where, d.kind) for d in plan.dropped] == [
        (f"{path}:2", "BadJSON"),
        (f"{path}:3", "InvalidUTF8"),
        (f"{path}:4", "NotAnObject"),
        (f"{path}:5", "Duplicate"),
        (f"{path}:7", "UnfinishedLine"),
    ]
    assert str(plan.dropped[3]) == f"{path}:5: Duplicate (task 0 rollout 0, as {path}:1)"


def test_missing_rollouts_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ReverifyError, match=r"--rollouts .*no such file"):
        plan_reverify(tmp_path / "absent.jsonl", failed_only=False)


def test_payload_is_the_row_as_sent_plus_the_stored_response() -> None:
    stored = rollout(0, 0.0, extracted="x")
    assert verify_payload(stored, {"sent": True}) == {"sent": True, "response": stored["response"]}
    rebuilt = verify_payload(stored, None)
    assert rebuilt["response"] == stored["response"] and "reward" not in rebuilt


def test_a_stored_rows_verifier_outputs_never_reach_verify_when_its_input_is_at_hand() -> None:
    # NeMo Gym's mcqa stores extracted_answer; its verifier passes it again and raises
    # "got multiple values for keyword argument" unless the row as sent is replayed
    stored = rollout(0, 1.0, extracted_answer="B", deliverables_dir="/out/0", reference_ids=[3])
    sent = {"responses_create_params": {"input": "q"}, "options": ["A", "B"], "agent_ref": AGENT}
    payload = verify_payload(stored, sent)
    assert "extracted_answer" not in payload and "reward" not in payload
    assert payload["options"] == ["A", "B"] and payload["response"] == stored["response"]
    assert (payload["deliverables_dir"], payload["reference_ids"]) == ("/out/0", [3])


def test_a_task_input_container_is_unpacked_as_nemo_gym_unpacks_it() -> None:
    sent = {
        "task_id": "t1",
        "agent_ref": AGENT,
        "task_input": {"question": "q", "task_data": {"answer": "4", "question": "q"}},
    }
    payload = verify_payload(rollout(0), sent)
    assert payload == {"agent_ref": AGENT, "question": "q", "answer": "4", "response": rollout(0)["response"]}
    with pytest.raises(ReverifyError, match="question"):
        verify_payload(rollout(0), {"task_input": {"question": "a", "task_data": {"question": "b"}}})


def test_a_row_without_its_materialized_input_is_refused_by_key(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    write_jsonl([rollout(0), rollout(1)], path)
    plan = plan_reverify(path, failed_only=False)
    inputs = tmp_path / "out_materialized_inputs.jsonl"
    with pytest.raises(ReverifyError, match=r"inputs.jsonl: no materialized input for task 1"):
        check_inputs(plan, {(0, 0): {}}, inputs)
    check_inputs(plan, {(0, 0): {}, (1, 0): {}}, inputs)


def test_a_stored_row_without_agent_ref_is_routed_by_its_materialized_input(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    write_jsonl([{k: v for k, v in rollout(0).items() if k != "agent_ref"}], path)
    with pytest.raises(ReverifyError, match="agent_ref"):
        plan_reverify(path, failed_only=False)
    plan = plan_reverify(path, failed_only=False, sent={(0, 0): {"agent_ref": {"name": "b"}}})
    assert plan.items[0].job.agent == "b"


def test_a_row_routed_by_task_source_goes_to_the_agent_its_environment_resolves_to(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    unrouted = {k: v for k, v in rollout(0).items() if k != "agent_ref"}
    write_jsonl([{**unrouted, "task_source": "env"}, {**rollout(1), "task_source": "env"}], path)
    agent = {"responses_api_agents": {"simple_agent": {"resources_server": {"name": "env"}}}}
    routes = task_routes({"env": {"resources_servers": {"env": {}}}, "env_agent": agent})
    plan = plan_reverify(path, failed_only=False, routes=routes)
    assert [i.job.agent for i in plan.items] == ["env_agent", "a"]  # agent_ref wins, as in NeMo Gym
    write_jsonl([{k: v for k, v in rollout(0).items() if k != "agent_ref"}], path)
    plan = plan_reverify(path, failed_only=False, sent={(0, 0): {"task_source": "env"}}, routes=routes)
    assert plan.items[0].job.agent == "env_agent"  # the materialized input's task_source
    write_jsonl([{**unrouted, "task_source": "other"}], path)
    with pytest.raises(ReverifyError, match=r"out\.jsonl:1: task_source 'other': cannot route: not a server"):
        plan_reverify(path, failed_only=False, routes=routes)


def item(old: float | None, verify: bool = True) -> Item:
    return Item(Job("a", 0, 0, rollout(0)), verify, old)


@pytest.mark.parametrize(
    ("old", "new", "verify", "outcome"),
    [
        (1.0, 1.0, True, "unchanged"),
        (0.0, 1.0, True, "raised"),
        (1.0, 0.5, True, "lowered"),
        (1.0, None, True, "newly_failed"),
        (None, 0.0, True, "fixed"),
        (None, None, True, "still_failed"),
        (1.0, 1.0, False, "carried"),
    ],
)
def test_classify(old: float | None, new: float | None, verify: bool, outcome: str) -> None:
    assert classify(item(old, verify), new) == outcome


class FakeClient:
    """Records the calls of a verification; ``verify`` is what ``/verify`` does."""

    def __init__(self, verify: Any) -> None:
        self.calls: list[tuple[str, str, dict[str, str] | None]] = []
        self.verify = verify

    async def call(self, name: str, path: str, payload: Any = None, **kw: Any) -> Any:
        self.calls.append((name, path, kw.get("cookies")))
        if path == "/verify":
            return Reply(self.verify(payload))
        return Reply({}, {"session": "s1"})


class Reply:
    status = 200

    def __init__(self, body: Any, cookies: dict[str, str] | None = None) -> None:
        self.body, self.cookies = body, cookies or {}

    def json(self) -> Any:
        return self.body


def run_item(verify: Any, unseeded: frozenset[str] = frozenset()) -> tuple[Result, FakeClient]:
    """One row through the collection engine, as ``reverify`` runs it."""
    client = FakeClient(verify)
    verifier = Verifier(client, {"a": "env"}, {}, unseeded)  # type: ignore[arg-type]

    async def one() -> list[Result]:
        jobs = [item(1.0).job]
        return [r async for r in collect(jobs, client, Limits(timeout_s=5.0), call=verifier)]  # type: ignore[arg-type]

    (result,) = asyncio.run(one())
    return result, client


def test_a_row_is_seeded_verified_in_its_session_and_released() -> None:
    outcome, client = run_item(lambda payload: {**payload, "reward": 0.0})
    assert outcome.rollout["reward"] == 0.0 and outcome.rollout["_ng_task_index"] == 0
    assert client.calls == [
        ("env", "/seed_session", None),
        ("env", "/verify", {"session": "s1"}),
        ("env", "/end_session", {"session": "s1"}),
    ]


def test_a_forced_server_gets_verify_alone_as_nemo_gyms_reverify_sends_it() -> None:
    """A stateful NeMo Gym server would score a freshly seeded, empty session; NeMo Gym's reverify
    seeds none, so the server answers as it does there (a refusal, or the same reward)."""
    outcome, client = run_item(lambda payload: {**payload, "reward": 1.0}, unseeded=frozenset({"env"}))
    assert outcome.rollout["reward"] == 1.0
    assert client.calls == [("env", "/verify", None)]


def test_a_failed_verify_is_a_failure_of_its_class_and_the_session_is_still_released() -> None:
    def judge_down(payload: Any) -> Any:
        raise ServerCallError("env /verify", "no verdict", status=424, error_class=JUDGE_FAILED)

    outcome, client = run_item(judge_down)
    assert outcome.rollout is None
    assert outcome.failure["error_class"] == JUDGE_FAILED
    assert outcome.failure["row"]["response"] == rollout(0)["response"]  # kept for --failed-only
    assert client.calls[-1][1] == "/end_session"


def test_a_reply_without_reward_is_a_failure_not_an_abort() -> None:
    outcome, _ = run_item(lambda payload: ["not", "a", "result"])
    assert outcome.failure["error_class"] == "ValueError" and "no reward" in outcome.failure["error"]


class ModeClient:
    """``old`` says (NeMo Gym's route) it cannot be reverified, ``quiet`` never said (NeMo Gym's
    default), ``stateless`` can be; ``new`` has no such route."""

    async def call(self, name: str, path: str, payload: Any = None, **kw: Any) -> Any:
        modes = {"old": "unsupported", "quiet": "unknown", "stateless": "stateless"}
        if name in modes:
            return Reply(modes[name])
        raise ServerCallError(f"{name} {path}", "not found", status=404)


def test_servers_that_say_unsupported_or_unknown_need_force_as_in_nemo_gym() -> None:
    servers = ["old", "new", "old", "quiet", "stateless"]
    found = asyncio.run(unsupported_servers(ModeClient(), servers))  # type: ignore[arg-type]
    assert found == ["old", "quiet"]


class HeadClient:
    """A stack's head that serves ``config`` at ``GET /config``."""

    head_url = "http://head"

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    async def request_url(self, method: str, url: str, **kw: Any) -> Any:
        return Reply(self.config)


def test_a_stack_without_agents_routes_every_agent_to_its_one_environment(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """NeMo Gym's gdpval.yaml starts the environment alone; its stored rows name gdpval_stirrup_agent."""
    alone = {
        "gdpval_resources_server": {"resources_servers": {"gdpval": {}}},
        "policy_model": {"responses_api_models": {"scripted_model": {}}},
    }
    routes = asyncio.run(resources_by_agent(HeadClient(alone), {"gdpval_stirrup_agent"}))  # type: ignore[arg-type]
    assert routes == {"gdpval_stirrup_agent": "gdpval_resources_server"}
    assert "routed to its one resources server 'gdpval_resources_server'" in capsys.readouterr().err
    two = {**alone, "other": {"resources_servers": {"x": {}}}}
    assert asyncio.run(resources_by_agent(HeadClient(two), {"a"})) == {}  # type: ignore[arg-type]
    simple = {
        "simple_agent": {"resources_server": {"type": "resources_servers", "name": "gdpval_resources_server"}}
    }
    with_agent = {**alone, "a": {"responses_api_agents": simple}}
    routes = asyncio.run(resources_by_agent(HeadClient(with_agent), {"stale"}))  # type: ignore[arg-type]
    assert routes == {"a": "gdpval_resources_server"}  # agents route their own rows only
