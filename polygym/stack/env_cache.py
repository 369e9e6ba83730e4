"""The cache of NeMo Gym environments: which are in use, and removing the least recently used.

Each environment ``stack.env_build`` builds is ~1.4 GB (nemo-gym pulls Ray, MLflow, ...), one per
distinct set of requirements, so a run over many NeMo Gym folders fills a disk (a catalogue run
stopped at 70 GB) unless something removes the environments not used lately. Two things do:
``gym env prune`` on demand, and a bound checked after every build (``POLYGYM_ENV_CACHE_MAX_SIZE``,
:data:`DEFAULT_MAX_SIZE` when unset), both through :func:`prune`.

The layout: ``<root>/<key>/`` is an environment, ready once its ``READY_MARKER`` exists (written
last by the builder), and ``<root>/<key>.lock`` its lock file. Who holds what:

* a builder holds the lock exclusively while it builds;
* a user holds it shared (a :class:`Lease`) for as long as it uses the environment: a stack for
  its whole life, and each NeMo Gym server it starts inherits the lock, so a server left running
  by a killed stack still holds it;
* removal takes it exclusively *without waiting*, so an environment being built or used is never
  removed; a process whose command line or working directory is inside an environment (started
  from it by anything, an older polygym included) keeps it too.

Recency is the ready marker's modification time, touched by every lease. Lock files are never
removed: a process waiting on one that was unlinked would hold a lock nobody else sees.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Self

import psutil

from polygym.settings import cli

READY_MARKER = "polygym-env.json"
MAX_SIZE_ENV_VAR = "POLYGYM_ENV_CACHE_MAX_SIZE"
DEFAULT_MAX_SIZE = "40GB"
"""The bound after each build when ``POLYGYM_ENV_CACHE_MAX_SIZE`` is unset: about 28 environments
of NeMo Gym 0.7.0 (1.3-1.7 GB each), and room left on a disk that a catalogue run filled at 70 GB."""
NO_BOUND = "none"
_KEY = re.compile(r"py[\d.]+-[0-9a-f]{16}")
_LEFTOVER = re.compile(rf"\.build-({_KEY.pattern})-.+")
"""A temporary build folder of an older polygym (built elsewhere, then renamed into place)."""
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([kmgt])(i)?)?b?", re.IGNORECASE)
_UNITS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_size(text: str) -> int:
    """Bytes from ``20GB``, ``1.5 GiB``, ``500M`` or ``1000000`` (decimal units, binary with ``i``)."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"'{text}' is not a size (give one such as 20GB, 500MB or 1.5GiB)")
    number, unit, binary = match[1], (match[2] or "").lower(), match[3]
    return int(float(number) * (1024 if binary else 1000) ** _UNITS[unit])


def format_size(size: int) -> str:
    """``1.4 GB``: decimal units, as :func:`parse_size` reads them."""
    value, unit = float(size), "B"
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            break
        value /= 1000
    return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"


def configured_max_size() -> int | None:
    """The bound checked after each build: ``POLYGYM_ENV_CACHE_MAX_SIZE`` (``none`` for no bound),
    else :data:`DEFAULT_MAX_SIZE`. A value that is not a size raises ``ValueError`` naming it."""
    text = os.environ.get(MAX_SIZE_ENV_VAR) or DEFAULT_MAX_SIZE
    if text.strip().lower() == NO_BOUND:
        return None
    try:
        return parse_size(text)
    except ValueError as exc:
        raise ValueError(f"{MAX_SIZE_ENV_VAR}: {exc}, or '{NO_BOUND}'") from None


@dataclass(frozen=True)
class PruneSettings:
    """What ``gym env prune`` removes, each setting declared once (``polygym.settings``). Both bounds
    are upper bounds: with both, what is kept satisfies both. With neither, the configured bound."""

    keep_last: int | None = field(
        default=None,
        metadata=cli("Keep the N most recently used environments; remove the others.", metavar="N", min=0),
    )
    max_size: int | None = field(
        default=None,
        metadata=cli(
            "Remove the least recently used environments until the cache holds at most SIZE "
            f"(20GB, 500MB, 1.5GiB) [default, when --keep-last is not given either: "
            f"{MAX_SIZE_ENV_VAR}, else {DEFAULT_MAX_SIZE}, the bound checked after each build].",
            metavar="SIZE",
            parse=parse_size,
        ),
    )
    dry_run: bool = field(
        default=False,
        metadata=cli("Print what would be removed and the bytes it would free; remove nothing."),
    )


def lock_path(env: Path) -> Path:
    """The lock file of the environment at ``env`` (beside it, ``<key>.lock``)."""
    return env.parent / f"{env.name}.lock"


class Lease:
    """A ready environment held in use: a shared lock on its lock file until :meth:`close`.

    A child process given :meth:`fileno` (``pass_fds``) shares the lock: the environment stays in
    use until both have let go of it."""

    def __init__(self, path: Path, handle: IO[str]) -> None:
        self.path = path
        self._handle = handle

    def fileno(self) -> int:
        return self._handle.fileno()

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def lease_ready(env: Path) -> Lease | None:
    """A lease on ``env`` when it is ready (waiting for a builder or a removal under way to end),
    its recency touched; None when it is not ready (never built, or removed)."""
    handle = lock_path(env).open("a")
    try:
        fcntl.flock(handle, fcntl.LOCK_SH)
        marker = env / READY_MARKER
        if not marker.is_file():
            handle.close()
            return None
        with contextlib.suppress(OSError):  # a cache on a read-only mount is still usable
            os.utime(marker)
    except BaseException:
        handle.close()
        raise
    return Lease(env, handle)


@contextlib.contextmanager
def exclusive(env: Path) -> Iterator[None]:
    """Hold ``env``'s lock alone, waiting for it (a builder)."""
    with lock_path(env).open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def exclusive_now(env: Path) -> Iterator[bool]:
    """Try to hold ``env``'s lock alone without waiting: yields False when someone builds or uses it."""
    with lock_path(env).open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
        else:
            yield True


@dataclass(frozen=True)
class CachedEnv:
    """One folder of the cache as found: an environment (ready or not) or an older build's leftover."""

    path: Path
    key: str
    ready: bool
    last_used: float
    size: int
    requirements: tuple[str, ...]

    def describe(self) -> str:
        """``py3.13.0-<hash> (1.4 GB, last used 2026-12-06 04:53; 3 requirements: a, b, ...)``."""
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.last_used))
        if not self.ready:
            what = "an unfinished build"
        elif self.requirements:
            shown = ", ".join(self.requirements[:2]) + (", ..." if len(self.requirements) > 2 else "")
            what = f"{len(self.requirements)} requirements: {shown}"
        else:
            what = "nemo-gym alone"
        return f"{self.path.name} ({format_size(self.size)}, last used {when}; {what})"


def disk_usage(path: Path) -> int:
    """Bytes that removing ``path`` frees on disk. A file linked from outside it stays (uv links the
    packages it installs from its own cache: ~0.3 of a 1.7 GB environment), so it is not counted;
    a file linked twice inside it is counted once."""
    links: dict[tuple[int, int], list[int]] = {}  # inode -> [links seen here, blocks, links in all]
    total, folders = 0, [path]
    while folders:
        with contextlib.suppress(OSError), os.scandir(folders.pop()) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    stat = entry.stat(follow_symlinks=False)
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(Path(entry.path))
                        total += stat.st_blocks * 512
                        continue
                    seen = links.setdefault(
                        (stat.st_dev, stat.st_ino), [0, stat.st_blocks * 512, stat.st_nlink]
                    )
                    seen[0] += 1
    return total + sum(blocks for here, blocks, everywhere in links.values() if here >= everywhere)


def scan(root: Path) -> list[CachedEnv]:
    """Every environment folder under ``root`` and older builds' leftovers; other files are not ours."""
    found = []
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        leftover = _LEFTOVER.fullmatch(path.name)
        if not path.is_dir() or not (_KEY.fullmatch(path.name) or leftover):
            continue
        marker = path / READY_MARKER
        ready = leftover is None and marker.is_file()
        stamp = (marker if ready else path).stat().st_mtime
        key = leftover[1] if leftover else path.name
        found.append(CachedEnv(path, key, ready, stamp, disk_usage(path), _requirements(marker)))
    return found


def _requirements(marker: Path) -> tuple[str, ...]:
    try:
        listed = json.loads(marker.read_text()).get("requirements", [])
    except (OSError, ValueError, AttributeError):
        return ()
    lines = (str(line).split("#", 1)[0].strip() for line in listed) if isinstance(listed, list) else ()
    return tuple(line for line in lines if line)


def users(root: Path) -> dict[str, int]:
    """Environment folder name -> a process whose command line or working directory is inside it."""
    prefixes = {f"{root}{os.sep}", f"{root.resolve()}{os.sep}"}
    found: dict[str, int] = {}
    for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
        paths = [*(proc.info["cmdline"] or []), proc.info["cwd"] or ""]
        for path in paths:
            prefix = next((p for p in prefixes if path.startswith(p)), None)
            if prefix is not None:
                found.setdefault(path[len(prefix) :].split(os.sep, 1)[0], proc.info["pid"])
    return found


@dataclass
class PruneReport:
    """What a prune found, removed (or would remove, in a dry run) and left because it was in use."""

    root: Path
    found: list[CachedEnv]
    """Least recently used first: the order environments are removed in."""
    removed: list[CachedEnv] = field(default_factory=list)
    kept: list[tuple[CachedEnv, str]] = field(default_factory=list)
    """Environments the bounds wanted removed that stay, and why (in use, being built)."""

    @property
    def freed(self) -> int:
        return sum(env.size for env in self.removed)

    @property
    def size_before(self) -> int:
        return sum(env.size for env in self.found)


def prune(root: Path, keep_last: int | None, max_size: int | None, dry_run: bool = False) -> PruneReport:
    """Remove unfinished builds nobody is building, then the least recently used environments:
    every one past the ``keep_last`` most recent, and the oldest until the rest fits ``max_size``.
    One in use is passed over (the next oldest goes instead); see the module's docstring."""
    report = PruneReport(root, sorted(scan(root), key=lambda env: env.last_used))
    ready = [e for e in report.found if e.ready]
    recent = {e.path for e in ready[max(0, len(ready) - keep_last) :]} if keep_last is not None else None
    oldest_first = [e for e in report.found if not e.ready] + ready
    running: dict[str, int] | None = None  # looked up once something may have to go
    total = report.size_before
    for env in oldest_first:
        over = max_size is not None and total > max_size
        if env.ready and not over and (recent is None or env.path in recent):
            continue
        running = users(root) if running is None else running
        reason = _kept_because(env, running, dry_run)
        if reason is not None:
            report.kept.append((env, reason))
            continue
        report.removed.append(env)
        total -= env.size
    return report


def _kept_because(env: CachedEnv, running: dict[str, int], dry_run: bool) -> str | None:
    """Why ``env`` stays (None: nothing keeps it, and unless ``dry_run`` it is removed here, under
    its lock)."""
    if env.path.name in running:
        return f"in use: pid {running[env.path.name]} runs from it"
    with exclusive_now(env.path.parent / env.key) as alone:
        if not alone:
            return "in use by a stack" if env.ready else "being built"
        if dry_run:
            return None
        try:
            # unready first: a user waiting for the lock finds it gone and builds it anew
            (env.path / READY_MARKER).unlink(missing_ok=True)
            shutil.rmtree(env.path)
        except OSError as exc:
            return f"not removed: {exc}"
    return None
