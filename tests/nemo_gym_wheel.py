"""NeMo Gym's released wheel, for the tests that check polygym against the real thing.

The wheel holds NeMo Gym's own resources servers, configs and example data. It is fetched with
pip the first time into a cache (``POLYGYM_TEST_CACHE``, default ``~/.cache/polygym-tests``) and
reused afterwards, so CI downloads it once per machine. NeMo Gym 0.7.0 declares Python >= 3.13.14,
hence the ``--python-version`` that lets pip fetch it from the test suite's older interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

NEMO_GYM_VERSION = "0.7.0"
NEMO_GYM_PYTHON = Path.home() / ".pyenv" / "versions" / "3.13.0" / "bin" / "python"
"""The interpreter NeMo Gym 0.7.0 is tested on (it declares 3.13.14; pip's --ignore-requires-python)."""


def cache_dir() -> Path:
    return Path(os.environ.get("POLYGYM_TEST_CACHE", Path.home() / ".cache" / "polygym-tests")) / "nemo-gym"


def env_cache() -> Path:
    """Where the tests keep NeMo Gym's environments (``polygym.stack.env_build``'s cache)."""
    return cache_dir().parent / "envs"


def nemo_gym_wheel() -> Path:
    """NeMo Gym's wheel from the test cache, downloaded with pip the first time."""
    cache = cache_dir()
    pattern = f"nemo_gym-{NEMO_GYM_VERSION}-*.whl"
    if not list(cache.glob(pattern)):
        cache.mkdir(parents=True, exist_ok=True)
        download = [
            *(sys.executable, "-m", "pip", "download", f"nemo-gym=={NEMO_GYM_VERSION}", "--no-deps"),
            *("--python-version", "3.13.14", "--only-binary=:all:", "--dest", str(cache)),
        ]
        done = subprocess.run(download, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"pip download nemo-gym=={NEMO_GYM_VERSION} failed:\n{done.stderr}"
    return sorted(cache.glob(pattern))[-1]


def nemo_gym_tree() -> Path:
    """The wheel unpacked once next to it (NeMo Gym's folders: resources_servers/, ...)."""
    root = cache_dir() / f"unpacked-{NEMO_GYM_VERSION}"
    if not (root / "resources_servers").is_dir():
        with zipfile.ZipFile(nemo_gym_wheel()) as archive:
            archive.extractall(root)
    return root
