"""The base every polygym server shares: a Starlette app, JSON endpoints, errors, liveness.

Servers are plain ASGI apps with a uniform lifecycle so that any launcher backend can place them
(DESIGN §4). JSON endpoints are thin on purpose: one orjson parse, one pydantic validation where a
model is declared, one orjson dump — the hot path of a rollout crosses several of them.
Errors always come back as ``{"error": {"type", "message"}}`` with a 4xx for bad input and a 5xx
for a failure inside the server, so a caller can record a clear failure instead of hanging. A call
to another server that failed for good (a ``ServerCallError`` out of a handler) answers 502 (504 on
a timeout) with its real class in ``failure.FAILURE_HEADER``, so the class reaches the collector
unchanged and no caller retries what this server's client already retried.

Every request runs inside the budget its caller sent (``polygym.net.budget``) and behind
``InboundGuard`` (bounded body, cancelled when the caller disconnects). ``GET /`` serves
``health()`` with secrets masked: a subclass adding a config field cannot leak a key through it.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import SimpleNamespace
from typing import Any, ClassVar, Generic, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.applications import Starlette
from starlette.datastructures import State
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from polygym.net import budget, failure
from polygym.net.asgi_transport import Handoff, Receive, Scope, Send
from polygym.net.client import ServerCallError, ServerClient
from polygym.redact import mask_secrets
from polygym.servers.inbound import InboundGuard, InFlight

logger = logging.getLogger("polygym.servers.base")


class ServerConfig(BaseModel):
    """Settings common to every server; implementations subclass this with their own fields."""

    model_config = ConfigDict(extra="allow")

    entrypoint: str = "app.py"
    description: str = ""


class HTTPError(Exception):
    """Raise from a handler to answer with ``status`` and a clear message (e.g. a 404).

    ``error_class`` (a ``polygym.net.failure`` class) marks a final failure of something this
    server called (an upstream API), for callers to record and not retry.
    """

    def __init__(self, status: int, message: str, error_type: str = "", error_class: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type or ("bad_request" if status < 500 else "server_error")
        self.error_class = error_class


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    return Response(orjson.dumps(data), status_code=status, media_type="application/json", headers=headers)


class SetCookies:
    """A handler's JSON result with cookies for the caller to keep (a session it started).

    Over HTTP it is a JSON reply with a ``Set-Cookie`` per cookie (``HttpOnly``, ``SameSite=Lax``);
    to a caller in this process the cookies go with the handed-over value (``Handoff``), where
    writing the headers and parsing them back cost a rollout's seed ~60 us for nothing.
    """

    __slots__ = ("cookies", "value")

    def __init__(self, value: Any, cookies: dict[str, str]) -> None:
        self.value = value
        self.cookies = cookies

    def response(self) -> Response:
        return with_cookies(json_response(self.value), self.cookies)


def with_cookies(response: Response, cookies: dict[str, str]) -> Response:
    """``response`` setting ``cookies`` as every polygym server sets a session's: HTTP only, same site."""
    for name, value in cookies.items():
        response.set_cookie(name, value, httponly=True, samesite="lax")
    return response


def owned_copy(result: Any) -> Any:
    """``result`` as JSON data sharing nothing with it: what the wire would deliver, unencoded."""
    if isinstance(result, BaseModel):
        return result.model_dump(mode="json")
    return orjson.loads(orjson.dumps(result))


def error_response(
    status: int, error_type: str, message: str, details: Any = None, error_class: str = ""
) -> Response:
    """A polygym error body; with ``error_class``, marked as that final failure class."""
    error: dict[str, Any] = {"type": error_type, "message": message}
    if details is not None:
        error["details"] = details
    headers = failure.failure_headers(error_class) if error_class else None
    return json_response({"error": error}, status, headers)


def call_failure_response(exc: ServerCallError) -> Response:
    """The answer of a server whose call to another failed for good: 504 for a timeout, else 502,
    with the real class, so the collector records it and nobody retries it again."""
    status = 504 if exc.error_class == failure.TIMEOUT else 502
    return error_response(status, exc.error_class, str(exc), error_class=exc.error_class)


def validation_message(exc: ValidationError) -> str:
    """``field.path: problem`` for every error, so the caller knows exactly what to fix."""
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err.get("loc", ())) or "(body)"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


Handler = Callable[[Any, Any], Awaitable[Any]]


class DirectRequest:
    """What our handlers read from a Starlette Request, for calls made inside one process.

    Made for every in-process call; ``state`` and ``url`` are built only for a handler that reads them.
    """

    __slots__ = ("_path", "_state", "cookies")

    def __init__(self, path: str, cookies: dict[str, str]) -> None:
        self.cookies = cookies
        self._path = path
        self._state: State | None = None

    @property
    def state(self) -> State:
        if self._state is None:
            self._state = State()
        return self._state

    @property
    def url(self) -> SimpleNamespace:
        return SimpleNamespace(path=self._path)


class JsonEndpoint:
    """``handler(body, request)`` as a JSON endpoint with uniform error handling.

    ``body`` is the validated ``model`` instance, or the parsed JSON when no model is given.
    ``handle_request`` serves it through Starlette; ``respond`` is the same endpoint for an
    in-process caller, which skips routing, middleware and the Request object entirely.
    """

    def __init__(self, handler: Handler, model: type[BaseModel] | None = None) -> None:
        self.handler = handler
        self.model = model

    async def handle_request(self, request: Request) -> Response:
        with budget.within(budget.from_headers(request.headers)):
            return await self.respond(await request.body(), request)

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        """This endpoint as an ASGI app of its own, for a request that skips the router
        (``InboundGuard``'s ``direct`` routes): what Starlette does around ``handle_request``."""
        response = await self.handle_request(Request(scope, receive))
        await response(scope, receive, send)

    async def respond(self, raw: bytes, request: Any) -> Response:
        result = await self.answer(raw, request)
        if isinstance(result, SetCookies):
            return result.response()
        return result if isinstance(result, Response) else json_response(result)

    async def answer(self, raw: bytes, request: Any) -> Any:
        """The handler's result as it returned it (a value, or its own Response), or an error Response."""
        try:
            data = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError as exc:
            return error_response(400, "invalid_json", f"request body is not valid JSON: {exc}")
        try:
            body = self.model.model_validate(data) if self.model is not None else data
        except ValidationError as exc:
            return error_response(422, "validation_error", validation_message(exc))
        try:
            result = await self.handler(body, request)
        except HTTPError as exc:
            return error_response(exc.status, exc.error_type, exc.message, error_class=exc.error_class)
        except ServerCallError as exc:
            logger.warning("%s: %s (%s)", request.url.path, exc, exc.error_class)
            return call_failure_response(exc)
        except ValidationError as exc:
            logger.exception("%s: invalid data produced by the handler", request.url.path)
            return error_response(500, "ValidationError", validation_message(exc))
        except Exception as exc:
            logger.exception("%s failed", request.url.path)
            return error_response(500, type(exc).__name__, str(exc) or repr(exc))
        return result


def json_endpoint(
    handler: Handler, model: type[BaseModel] | None = None
) -> Callable[[Request], Awaitable[Response]]:
    """A Starlette endpoint for ``handler``; in-process callers find its JsonEndpoint through it."""
    return JsonEndpoint(handler, model).handle_request


def direct_routes(routes: Sequence[BaseRoute]) -> dict[tuple[str, str], JsonEndpoint]:
    """The JSON endpoints that callers may reach without the router, by (method, path).

    Exactly those the router would pick: for each method and path the first route that matches
    wins (a later route, or a tool named like a built-in route, never shadows an earlier one), a
    route with path parameters is left to the router, and so is everything after a route that is
    not a plain ``Route`` (a mount may match any path below it).
    """
    table: dict[tuple[str, str], JsonEndpoint] = {}
    taken: set[tuple[str, str]] = set()
    every_method: set[str] = set()
    """Paths where a route without methods (an ASGI app) takes whatever is left."""
    for route in routes:
        if not isinstance(route, Route):
            break
        if route.methods is None:
            every_method.add(route.path)
            continue
        endpoint = getattr(route.endpoint, "__self__", None)
        for key in ((method, route.path) for method in route.methods):
            if key in taken or route.path in every_method:
                continue
            taken.add(key)
            if isinstance(endpoint, JsonEndpoint) and "{" not in route.path:
                table[key] = endpoint
    return table


def body_model(method: Callable[..., Any], param: str = "body") -> type[BaseModel] | None:
    """The pydantic model annotated on ``method``'s ``param`` (None when not a model)."""
    hints = typing.get_type_hints(method)
    annotation = hints.get(param)
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return annotation
    return None


ConfigT = TypeVar("ConfigT", bound=ServerConfig)


class BaseServer(Generic[ConfigT]):
    """A named server instance built from its config block; ``app`` is what launchers serve.

    The config class is the type parameter: ``class Math(ResourcesServer[MathConfig])`` both types
    ``self.config`` for a type checker and tells the base (and the loader, through ``config_class``)
    which model validates the config block, so a subclass states it once. A subclass without a
    parameter keeps its parent's config class; a base parameterized by a TypeVar gets the TypeVar's
    bound (``ResourcesServer`` validates with ``ResourcesServerConfig``).
    """

    kind: ClassVar[str] = ""
    config_class: ClassVar[type[ServerConfig]] = ServerConfig
    config: ConfigT

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        found = _config_parameter(cls)
        if found is not None:
            cls.config_class = found

    def __init__(
        self,
        name: str,
        config: dict[str, Any] | ServerConfig | None = None,
        client: ServerClient | None = None,
    ):
        self.name = name
        self.config = (
            config  # type: ignore[assignment]
            if isinstance(config, ServerConfig)
            else self.config_class.model_validate(config or {})
        )
        self.client = client or ServerClient()
        self._app: Starlette | None = None
        self._direct: dict[tuple[str, str], JsonEndpoint] = {}
        self.in_flight = InFlight()
        """Requests being served, in-process and over HTTP (``GET /`` reports it as ``in_flight``)."""

    @property
    def implementation(self) -> str:
        return (
            type(self).__module__.rsplit(".", 2)[-2] if "." in type(self).__module__ else type(self).__name__
        )

    def routes(self) -> list[Route]:
        """HTTP routes of this server; subclasses add theirs to the base list."""
        return [Route("/", self._liveness, methods=["GET"])]

    @property
    def app(self) -> Starlette:
        if self._app is None:
            routes = self.routes()
            self._direct = direct_routes(routes)
            direct = {key: endpoint.serve for key, endpoint in self._direct.items()}
            self._app = Starlette(
                routes=routes,
                lifespan=self._lifespan,
                middleware=[Middleware(InboundGuard, in_flight=self.in_flight, direct=direct)],
            )
        return self._app

    async def dispatch(
        self, method: str, path: str, body: bytes, cookies: dict[str, str]
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes] | Handoff | None:
        """Serve a JSON route for a caller in this process; None when the route needs Starlette.

        A handler's plain result is handed over unencoded (``Handoff``, made the caller's own), with
        the cookies it sets (``SetCookies``); a Response (an error, a handler's own reply) goes back
        as its status, headers and bytes.
        """
        endpoint = self._direct.get((method, path)) if self._app is not None else None
        if endpoint is None:
            return None
        with self.in_flight.serving():
            result = await endpoint.answer(body, DirectRequest(path, cookies))
        if isinstance(result, Response):
            return result.status_code, result.raw_headers, bytes(result.body)
        if isinstance(result, SetCookies):
            return Handoff(owned_copy(result.value), dict(result.cookies))
        return Handoff(owned_copy(result))

    async def startup(self) -> None:
        """Called once before the first request; override to open resources."""

    async def shutdown(self) -> None:
        """Called once when the server stops; override to release resources."""

    async def health(self) -> dict[str, Any]:
        """Liveness payload of ``GET /``; subclasses add counters worth watching (served masked)."""
        return {
            "status": "ok",
            "name": self.name,
            "kind": self.kind,
            "pid": os.getpid(),
            "in_flight": self.in_flight.count,
        }

    async def _liveness(self, request: Request) -> Response:
        return json_response(mask_secrets(await self.health()))

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.startup()
        try:
            yield
        finally:
            await self.shutdown()


def _config_parameter(cls: type) -> type[ServerConfig] | None:
    """The config class named by ``cls``'s own parameterized BaseServer base, if it has one.

    Only the bases written on ``cls`` itself count (``__orig_bases__`` in its ``__dict__``; the
    inherited attribute would repeat the parent's). A TypeVar stands for its bound.
    """
    for base in cls.__dict__.get("__orig_bases__", ()):
        origin = typing.get_origin(base)
        if not (inspect.isclass(origin) and issubclass(origin, BaseServer)):
            continue
        (argument,) = typing.get_args(base)
        if isinstance(argument, TypeVar):
            argument = argument.__bound__
        if not (inspect.isclass(argument) and issubclass(argument, ServerConfig)):
            raise TypeError(
                f"{cls.__name__}: the parameter of {origin.__name__} must be a ServerConfig subclass"
            )
        return argument
    return None
