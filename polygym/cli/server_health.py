"""Asking running servers how they are: each replica's ``GET /``, and what a model server found
when it asked its upstream. Shared by ``gym env start`` (its ``ready:`` line), ``gym env status``
and ``gym eval run`` (a warning before the first rollout when the policy cannot be reached).
"""

from __future__ import annotations

import asyncio
from typing import Any

from polygym.kinds import MODEL_KIND, UPSTREAM_PROBE, UPSTREAM_PROBE_TIMEOUT_S
from polygym.net.client import ServerCallError, ServerClient
from polygym.net.replicas import slot_of
from polygym.net.retry import NO_RETRY

HEALTH_TIMEOUT_S = UPSTREAM_PROBE_TIMEOUT_S + 2.0
"""A server's ``GET /`` may wait for its upstream probe: a silent upstream shows as such, not as a
model server that is down."""
UPSTREAM = "upstream"
"""How a health status starts when the server is up but its upstream is not (never ``ok``)."""


async def ping_servers(servers: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every replica pinged on its own URL (not one per name): its status and requests in flight."""
    client = ServerClient(pool_size=64)
    try:

        async def probe(entry: dict[str, Any]) -> tuple[str, dict[str, Any]]:
            slot = slot_of(entry)
            try:
                url = entry["url"] + str(entry.get("health_path") or "/")
                reply = await client.request_url("GET", url, timeout_s=HEALTH_TIMEOUT_S, retry=NO_RETRY)
            except ServerCallError as exc:
                return slot, {"status": f"down ({exc.error_class})"}
            if reply.status != 200:
                return slot, {"status": f"unhealthy (HTTP {reply.status})"}
            try:
                body = reply.json()
            except ServerCallError:
                body = None
            body = body if isinstance(body, dict) else {}
            sessions = body.get("sessions")
            status = f"ok, {sessions['active']} sessions" if isinstance(sessions, dict) else "ok"
            status = upstream_status(body.get(UPSTREAM_PROBE)) or status
            return slot, {"status": status, "in_flight": body.get("in_flight")}

        return dict(await asyncio.gather(*(probe(e) for e in servers)))
    finally:
        await client.close()


def upstream_status(probes: Any) -> str | None:
    """What a model server's upstream probes found, when one is not ``ok``: the URL (its password
    masked by the server) and why; None when every upstream answered or there is none."""
    if not isinstance(probes, list):
        return None
    bad = [p for p in probes if isinstance(p, dict) and p.get("ok") is False]
    if not bad:
        return None
    return f"{UPSTREAM} " + ", ".join(f"{p.get('url', '?')} {p.get('error', 'failed')}" for p in bad)


async def upstream_problems(servers: list[dict[str, Any]]) -> list[str]:
    """``"<slot> upstream <url> <why>"`` for each model server of ``servers`` whose upstream did
    not answer its probe; empty when every policy can be reached (or none has an upstream)."""
    found = await ping_servers([s for s in servers if s.get("kind") == MODEL_KIND])
    statuses = {slot: str(probe["status"]) for slot, probe in found.items()}
    return [f"{slot} {status}" for slot, status in statuses.items() if status.startswith(UPSTREAM)]
