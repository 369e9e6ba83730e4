"""Probing a server under test the way an agent calls it, without ever raising.

A conformance checker wants every call's outcome as data (a status and a body, or why there was
none) to report on, not an exception to unwind; it wants no retries of error statuses or timeouts
(a retry would hide the very failure being checked); and it must not wait on a hung endpoint
twice, so that a hanging verifier costs one timeout rather than one per dataset row. The transport
itself is the shared ``ServerClient``; the session calls (``seed`` and ``end``) count what they
open and release so that leaked sessions can be reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from polygym.net.client import ServerCallError, ServerClient
from polygym.net.retry import RetryPolicy
from polygym.servers.sessions import SESSION_COOKIE

NOT_CALLED = "not called"
"""Starts the error of a call skipped because the same endpoint timed out earlier."""
_RETRY = RetryPolicy(attempts=2, base_delay_s=0.0, retry_statuses=frozenset())
"""No status is retried, a connection error once and at once: uvicorn closes a kept-alive
connection after a 500 from an exception, and the pool only finds out when the next call fails to
write on it. A server that really drops connections fails the retry too."""


@dataclass
class ProbeReply:
    """What came back: an HTTP status and body, or (``status`` None) why nothing did."""

    status: int | None
    body: bytes = b""
    cookie: str | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    def json(self) -> Any:
        try:
            return orjson.loads(self.body) if self.body else None
        except orjson.JSONDecodeError:
            return None

    def message(self) -> str:
        """The error message of a polygym error body (``{"error": {"message"}}``), else the text."""
        data = self.json()
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            return str(data["error"].get("message") or "").strip()
        return self.body.decode("utf-8", "replace").strip()

    def describe(self) -> str:
        """``HTTP 422: <the server's error message>``, shortened; or why there was no reply."""
        if self.status is None:
            return self.error
        text = self.message()
        text = text if len(text) <= 200 else text[:200] + "..."
        return f"HTTP {self.status}" + (f": {text}" if text else "")


class Probe:
    """Calls to one server at ``base_url``: a timeout each, no retries, a hung endpoint called once."""

    def __init__(self, base_url: str, timeout_s: float) -> None:
        self.base_url = base_url
        self.timeout_s = timeout_s
        self.hung: set[str] = set()
        self.client = ServerClient(timeout_s=timeout_s)
        self.seeded = 0
        self.released = 0

    async def request(
        self, method: str, path: str, body: Any = None, cookie: str | None = None
    ) -> ProbeReply:
        """``body``: JSON-able, or bytes sent as they are (malformed JSON, on purpose)."""
        if path in self.hung:
            return ProbeReply(None, error=f"{NOT_CALLED}: {method} {path} timed out earlier")
        payload = orjson.Fragment(body) if isinstance(body, bytes) else body  # Fragment: sent verbatim
        headers = {"cookie": f"{SESSION_COOKIE}={cookie}"} if cookie else None
        url = self.base_url + path
        try:
            reply = await self.client.request_url(method, url, payload, headers=headers, retry=_RETRY)
        except ServerCallError as exc:
            if exc.error_class == "Timeout":
                self.hung.add(path)
                return ProbeReply(
                    None, error=f"{method} {path}: no reply within {self.timeout_s:g}s (timeout)"
                )
            return ProbeReply(None, error=f"{method} {path}: {exc.error_class}: {exc.detail}")
        except aiohttp.ClientError as exc:  # a broken reply (bad framing, payload): not a 2xx
            return ProbeReply(None, error=f"{method} {path}: {type(exc).__name__}: {exc}")
        return ProbeReply(reply.status, reply.body, reply.cookies.get(SESSION_COOKIE))

    async def seed(self, row: dict[str, Any]) -> tuple[str | None, str]:
        """A fresh session for ``row``: its cookie, or None and why."""
        reply = await self.request("POST", "/seed_session", row)
        if not reply.ok:
            return None, f"seed_session: {reply.describe()}"
        if not reply.cookie:
            return None, f"seed_session did not set the {SESSION_COOKIE} cookie"
        self.seeded += 1
        return reply.cookie, ""

    async def end(self, cookie: str | None) -> str:
        """Release the session ``cookie`` names (if any): "" when it was released, else why not."""
        if cookie is None:
            return ""
        reply = await self.request("POST", "/end_session", {}, cookie)
        if not reply.ok:
            return f"end_session: {reply.describe()}"
        if not (reply.json() or {}).get("released"):
            return "end_session did not release the session"
        self.released += 1
        return ""

    async def close(self) -> None:
        await self.client.close()
