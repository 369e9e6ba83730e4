"""The viewer's web app: read-only pages over the runs given on the command line.

Routes take a run's number (its place on the command line) and a row's number in that run's
index, never a path, so the files ``polygym.view.runs.discover`` found are all that can be read;
static files are a fixed list from the package. Only GET and HEAD are answered; a query string
over 4 KB is refused. Every page carries a Content-Security-Policy that allows scripts from this
server only (no inline script, no eval), ``nosniff`` and ``frame-ancestors 'none'``, so even a
rendering bug could not run a rollout's ``<script>``.

Pages never compute on the event loop: the runs are read and every page's numbers computed on the
viewer's worker thread (``polygym.view.work``). A page whose numbers take longer than ``WAIT_S``
shows what the worker is doing instead (``waiting.html``), and reloads when they are ready; a run
still being written is read again on each request, so its pages show its new rows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, MutableMapping
from dataclasses import replace
from importlib.resources import files
from pathlib import Path
from typing import Any

import orjson
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from polygym.row import ALL_ENVS, env_label
from polygym.servers.cross_site import CrossSitePolicy
from polygym.view import charts, pages
from polygym.view.index import RunIndex
from polygym.view.query import QueryError
from polygym.view.runs import discover
from polygym.view.svg import figure_svg
from polygym.view.training import point_files, read_curves, signature
from polygym.view.work import Worker

MAX_QUERY_BYTES = 4096
WAIT_S = 1.0
"""How long a page waits for its numbers before it shows progress instead."""
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
PACKAGE = Path(str(files("polygym.view")))
STATIC = {"view.css": PACKAGE / "static" / "view.css", "view.js": PACKAGE / "static" / "view.js"}

Scope = MutableMapping[str, Any]
ASGI = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


def embed_json(value: Any) -> Markup:
    """JSON safe inside ``<script type="application/json">``: ``<``, ``>``, ``&`` and the two JavaScript
    line separators escaped, so no content can close the element; the page reads it with JSON.parse."""
    text = orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    for raw, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(raw, escaped)
    return Markup(text)  # escaped above for this one context


def templates() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(PACKAGE / "templates")),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["embed_json"] = embed_json
    env.filters["env_label"] = env_label
    env.filters["fmt"] = pages.fmt
    env.filters["svg"] = figure_svg
    env.globals.update(ALL_ENVS=ALL_ENVS, cells=pages.summary_cells)
    return env


class ViewerState:
    """The runs' indexes and the worker that reads them and computes the pages' numbers.

    The runs named on the command line come first; the validation rollouts of a training run are
    runs too, added as their files appear (``validation_runs``), so each validation point links
    to its rollouts with every page a run has."""

    def __init__(self, indexes: list[RunIndex]) -> None:
        self.indexes = indexes
        self.named = len(indexes)
        self.worker = Worker(indexes)
        self._points: dict[tuple[int, Path], int] = {}
        for number in range(len(indexes)):
            self.worker.refresh(number)

    def validation_runs(self, number: int) -> dict[int, tuple[int, RunIndex]]:
        """Validation step -> (run number, index) of the rollouts behind it, for training run ``number``."""
        source = self.indexes[number].source
        if source.folder is None:
            return {}
        out = {}
        for step, path in point_files(source.folder, [p.step for p in read_curves(source.folder)]).items():
            found = self._points.get((number, path))
            if found is None:
                name = f"{source.name} · validation at step {step}"
                found = self._points[(number, path)] = len(self.indexes)
                self.indexes.append(RunIndex(replace(discover(path), name=name)))
            out[step] = (found, self.indexes[found])
        return out

    def run(self, number: int) -> RunIndex:
        if not 0 <= number < len(self.indexes):
            raise LookupError(f"no run {number}")
        self.worker.refresh(number)
        return self.indexes[number]

    def live(self, index: RunIndex) -> bool:
        """A run is taken as still being written until its metrics file (a training run: its
        ``summary.json``) exists."""
        return not index.source.ended.is_file() or not index.loaded

    def version(self, index: RunIndex) -> str:
        """Changes whenever a live page has something new to show (its rows, a training run's logs)."""
        folder = index.source.folder
        extra = signature(folder, index.source.steps) if folder is not None else ()
        return f"{len(index)}:{hash(extra) & 0xFFFFFFFF:x}"


def guard(app: ASGI) -> ASGI:
    """Refuse what a read-only viewer never needs (another site's page or a rebound host name
    included: ``CrossSitePolicy``), and add the security headers to every reply."""
    cross_site = CrossSitePolicy.from_env()

    async def guarded(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        refusal = cross_site.refusal(scope, json_bodies=False)
        if refusal is not None:
            await refusal.send(send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            await PlainTextResponse("read-only viewer: GET only", 405, headers={"Allow": "GET, HEAD"})(
                scope, receive, send
            )
            return
        if len(scope.get("query_string", b"")) > MAX_QUERY_BYTES:
            await PlainTextResponse("query string too long", 414)(scope, receive, send)
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [
                    (k.lower().encode(), v.encode())
                    for k, v in SECURITY_HEADERS.items()
                    if k.lower().encode() not in present
                ]
                message = {**message, "headers": headers}
            await send(message)

        await app(scope, receive, send_with_headers)

    return guarded


def create_app(indexes: list[RunIndex], wait_s: float = WAIT_S) -> ASGI:
    state = ViewerState(indexes)
    jinja = templates()

    async def numbers(
        key: str, runs: list[int], what: str, compute: Callable[[], Any], extra: Hashable = None
    ) -> tuple[Any, bool]:
        """The page's numbers and whether they are older than the runs, waiting ``wait_s`` at
        most for the current ones; (None, False): nothing to show yet, show progress instead."""
        answer = state.worker.ask(key, runs, what, compute, extra)
        future = state.worker.future(key)
        if (answer.value is None or answer.stale) and future is not None:
            try:
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), wait_s)
            except TimeoutError:
                return answer.value, answer.stale
            answer = state.worker.ask(key, runs, what, compute, extra)
        return answer.value, answer.stale

    def updating(stale: bool) -> dict[str, Any]:
        """Numbers older than the runs: said on the page, which reloads at its next poll."""
        return {"stale": True, "live": True, "live_version": "updating"} if stale else {"stale": False}

    def waiting(request: Request, key: str, runs: list[int], title: str) -> Response:
        return render(
            request,
            "waiting.html",
            title=title,
            key=key,
            runs_waited=",".join(map(str, runs)),
            progress=state.worker.progress(runs),
        )

    def render(request: Request, name: str, status: int = 200, **context: Any) -> Response:
        runs = [(i, x.source) for i, x in enumerate(state.indexes)]
        html = jinja.get_template(name).render(
            runs=runs, nav_runs=runs[: state.named], path=request.url.path, export=False, **context
        )
        return Response(html, status, media_type="text/html; charset=utf-8")

    def run_context(number: int) -> dict[str, Any]:
        index = state.run(number)
        return {
            "run": number,
            "index": index,
            "source": index.source,
            "live": state.live(index),
            "row_count": len(index),
            "live_version": state.version(index),
        }

    async def home(request: Request) -> Response:
        return RedirectResponse("/run/0", 303)

    async def overview(request: Request) -> Response:
        ctx = run_context(request.path_params["run"])
        key = f"overview/{ctx['run']}"
        view, stale = await numbers(
            key, [ctx["run"]], "computing the overview", lambda: pages.overview(ctx["index"])
        )
        if view is None:
            return waiting(request, key, [ctx["run"]], f"{ctx['source'].name} · overview")
        return render(request, "overview.html", **{**ctx, **updating(stale)}, **view)

    async def steps(request: Request) -> Response:
        ctx = run_context(request.path_params["run"])
        return render(request, "steps.html", **ctx, **pages.steps_page(ctx["index"]))

    async def rollouts(request: Request) -> Response:
        ctx = run_context(request.path_params["run"])
        try:
            view = pages.rollout_list(ctx["index"], dict(request.query_params))
        except QueryError as exc:
            return render(request, "error.html", 400, message=str(exc))
        return render(request, "rollouts.html", **ctx, **view)

    async def rollout(request: Request) -> Response:
        ctx = run_context(request.path_params["run"])
        number = request.path_params["row"]
        if not 0 <= number < len(ctx["index"]):
            return render(request, "error.html", 404, message=f"run {ctx['run']} has no row {number}")
        return render(
            request, "rollout.html", **{**ctx, "live": False}, **pages.rollout_detail(ctx["index"], number)
        )

    def pair(request: Request) -> tuple[RunIndex, RunIndex, int, int]:
        a, b = request.path_params["base"], request.path_params["new"]
        return state.run(a), state.run(b), a, b

    async def compare(request: Request) -> Response:
        base, new, a, b = pair(request)
        key = f"compare/{a}/{b}"
        what = "comparing (paired bootstrap over tasks)"
        view, stale = await numbers(key, [a, b], what, lambda: pages.comparison(base, new))
        if view is None:
            return waiting(request, key, [a, b], "compare")
        return render(request, "compare.html", base=a, new=b, **updating(stale), **view)

    async def compare_task(request: Request) -> Response:
        base, new, a, b = pair(request)
        picks = []
        for name in ("left", "right"):
            value = request.query_params.get(name, "")
            picks.append(int(value) if value.isdigit() and len(value) < 12 else None)
        view = pages.side_by_side(base, new, request.path_params["key"][:64], picks[0], picks[1])
        return render(request, "compare_task.html", base=a, new=b, **view)

    async def count(request: Request) -> Response:
        index = state.run(request.path_params["run"])
        return JSONResponse({"rows": len(index), "live": state.live(index), "version": state.version(index)})

    async def training(request: Request) -> Response:
        ctx = run_context(request.path_params["run"])
        if ctx["source"].folder is None:
            return render(request, "error.html", 404, message=f"run {ctx['run']} is not a training run")
        points = state.validation_runs(ctx["run"])
        key = f"training/{ctx['run']}"
        runs = [ctx["run"], *(number for number, _ in points.values())]
        extra = signature(ctx["source"].folder, ctx["source"].steps)
        view, stale = await numbers(
            key, runs, "reading the training run", lambda: pages.training_page(ctx["index"], points), extra
        )
        if view is None:
            return waiting(request, key, runs, f"{ctx['source'].name} · training")
        return render(request, "training.html", **{**ctx, **updating(stale)}, **view)

    async def progress(request: Request) -> Response:
        """For a waiting page: how far the worker has got, and whether the page can be shown."""
        runs = [int(r) for r in request.query_params.get("runs", "").split(",") if r.isdigit() and len(r) < 6]
        runs = [r for r in runs if r < len(state.indexes)]
        key = request.query_params.get("page", "")[:64]
        return JSONResponse({"ready": state.worker.ready(key), **state.worker.progress(runs)})

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        path = charts.plotly_js() if name == "plotly.min.js" else STATIC.get(name)
        if path is None:
            return PlainTextResponse("not found", 404)
        media = "text/css" if name.endswith(".css") else "text/javascript"
        return FileResponse(path, media_type=media, headers={"Cache-Control": "max-age=3600"})

    async def not_found(request: Request, exc: Exception) -> Response:
        return render(request, "error.html", 404, message=str(exc) or "not found")

    routes = [
        Route("/", home),
        Route("/run/{run:int}", overview),
        Route("/run/{run:int}/steps", steps),
        Route("/run/{run:int}/training", training),
        Route("/run/{run:int}/rollouts", rollouts),
        Route("/run/{run:int}/rollouts/{row:int}", rollout),
        Route("/run/{run:int}/count.json", count),
        Route("/progress.json", progress),
        Route("/compare/{base:int}/{new:int}", compare),
        Route("/compare/{base:int}/{new:int}/task/{key}", compare_task),
        Route("/static/{name}", static),
    ]
    app = Starlette(routes=routes, exception_handlers={LookupError: not_found, 404: not_found})
    return guard(app)
