"""An environment's tools over MCP (streamable HTTP), mounted at ``/mcp`` on the server's own app.

``expose_tools_over_mcp: true`` in a resources server's config lets any MCP client (an agent
framework, an IDE, the ``mcp`` package's ``streamablehttp_client`` + ``ClientSession``) list and
call the environment's ``@tool`` methods. The ``mcp`` package is imported only then, so the core
stays slim (``pip install 'polygym[mcp]'``).

**One MCP session is one rollout session.** Each MCP session holds exactly one environment
``Session`` for its whole life and releases it when the MCP session ends: the client's ``DELETE``
(closing ``streamablehttp_client``), the MCP idle time-out (the environment's
``session_idle_timeout_s``), or the server stopping. Which session it holds is decided by the
``initialize`` request:

* with a ``polygym_session`` cookie — the rollout a harness seeded with ``POST /seed_session``,
  exactly as NeMo Gym agents do — the MCP session adopts that rollout, so a harness seeds from the
  dataset row, lets the model act through MCP, and calls ``POST /verify`` with the same cookie
  before it closes the MCP session;
* without one, the MCP session gets a fresh, unseeded session (what a cookie-less HTTP tool call
  gets), for plain tool use.

Why not a ``seed_session`` (or ``verify``) MCP tool: an MCP client shows the model every listed
tool, and a policy under RL would learn to reseed its own rollout (an easier start, a reset
counter) or to ask for its reward. Seeding stays on the HTTP route, with the same request model
and checks as for every agent, and the MCP tool list is the environment's tools, nothing more.
An unknown or expired cookie is refused at ``initialize`` (409), and one rollout cannot be held
by two MCP sessions at once (409), since the first to end would release it under the other.

**Same tools, same results.** Tools are listed with the names, descriptions and parameter
schemas of ``GET /tools``. A call goes through the very endpoint that serves ``POST /<tool>``
(``BaseServer.dispatch``: pydantic validation, error bodies, session lookup), and its result is
that route's JSON body as text (plus ``structuredContent`` when it is an object); a status of 400
or more is an MCP tool error (``isError``) with the route's error body. The MCP library's own
JSON-schema check is off, so bad arguments get the environment's 422 message, as over HTTP.

**No new hole.** The mount sits behind the same ``InboundGuard`` as every route (bounded body,
work cancelled when the caller leaves, no foreign Host or Origin) and the MCP transport's own body
limit is set to the same bound. MCP sessions are bounded too: each holds a task and its streams
until the client ends it or it idles out (``session_idle_timeout_s``, 15 minutes by default), so a
client opening sessions in a loop would hold thousands; past ``max_mcp_sessions`` open at once, a
new one is refused with 503 until one ends. Like the other routes of an environment it has no
credential of its own: the stack secret guards only the head registry's writes
(docs/security.md), and a session id is a 128-bit secret.
Tool names are looked up among the environment's ``@tool`` methods only, so ``/verify`` or
``/seed_session`` can never be reached as an MCP tool.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

import orjson
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.requests import Request
from starlette.routing import Route

from polygym.net.asgi_transport import Handoff, Receive, Scope, Send
from polygym.net.body_limit import DEFAULT_MAX_BODY_BYTES
from polygym.servers.base import error_response
from polygym.servers.sessions import SESSION_COOKIE, SessionStore


class _McpConfig(Protocol):
    session_idle_timeout_s: float
    max_mcp_sessions: int


class ToolHost(Protocol):
    """What the bridge needs of an environment (a ``ResourcesServer``), named here rather than
    imported: ``servers.resources`` builds the bridge, so importing it back would make a loop."""

    name: str
    sessions: SessionStore

    @property
    def config(self) -> _McpConfig: ...

    def tools(self) -> Mapping[str, Any]: ...

    def tool_schemas(self) -> list[dict[str, Any]]: ...

    async def dispatch(
        self, method: str, path: str, body: bytes, cookies: dict[str, str]
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes] | Handoff | None: ...


MOUNT_PATH = "/mcp"

# The rollout session the opening (initialize) request adopts, handed from the request's task to
# the MCP session's task, which the session manager starts from it (tasks copy the context).
_adopted: contextvars.ContextVar[str | None] = contextvars.ContextVar("polygym_mcp_adopted", default=None)


class McpBridge:
    """The MCP server of one environment: its tools, its session mapping, its ``/mcp`` mount."""

    def __init__(self, env: ToolHost) -> None:
        self.env = env
        self._tool_names = frozenset(env.tools())
        self.server: Server[dict[str, str], Request] = Server(env.name, lifespan=self._mcp_session)
        self.server.list_tools()(self._list_tools)
        self.server.call_tool(validate_input=False)(self._call_tool)
        self._manager: StreamableHTTPSessionManager | None = None
        self._running: contextlib.AsyncExitStack | None = None
        self._held: set[str] = set()
        """Environment sessions held by a live MCP session."""
        self._opening = 0
        """Requests that may open an MCP session, being served (not yet in ``_held``)."""

    def route(self) -> Route:
        """``/mcp`` exactly (a Mount would redirect it to ``/mcp/``); the bridge is its ASGI app."""
        return Route(MOUNT_PATH, endpoint=self)

    async def start(self) -> None:
        """Run a session manager for this lifespan (a manager runs once, so a fresh one each time)."""
        self._manager = StreamableHTTPSessionManager(
            self.server,
            session_idle_timeout=self.env.config.session_idle_timeout_s,
            max_request_body_size=DEFAULT_MAX_BODY_BYTES,
        )
        self._running = contextlib.AsyncExitStack()
        await self._running.enter_async_context(self._manager.run())

    async def stop(self) -> None:
        """End every MCP session (each releases its rollout session) and the manager."""
        if self._running is not None:
            await self._running.aclose()
        self._running = self._manager = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._manager is None:
            await error_response(503, "not_started", "the MCP endpoint is not running")(scope, receive, send)
            return
        request = Request(scope)
        if MCP_SESSION_ID_HEADER in request.headers:
            await self._manager.handle_request(scope, receive, send)
            return
        limit = self.env.config.max_mcp_sessions
        if len(self._held) + self._opening >= limit:
            message = f"{limit} MCP sessions are open (max_mcp_sessions); end one or wait for one to idle out"
            await error_response(503, "too_many_sessions", message)(scope, receive, send)
            return
        session_id = request.cookies.get(SESSION_COOKIE)
        refusal = self._refuse_adoption(session_id) if session_id is not None else None
        if refusal is not None:
            await error_response(409, "unknown_session", refusal)(scope, receive, send)
            return
        _adopted.set(session_id)
        self._opening += 1
        try:
            await self._manager.handle_request(scope, receive, send)
        finally:
            self._opening -= 1

    def _refuse_adoption(self, session_id: str) -> str | None:
        """Why the rollout named by an initialize request's cookie cannot be adopted, or None."""
        if session_id in self._held:
            return f"session '{session_id}' is already held by another MCP session"
        if self.env.sessions.get(session_id) is None:
            return (
                f"unknown or expired session '{session_id}'; seed one with POST /seed_session, "
                "or open the MCP session without the cookie for a fresh one"
            )
        return None

    @contextlib.asynccontextmanager
    async def _mcp_session(self, server: Server[Any, Any]) -> AsyncIterator[dict[str, str]]:
        """The life of one MCP session: hold its rollout session, release it however it ends."""
        session_id = _adopted.get() or self.env.sessions.create().id
        self._held.add(session_id)
        try:
            yield {"session_id": session_id}
        finally:
            self._held.discard(session_id)
            self.env.sessions.release(session_id)

    async def _list_tools(self) -> list[types.Tool]:
        return [
            types.Tool(
                name=schema["name"], description=schema["description"], inputSchema=schema["parameters"]
            )
            for schema in self.env.tool_schemas()
        ]

    async def _call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Serve the call through ``POST /<name>``'s own endpoint, in the MCP session's rollout."""
        if name not in self._tool_names:
            unknown = {"error": {"type": "unknown_tool", "message": f"no tool named {name!r}"}}
            return _result(orjson.dumps(unknown).decode(), 404)
        session_id = self.server.request_context.lifespan_context["session_id"]
        served = await self.env.dispatch(
            "POST", f"/{name}", orjson.dumps(arguments), {SESSION_COOKIE: session_id}
        )
        assert served is not None, "a tool route is always a JSON endpoint"
        if isinstance(served, Handoff):
            return _result(orjson.dumps(served.value).decode(), 200)
        status, _, body = served
        return _result(body.decode(), status)


def _result(text: str, status: int) -> types.CallToolResult:
    """An HTTP tool answer as an MCP tool result: the body as text, an object also structured."""
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:
        parsed = None
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structuredContent=parsed if isinstance(parsed, dict) else None,
        isError=status >= 400,
    )
