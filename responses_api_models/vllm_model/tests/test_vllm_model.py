"""vllm_model: Responses in front of Chat Completions upstreams, on real loopback sockets.

Upstreams are either the scripted model (a real policy, to show the official SDK works end to end
through the conversion) or small Starlette apps in this file that record what they were sent and
answer like vLLM does — including its token-id and log-prob extensions and its context errors.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from polygym import NO_RETRY, TRAINING_TOKEN_FIELDS
from polygym.testing import SESSION_COOKIE, AppServer, Reply, ServerClient, bind_socket, load_config
from responses_api_models.scripted_model.app import ScriptedModel
from responses_api_models.vllm_model.app import (
    VLLMModel,
    context_overflow,
    token_fields,
    upstream_policy_version,
)
from responses_api_models.vllm_model.routing import UpstreamPool
from tests.conftest import WEATHER_RULE, WEATHER_TOOL, sdk_weather_round_trip
from tests.net.fake_upstream import Answer, FakeUpstream, cut_reply, gzip_bomb, reply

CONFIG_FILE = Path(__file__).resolve().parent.parent / "configs" / "vllm_model.yaml"

FAST = {"retry_base_delay_s": 0.001, "retry_max_delay_s": 0.01}

Handler = Callable[[dict[str, Any]], Awaitable[tuple[int, Any]] | tuple[int, Any]]


def completion(
    content: str | None = "ok",
    *,
    finish_reason: str = "stop",
    tool_calls: list[dict[str, Any]] | None = None,
    **message_fields: Any,
) -> dict[str, Any]:
    """A chat completion the way vLLM shapes one."""
    message: dict[str, Any] = {"role": "assistant", "content": content, **message_fields}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "policy-7b",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
    }


@dataclass
class Upstream:
    """A fake Chat Completions server: records every request and answers through ``handler``."""

    name: str = "upstream"
    handler: Handler | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    replies: list[tuple[int, Any]] = field(default_factory=list)
    """Queued (status, body) answers, used before ``handler``."""

    def app(self) -> Starlette:
        async def endpoint(request: Request) -> Response:
            body = json.loads(await request.body())
            self.requests.append(body)
            self.headers.append(dict(request.headers))
            if self.replies:
                status, payload = self.replies.pop(0)
            elif self.handler is not None:
                result = self.handler(body)
                status, payload = await result if asyncio.iscoroutine(result) else result
            else:
                status, payload = 200, completion(f"from {self.name}")
            if isinstance(payload, bytes | str):
                return Response(payload, status_code=status, media_type="text/plain")
            return JSONResponse(payload, status_code=status)

        return Starlette(routes=[Route("/v1/chat/completions", endpoint, methods=["POST"])])


async def start(app: Any) -> AppServer:
    srv = AppServer(app, bind_socket())
    await srv.start()
    return srv


@pytest.fixture
async def servers() -> AsyncIterator[list[AppServer]]:
    """Servers started by a test; all stopped at the end, in reverse order."""
    started: list[AppServer] = []
    yield started
    for srv in reversed(started):
        await srv.stop()


@pytest.fixture
async def raw() -> AsyncIterator[ServerClient]:
    client = ServerClient()
    yield client
    await client.close()


def config(base_url: str | list[str], **extra: Any) -> dict[str, Any]:
    return {"base_url": base_url, "api_key": "sk-test", "model": "policy-7b", **FAST, **extra}


async def serve_upstream(servers: list[AppServer], upstream: Upstream) -> str:
    srv = await start(upstream.app())
    servers.append(srv)
    return srv.url + "/v1"


async def serve_model(servers: list[AppServer], **cfg: Any) -> AppServer:
    srv = await start(VLLMModel("policy_model", cfg).app)
    servers.append(srv)
    return srv


def dead_url() -> str:
    sock = bind_socket()
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/v1"


async def post(
    client: ServerClient, srv: AppServer, path: str, body: dict[str, Any], session: str | None = None
) -> Reply:
    headers = {"cookie": f"{SESSION_COOKIE}={session}"} if session else None
    return await client.request_url("POST", srv.url + path, body, headers=headers, retry=NO_RETRY)


# --------------------------------------------------------------------------- the official SDK


async def test_sdk_responses_and_chat_through_to_scripted_model(servers: list[AppServer]) -> None:
    scripted = await start(ScriptedModel("scripted", {"rules": [WEATHER_RULE]}).app)
    servers.append(scripted)
    proxy = await serve_model(servers, **config(scripted.url + "/v1/"))
    sdk = AsyncOpenAI(base_url=proxy.url + "/v1", api_key="ignored", max_retries=0)
    try:
        first = await sdk_weather_round_trip(sdk)
        assert first.status == "completed" and first.model == "policy-7b"
        assert first.usage is not None and first.usage.input_tokens == 6
        assert [m.id for m in (await sdk.models.list()).data] == ["policy-7b"]
    finally:
        await sdk.close()


async def test_what_is_sent_upstream(servers: list[AppServer]) -> None:
    upstream = Upstream()
    base = await serve_upstream(servers, upstream)
    proxy = await serve_model(
        servers, **config(base, extra_body={"chat_template_kwargs": {"enable_thinking": False}, "top_k": 20})
    )
    sdk = AsyncOpenAI(base_url=proxy.url + "/v1", api_key="caller-key", max_retries=0)
    try:
        response = await sdk.responses.create(
            model="gpt-caller",
            instructions="Be terse.",
            input="hi",
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "name": "get_weather"},
            parallel_tool_calls=False,
            temperature=0.7,
            top_p=0.9,
            max_output_tokens=128,
            store=False,
            extra_body={"seed": 3, "stop": ["\n\n"], "top_k": 5},
        )
        assert response.output_text == "from upstream"
        assert response.temperature == 0.7 and response.instructions == "Be terse."
    finally:
        await sdk.close()
    (sent,) = upstream.requests
    assert upstream.headers[0]["authorization"] == "Bearer sk-test"
    assert sent == {
        "model": "policy-7b",
        "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {k: v for k, v in WEATHER_TOOL.items() if k != "type"}}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False,
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 128,
        "seed": 3,
        "stop": ["\n\n"],
        "top_k": 5,  # the request's own value wins over extra_body
        "chat_template_kwargs": {"enable_thinking": False},
    }


def test_shipped_config_loads_one_or_many_urls() -> None:
    for value, urls in [
        ("http://a:8000/v1", ["http://a:8000/v1"]),
        ("http://a:8000/v1/,http://b:8000/v1", ["http://a:8000/v1", "http://b:8000/v1"]),
        ("[http://a:8000/v1,http://b:8000/v1]", ["http://a:8000/v1", "http://b:8000/v1"]),
    ]:
        stack = load_config(
            [CONFIG_FILE],
            overrides=[f"policy_base_url={value}", "policy_api_key=k", "policy_model_name=Qwen/Qwen3-8B"],
            env_files=[],
        )
        spec = stack.servers["policy_model"]
        assert spec.implementation == "vllm_model"
        server = VLLMModel("policy_model", spec.config)
        assert server.pool.urls == urls
        assert server.model_name == "Qwen/Qwen3-8B"
        assert server.config.return_token_ids is False
    with pytest.raises(ValueError, match="must start with http"):
        VLLMModel("policy_model", config("localhost:8000/v1"))


# ---------------------------------------------------------------------------- sticky routing


async def test_sessions_stick_to_one_upstream_and_spread(servers: list[AppServer], raw: ServerClient) -> None:
    a, b = Upstream("a"), Upstream("b")
    urls = [await serve_upstream(servers, a), await serve_upstream(servers, b)]
    proxy = await serve_model(servers, **config(urls))
    seen: dict[str, set[str]] = {}
    for index in range(40):
        session = f"session-{index}"
        for turn in range(3):
            body = {"input": [{"role": "user", "content": f"task {index % 4}"}] * (turn + 1)}
            reply = await post(raw, proxy, "/v1/responses", body, session)
            assert reply.status == 200, reply.body
            text = reply.json()["output"][0]["content"][0]["text"]
            seen.setdefault(session, set()).add(text)
    assert all(len(upstreams) == 1 for upstreams in seen.values())  # every turn on the same upstream
    per_upstream = [sum(1 for s in seen.values() if s == {f"from {n}"}) for n in ("a", "b")]
    assert min(per_upstream) >= 8, per_upstream  # 40 sessions spread over both (binomial, p=1/2)

    # without a session cookie the conversation's opening is the key: stable over the turns
    # (the growing history does not move it), and different tasks spread
    texts = set()
    for turn in range(3):
        history: list[dict[str, Any]] = [
            {"role": "system", "content": "shared"},
            {"role": "user", "content": "q"},
        ]
        history += [{"role": "assistant", "content": "x"}, {"role": "user", "content": "more"}] * turn
        reply = await post(raw, proxy, "/v1/responses", {"input": history})
        texts.add(reply.json()["output"][0]["content"][0]["text"])
    assert len(texts) == 1
    targets = set()
    for task in range(20):
        body = {"input": [{"role": "system", "content": "shared"}, {"role": "user", "content": f"q{task}"}]}
        targets.add((await post(raw, proxy, "/v1/responses", body)).json()["output"][0]["content"][0]["text"])
    assert targets == {"from a", "from b"}

    # chat pass-through routes the same way
    chat_seen = set()
    for _ in range(3):
        reply = await post(
            raw, proxy, "/v1/chat/completions", {"messages": [{"role": "user", "content": "c"}]}, "s"
        )
        chat_seen.add(reply.json()["choices"][0]["message"]["content"])
    assert len(chat_seen) == 1


async def test_one_upstream_down_the_other_serves(servers: list[AppServer], raw: ServerClient) -> None:
    alive = Upstream("alive")
    down = dead_url()
    proxy_server = VLLMModel("policy_model", config([down, await serve_upstream(servers, alive)]))
    proxy = await start(proxy_server.app)
    servers.append(proxy)
    for index in range(12):
        reply = await post(raw, proxy, "/v1/responses", {"input": "hi"}, f"s{index}")
        assert reply.status == 200, reply.body
        assert reply.json()["output"][0]["content"][0]["text"] == "from alive"
    assert len(alive.requests) == 12
    status = {entry["url"]: entry for entry in proxy_server.pool.status()}
    assert status[down]["down"] is True
    assert status[down]["failures"] == 1  # passed over while cooling down, not retried per call
    health = (await raw.request_url("GET", proxy.url + "/", retry=NO_RETRY)).json()
    assert {u["url"]: u["down"] for u in health["upstreams"]}[down] is True


async def test_all_upstreams_down_is_a_clear_502(servers: list[AppServer], raw: ServerClient) -> None:
    urls = [dead_url(), dead_url()]
    proxy = await serve_model(servers, **config(urls, max_attempts=2))
    reply = await post(raw, proxy, "/v1/responses", {"input": "hi"})
    assert reply.status == 502
    error = reply.json()["error"]
    assert error["type"] == "upstream_unreachable"
    assert "2 round(s)" in error["message"]
    assert all(url in error["message"] for url in urls)


async def test_an_upstream_password_never_shows(
    servers: list[AppServer], raw: ServerClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A base_url with ``user:password@`` is masked in the log, the 502 and ``GET /``, and the
    failure keeps its class (the request provably never arrived)."""
    url = dead_url().replace("http://", "http://policy:hunter2-very-secret@")
    proxy = await serve_model(servers, **config(url, max_attempts=1, api_key=""))
    with caplog.at_level(logging.WARNING, logger="polygym.vllm_model"):
        reply = await post(raw, proxy, "/v1/responses", {"input": "hi"})
    health = await raw.request_url("GET", proxy.url + "/", retry=NO_RETRY)
    assert reply.status == 502 and reply.headers["x-polygym-failure"] == "ConnectionRefused"
    assert "unreachable" in caplog.text and "policy:****@" in caplog.text
    for shown in (caplog.text, reply.body.decode(), health.body.decode()):
        assert "hunter2-very-secret" not in shown


@pytest.mark.parametrize(
    ("answers", "status", "error_class", "requests"),
    [
        ([cut_reply(), reply(200, json.dumps(completion()).encode())], 200, None, 2),
        (
            [reply(429, b"{}", {"Retry-After": "0"}), reply(200, json.dumps(completion()).encode())],
            200,
            None,
            2,
        ),
        ([cut_reply()], 502, "ConnectionReset", 3),
        ([reply(503, b"{}")], 503, "Upstream5xx", 3),
        ([gzip_bomb(8 << 20)], 502, "ResponseTooLarge", 1),
        ([reply(200, b"not json")], 502, "BadJSON", 1),
    ],
    ids=["reset-then-ok", "429-then-ok", "reset", "503", "gzip-bomb", "bad-json"],
)
async def test_upstream_failures_are_retried_within_bounds_and_classed(
    servers: list[AppServer],
    raw: ServerClient,
    answers: list[Answer],
    status: int,
    error_class: str | None,
    requests: int,
) -> None:
    async with FakeUpstream(answers) as upstream:
        cfg = config(upstream.url + "/v1", max_attempts=3, down_cooldown_s=0, max_response_bytes=1 << 20)
        proxy = await serve_model(servers, **cfg)
        reply_ = await post(raw, proxy, "/v1/responses", {"input": "hi"})
    assert reply_.status == status
    assert reply_.headers.get("x-polygym-failure") == error_class
    assert len(upstream.requests) == requests


def test_rendezvous_ranking_is_stable_and_minimal_on_change() -> None:
    urls = [f"http://h{i}:8000/v1" for i in range(4)]
    pool = UpstreamPool(urls)
    keys = [f"k{i}" for i in range(400)]
    first = {key: pool.ranking(key)[0] for key in keys}
    assert first == {key: UpstreamPool(list(reversed(urls))).ranking(key)[0] for key in keys}
    counts = [list(first.values()).count(url) for url in urls]
    assert min(counts) > 60, counts
    smaller = UpstreamPool(urls[:3])
    moved = [key for key in keys if smaller.ranking(key)[0] != first[key]]
    assert all(first[key] == urls[3] for key in moved)  # only the removed upstream's keys move

    now = [0.0]
    pool = UpstreamPool(urls[:2], cooldown_s=5, clock=lambda: now[0])
    ranking = pool.ranking("k")
    pool.mark_down(ranking[0])
    assert pool.pick(ranking, set()) == ranking[1]
    assert pool.pick(ranking, {ranking[1]}) == ranking[0]  # cooling down, but the only one left
    now[0] = 6.0
    assert pool.pick(ranking, set()) == ranking[0]


# ------------------------------------------------------------------------- retries and errors


async def test_transient_statuses_are_retried_then_relayed(
    servers: list[AppServer], raw: ServerClient
) -> None:
    upstream = Upstream()
    upstream.replies += [(429, {"error": {"message": "slow down"}}), (503, "busy")]
    proxy = await serve_model(servers, **config(await serve_upstream(servers, upstream), max_attempts=3))
    reply = await post(raw, proxy, "/v1/responses", {"input": "x"})
    assert reply.status == 200 and len(upstream.requests) == 3

    upstream.requests.clear()
    upstream.replies += [(503, "busy")] * 3
    reply = await post(raw, proxy, "/v1/responses", {"input": "x"})
    assert (reply.status, reply.body) == (503, b"busy")
    assert len(upstream.requests) == 3

    upstream.requests.clear()
    upstream.replies.append((401, {"error": {"message": "bad key"}}))
    reply = await post(raw, proxy, "/v1/responses", {"input": "x"})
    assert reply.status == 401 and b"bad key" in reply.body
    assert len(upstream.requests) == 1


async def test_upstream_timeout_is_a_504(servers: list[AppServer], raw: ServerClient) -> None:
    release = asyncio.Event()

    async def hang(body: dict[str, Any]) -> tuple[int, Any]:
        await release.wait()
        return 200, completion()

    base = await serve_upstream(servers, Upstream(handler=hang))
    proxy = await serve_model(servers, **config(base, timeout_s=0.2))
    started = time.monotonic()
    try:
        reply = await post(raw, proxy, "/v1/responses", {"input": "x"})
    finally:
        release.set()
    assert time.monotonic() - started < 5
    assert reply.status == 504
    assert reply.json()["error"]["type"] == "upstream_timeout"
    assert "0.2s" in reply.json()["error"]["message"]


async def test_stream_and_bad_input_are_refused(servers: list[AppServer], raw: ServerClient) -> None:
    upstream = Upstream()
    proxy = await serve_model(servers, **config(await serve_upstream(servers, upstream)))
    for path, body in [
        ("/v1/responses", {"input": "x", "stream": True}),
        ("/v1/chat/completions", {"messages": [], "stream": True}),
        ("/v1/responses", {"input": [1, 2]}),
        ("/v1/chat/completions", {"messages": "hi"}),
    ]:
        reply = await post(raw, proxy, path, body)
        assert reply.status == 400, (path, body)
    assert upstream.requests == []


# ------------------------------------------------------------------------------ token ids


def vllm_tokens(body: dict[str, Any]) -> tuple[int, Any]:
    """Answers like vLLM with return_token_ids / logprobs / return_tokens_as_token_ids."""
    prompt = list(range(100, 100 + 2 * len(body["messages"])))
    reply = completion("hello there")
    reply["prompt_token_ids"] = prompt if body.get("return_token_ids") else None
    choice = reply["choices"][0]
    if body.get("return_token_ids"):
        choice["token_ids"] = [7, 8, 9]
    if body.get("logprobs") and body.get("top_logprobs") is not None:
        choice["logprobs"] = {
            "content": [
                {"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
                for t, lp in zip([7, 8, 9], [-0.5, -0.25, -0.125], strict=True)
            ]
        }
    return 200, reply


async def test_token_ids_on_the_last_item_and_stripped_from_history(
    servers: list[AppServer], raw: ServerClient
) -> None:
    tool_call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}

    def handler(body: dict[str, Any]) -> tuple[int, Any]:
        status, reply = vllm_tokens(body)
        if len(body["messages"]) == 1:  # first turn: reasoning + text + a call
            reply["choices"][0]["message"].update(reasoning="let me look", tool_calls=[tool_call])
        return status, reply

    upstream = Upstream(handler=handler)
    proxy = await serve_model(
        servers, **config(await serve_upstream(servers, upstream), return_token_ids=True)
    )
    sdk = AsyncOpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
    try:
        first = await sdk.responses.create(model="m", input="weather?", tools=[WEATHER_TOOL])
    finally:
        await sdk.close()
    data = first.model_dump()
    assert [item["type"] for item in data["output"]] == ["reasoning", "message", "function_call"]
    last = data["output"][-1]
    assert last["prompt_token_ids"] == [100, 101]
    assert last["generation_token_ids"] == [7, 8, 9]
    assert last["generation_log_probs"] == [-0.5, -0.25, -0.125]
    assert not any(key in item for item in data["output"][:-1] for key in TRAINING_TOKEN_FIELDS)
    sent = upstream.requests[0]
    assert (sent["return_token_ids"], sent["logprobs"], sent["top_logprobs"]) == (True, True, 0)
    assert sent["return_tokens_as_token_ids"] is True

    # the agent sends the items back (token fields included); the upstream never sees them
    history = [{"role": "user", "content": "weather?"}, *data["output"]]
    history.append({"type": "function_call_output", "call_id": "c1", "output": "sunny"})
    reply = await post(raw, proxy, "/v1/responses", {"input": history, "tools": [WEATHER_TOOL]})
    assert reply.status == 200, reply.body
    messages = upstream.requests[1]["messages"]
    assert not any(key in json.dumps(messages) for key in TRAINING_TOKEN_FIELDS)
    assert messages[1]["reasoning_content"] == messages[1]["reasoning"] == "let me look"
    assert messages[1]["tool_calls"][0]["id"] == "c1"
    assert reply.json()["output"][-1]["prompt_token_ids"] == [100, 101, 102, 103, 104, 105]

    # chat pass-through: token fields in the messages are stripped too
    chat_body = {"messages": [{"role": "user", "content": "q", "prompt_token_ids": [1]}]}
    await post(raw, proxy, "/v1/chat/completions", chat_body)
    assert upstream.requests[-1]["messages"] == [{"role": "user", "content": "q"}]
    assert upstream.requests[-1]["return_token_ids"] is True
    assert upstream.requests[-1]["top_logprobs"] == 0
    await post(raw, proxy, "/v1/chat/completions", {**chat_body, "top_logprobs": 5})
    assert upstream.requests[-1]["top_logprobs"] == 5  # a caller's own choice is kept


async def test_token_capture_per_request_and_fallbacks(servers: list[AppServer], raw: ServerClient) -> None:
    upstream = Upstream(handler=vllm_tokens)
    proxy = await serve_model(servers, **config(await serve_upstream(servers, upstream)))
    reply = await post(raw, proxy, "/v1/responses", {"input": "x"})
    assert not any(key in reply.json()["output"][-1] for key in TRAINING_TOKEN_FIELDS)
    assert "return_token_ids" not in upstream.requests[-1]

    reply = await post(raw, proxy, "/v1/responses", {"input": "x", "return_token_ids": True})
    assert reply.json()["output"][-1]["generation_token_ids"] == [7, 8, 9]
    assert "return_token_ids" in upstream.requests[-1]

    # an older vLLM: no token_ids, but "token_id:<id>" log-prob tokens still give the ids
    _, older = vllm_tokens({"messages": [{}], "return_token_ids": True, "logprobs": True, "top_logprobs": 0})
    del older["choices"][0]["token_ids"]
    assert token_fields(older) == ([100, 101], [7, 8, 9], [-0.5, -0.25, -0.125])

    # a server that ignores the request: a clear 502, not an untrainable rollout
    upstream.replies.append((200, completion("no ids")))
    reply = await post(raw, proxy, "/v1/responses", {"input": "x", "return_token_ids": True})
    assert reply.status == 502
    error = reply.json()["error"]
    assert error["type"] == "upstream_token_ids_missing"
    assert "prompt_token_ids" in error["message"] and "choices[0].token_ids" in error["message"]


def prefix_honouring(body: dict[str, Any]) -> tuple[int, Any]:
    """A backend with the ``required_prefix_token_ids`` extension: its prompt starts with them."""
    status, reply = vllm_tokens(body)
    prefix = body.get("required_prefix_token_ids")
    if prefix is not None:
        reply["prompt_token_ids"] = [*prefix, 50, 51]
    return status, reply


async def test_prefix_token_ids_supplied_from_the_history(
    servers: list[AppServer], raw: ServerClient
) -> None:
    upstream = Upstream(handler=prefix_honouring)
    url = await serve_upstream(servers, upstream)
    proxy = await serve_model(servers, **config(url, return_token_ids=True, supply_prefix_token_ids=True))
    first = (await post(raw, proxy, "/v1/responses", {"input": "weather?"})).json()
    assert "required_prefix_token_ids" not in upstream.requests[0]  # a first turn has no parent
    assert "prompt_continuation" not in first["output"][-1]
    history = [{"role": "user", "content": "weather?"}, *first["output"], {"role": "user", "content": "and?"}]
    second = (await post(raw, proxy, "/v1/responses", {"input": history})).json()
    sent = upstream.requests[1]
    assert sent["required_prefix_token_ids"] == [100, 101, 7, 8, 9]  # turn 0's prompt + generation
    assert not any(key in json.dumps(sent["messages"]) for key in TRAINING_TOKEN_FIELDS)
    assert second["output"][-1]["prompt_token_ids"] == [100, 101, 7, 8, 9, 50, 51]
    assert second["output"][-1]["prompt_continuation"] == {"exact": True}

    # the backend's own fallback is passed on; an assistant item after the ids is not continued
    upstream.replies.append(
        (200, {**vllm_tokens(sent)[1], "prompt_continuation": {"exact": False, "reason": "no clean suffix"}})
    )
    fell_back = (await post(raw, proxy, "/v1/responses", {"input": history})).json()
    assert fell_back["output"][-1]["prompt_continuation"] == {"exact": False, "reason": "no clean suffix"}
    prefilled = [*history, {"role": "assistant", "content": "prefilled"}]
    reply = (await post(raw, proxy, "/v1/responses", {"input": prefilled})).json()
    assert "required_prefix_token_ids" not in upstream.requests[-1]
    assert reply["output"][-1]["prompt_continuation"] == {
        "exact": False,
        "reason": "assistant items follow the last generated turn",
    }

    # stock vLLM ignores the field: a 502 naming the fix, not a silently re-rendered history
    plain = await serve_model(
        servers,
        **config(
            await serve_upstream(servers, Upstream(handler=vllm_tokens)),
            return_token_ids=True,
            supply_prefix_token_ids=True,
        ),
    )
    reply_raw = await post(raw, plain, "/v1/responses", {"input": history})
    assert reply_raw.status == 502
    assert reply_raw.json()["error"]["type"] == "upstream_prefix_ignored"
    assert "supply_prefix_token_ids: false" in reply_raw.json()["error"]["message"]


def test_a_stated_policy_version_is_kept_and_a_bad_one_ignored() -> None:
    from polygym.models import POLICY_VERSION_FIELD, attach_token_fields, strip_token_fields

    assert upstream_policy_version({"policy_version": 3}) == 3
    for junk in (True, -1, "3", 2.5, None):
        assert upstream_policy_version({"policy_version": junk}) is None
    output: list[dict[str, Any]] = [{"type": "message"}]
    attach_token_fields(
        output, [1], [2], [-0.1], None, policy_version=upstream_policy_version({"policy_version": 3})
    )
    assert output[0][POLICY_VERSION_FIELD] == 3
    assert POLICY_VERSION_FIELD not in strip_token_fields(output)[0]  # never sent back upstream


# --------------------------------------------------------------------------- context length

VLLM_MAX_TOKENS_TOO_LARGE = (
    "'max_tokens' or 'max_completion_tokens' is too large: 500. This model's maximum context length "
    "is 1024 tokens and your request has 900 input tokens (500 > 1024 - 900)."
)
VLLM_PROMPT_TOO_LONG = (
    "This model's maximum context length is 1024 tokens. However, your request has 1500 input "
    "tokens. Please reduce the length of the input messages."
)


def bad_request(message: str) -> tuple[int, Any]:
    return 400, {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}


async def test_context_length_errors_become_incomplete_responses(servers: list[AppServer]) -> None:
    upstream = Upstream()
    proxy = await serve_model(servers, **config(await serve_upstream(servers, upstream)))
    sdk = AsyncOpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
    try:
        # max_tokens too large for what is left: retried once with the room the error reports
        upstream.replies.append(bad_request(VLLM_MAX_TOKENS_TOO_LARGE))
        response = await sdk.responses.create(model="m", input="x", max_output_tokens=500)
        assert response.status == "completed" and response.output_text == "from upstream"
        assert [r["max_tokens"] for r in upstream.requests] == [500, 124]

        # the prompt itself does not fit: an incomplete response, no retry
        upstream.requests.clear()
        upstream.replies.append(bad_request(VLLM_PROMPT_TOO_LONG))
        response = await sdk.responses.create(model="m", input="x", max_output_tokens=500)
        assert response.status == "incomplete"
        assert response.output == []
        details = response.model_dump()["incomplete_details"]
        assert details["reason"] == "max_output_tokens"
        assert details["detail"] == "context_length_exceeded"
        assert "maximum context length is 1024" in details["message"]
        assert len(upstream.requests) == 1

        # generation cut off by the limit
        upstream.replies.append((200, completion("<think>a long thought", finish_reason="length")))
        response = await sdk.responses.create(model="m", input="x")
        assert response.status == "incomplete"
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
        assert [item.type for item in response.output] == ["reasoning"]
    finally:
        await sdk.close()


def test_context_error_shapes_of_other_servers() -> None:
    def reply(status: int, body: Any) -> Reply:
        return Reply(status, json.dumps(body).encode())

    sglang = {
        "object": "error",
        "message": "Requested token count exceeds the model's maximum context length of 4096 tokens. "
        "You requested a total of 5000 tokens: 1000 tokens from the input messages and 4000 tokens "
        "for the completion.",
    }
    llama_cpp = {
        "error": {
            "code": 400,
            "message": "the request exceeds the available context size, try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 5000,
            "n_ctx": 4096,
        }
    }
    openai_style = {"error": {"message": "too long", "code": "context_length_exceeded"}}
    old_vllm = {
        "message": "The decoder prompt (length 5000) is longer than the maximum model length of 4096."
    }
    assert context_overflow(reply(400, sglang))[1:] == (4096, 1000)
    assert context_overflow(reply(400, llama_cpp))[1:] == (4096, 5000)
    assert context_overflow(reply(400, openai_style))[1:] == (None, None)
    assert context_overflow(reply(400, old_vllm))[1:] == (4096, 5000)
    assert context_overflow(reply(400, {"message": "max_tokens must be at least 1"})) is None
    assert context_overflow(reply(500, sglang)) is None


# ------------------------------------------------------------------------------- reasoning


async def test_reasoning_extraction_and_replay(servers: list[AppServer], raw: ServerClient) -> None:
    upstream = Upstream()
    base = await serve_upstream(servers, upstream)
    proxy = await serve_model(servers, **config(base))

    async def ask(reply: dict[str, Any], srv: AppServer = proxy) -> dict[str, Any]:
        upstream.replies.append((200, reply))
        result = await post(raw, srv, "/v1/responses", {"input": "q"})
        assert result.status == 200, result.body
        return result.json()

    def summary(response: dict[str, Any]) -> list[tuple[str, str]]:
        return [
            (
                item["type"],
                item["summary"][0]["text"] if item["type"] == "reasoning" else item["content"][0]["text"],
            )
            for item in response["output"]
        ]

    assert summary(await ask(completion("<think>\nplan it\n</think>\n\nAnswer."))) == [
        ("reasoning", "plan it"),
        ("message", "Answer."),
    ]
    # the chat template opened the block in the prompt: the reply starts inside it
    assert summary(await ask(completion("plan it</think>Answer."))) == [
        ("reasoning", "plan it"),
        ("message", "Answer."),
    ]
    assert summary(await ask(completion("Answer.", reasoning_content="field"))) == [
        ("reasoning", "field"),
        ("message", "Answer."),
    ]
    assert summary(await ask(completion("Answer.", reasoning="newer field"))) == [
        ("reasoning", "newer field"),
        ("message", "Answer."),
    ]

    # replay styles for a history holding a reasoning item
    history = {
        "input": [
            {"role": "user", "content": "q"},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "thought"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A."}]},
            {"role": "user", "content": "and?"},
        ]
    }
    expected = {
        "both": {
            "role": "assistant",
            "content": "A.",
            "reasoning_content": "thought",
            "reasoning": "thought",
        },
        "reasoning_content": {"role": "assistant", "content": "A.", "reasoning_content": "thought"},
        "drop": {"role": "assistant", "content": "A."},
        "think_tags": {"role": "assistant", "content": "<think>\nthought\n</think>\n\nA."},
    }
    for mode, assistant in expected.items():
        srv = await serve_model(servers, **config(base, reasoning_history=mode, parse_think_tags=False))
        await post(raw, srv, "/v1/responses", history)
        assert upstream.requests[-1]["messages"][1] == assistant, mode

    # parse_think_tags off keeps the content as written; reasoning_output=content uses reasoning_text
    srv = await serve_model(servers, **config(base, parse_think_tags=False, reasoning_output="content"))
    kept = await ask(completion("<think>x</think>y"), srv)
    assert [i["type"] for i in kept["output"]] == ["message"]
    assert kept["output"][0]["content"][0]["text"] == "<think>x</think>y"
    raw_thought = await ask(completion("y", reasoning_content="x"), srv)
    assert raw_thought["output"][0]["content"] == [{"type": "reasoning_text", "text": "x"}]
    assert raw_thought["output"][0]["summary"] == []
