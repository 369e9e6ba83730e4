"""Base class for environments (resources servers): tools, per-rollout sessions, a verifier.

An environment author writes typed async methods and a ``verify``; everything else — routes,
validation with clear 422s, session cookies, release and expiry, tool schemas, liveness and
aggregate metrics — comes from here::

    class Weather(ResourcesServer):
        @tool
        async def get_weather(self, body: GetWeatherRequest) -> GetWeatherResponse:
            "Current weather for a city."
            ...

        async def verify(self, body: WeatherVerifyRequest, session: Session) -> VerifyResponse:
            ...

A tool or ``verify`` that declares a ``session`` parameter receives the rollout's ``Session``;
calls without a session cookie get a fresh session (released at once after a cookie-less verify).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from polygym import metrics
from polygym.kinds import RESOURCES_KIND
from polygym.protocol import AggregateMetricsRequest, SeedSessionRequest, VerifyRequest
from polygym.servers.base import (
    BaseServer,
    HTTPError,
    ServerConfig,
    SetCookies,
    body_model,
    json_endpoint,
    json_response,
    validation_message,
    with_cookies,
)
from polygym.servers.cpu_pool import CpuPool
from polygym.servers.episode_sessions import EpisodeSessions, TypedSeed, typed_seed
from polygym.servers.extras import require_extra
from polygym.servers.sessions import SESSION_COOKIE, Session, SessionStore

if TYPE_CHECKING:
    from polygym.servers.mcp_bridge import McpBridge

F = TypeVar("F", bound=Callable[..., Any])


def tool(method: F) -> F:
    """Mark an async method as a tool served at ``POST /<method name>``."""
    method._polygym_tool = True  # type: ignore[attr-defined]
    return method


class ResourcesServerConfig(ServerConfig):
    domain: str = "other"
    session_idle_timeout_s: float = 900.0
    reward_range: tuple[float, float] = (0.0, 1.0)
    cpu_workers: int | None = Field(
        default=0,
        ge=0,
        description="Worker processes of the server's cpu_pool, for CPU-heavy verification; "
        "0: no pool, null: min(4, CPU count).",
    )
    cpu_slow_after_s: float = Field(
        default=1.0,
        gt=0,
        description="A cpu_pool call running this long counts as slow; when every worker holds a slow "
        "call, others run on overflow workers instead of queueing behind them.",
    )
    expose_tools_over_mcp: bool = Field(
        default=False, description="Also serve the tools over MCP (streamable HTTP) at /mcp; needs [mcp]."
    )
    max_mcp_sessions: int = Field(
        default=1024, ge=1, description="MCP sessions open at once; a new one past it is refused (503)."
    )


class ToolSpec:
    """A tool discovered on the class: its name, request model and description."""

    def __init__(self, name: str, method: Callable[..., Any]) -> None:
        self.name = name
        self.method = method
        self.request_model = body_model(method)
        self.description = inspect.getdoc(method) or ""
        self.wants_session = "session" in inspect.signature(method).parameters

    def schema(self) -> dict[str, Any]:
        """The tool as a Responses ``tools`` entry, derived from the request model."""
        parameters = self.request_model.model_json_schema() if self.request_model else {"type": "object"}
        parameters = _strip_titles(parameters)
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": parameters,
            "strict": False,
        }


def _strip_titles(schema: Any) -> Any:
    """Drop pydantic's generated ``title`` strings: tokens the model reads for nothing.

    Only string values are titles; a property that is itself *named* ``title`` maps to a schema
    (a dict) and is kept.
    """
    if isinstance(schema, dict):
        return {k: _strip_titles(v) for k, v in schema.items() if not (k == "title" and isinstance(v, str))}
    if isinstance(schema, list):
        return [_strip_titles(v) for v in schema]
    return schema


ResourcesConfigT = TypeVar("ResourcesConfigT", bound=ResourcesServerConfig)


class ResourcesServer(BaseServer[ResourcesConfigT]):
    """An environment: subclasses add ``@tool`` methods and implement ``verify``.

    An environment with settings of its own names their model: ``ResourcesServer[MyConfig]``.
    """

    kind: ClassVar[str] = RESOURCES_KIND
    reverify_mode: ClassVar[Literal["stateless", "unsupported", "unknown"] | None] = None
    """NeMo Gym's ``GET /reverify_mode``, served when set: ``stateless`` when ``verify`` reads only
    the row and the response, so NeMo Gym's own reverify accepts the server without ``force``.
    None (no route) keeps polygym's reverify, which seeds a session for each row, as it was."""
    cpu_worker_initializer: ClassVar[Callable[[], Any] | None] = None
    """Runs once in each new ``cpu_pool`` worker, before its first call: a module-level function that
    imports and warms what the calls need, so that a replacement worker (after a timeout killed one)
    does not pay for sympy's import inside the next rollout's time limit."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sessions = SessionStore(idle_timeout_s=self.config.session_idle_timeout_s)
        self._verify_wants_session = "session" in inspect.signature(self.verify).parameters
        self._cpu_pool: CpuPool | None = None
        self._mcp = _mcp_bridge(self) if self.config.expose_tools_over_mcp else None
        self._seed_model = body_model(type(self).seed_session) or SeedSessionRequest
        self.episodes = EpisodeSessions()
        """The sessions NeMo Gym's environment servers named in a typed seed (``episode_sessions``)."""

    @property
    def cpu_pool(self) -> CpuPool:
        """Worker processes for CPU-heavy verification, sized by the ``cpu_workers`` setting.

        The base opens the pool at startup and closes it at shutdown, so an environment only calls
        ``await self.cpu_pool.run(fn, ..., timeout_s=...)`` and never leaks workers.
        """
        if self._cpu_pool is None:
            reason = (
                "cpu_workers is 0 in its config"
                if self.config.cpu_workers == 0
                else "the pool opens at startup (serve the app, or enter its lifespan, first)"
            )
            raise RuntimeError(f"{self.name}: no cpu_pool: {reason}")
        return self._cpu_pool

    # -- to override -------------------------------------------------------------------------
    async def seed_session(self, body: SeedSessionRequest, session: Session) -> dict[str, Any] | None:
        """Set up per-rollout state from the dataset row; the default keeps no state."""
        return None

    async def verify(self, body: VerifyRequest, session: Session) -> BaseModel | dict[str, Any]:
        """Turn a finished rollout into a reward; every environment must implement it."""
        raise NotImplementedError(f"{type(self).__name__} does not implement verify")

    def aggregate_metrics(self, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
        """Metrics over this environment's rollouts; override to add domain metrics."""
        return metrics.aggregate(rollouts)

    @classmethod
    def example_solution(cls, row: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The output items of a rollout of ``row`` that deserves the top reward; None: not known.

        Conformance checks (``gym env check``, ``check_env``) replay its tool calls in a session and
        verify it, to show that a correct answer is rewarded and beats wrong ones; without one
        (the default) those checks are skipped. May be async.
        """
        return None

    # -- machinery ---------------------------------------------------------------------------
    @classmethod
    def tools(cls) -> dict[str, ToolSpec]:
        """Tools in definition order (base classes first), the order models are offered them."""
        found: dict[str, ToolSpec] = {}
        for klass in reversed(cls.__mro__):
            for name, member in vars(klass).items():
                if inspect.isfunction(member) and getattr(member, "_polygym_tool", False):
                    found[name] = ToolSpec(name, member)
        return found

    @classmethod
    def tool_schemas(cls) -> list[dict[str, Any]]:
        return [spec.schema() for spec in cls.tools().values()]

    def routes(self) -> list[Route]:
        routes = super().routes()
        verify_model = body_model(type(self).verify) or VerifyRequest
        routes += [
            Route("/seed_session", json_endpoint(self._seed_request), methods=["POST"]),
            Route("/verify", json_endpoint(self._verify, verify_model), methods=["POST"]),
            Route("/end_session", json_endpoint(self._end_session), methods=["POST"]),
            Route("/close_session", json_endpoint(self._close_session), methods=["POST"]),
            Route(
                "/aggregate_metrics",
                json_endpoint(self._aggregate, AggregateMetricsRequest),
                methods=["POST"],
            ),
            Route("/tools", self._list_tools, methods=["GET"]),
        ]
        if type(self).reverify_mode is not None:
            routes.append(Route("/reverify_mode", self._reverify_mode, methods=["GET"]))
        for name, spec in self.tools().items():
            routes.append(
                Route(
                    f"/{name}", json_endpoint(self._tool_handler(spec), spec.request_model), methods=["POST"]
                )
            )
        return routes + ([self._mcp.route()] if self._mcp else [])

    async def startup(self) -> None:
        if self.config.cpu_workers != 0:
            self._cpu_pool = CpuPool(
                workers=self.config.cpu_workers,
                initializer=type(self).cpu_worker_initializer,
                slow_after_s=self.config.cpu_slow_after_s,
            )
        self.sessions.start_sweeper()
        if self._mcp:
            await self._mcp.start()

    async def shutdown(self) -> None:
        if self._mcp:
            await self._mcp.stop()
        if self._cpu_pool is not None:
            self._cpu_pool.close()
            self._cpu_pool = None
        await self.sessions.stop_sweeper()

    async def health(self) -> dict[str, Any]:
        return {**await super().health(), "sessions": self.sessions.stats()}

    def _session_for(self, request: Request) -> Session:
        """The rollout's session from its cookie; a call without one gets a fresh session."""
        session_id = request.cookies.get(SESSION_COOKIE)
        if session_id is None:
            session = self.sessions.create()
            request.state.new_session = session.id
            return session
        found = self.sessions.get(session_id)
        if found is None:
            raise HTTPError(
                409,
                f"unknown or expired session '{session_id}' (released after verify, or idle longer than "
                f"{self.config.session_idle_timeout_s:g}s); call /seed_session to start a new one",
                "unknown_session",
            )
        return found

    @staticmethod
    def _with_cookie(request: Request, result: Any) -> Any:
        """``result`` with the cookie of a session this request started; never encoded here, so
        that an in-process caller gets it handed over (``Handoff``, the cookie with it) instead of
        parsing it again: the seed, tool calls and ``/verify`` (the whole rollout) of a rollout."""
        new_session = getattr(request.state, "new_session", None)
        if not new_session:
            return result if result is not None else {}
        if isinstance(result, Response):  # the handler's own reply
            return with_cookies(result, {SESSION_COOKIE: new_session})
        return SetCookies(result if result is not None else {}, {SESSION_COOKIE: new_session})

    async def _seed_request(self, body: Any, request: Request) -> Any:
        """A seed from an agent (the dataset row), or NeMo Gym's typed seed from an environment
        server, whose ``task_data`` is that row; either way the row is checked by the seed's model."""
        try:
            typed = typed_seed(body)
            row = self._seed_model.model_validate(typed.task_data if typed is not None else body)
        except ValidationError as exc:
            raise HTTPError(422, validation_message(exc), "validation_error") from None
        except ValueError as exc:
            raise HTTPError(422, str(exc), "validation_error") from None
        if typed is not None:
            return await self._typed_seed(typed, row, request)
        _, result = await self._seed(row, request)
        return self._with_cookie(request, result)

    async def _seed(self, body: Any, request: Request) -> tuple[Session, Any]:
        session = self.sessions.create()
        request.state.new_session = session.id
        try:
            result = await self.seed_session(body, session)
        except BaseException:
            self.sessions.release(session.id)  # no cookie goes out, so nobody could release it later
            raise
        return session, result

    async def _typed_seed(self, typed: TypedSeed, row: Any, request: Request) -> Any:
        """NeMo Gym's answer to a typed seed: the session's name (and, with MCP, where the tools
        are), never the environment's own seed result, which its model forbids; a repeated seed
        gets the session it opened (``EpisodeSessions``)."""
        try:
            session_id = self.episodes.existing(typed)
        except ValueError as exc:
            raise HTTPError(409, str(exc), "session_conflict") from None
        if session_id is None:
            session, _ = await self._seed(row, request)
            session_id = session.id
            self.episodes.bind(typed, session_id)
        reply: dict[str, Any] = {"resources_session_id": typed.resources_session_id}
        if self._mcp is not None:
            cookie = {"Cookie": f"{SESSION_COOKIE}={session_id}"}
            reply["resources_tools"] = {
                "server_name": self.name,
                "url_path": "/mcp",
                "transport": "http",
                "headers": cookie,
            }
        return SetCookies(reply, {SESSION_COOKIE: session_id})

    async def _verify(self, body: VerifyRequest, request: Request) -> Any:
        """Verify within the rollout's session (a cookie-less call uses a throwaway one), then end it."""
        session = self._session_for(request)
        try:
            if self._verify_wants_session:
                result = await self.verify(body, session=session)
            else:
                result = await self.verify(body)  # type: ignore[call-arg]
        finally:
            # The rollout is over: release now, since NeMo Gym's agents never call /end_session.
            self.sessions.release(session.id)
            request.state.new_session = None
        return self._with_cookie(request, result)

    async def _end_session(self, body: Any, request: Request) -> dict[str, Any]:
        session_id = request.cookies.get(SESSION_COOKIE)
        return {"released": bool(session_id and self.sessions.end(session_id))}

    async def _close_session(self, body: Any, request: Request) -> dict[str, Any]:
        """NeMo Gym's name for ``/end_session`` (0.7 and its main branch), so its callers release
        sessions here too: an agent that seeded through ``/run`` posts ``{}`` with the session
        cookie; an environment server posts ``{resources_session_id, episode_id}`` with it, and
        gets the id back. Sessions are keyed by the cookie here, so the cookie's session is the one
        released. A close always succeeds, as NeMo Gym requires: afterwards no session is open."""
        await self._end_session(body, request)
        named = body.get("resources_session_id") if isinstance(body, dict) else None
        if not isinstance(named, str):
            return {"closed": True}
        session_id = self.episodes.close(named)  # also when the cookie was lost with a seed's reply
        if session_id is not None:
            self.sessions.end(session_id)
        return {"resources_session_id": named}

    async def _aggregate(self, body: AggregateMetricsRequest, request: Request) -> dict[str, Any]:
        return metrics.nemo_shape(self.aggregate_metrics(body.all_rollouts()))

    async def _reverify_mode(self, request: Request) -> Response:
        return json_response(type(self).reverify_mode)

    async def _list_tools(self, request: Request) -> Response:
        return json_response(self.tool_schemas())

    def _tool_handler(self, spec: ToolSpec) -> Callable[[Any, Request], Any]:
        bound = getattr(self, spec.name)

        async def handler(body: Any, request: Request) -> Any:
            session = self._session_for(request)
            result = await (bound(body, session=session) if spec.wants_session else bound(body))
            return self._with_cookie(request, result)

        return handler


def _mcp_bridge(server: ResourcesServer[Any]) -> McpBridge:
    """The server's MCP bridge; imported only when asked for, so the core never needs ``mcp``."""
    require_extra(f"{server.name} (expose_tools_over_mcp)", "mcp", "mcp")
    from polygym.servers.mcp_bridge import McpBridge

    return McpBridge(server)
