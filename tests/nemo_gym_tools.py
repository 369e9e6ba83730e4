"""NeMo Gym's own ``gym eval`` tools (profile, compare, health-check, reverify, aggregation), runnable.

The tests that check polygym's files against NeMo Gym's readers, and NeMo Gym's files against
polygym's, run NeMo Gym 0.7.0's code itself, not a restatement of it. That code needs Python 3.13
(the wheel declares >= 3.13.14; 3.13.0 runs it) and only part of NeMo Gym's dependencies: the
environment made here holds the wheel (``--no-deps``) plus what its evaluation tools import,
pinned, not vLLM, MLflow or the sandboxes. It is built once per machine in the test cache
(``POLYGYM_TEST_CACHE``, ~1 GB, a few minutes) and reused while ``TOOL_REQUIREMENTS`` is unchanged;
only a build that finished is trusted (a marker written last), a failed one is redone.

Without a Python 3.13 the tests that need it are skipped, saying so.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.nemo_gym_wheel import NEMO_GYM_VERSION, cache_dir, nemo_gym_wheel

TOOL_REQUIREMENTS = (
    "openai==2.44.0",  # NeMo Gym 0.7.0's own pin; its CLI refuses another version
    "anthropic<=0.109.2",
    "pydantic>=2.11,<3",
    "omegaconf>=2.3,<2.5",
    "hydra-core>=1.3,<1.4",
    "orjson>=3.11.6,<4",
    "pandas>=2.2,<4",
    "scipy>=1.14.1,<2",
    "rich>=13,<16",
    "tqdm>=4.66,<5",
    "wandb>=0.30,<0.40",
    "fastapi>=0.115,<1",
    "uvicorn>=0.30,<1",
    "httptools>=0.6,<1",
    "aiohttp>=3.14.4,<4",
    "itsdangerous>=2.2,<3",
    "yappi>=1.7.6,<2",
    "pydot>=3,<5",
    "devtools>=0.12,<1",
    "psutil>=5.9,<8",
)
"""What NeMo Gym 0.7.0's evaluation tools import (found by importing them), pinned to ranges."""
METADATA_ONLY = ("ray==2.60.0",)
"""Installed without dependencies: NeMo Gym reads Ray's version at import, its tools never start it."""


def _python_313() -> str | None:
    """A Python 3.13 interpreter: on PATH, or one of pyenv's."""
    found = shutil.which("python3.13")
    if found:
        return found
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = sorted(pyenv.glob("3.13.*/bin/python3.13")) if pyenv.is_dir() else []
    return str(candidates[-1]) if candidates else None


def _fingerprint() -> str:
    return hashlib.sha256(
        "\n".join((NEMO_GYM_VERSION, *TOOL_REQUIREMENTS, *METADATA_ONLY)).encode()
    ).hexdigest()


def _pip(python: Path, *args: str) -> None:
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, f"pip install {' '.join(args)} failed:\n{done.stderr[-3000:]}"


def tools_python() -> Path:
    """The interpreter of the environment holding NeMo Gym's tools (built the first time)."""
    venv = cache_dir().parent / f"ng-tools-{NEMO_GYM_VERSION}"
    python = venv / "bin" / "python"
    marker = venv / ".polygym-complete"
    if marker.is_file() and marker.read_text() == _fingerprint():
        return python
    base = _python_313()
    if base is None:
        pytest.skip(f"NeMo Gym {NEMO_GYM_VERSION}'s tools need Python 3.13; none found (PATH, pyenv)")
    wheel = nemo_gym_wheel()
    marker.unlink(missing_ok=True)
    if not python.is_file():  # else brought up to date in place: pip keeps what already fits
        subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=300)
    _pip(python, "--no-deps", "--ignore-requires-python", str(wheel))
    _pip(python, *TOOL_REQUIREMENTS)
    _pip(python, "--no-deps", *METADATA_ONLY)
    marker.write_text(_fingerprint())
    return python


def run_nemo_gym(
    python: Path, *args: str, cwd: Path, timeout_s: float = 300
) -> subprocess.CompletedProcess[str]:
    """NeMo Gym's ``gym`` command (its console entry point, ``nemo_gym.cli.main:main``) in ``cwd``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEMO_GYM", "POLYGYM"))}
    entry = "import sys; from nemo_gym.cli.main import main; sys.argv[0] = 'gym'; sys.exit(main())"
    return subprocess.run(
        [str(python), "-c", entry, *args],
        cwd=cwd,
        env={**env, "WANDB_MODE": "disabled"},
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
