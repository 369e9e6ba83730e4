"""NeMo Gym's side of the wire: its collectors' request bodies and the answer shapes it reads."""

from __future__ import annotations

from typing import Any

import orjson
from omegaconf import OmegaConf
from openai.types.responses import Response

from polygym.net.asgi_transport import asgi_request
from polygym.net.client import ServerClient
from polygym.net.listen import AppServer, bind_socket
from polygym.net.retry import NO_RETRY
from polygym.protocol import STEP_LIMIT, TERMINATION_REASON, VerifyRequest, complete_response
from polygym.servers.resources import ResourcesServer
from polygym.stack.head import Registry, head_app

JSON = [(b"content-type", b"application/json")]


def verified(task: int, rollout: int, reward: float) -> dict[str, Any]:
    usage = {"input_tokens": 10, "output_tokens": 2 + rollout, "total_tokens": 12 + rollout}
    return {
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
        "reward": reward,
        "response": {"output": [], "usage": usage},
    }


ROLLOUTS = [verified(t, r, float(t == r)) for t in range(2) for r in range(2)]


async def post(app: Any, path: str, body: Any) -> tuple[int, Any]:
    status, _, raw = await asgi_request(app, "POST", path, orjson.dumps(body), JSON)
    return status, orjson.loads(raw)


async def test_aggregate_metrics_reads_nemo_gyms_verify_responses_key() -> None:
    server = ResourcesServer("env", {})
    status, nemo = await post(server.app, "/aggregate_metrics", {"verify_responses": ROLLOUTS})
    assert status == 200
    _, ours = await post(server.app, "/aggregate_metrics", {"rollouts": ROLLOUTS})
    assert nemo == ours
    assert nemo["agent_metrics"]["num_rollouts"] == 4
    assert nemo["agent_metrics"]["mean/reward"] == 0.5
    assert {"agent_metrics", "key_metrics", "group_level_metrics", "repeat_level_metrics"} <= set(nemo)


async def test_aggregate_metrics_refuses_both_keys_naming_them() -> None:
    server = ResourcesServer("env", {})
    status, body = await post(server.app, "/aggregate_metrics", {"rollouts": [], "verify_responses": []})
    assert status == 422
    assert "verify_responses" in orjson.dumps(body).decode()


async def test_an_environments_own_metrics_survive_the_nemo_shape() -> None:
    class Custom(ResourcesServer):
        def aggregate_metrics(self, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
            return {"agent_metrics": {"mean/custom": 7.0}}

    status, body = await post(Custom("env", {}).app, "/aggregate_metrics", {"verify_responses": ROLLOUTS})
    assert status == 200
    assert body["agent_metrics"] == {"mean/custom": 7.0}
    assert body["key_metrics"] == {} and body["group_level_metrics"] == []


def test_complete_response_keeps_given_fields_and_fills_the_rest() -> None:
    lean = {"output": [{"type": "message", "content": [{"type": "output_text", "text": "hi"}]}]}
    done = complete_response(lean, {"tools": [{"type": "function", "name": "f"}], "tool_choice": "none"})
    assert done["tools"] == [{"type": "function", "name": "f"}] and done["tool_choice"] == "none"
    assert done["parallel_tool_calls"] is True and done["object"] == "response"
    message = done["output"][0]
    assert message["id"].startswith("msg_") and message["status"] == "completed"
    assert message["content"][0]["annotations"] == []
    assert done["usage"]["input_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 0}
    given = {"id": "resp_1", "usage": {"input_tokens": 3, "input_tokens_details": {"cached_tokens": 2}}}
    kept = complete_response(given)
    assert kept["id"] == "resp_1"
    assert kept["usage"]["input_tokens"] == 3 and kept["usage"]["total_tokens"] == 0
    assert kept["usage"]["input_tokens_details"]["cached_tokens"] == 2


class Scored(ResourcesServer):
    async def verify(self, body: VerifyRequest) -> dict[str, Any]:
        return {**body.model_dump(), "reward": 1.0}


async def test_verify_ends_the_session_and_a_later_end_session_still_succeeds() -> None:
    server = Scored("env", {})
    status, headers, _ = await asgi_request(server.app, "POST", "/seed_session", b"{}", JSON)
    assert status == 200
    cookie = next(v for k, v in headers if k == b"set-cookie").split(b";")[0]
    with_cookie = [*JSON, (b"cookie", cookie)]
    row = {"responses_create_params": {"input": []}, "response": {"output": []}}
    status, _, _ = await asgi_request(server.app, "POST", "/verify", orjson.dumps(row), with_cookie)
    assert status == 200
    assert server.sessions.stats() == {"active": 0, "released": 1, "expired": 0}  # no /end_session
    status, _, body = await asgi_request(server.app, "POST", "/end_session", b"{}", with_cookie)
    assert status == 200 and orjson.loads(body) == {"released": True}
    assert server.sessions.stats()["released"] == 1
    status, _, body = await asgi_request(
        server.app, "POST", "/end_session", b"{}", [*JSON, (b"cookie", b"polygym_session=nope")]
    )
    assert status == 200 and orjson.loads(body) == {"released": False}


async def test_a_nemo_gym_client_resolves_stack_names_from_the_head_without_the_secret() -> None:
    registry = Registry()
    registry.register(
        {
            "name": "policy_model",
            "kind": "responses_api_models",
            "implementation": "vllm_model",
            "url": "http://127.0.0.1:4321",
            "pid": 9,
        }
    )
    public = {
        "policy_model": {"responses_api_models": {"vllm_model": {"api_key": "sk-live-0123456789abcdef"}}}
    }
    server = AppServer(head_app(registry, public, "stack-n", "the-secret"), bind_socket())
    await server.start()
    client = ServerClient(pool_size=2)
    try:
        reply = await client.request_url("GET", f"{server.url}/global_config_dict_yaml", retry=NO_RETRY)
        assert reply.status == 200
        # What NeMo Gym's ServerClient does: JSON-decode the body, parse the text as YAML with OmegaConf,
        # then take the first implementation of the first kind under the server's name.
        config = OmegaConf.create(orjson.loads(reply.body))
        model = next(iter(next(iter(config["policy_model"].values())).values()))
        assert (model.host, model.port) == ("127.0.0.1", 4321)
        assert model.api_key == "****" and b"sk-live" not in reply.body
        assert config["head_server"]["port"] == int(server.url.rsplit(":", 1)[1])
        instances = (await client.request_url("GET", f"{server.url}/server_instances", retry=NO_RETRY)).json()
        assert [(i["process_name"], i["server_type"], i["name"], i["port"], i["pid"]) for i in instances] == [
            ("policy_model", "responses_api_models", "vllm_model", 4321, 9)
        ]
    finally:
        await client.close()
        await server.stop()


def test_an_agents_own_stop_reason_moves_to_metadata_and_the_models_stays() -> None:
    """OpenAI's Response admits only the model's reasons in ``incomplete_details``; an agent's own
    (``max_steps``) would make every NeMo Gym verifier answer 422, so it goes to ``metadata``."""
    cut = complete_response(
        {"status": "incomplete", "incomplete_details": {"reason": STEP_LIMIT}, "metadata": {"a": "b"}}
    )
    assert cut["incomplete_details"] is None
    assert cut["metadata"] == {"a": "b", TERMINATION_REASON: STEP_LIMIT}
    assert Response.model_validate(cut).status == "incomplete"
    model_stop = complete_response(
        {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    )
    assert (
        model_stop["incomplete_details"] == {"reason": "max_output_tokens"} and "metadata" not in model_stop
    )
    Response.model_validate(model_stop)


TYPED_SEED = {
    "resources_session_id": "resources-session-1",
    "episode_id": {"rollout_id": "0-0", "attempt": 0},
    "task_id": {"taskset": "weather", "task_id": "t1"},
    "task_data": {"city": "Paris"},
}


class Seeded(Scored):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[dict[str, Any]] = []

    async def seed_session(self, body: Any, session: Any) -> dict[str, Any]:
        self.seen.append(body.model_dump())
        return {"observation": "ignored by a typed seed"}


async def test_a_typed_seed_from_nemo_gyms_environment_server_gets_its_answer_and_a_cookie() -> None:
    """NeMo Gym 0.7's ``single_agent_turn`` seeds with ``ResourcesSeedSessionRequest`` and reads
    ``ResourcesSeedSessionResponse`` (no other key) plus a cookie; the environment sees the row
    (``task_data``). A repeat gets the same session; another episode under that name, or a seed of
    a closed name, is refused; the close (by name, even without the cookie) releases it."""
    server = Seeded("env", {})
    status, headers, body = await asgi_request(
        server.app, "POST", "/seed_session", orjson.dumps(TYPED_SEED), JSON
    )
    assert status == 200 and orjson.loads(body) == {"resources_session_id": "resources-session-1"}
    assert server.seen == [{"city": "Paris"}]
    cookie = next(v for k, v in headers if k == b"set-cookie").split(b";")[0]
    _, again, _ = await asgi_request(server.app, "POST", "/seed_session", orjson.dumps(TYPED_SEED), JSON)
    assert next(v for k, v in again if k == b"set-cookie").split(b";")[0] == cookie
    assert server.sessions.stats()["active"] == 1 and len(server.seen) == 1
    other = {**TYPED_SEED, "episode_id": {"rollout_id": "0-1", "attempt": 0}}
    status, _ = await post(server.app, "/seed_session", other)
    assert status == 409
    close = {"resources_session_id": "resources-session-1", "episode_id": TYPED_SEED["episode_id"]}
    status, closed = await post(server.app, "/close_session", close)
    assert status == 200 and closed == {"resources_session_id": "resources-session-1"}
    assert server.sessions.stats()["active"] == 0
    status, refused = await post(server.app, "/seed_session", TYPED_SEED)
    assert status == 409 and "already closed" in orjson.dumps(refused).decode()
    status, _ = await post(server.app, "/seed_session", {**TYPED_SEED, "task_data": []})
    assert status == 422


async def test_a_path_under_nemo_gyms_rollout_prefix_is_served_as_its_route() -> None:
    """NeMo Gym's agents call ``/ng-rollout/<id>[/training-token-capture]/v1/responses``."""
    server = Scored("env", {})
    for prefix in ("/ng-rollout/0-0", "/ng-rollout/r.1-a2/training-token-capture"):
        status, body = await post(server.app, f"{prefix}/aggregate_metrics", {"rollouts": ROLLOUTS})
        assert status == 200 and body["agent_metrics"]["num_rollouts"] == 4
    status, _, _ = await asgi_request(server.app, "POST", "/ng-rollout//aggregate_metrics", b"{}", JSON)
    assert status == 404
