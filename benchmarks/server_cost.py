"""Server CPU per request: a polygym JSON route over HTTP against the floor's bare aiohttp server.

The throughput benchmark's endpoint is a whole polygym server running the scripted policy, so its
CPU mixes the HTTP server with the policy. This one separates the server: each side answers the
same fixed reply to the same 2 KB POST, one process each, driven by the same aiohttp client at
--concurrency, and only the server process's CPU is counted. The polygym side is a ``BaseServer``
with one ``json_endpoint`` route, served as ``gym env start`` serves it (uvicorn on a bound socket,
``InboundGuard``, the direct JSON route, the GC pace of ``polygym.event_loop``).

    python -m benchmarks.server_cost --requests 20000 --concurrency 64
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time

import aiohttp
import psutil

from benchmarks.floor import SERVER as BARE_AIOHTTP
from benchmarks.harness import TESTED, print_table, write_json
from polygym.event_loop import run_async

POLYGYM = """
import asyncio, sys
from starlette.routing import Route
from polygym.event_loop import run_async
from polygym.net.listen import AppServer, bind_socket
from polygym.servers.base import BaseServer, json_endpoint
TEXT = [{"type": "output_text", "text": "ok"}]
ITEM = {"type": "message", "role": "assistant", "content": TEXT}
REPLY = {"id": "r", "object": "response", "status": "completed", "output": [ITEM]}
class Fixed(BaseServer):
    def routes(self):
        return [*super().routes(), Route("/v1/responses", json_endpoint(self.answer), methods=["POST"])]
    async def answer(self, body, request):
        return REPLY
async def main():
    server = AppServer(Fixed("fixed").app, bind_socket("127.0.0.1", int(sys.argv[1])))
    await server.start()
    await asyncio.Event().wait()
run_async(main())
"""
BODY = b'{"input":"' + b"x" * 2000 + b'"}'
HEADERS = {"content-type": "application/json"}


def free_port() -> int:
    with socket.socket() as sock:  # only to pick a port for the server's own bind
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def drive(session: aiohttp.ClientSession, url: str, requests: int, concurrency: int) -> None:
    pending = iter(range(requests))

    async def worker() -> None:
        for _ in pending:
            async with session.post(url, data=BODY, headers=HEADERS) as resp:
                await resp.read()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def wait_up(session: aiohttp.ClientSession, url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            async with session.post(url, data=b"{}", headers=HEADERS) as resp:
                await resp.read()
                return
        except aiohttp.ClientConnectionError:
            await asyncio.sleep(0.05)
    raise RuntimeError(f"no server at {url} within 30 s")


async def server_cpu_us(code: str, requests: int, concurrency: int) -> float:
    """CPU microseconds the server process spends per request, after a warm-up."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", code, str(port)], cwd=TESTED)
    url = f"http://127.0.0.1:{port}/v1/responses"
    try:
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:
            await wait_up(session, url)
            await drive(session, url, min(2000, requests), concurrency)
            times = psutil.Process(server.pid).cpu_times()
            before = times.user + times.system
            await drive(session, url, requests, concurrency)
            times = psutil.Process(server.pid).cpu_times()
            return 1e6 * (times.user + times.system - before) / requests
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=2, help="runs of each side, interleaved")
    args = parser.parse_args()
    rows = []
    for run in range(1, args.repeat + 1):
        for side, code in (("polygym json_endpoint (uvicorn)", POLYGYM), ("bare aiohttp", BARE_AIOHTTP)):
            cpu = run_async(server_cpu_us(code, args.requests, args.concurrency))
            rows.append({"run": run, "server": side, "server_cpu_us_per_request": round(cpu, 1)})
    print_table(f"server CPU per request, concurrency {args.concurrency}", rows)
    write_json("server_cost", {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
