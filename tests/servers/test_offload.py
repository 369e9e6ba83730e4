"""CpuPool: results come back, overruns are stopped, the pool survives a killed worker.

The offloaded callables are builtins because workers import functions by module name, and test
modules are not importable from a fresh worker process.
"""

import math
import re
import time

import pytest

from polygym.servers.cpu_pool import CpuPool, CpuTimeout


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
