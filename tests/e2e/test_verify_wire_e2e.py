"""End to end: what a polygym agent POSTs to ``/verify`` is a complete OpenAI Response.

NeMo Gym's verifiers validate the verify body's ``response`` as an OpenAI ``Response`` (its
``NeMoGymResponse`` subclass, which also admits ``function_call_output`` items); anything less is
a 422 from every one of them. The resources server echoes the request it verified, so the
``/run`` result shows exactly what the agent sent over the socket.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from omegaconf import OmegaConf
from openai.types.responses import Response
from openai.types.responses.response_function_tool_call_output_item import (
    ResponseFunctionToolCallOutputItem,
)

from polygym.net.client import ServerClient
from polygym.protocol import STEP_LIMIT, TERMINATION_REASON
from polygym.stack.catalog import selector_paths
from polygym.stack.config import load_config
from polygym.stack.launcher import Stack
from tests.e2e.test_stack_e2e import example_rows

pytestmark = pytest.mark.e2e

ENVS = ("example_single_tool_call", "example_multi_step")


def assert_openai_response(response: dict[str, Any]) -> None:
    """Validate as OpenAI does; tool outputs (outside OpenAI's output union) item by item."""
    outputs = [i for i in response["output"] if i.get("type") == "function_call_output"]
    for item in outputs:
        ResponseFunctionToolCallOutputItem.model_validate(item)
    rest = [i for i in response["output"] if i.get("type") != "function_call_output"]
    parsed = Response.model_validate({**response, "output": rest})
    assert parsed.usage is not None
    assert parsed.usage.input_tokens_details.cached_tokens == 0
    assert parsed.usage.output_tokens_details.reasoning_tokens == 0


async def test_agent_sends_complete_openai_response_to_verify() -> None:
    config = load_config(selector_paths(list(ENVS), ["scripted_model"], []), env_files=[])
    stack = Stack(config, backend="inline", head_port=0, record=False)
    await stack.start()
    client = ServerClient(stack.head_url)
    try:
        reply = await client.request_url("GET", f"{stack.head_url}/global_config_dict_yaml")
        nemo_config = OmegaConf.create(orjson.loads(reply.body))
        for name in (*ENVS, "policy_model"):
            server = next(iter(next(iter(nemo_config[name].values())).values()))
            health = await client.request_url("GET", f"http://{server.host}:{server.port}/")
            assert health.status == 200, name
        for env in ENVS:
            row = example_rows(env)[0]
            result = (await client.call(f"{env}_simple_agent", "/run", row)).json()
            assert result["reward"] == 1.0, result
            response = result["response"]
            assert_openai_response(response)
            assert response["tools"] == row["responses_create_params"].get("tools", [])
            assert {i["type"] for i in response["output"]} >= {"function_call", "message"}
            body = {"verify_responses": [{**result, "_ng_task_index": 0, "_ng_rollout_index": 0}]}
            metrics = (await client.call(f"{env}_simple_agent", "/aggregate_metrics", body)).json()
            assert metrics["agent_metrics"]["num_rollouts"] == 1
            assert metrics["agent_metrics"]["mean/reward"] == 1.0
    finally:
        await client.close()
        await stack.stop()


async def test_an_agent_out_of_steps_still_sends_a_valid_response() -> None:
    """At its step limit the agent says so in ``metadata``, not in ``incomplete_details`` (whose
    reasons OpenAI's Response, hence every NeMo Gym verifier, restricts to the model's own)."""
    env = "example_single_tool_call"
    limit = f"{env}_simple_agent.responses_api_agents.simple_agent.max_steps=1"
    config = load_config(selector_paths([env], ["scripted_model"], []), [limit], env_files=[])
    stack = Stack(config, backend="inline", head_port=0, record=False)
    await stack.start()
    client = ServerClient(stack.head_url)
    try:
        result = (await client.call(f"{env}_simple_agent", "/run", example_rows(env)[0])).json()
    finally:
        await client.close()
        await stack.stop()
    response = result["response"]
    assert response["status"] == "incomplete"
    assert response["metadata"] == {TERMINATION_REASON: STEP_LIMIT}
    assert response.get("incomplete_details") is None
    assert_openai_response(response)
