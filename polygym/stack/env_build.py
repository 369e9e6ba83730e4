"""The Python environments NeMo Gym servers run in, built once per set of inputs and cached.

A NeMo Gym server folder runs in a virtual environment of its own holding ``nemo-gym`` and the
folder's ``requirements.txt`` (NeMo Gym's own ``ng_run`` does the same with uv). Building one
takes minutes (nemo-gym pulls Ray, MLflow, ...), so an environment is kept under a cache
directory keyed on everything that decides its contents: the interpreter and its version, the
nemo-gym package (a wheel by content hash, else the requirement text) and the requirement
lines. Change any of them and a new environment is built; servers whose inputs match share one.

An environment with requirements of its own starts as a copy of the one with nemo-gym alone.
Each is built at its final path (a venv's ``bin/pip``, console scripts and ``activate`` name their
folder by absolute path, so a build renamed into place would leave them pointing at a deleted
folder; a copy has those paths rewritten). A failed build is never reused: the ready marker is
written last, a folder without it is removed before the next build, and a build that fails
removes its folder. A lock file per key keeps two stacks that start together from building the
same environment twice.

Every environment holds ``uv`` (NeMo Gym's servers call it: its ``ng_run`` builds with uv and
some servers install tools at start), and installs are made with uv when one is at hand (the base
environment's own, or one on PATH). An interpreter older than nemo-gym declares gets pip's
``--ignore-requires-python``, or with uv its ``--python-version`` at nemo-gym's floor.

Cache root: ``POLYGYM_ENV_CACHE``, else ``~/.cache/polygym/envs``. Its size is bounded after each
build, and a stack holds the environments it runs so that they are never removed under it
(``stack.env_cache``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import ClassVar

from polygym.errors import ConfigError, ProblemsError
from polygym.stack.env_cache import (
    MAX_SIZE_ENV_VAR,
    READY_MARKER,
    Lease,
    configured_max_size,
    exclusive,
    format_size,
    lease_ready,
    prune,
)

CACHE_ENV_VAR = "POLYGYM_ENV_CACHE"
PYTHON_ENV_VAR = "POLYGYM_NEMO_GYM_PYTHON"
PYTHON_KEY = "nemo_gym_python"
"""Config key (a path, a command or a version such as ``3.13``) choosing the servers' interpreter."""
PACKAGE_KEY = "nemo_gym_package"
"""Config key: what pip installs as nemo-gym (a requirement such as ``nemo-gym==0.7.0``, or a wheel path)."""
PIP_TAIL_LINES = 30
BUILD_TIMEOUT_S = 3600.0
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


class EnvBuildError(ProblemsError):
    """Building an environment failed (pip's tail is included). A missing or unusable interpreter
    is a ``ConfigError`` instead (exit 2): it names the option that chooses one."""

    exit_code: ClassVar[int] = 1


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV_VAR) or Path.home() / ".cache" / "polygym" / "envs")


def python_version(python: Path) -> tuple[int, int, int] | None:
    """``(major, minor, micro)`` of an interpreter, or None when it does not run."""
    try:
        done = subprocess.run(
            [str(python), "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = _VERSION.fullmatch(done.stdout.strip()) if done.returncode == 0 else None
    return (int(match[1]), int(match[2]), int(match[3] or 0)) if match else None


def _candidates() -> Iterator[Path]:
    """Interpreters worth trying, newest first: ``python3.1x`` on PATH, then pyenv's versions."""
    for minor in (14, 13, 12):
        found = shutil.which(f"python3.{minor}")
        if found:
            yield Path(found)
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    if pyenv.is_dir():
        for folder in sorted(pyenv.iterdir(), key=lambda p: _sort_key(p.name), reverse=True):
            if _VERSION.match(folder.name) and (folder / "bin" / "python").is_file():
                yield folder / "bin" / "python"


def _sort_key(text: str) -> tuple[int, ...]:
    match = _VERSION.match(text)
    return (int(match[1]), int(match[2]), int(match[3] or 0)) if match else (0,)


def satisfies(version: tuple[int, int, int], requires_python: str) -> bool:
    """Whether ``version`` meets a ``Requires-Python`` specifier (``>=3.13.14``, ``>=3.12,<3.14``)."""
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(requires_python).contains(".".join(map(str, version)))


@dataclass(frozen=True)
class Interpreter:
    path: Path
    version: tuple[int, int, int]
    ignore_requires_python: bool
    """True when the interpreter is older than nemo-gym declares: pip is then told to install anyway."""

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))


def find_python(requested: str | None, requires_python: str | None) -> Interpreter:
    """The interpreter NeMo Gym servers get.

    ``requested`` (config ``nemo_gym_python``, else ``POLYGYM_NEMO_GYM_PYTHON``) is a path, a command
    on PATH, or a version (``3.13`` picks the newest 3.13 found). Without one, the newest Python
    3.12+ that meets nemo-gym's ``Requires-Python`` is chosen, else the newest 3.12+ found, with
    pip's ``--ignore-requires-python`` (nemo-gym 0.5+ declares 3.13.14, which few machines have;
    0.7.0 is tested here on 3.13.0 that way).
    """
    requested = requested or os.environ.get(PYTHON_ENV_VAR) or None
    if requested:
        return _requested(requested, requires_python)
    found = [
        (path, version)
        for path in _candidates()
        if (version := python_version(path)) and version >= (3, 12, 0)
    ]
    if not found:
        raise ConfigError(
            [
                "no Python 3.12+ found for NeMo Gym servers (looked for python3.12-3.14 on PATH and in "
                f"~/.pyenv/versions): install one, or name it with {PYTHON_KEY}: PATH in the config, "
                f"--nemo-gym-python PATH or {PYTHON_ENV_VAR}"
                + (f" (nemo-gym declares Requires-Python {requires_python})" if requires_python else "")
            ]
        )
    for path, version in found:
        if requires_python is None or satisfies(version, requires_python):
            return Interpreter(path, version, False)
    path, version = max(found, key=lambda item: item[1])
    return Interpreter(path, version, True)


def _requested(requested: str, requires_python: str | None) -> Interpreter:
    path: Path | None
    if _VERSION.fullmatch(requested):
        path = next((p for p in _candidates() if (v := python_version(p)) and _matches(v, requested)), None)
    else:
        which = shutil.which(requested)
        path = (
            Path(which)
            if which
            else (Path(requested).expanduser() if Path(requested).expanduser().is_file() else None)
        )
    version = python_version(path) if path is not None else None
    if path is None or version is None:
        raise ConfigError(
            [
                f"{PYTHON_KEY} / --nemo-gym-python / {PYTHON_ENV_VAR} '{requested}': no such Python "
                "(give a path, a command on PATH, or a version such as 3.13)"
            ]
        )
    ignore = requires_python is not None and not satisfies(version, requires_python)
    return Interpreter(path, version, ignore)


def _matches(version: tuple[int, int, int], wanted: str) -> bool:
    parts = tuple(int(p) for p in wanted.split("."))
    return version[: len(parts)] == parts


@dataclass(frozen=True)
class EnvInputs:
    """Everything that decides an environment's contents; its hash is the cache key."""

    python: str
    python_version: str
    ignore_requires_python: bool
    nemo_gym: str
    """What pip installs as nemo-gym: a wheel path, a checkout path or a requirement (``nemo-gym==0.7.0``)."""
    nemo_gym_digest: str
    requirements: tuple[str, ...]
    layout: str = "in-place+uv"
    """How environments are built; a change here must not reuse environments built the old way
    (renamed into place, without uv)."""
    overrides: tuple[str, ...] = ()
    """NeMo Gym's ``overrides.txt`` beside a ``requirements.txt``: versions that win over what any
    package declares (uv's ``--override``, as ``ng_run`` installs them)."""

    def key(self) -> str:
        data = asdict(self)
        if not self.overrides:  # environments built before overrides were read keep their key
            del data["overrides"]
        text = json.dumps(data, sort_keys=True)
        return f"py{self.python_version}-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def venv_python(env: Path) -> Path:
    return env / "bin" / "python"


LEASE_TRIES = 3
"""Builds one lease may start: each is undone only by a prune removing the environment between
its build and the lease, so a third is a prune running in a loop."""


def lease_env(inputs: EnvInputs, announce: bool = True) -> Lease:
    """The ready environment for ``inputs``, held in use until the lease is closed (a prune leaves
    it alone), built first when the cache has none; after a build, the cache is brought within
    its bound (``env_cache.configured_max_size``), least recently used environments first."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    final = root / inputs.key()
    bound = _bound()  # a bad setting is said before a build of minutes, not after
    built = False
    for _ in range(LEASE_TRIES):
        lease = lease_ready(final)
        if lease is not None:
            if built and bound is not None:
                try:
                    _keep_within(root, bound)
                except BaseException:
                    lease.close()
                    raise
            return lease
        built = _build_unless_ready(final, inputs, announce) or built
    raise EnvBuildError([f"the NeMo Gym environment {final} was removed {LEASE_TRIES} times as it was built"])


def ensure_env(inputs: EnvInputs, announce: bool = True) -> Path:
    """The ready environment for ``inputs``, not held: for a caller that runs it at once and never
    prunes (a stack holds its environments with :func:`lease_env`)."""
    with lease_env(inputs, announce) as lease:
        return lease.path


def _build_unless_ready(final: Path, inputs: EnvInputs, announce: bool) -> bool:
    """Build ``final`` under its lock unless another process has (True when this one built it)."""
    with exclusive(final):
        if (final / READY_MARKER).is_file():  # another process built it while we waited
            return False
        # not ready: a killed builder's, or an older polygym's temporary build folders; we hold the lock
        for stale in [final, *final.parent.glob(f".build-{inputs.key()}-*")]:
            shutil.rmtree(stale, ignore_errors=True)
        if announce:
            print(
                f"building the NeMo Gym environment {final.name} (Python {inputs.python_version}, "
                f"{inputs.nemo_gym}); this takes minutes once, then it is cached in {final.parent}",
                file=sys.stderr,
                flush=True,
            )
        try:
            final.mkdir()
            _build(final, inputs)
        except BaseException:
            shutil.rmtree(final, ignore_errors=True)
            raise
    return True


def _bound() -> int | None:
    try:
        return configured_max_size()
    except ValueError as exc:
        raise ConfigError([str(exc)]) from None


def _keep_within(root: Path, bound: int) -> None:
    """Remove the least recently used environments past ``bound``, each named on stderr."""
    for env in prune(root, keep_last=None, max_size=bound).removed:
        print(
            f"removed the least recently used NeMo Gym environment {env.describe()} to keep {root} "
            f"within {format_size(bound)} ({MAX_SIZE_ENV_VAR}; gym env prune)",
            file=sys.stderr,
            flush=True,
        )


UV_REQUIREMENT = "uv>=0.8"
"""Installed into every environment: NeMo Gym's servers expect ``uv`` beside their Python."""


def _build(work: Path, inputs: EnvInputs) -> None:
    """A venv with nemo-gym, uv and the requirements, at ``work`` (its final path).

    With requirements of its own, the environment starts as a copy of the one with nemo-gym alone
    (built first when missing, and shared by every server that needs nothing more): copying takes
    seconds where installing nemo-gym's ~300 packages takes minutes. The one install that follows
    names nemo-gym and the requirements together, so they resolve together as in NeMo Gym.
    """
    log = work / "build.log"
    if inputs.requirements:
        with lease_env(replace(inputs, requirements=(), overrides=()), announce=False) as base:
            shutil.copytree(base.path, work, symlinks=True, dirs_exist_ok=True)
        (work / READY_MARKER).unlink()
        relocate_scripts(work, base.path)
    else:
        _run([inputs.python, "-m", "venv", str(work)], log, "python -m venv")
    requirements = work / "requirements.txt"
    requirements.write_text("\n".join([*inputs.requirements, UV_REQUIREMENT]) + "\n")
    install, what = installer(work, inputs)
    _run([*install, *_override_args(work, inputs, what), inputs.nemo_gym, "-r", str(requirements)], log, what)
    (work / READY_MARKER).write_text(json.dumps(asdict(inputs), indent=2))


def installer(env: Path, inputs: EnvInputs) -> tuple[list[str], str]:
    """The install command for ``env`` and its name: uv (the environment's own, else one on PATH)
    when there is one, else pip. An interpreter older than nemo-gym declares (pip's
    ``--ignore-requires-python``) gets uv's ``--python-version`` at nemo-gym's floor instead, when
    that floor is known and of the same minor version (so the same wheels fit)."""
    own = env / "bin" / "uv"
    uv = str(own) if own.is_file() else shutil.which("uv")
    floor = _same_minor_floor(inputs) if inputs.ignore_requires_python else None
    if uv is not None and (floor is not None or not inputs.ignore_requires_python):
        install = [uv, "pip", "install", "--python", str(venv_python(env))]
        return [*install, *(["--python-version", floor] if floor else [])], "uv pip install"
    pip = [str(venv_python(env)), "-m", "pip", "install", "--disable-pip-version-check"]
    if inputs.ignore_requires_python:
        pip.append("--ignore-requires-python")
    return pip, "pip install"


def _override_args(work: Path, inputs: EnvInputs, what: str) -> list[str]:
    """uv's ``--override`` with the folder's overrides; pip has none, and gets them as constraints
    (a version no package's declaration allows then fails the install instead of winning)."""
    if not inputs.overrides:
        return []
    path = work / "overrides.txt"
    path.write_text("\n".join(inputs.overrides) + "\n")
    return ["--override" if what.startswith("uv") else "-c", str(path)]


def _same_minor_floor(inputs: EnvInputs) -> str | None:
    """nemo-gym's ``Requires-Python`` lower bound (from its wheel), when it has the interpreter's minor."""
    try:
        with zipfile.ZipFile(inputs.nemo_gym) as wheel:
            name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
            text = wheel.read(name).decode(errors="replace")
    except (OSError, zipfile.BadZipFile, StopIteration):
        return None
    match = re.search(r"^Requires-Python:\s*>=\s*(\d+\.\d+(?:\.\d+)?)\s*$", text, re.MULTILINE)
    if match is None or _sort_key(match[1])[:2] != _sort_key(inputs.python_version)[:2]:
        return None
    return match[1]


def relocate_scripts(env: Path, copied_from: Path) -> None:
    """Point a copied venv's scripts (``bin/pip``, console scripts' shebangs, ``activate`` and its
    prompt) at ``env`` instead of the folder they were copied from, so they run after the copy."""
    renames = [(str(copied_from).encode(), str(env).encode()), (copied_from.name.encode(), env.name.encode())]
    for script in (env / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        data = script.read_bytes()
        moved = data
        for old, new in renames:
            moved = moved.replace(old, new)
        if moved != data:
            script.write_bytes(moved)


def _run(command: list[str], log: Path, what: str) -> None:
    with log.open("ab") as out:
        try:
            done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise EnvBuildError([f"{what} ran past {BUILD_TIMEOUT_S:g}s; log tail:\n{_tail(log)}"]) from None
    if done.returncode != 0:
        raise EnvBuildError(
            [f"building the NeMo Gym environment failed: {what} exited {done.returncode}:\n{_tail(log)}"]
        )


def _tail(log: Path) -> str:
    lines = log.read_text(errors="replace").splitlines()
    useful = [line for line in lines if not line.startswith("WARNING: Location ")]
    return "\n".join(f"    {line}" for line in useful[-PIP_TAIL_LINES:])
