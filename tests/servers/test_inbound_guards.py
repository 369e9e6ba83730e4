"""What a web page, or a client that lies about its body, gets from every server of a stack.

Raw HTTP over a socket, so the test controls each header exactly (``Host``, ``Origin``,
``Content-Type``, ``Content-Length``) as a browser or a hostile local process would send them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httpx
import openai
import orjson
import pytest

from polygym.net.client import ServerClient
from polygym.net.listen import AppServer, bind_socket
from polygym.servers.cross_site import ALLOWED_HOSTS_ENV, CrossSitePolicy
from polygym.servers.inbound import (
    DEFAULT_MAX_PROMPT_BODY_BYTES,
    MAX_PARSED_RATIO,
    InboundGuard,
    could_amplify,
    parsed_size_estimate,
)
from polygym.stack.catalog import selector_paths
from polygym.stack.config import load_config
from polygym.stack.launcher import Stack
from polygym.view.app import create_app

ENV = "example_single_tool_call"
AGENT = f"{ENV}_simple_agent"
MODEL = "policy_model"
READ_TIMEOUT_S = 20.0
JSON = {"Content-Type": "application/json"}


async def raw_request(
    url: str, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b""
) -> tuple[int, bytes]:
    """One request on its own connection, exactly these headers (Host defaults to the URL's)."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    headers = {
        "Host": parts.netloc,
        "Content-Length": str(len(body)),
        "Connection": "close",
        **(headers or {}),
    }
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        head = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
        writer.write("\r\n".join(head).encode("latin-1") + body)
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), READ_TIMEOUT_S)
    finally:
        writer.close()
    status_line, _, rest = reply.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    config = load_config(selector_paths([ENV], ["scripted_model"], []), env_files=[])
    running = Stack(config, backend="inline", head_port=0, record=False)
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


def targets(stack: Stack) -> dict[str, tuple[str, str]]:
    """Every server of the stack: its URL and a JSON route of its own."""
    urls = {entry["name"]: entry["url"] for entry in stack.servers()}
    return {
        "head": (stack.head_url, "/register"),
        "model": (urls[MODEL], "/v1/responses"),
        "agent": (urls[AGENT], "/run"),
        "resources": (urls[ENV], "/seed_session"),
    }


@pytest.mark.e2e
async def test_a_foreign_host_is_refused_by_every_server_and_loopback_names_are_served(stack: Stack) -> None:
    for name, (url, route) in targets(stack).items():
        port = urlsplit(url).port
        for host in ("attacker.example", f"attacker.example:{port}", f"rebind.127.0.0.1.nip.io:{port}"):
            for method, path in (("GET", "/"), ("POST", route)):
                status, body = await raw_request(url, method, path, {"Host": host, **JSON}, b"{}")
                assert (status, b"misdirected_request" in body) == (421, True), (name, host, path)
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"127.5.6.7:{port}"):
            assert (await raw_request(url, "GET", "/", {"Host": host}))[0] == 200, (name, host)


@pytest.mark.e2e
async def test_non_json_bodies_are_refused_with_415_on_every_json_route(stack: Stack) -> None:
    kinds = [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ]
    for name, (url, route) in targets(stack).items():
        for content_type in kinds:
            status, body = await raw_request(url, "POST", route, {"Content-Type": content_type}, b"{}")
            assert (status, b"unsupported_media_type" in body) == (415, True), (name, content_type)


@pytest.mark.e2e
async def test_a_foreign_origin_is_refused_and_the_servers_own_origin_served(stack: Stack) -> None:
    for name, (url, route) in targets(stack).items():
        for origin in ("https://attacker.example", "null", "http://127.0.0.1:1"):
            status, body = await raw_request(url, "POST", route, {"Origin": origin, **JSON}, b"{}")
            assert (status, b"foreign_origin" in body) == (403, True), (name, origin)
        status, _ = await raw_request(url, "GET", "/", {"Origin": url})
        assert status == 200, name


@pytest.mark.e2e
async def test_json_from_every_client_library_is_served(stack: Stack) -> None:
    """polygym's client, aiohttp, httpx and the OpenAI SDK (NeMo Gym's client is aiohttp with an
    explicit ``Content-Type: application/json``) all pass the guard."""
    urls = {entry["name"]: entry["url"] for entry in stack.servers()}
    seed = urls[ENV] + "/seed_session"
    request = {"input": "What is the weather in Paris?", "model": "scripted"}
    client = ServerClient()
    try:
        assert (await client.request_url("POST", seed, {})).status == 200
    finally:
        await client.close()
    async with aiohttp.ClientSession() as session:
        async with session.post(seed, json={}) as reply:
            assert reply.status == 200
        async with session.post(seed, data=orjson.dumps({}), headers=JSON) as reply:  # NeMo Gym's way
            assert reply.status == 200
        async with session.post(seed, data=b"{}") as reply:  # bytes with no type of their own
            assert reply.status == 200
    async with httpx.AsyncClient() as http:
        assert (await http.post(seed, json={})).status_code == 200
    sdk = openai.AsyncOpenAI(base_url=urls[MODEL] + "/v1", api_key="none", max_retries=0)
    try:
        response = await sdk.responses.create(input=request["input"], model=request["model"])
        assert response.output
    finally:
        await sdk.close()
    status, _ = await raw_request(urls[MODEL], "POST", "/v1/responses", JSON, orjson.dumps(request))
    assert status == 200


async def test_a_configured_host_name_is_served(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOWED_HOSTS_ENV, "gym.internal, Other.Example.")
    app = InboundGuard(_ok)
    server = AppServer(app, bind_socket("127.0.0.1", 0))
    await server.start()
    try:
        for host in ("gym.internal", "gym.internal:80", "other.example"):
            assert (await raw_request(server.url, "GET", "/", {"Host": host}))[0] == 200, host
        assert (await raw_request(server.url, "GET", "/", {"Host": "third.example"}))[0] == 421
    finally:
        await server.stop()


async def test_the_viewer_refuses_a_foreign_host_and_origin() -> None:
    server = AppServer(create_app([]), bind_socket("127.0.0.1", 0))
    await server.start()
    try:
        assert (await raw_request(server.url, "GET", "/"))[0] == 303
        assert (await raw_request(server.url, "GET", "/", {"Host": "attacker.example"}))[0] == 421
        assert (await raw_request(server.url, "GET", "/", {"Origin": "http://attacker.example"}))[0] == 403
    finally:
        await server.stop()


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    """200 to every request (the guard's verdict is what is tested); lifespan acknowledged."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


def test_the_policy_reads_host_names_without_port_brackets_or_final_dot() -> None:
    policy = CrossSitePolicy.from_env({ALLOWED_HOSTS_ENV: "A.example:8080,[fd00::1]"})
    assert policy.hosts == frozenset({"a.example", "fd00::1"})
    scope = {
        "type": "http",
        "method": "GET",
        "server": ("10.1.2.3", 80),
        "headers": [(b"host", b"10.1.2.3:80")],
    }
    assert policy.refusal(scope) is None  # the address the connection arrived at
    scope["headers"] = [(b"host", b"10.1.2.4:80")]
    refusal = policy.refusal(scope)
    assert refusal is not None and refusal.status == 421


# --- M3: what a body may become -------------------------------------------------------------


def test_the_parse_estimate_bounds_the_real_size_and_refuses_only_amplifying_shapes() -> None:
    """The estimate is an upper bound of tracemalloc's count for each shape, and the limit
    separates the amplifying shapes from the densest legitimate ones."""
    import tracemalloc

    n = 20_000
    shapes = {
        "empty objects": (b"[" + b",".join([b"{}"] * n) + b"]", True),
        "empty lists": (b"[" + b",".join([b"[]"] * n) + b"]", True),
        "one-key objects": (b"[" + b",".join([b'{"a":1}'] * n) + b"]", True),
        "token ids": (orjson.dumps(list(range(1000, 1000 + n))), False),
        "small ints": (orjson.dumps([i % 2 for i in range(n)]), False),
        "log probs": (orjson.dumps([-0.1234 - i / n for i in range(n)]), False),
        "messages": (orjson.dumps([{"role": "user", "content": "hi, what is 2+2? " * 4}] * (n // 10)), False),
    }
    for name, (body, amplifies) in shapes.items():
        tracemalloc.start()
        parsed = orjson.loads(body)
        real, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del parsed
        estimate = parsed_size_estimate(body)
        assert estimate >= real, name
        assert (estimate > MAX_PARSED_RATIO * len(body)) == amplifies, name
        assert could_amplify(body * 20) == amplifies, name  # past the 1 MiB of slack
    assert not could_amplify(b"{" * 6000)  # too short to matter, not scanned


async def test_a_body_of_small_objects_is_refused_before_it_is_parsed() -> None:
    parsed: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            parsed.append(len(orjson.loads((await receive())["body"])))
        await _ok(scope, receive, send)

    guard = InboundGuard(app)
    server = AppServer(guard, bind_socket("127.0.0.1", 0))
    await server.start()
    try:
        bomb = b"[" + b",".join([b"{}"] * 1_000_000) + b"]"  # 3 MB; would parse to 72 MB
        status, body = await raw_request(server.url, "POST", "/verify", JSON, bomb)
        assert (status, b"request_too_complex" in body) == (413, True)
        rows = orjson.dumps([{"role": "user", "content": "x" * 100}] * 20_000)  # 2.5 MB of real rows
        assert (await raw_request(server.url, "POST", "/verify", JSON, rows))[0] == 200
        assert parsed == [20_000]
    finally:
        await server.stop()


async def test_prompt_routes_take_a_smaller_body_than_the_rest() -> None:
    server = AppServer(InboundGuard(_ok), bind_socket("127.0.0.1", 0))
    await server.start()
    try:
        over = {"Content-Length": str(DEFAULT_MAX_PROMPT_BODY_BYTES + 1), **JSON}
        for path in ("/v1/responses", "/v1/chat/completions", "/v1/messages", "/run"):
            status, body = await _declared_only(server.url, path, over)
            assert (status, b"request_too_large" in body) == (413, True), path
    finally:
        await server.stop()


async def _declared_only(url: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """A request that declares a body and sends 10 bytes of it, then waits for the answer."""
    return await raw_request(url, "POST", path, headers, b"[" * 10)


async def test_a_body_that_does_not_arrive_in_time_is_answered_408() -> None:
    """A client declaring 200 MB and sending 10 bytes no longer holds the request for ever."""
    server = AppServer(InboundGuard(_ok, body_read_timeout_s=0.5), bind_socket("127.0.0.1", 0))
    await server.start()
    try:
        headers = {"Content-Length": str(200 * 1024 * 1024), **JSON}
        status, body = await _declared_only(server.url, "/verify", headers)
        assert (status, b"request_timeout" in body) == (408, True)
    finally:
        await server.stop()
