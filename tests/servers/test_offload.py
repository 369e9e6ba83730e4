"""CpuPool: results come back, overruns are stopped, the pool survives a killed worker; the
resources server opens and closes its pool (`cpu_workers`).

The offloaded callables are builtins because workers import functions by module name, and test
modules are not importable from a fresh worker process.
"""

import asyncio
import math
import re
import time

import pytest

from polygym.servers.cpu_pool import CpuPool, CpuTimeout
from polygym.servers.resources import ResourcesServer


async def test_results_timeouts_and_errors() -> None:
    pool = CpuPool(workers=1)
    try:
        assert await pool.run(math.factorial, 10, timeout_s=30) == 3628800
        with pytest.raises(CpuTimeout, match=re.escape("sleep exceeded 0.3s")):
            await pool.run(time.sleep, 30, timeout_s=0.3)
        assert await pool.run(math.factorial, 5, timeout_s=30) == 120  # replaced worker
        with pytest.raises(ValueError, match="invalid literal"):
            await pool.run(int, "not a number", timeout_s=30)
    finally:
        pool.close()


class Offloading(ResourcesServer):
    pass


async def test_the_resources_server_owns_its_pool_when_cpu_workers_is_set() -> None:
    server = Offloading("env", {"cpu_workers": 1})
    with pytest.raises(RuntimeError, match="the pool opens at startup"):
        server.cpu_pool  # noqa: B018
    async with server.app.router.lifespan_context(server.app):
        pool = server.cpu_pool
        assert pool.workers == 1
        assert await pool.run(math.factorial, 4, timeout_s=30) == 24
    assert not pool.running  # closed at shutdown: its workers are gone
    with pytest.raises(RuntimeError, match="the pool opens at startup"):
        server.cpu_pool  # noqa: B018


async def test_no_pool_by_default() -> None:
    server = Offloading("env")
    async with server.app.router.lifespan_context(server.app):
        with pytest.raises(RuntimeError, match="env: no cpu_pool: cpu_workers is 0"):
            server.cpu_pool  # noqa: B018


@pytest.mark.slow
async def test_slow_calls_do_not_starve_ordinary_ones() -> None:
    """Five slow calls on two workers used to delay an ordinary one by three rounds of their runtime;
    with the overflow lane (four more processes) it waits about ``slow_after_s`` behind them."""
    slow_s = 3.0
    pool = CpuPool(workers=2, slow_after_s=0.2)
    try:
        await pool.run(math.factorial, 1, timeout_s=30)  # workers started: spawn time is not the point
        began = time.perf_counter()
        slow = [asyncio.ensure_future(pool.run(time.sleep, slow_s, timeout_s=30)) for _ in range(5)]
        await asyncio.sleep(0)  # the slow calls are queued first, as in the reported case
        assert await pool.run(math.factorial, 10, timeout_s=30) == 3628800
        ordinary_s = time.perf_counter() - began
        await asyncio.gather(*slow)
        assert ordinary_s < slow_s, f"an ordinary call waited {ordinary_s:.1f}s behind slow ones"
    finally:
        pool.close()


async def test_without_a_slow_lane_the_pool_is_fifo() -> None:
    pool = CpuPool(workers=1, slow_after_s=0.1, slow_workers=0)
    try:
        began = time.perf_counter()
        slow = asyncio.ensure_future(pool.run(time.sleep, 1.0, timeout_s=30))
        await asyncio.sleep(0)
        await pool.run(math.factorial, 3, timeout_s=30)
        assert time.perf_counter() - began >= 1.0
        await slow
    finally:
        pool.close()


def test_slow_lane_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="slow_after_s"):
        CpuPool(workers=1, slow_after_s=0)
    with pytest.raises(ValueError, match="slow_workers"):
        CpuPool(workers=1, slow_workers=-1)
