"""CpuPool: results come back, overruns are stopped, the pool survives a killed worker; the
resources server opens and closes its pool (`cpu_workers`).

The offloaded callables are builtins because workers import functions by module name, and test
modules are not importable from a fresh worker process.
"""

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
    assert pool._pool is None  # closed at shutdown: its workers are gone
    with pytest.raises(RuntimeError, match="the pool opens at startup"):
        server.cpu_pool  # noqa: B018


async def test_no_pool_by_default() -> None:
    server = Offloading("env")
    async with server.app.router.lifespan_context(server.app):
        with pytest.raises(RuntimeError, match="env: no cpu_pool: cpu_workers is 0"):
            server.cpu_pool  # noqa: B018
