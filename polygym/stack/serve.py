"""Entry point of one server process of the subprocess and workers backends (``polygym.stack.serve``).

The launcher writes ``{"specs", "replica", "head_url", "parent_pid", "stack_secret", "pool_size"}``
as JSON on stdin — on stdin rather than argv, the environment or a file, because the specs hold
secrets (API keys) and the stack secret, which must not show in ``ps`` or on disk. The process
builds every server of ``specs`` with one shared client, so calls between them stay in-process
(the subprocess backend sends one spec, a worker of ``--workers`` the whole stack), binds a free
loopback port for each, registers each real address with the head server as replica ``replica``
(proving with the stack secret that it belongs to the stack, then dropping the secret: nothing
later needs it), serves until SIGTERM/SIGINT, and exits by itself if its launcher disappears (a
``kill -9`` of ``gym env start`` must not leave orphans serving forever).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from typing import Any

import orjson

from polygym.event_loop import run_async
from polygym.net.client import ServerClient
from polygym.net.retry import RetryPolicy
from polygym.stack.backend import spec_from_dict, stack_client
from polygym.stack.head import STACK_SECRET_HEADER
from polygym.stack.loader import serve_in_process

PARENT_POLL_S = 0.5


async def _watch_parent(parent_pid: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        if os.getppid() != parent_pid:
            logging.getLogger("polygym.stack.serve").warning("launcher %s is gone; shutting down", parent_pid)
            stop.set()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), PARENT_POLL_S)


async def _register(client: ServerClient, head_url: str, entry: dict[str, Any], secret: str) -> None:
    reply = await client.request_url(
        "POST",
        f"{head_url}/register",
        entry,
        headers={STACK_SECRET_HEADER: secret},
        retry=RetryPolicy(attempts=5),
    )
    if reply.status != 200:
        raise RuntimeError(f"head server refused registration: {reply.status} {reply.body[:500]!r}")


async def serve(payload: dict[str, Any]) -> None:
    specs = [spec_from_dict(spec) for spec in payload["specs"]]
    client = stack_client(payload["head_url"], payload.get("pool_size"))
    served = await serve_in_process(specs, client, "127.0.0.1")
    app_servers = [app_server for _, app_server in served]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    secret = payload.pop("stack_secret")
    for spec, app_server in served:
        entry = {
            "name": spec.name,
            "kind": spec.kind,
            "implementation": spec.implementation,
            "url": app_server.url,
            "pid": os.getpid(),
            "pool_size": client.pool_size or None,  # what the pool really allows; None: no limit
            **({"replica": payload["replica"]} if payload.get("replica") is not None else {}),
        }
        await _register(client, payload["head_url"], entry, secret)
        print(f"{spec.name} serving on {app_server.url}", flush=True)
    watcher = asyncio.create_task(_watch_parent(int(payload["parent_pid"]), stop))
    serving = [asyncio.ensure_future(s.task) for s in app_servers if s.task is not None]
    await asyncio.wait([asyncio.ensure_future(stop.wait()), *serving], return_when=asyncio.FIRST_COMPLETED)
    watcher.cancel()
    await asyncio.gather(*(s.stop() for s in app_servers), return_exceptions=True)
    await client.close()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    payload = orjson.loads(sys.stdin.buffer.read())
    run_async(serve(payload))


if __name__ == "__main__":
    main()
