"""The head server: the stack's registry of server names and addresses, and its public config.

Servers register the address they actually bound (DESIGN §4: ports are bound, never probed), and
every client resolves names here, so nothing in the stack hard-codes a port. The config it serves
has secrets masked: anything on the machine can read the head server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from polygym.servers.base import HTTPError, json_endpoint, json_response

REQUIRED_FIELDS = ("name", "kind", "implementation", "url")


class Registry:
    """Running servers by name; waiters are woken whenever a server registers."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}
        self._changed = asyncio.Event()

    def register(self, entry: dict[str, Any]) -> None:
        missing = [f for f in REQUIRED_FIELDS if not entry.get(f)]
        if missing:
            raise HTTPError(422, f"registration is missing: {', '.join(missing)}", "validation_error")
        self.entries[entry["name"]] = {**entry, "registered_at": time.time()}
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_changed(self, timeout_s: float) -> None:
        """Return when a server registers, or after ``timeout_s``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)


def head_app(registry: Registry, public_config: dict[str, Any], stack_id: str) -> Starlette:
    """The head server's ASGI app."""

    async def liveness(request: Request) -> Response:
        return json_response(
            {
                "status": "ok",
                "kind": "head",
                "stack_id": stack_id,
                "pid": os.getpid(),
                "servers": len(registry.entries),
            }
        )

    async def servers(request: Request) -> Response:
        return json_response(list(registry.entries.values()))

    async def config(request: Request) -> Response:
        return json_response(public_config)

    async def register(body: Any, request: Request) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise HTTPError(400, "registration must be a JSON object", "invalid_request")
        registry.register(body)
        return {"registered": body["name"]}

    return Starlette(
        routes=[
            Route("/", liveness, methods=["GET"]),
            Route("/servers", servers, methods=["GET"]),
            Route("/config", config, methods=["GET"]),
            Route("/register", json_endpoint(register), methods=["POST"]),
        ]
    )
