"""Refusing the requests a web page could make to a server on this machine.

Every server of a stack (and ``gym view``) listens on loopback, where any page the user opens in a
browser can reach it: by DNS rebinding (a name the attacker controls first resolves to their
server, then to 127.0.0.1, so the page reads our replies as its own origin) or by a cross-site
``POST`` (a form or ``fetch`` that spends the policy's API key through ``/v1/responses`` or starts
rollouts). Three checks close both, each cheap enough for every request:

* **Host.** A rebound request names the attacker's host, so only hosts a browser cannot be
  rebound to are served: loopback names and addresses (``localhost``, ``127.0.0.0/8``, ``::1``),
  the unspecified addresses a server bound to ``0.0.0.0`` is reached at, the address the
  connection itself arrived at (a Ray node's IP, or ``in-process`` for calls inside one process),
  and the names listed in ``POLYGYM_ALLOWED_HOSTS`` (comma-separated; for a stack reached through
  a DNS name). An IP address cannot be rebound, but one that is not this server's is refused all
  the same: nothing legitimate names it. Answered 421 (Misdirected Request).
* **Origin.** Browsers send ``Origin`` with every request other than ``GET``/``HEAD``; a request
  whose ``Origin`` is not the server's own (``scheme://Host``) nor listed in
  ``POLYGYM_ALLOWED_ORIGINS`` comes from another site's page and is refused with 403. A request
  without one (every HTTP library: aiohttp, httpx, the OpenAI and Anthropic clients, NeMo Gym's
  client, curl) is not a browser's cross-site request.
* **Content-Type** (JSON servers only). The bodies a page may send without a CORS preflight are
  forms, multipart and ``text/plain``; a JSON route refuses any body declared as something other
  than JSON (``application/json`` or ``application/*+json``) with 415. A body without a type, or
  typed ``application/octet-stream`` (what aiohttp says of bytes it was given), is served: a browser
  sends one only from ``fetch``, which adds ``Origin``, so the check above stops it, while scripts
  that post bytes without saying what they are (``requests.post(data=...)``) keep working.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import orjson

from polygym.net.asgi_transport import Scope, Send

ALLOWED_HOSTS_ENV: Final = "POLYGYM_ALLOWED_HOSTS"
ALLOWED_ORIGINS_ENV: Final = "POLYGYM_ALLOWED_ORIGINS"
_ALWAYS_LOCAL = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", "::"})
_BODYLESS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True)
class Refusal:
    """Why a request is not served: its status, error type and message."""

    status: int
    error_type: str
    message: str

    async def send(self, send: Send) -> None:
        body = orjson.dumps({"error": {"type": self.error_type, "message": self.message}})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@dataclass(frozen=True)
class CrossSitePolicy:
    """The host names and origins served beyond this machine's own (see the module docstring)."""

    hosts: frozenset[str] = frozenset()
    origins: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> CrossSitePolicy:
        """The policy set by ``POLYGYM_ALLOWED_HOSTS`` / ``POLYGYM_ALLOWED_ORIGINS``; read when a
        server is built, so every process of a stack (they inherit the environment) agrees."""
        return cls(
            hosts=frozenset(_host_name(h) for h in _listed(environ.get(ALLOWED_HOSTS_ENV, ""))),
            origins=frozenset(o.rstrip("/").lower() for o in _listed(environ.get(ALLOWED_ORIGINS_ENV, ""))),
        )

    def refusal(self, scope: Scope, json_bodies: bool = True) -> Refusal | None:
        """None when ``scope`` may be served; else why not. ``json_bodies``: refuse non-JSON bodies."""
        host = origin = content_type = None
        for name, value in scope.get("headers", ()):
            lowered = name.lower()
            if lowered == b"host":
                host = value.decode("latin-1").lower()
            elif lowered == b"origin":
                origin = value.decode("latin-1").rstrip("/").lower()
            elif lowered == b"content-type":
                content_type = value.decode("latin-1").lower()
        if host is not None and not self._local_host(_host_name(host), scope):
            return Refusal(
                421,
                "misdirected_request",
                f"host {host!r} is not this server's; set {ALLOWED_HOSTS_ENV} to serve a name of your own",
            )
        own_origin = f"{scope.get('scheme', 'http')}://{host}"
        if origin is not None and origin != own_origin and origin not in self.origins:
            message = f"requests from origin {origin!r} are refused; see {ALLOWED_ORIGINS_ENV}"
            return Refusal(403, "foreign_origin", message)
        body_typed = content_type is not None and scope.get("method") not in _BODYLESS
        if json_bodies and body_typed and not _is_json(content_type or ""):
            message = f"this route takes application/json, not {content_type!r}"
            return Refusal(415, "unsupported_media_type", message)
        return None

    def _local_host(self, name: str, scope: Scope) -> bool:
        if name in _ALWAYS_LOCAL or name in self.hosts:
            return True
        server = scope.get("server")
        if server and name == _host_name(str(server[0])):
            return True
        try:
            address = ipaddress.ip_address(name)
        except ValueError:
            return False
        return address.is_loopback or address.is_unspecified


def _listed(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def _host_name(host: str) -> str:
    """``host`` without its port, IPv6 brackets or a final dot, lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host[1:]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def _is_json(content_type: str) -> bool:
    """JSON, or bytes whose sender did not say what they are (see the module docstring)."""
    media = content_type.split(";", 1)[0].strip()
    if media in ("application/json", "application/octet-stream"):
        return True
    return media.startswith("application/") and media.endswith("+json")
