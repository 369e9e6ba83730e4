"""NeMo Gym's own ``gym eval`` tools (profile, compare, health-check, reverify, aggregation), runnable.

The tests that check polygym's files against NeMo Gym's readers, and NeMo Gym's files against
polygym's, run NeMo Gym 0.7.0's code itself, not a restatement of it. It runs in NeMo Gym's own
environment as polygym builds it for NeMo Gym's servers (``polygym.stack.env_build``: nemo-gym with
its dependencies, on pyenv's Python 3.13.0), the very one the server tests use
(``tests/e2e/test_nemo_gym_servers_e2e.py``), so a machine builds it once for both and the cache
rules are polygym's (rebuilt when its inputs change, a failed build never reused).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from polygym.stack.env_build import CACHE_ENV_VAR, EnvInputs, ensure_env, find_python, venv_python
from polygym.stack.nemo_gym_server import nemo_gym_package
from tests.nemo_gym_wheel import NEMO_GYM_PYTHON, env_cache, nemo_gym_tree


def tools_python() -> Path:
    """The interpreter of NeMo Gym's environment (built the first time, minutes; cached after)."""
    if not NEMO_GYM_PYTHON.is_file():
        pytest.fail(f"NeMo Gym's tools need Python 3.13.0 at {NEMO_GYM_PYTHON} (pyenv install 3.13.0)")
    package = nemo_gym_package(nemo_gym_tree(), None)
    python = find_python(str(NEMO_GYM_PYTHON), package.requires_python)
    inputs = EnvInputs(
        python=str(python.path),
        python_version=python.version_text,
        ignore_requires_python=python.ignore_requires_python,
        nemo_gym=package.install,
        nemo_gym_digest=package.digest,
        requirements=(),
    )
    saved = os.environ.get(CACHE_ENV_VAR)
    os.environ[CACHE_ENV_VAR] = str(env_cache())
    try:
        return venv_python(ensure_env(inputs))
    finally:
        if saved is None:
            os.environ.pop(CACHE_ENV_VAR, None)
        else:
            os.environ[CACHE_ENV_VAR] = saved


def nemo_gym_command(python: Path, *args: str) -> list[str]:
    """NeMo Gym's ``gym`` command line (its console entry point, ``nemo_gym.cli.main:main``)."""
    entry = "import sys; from nemo_gym.cli.main import main; sys.argv[0] = 'gym'; sys.exit(main())"
    return [str(python), "-c", entry, *args]


def nemo_gym_env() -> dict[str, str]:
    """This environment without polygym's settings or import path (polygym's ``resources_servers``
    on ``PYTHONPATH`` would shadow NeMo Gym's own packages of that name)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEMO_GYM", "POLYGYM", "PYTHONPATH"))}
    return {**env, "WANDB_MODE": "disabled"}


def run_nemo_gym(
    python: Path, *args: str, cwd: Path, timeout_s: float = 300
) -> subprocess.CompletedProcess[str]:
    """NeMo Gym's ``gym`` command in ``cwd``, to its end."""
    return subprocess.run(
        nemo_gym_command(python, *args),
        cwd=cwd,
        env=nemo_gym_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def run_nemo_gym_code(python: Path, code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A Python snippet against NeMo Gym's modules (its functions, where no command exposes them)."""
    return subprocess.run(
        [str(python), "-c", code, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
