"""Floor: the cheapest possible version of a rollout's HTTP round trips.

A bare aiohttp client does ROUND_TRIPS sequential POSTs per "rollout" against a bare aiohttp
server (a separate process) that answers a fixed JSON body at once. Nothing is parsed, validated
or routed beyond what HTTP itself needs, so CPU per rollout here is the lower bound for any
orchestrator making the same round trips; throughput.py prints its own figures against this.

    python -m benchmarks.floor --round-trips 4 --concurrency 64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

import aiohttp

from benchmarks.harness import cpu_seconds, percentile, print_table, write_json
from polygym.event_loop import run_async  # uvloop, as the gym command uses

SERVER = """
import sys
from aiohttp import web
import json
TEXT = [{"type": "output_text", "text": "ok"}]
ITEM = {"type": "message", "role": "assistant", "content": TEXT}
BODY = json.dumps({"id": "r", "object": "response", "status": "completed", "output": [ITEM]}).encode()
async def handle(request):
    await request.read()
    return web.Response(body=BODY, content_type="application/json")
app = web.Application()
app.router.add_post("/v1/responses", handle)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def free_port() -> int:
    import socket

    with socket.socket() as sock:  # only to pick a port for the bare server's own bind
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def wait_up(session: aiohttp.ClientSession, url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            async with session.post(url, data=b"{}") as resp:
                await resp.read()
                return
        except aiohttp.ClientConnectionError:
            await asyncio.sleep(0.02)
    raise RuntimeError("bare server did not start")


async def run(rollouts: int, round_trips: int, concurrency: int, body_bytes: int) -> dict[str, float]:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)])
    url = f"http://127.0.0.1:{port}/v1/responses"
    body = b'{"input":"' + b"x" * body_bytes + b'"}'
    try:
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:
            await wait_up(session, url)
            latencies: list[float] = []
            pending = iter(range(rollouts))

            async def worker() -> None:
                for _ in pending:
                    began = time.perf_counter()
                    for _ in range(round_trips):
                        async with session.post(
                            url, data=body, headers={"content-type": "application/json"}
                        ) as r:
                            await r.read()
                    latencies.append(time.perf_counter() - began)

            pids = [os.getpid(), server.pid]
            cpu_before = cpu_seconds(pids)
            began = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            wall = time.perf_counter() - began
            cpu = cpu_seconds(pids) - cpu_before
    finally:
        server.terminate()
        server.wait(10)
    return {
        "concurrency": concurrency,
        "round_trips": round_trips,
        "rollouts_per_s": rollouts / wall,
        "p50_s": percentile(latencies, 50),
        "cpu_ms_per_rollout": 1000 * cpu / rollouts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--round-trips", type=int, default=4)
    parser.add_argument("--concurrency", default="1,16,64,256,1024")
    parser.add_argument("--body-bytes", type=int, default=2000, help="request size, about a rollout's prompt")
    args = parser.parse_args()
    rows = [
        run_async(run(args.rollouts, args.round_trips, int(c), args.body_bytes))
        for c in args.concurrency.split(",")
    ]
    print_table(f"floor: bare aiohttp, {args.round_trips} round trips per rollout", rows)
    write_json("floor", {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
