"""Limiting a whole submission, not each of its processes: memory, process count, and the final kill.

RLIMIT_AS and RLIMIT_NPROC are per process (or per uid), so a submission that forks N children gets
N times ``memory_mb``. Here the unit is the submission's whole process tree:

- ``cgroup``: one control group per run, created by the server, that the trusted runner joins as
  its very first act (before any submission code exists in it), so every descendant is inside. The
  kernel enforces the memory limit (OOM kill inside the group) and the process limit (``fork``
  fails); the server reads the group's event counters afterwards to say which limit was hit, and
  kills every member at the end. cgroup v2 is used where the server's own group delegates the
  ``memory`` and ``pids`` controllers; otherwise the v1 ``memory`` and ``pids`` hierarchies.
- ``process_tree``: where no cgroup is writable, the server polls the runner's descendants every
  ``POLL_S`` (the runner is a child subreaper, so orphans that ``setsid`` or double-fork stay in
  its tree), sums their memory (proportional set size, so pages a fork shares count once), counts
  them, and kills the tree on excess. A burst that starts and ends between two polls is not seen;
  that is why cgroups are preferred.

Both record why they killed (``memory_limit`` or ``pids_limit``), which scores the run 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import psutil

Enforcement = Literal["auto", "cgroup", "process_tree"]
POLL_S = 0.02
KILL_ROUNDS = 50
_SEQUENCE = itertools.count()


@dataclass(frozen=True)
class CgroupLayout:
    """Where per-run groups are made: one directory (v2) or one per controller (v1)."""

    version: int
    memory_parent: Path
    pids_parent: Path


def _own_cgroups() -> dict[str, str]:
    """Controller (or "" for v2) -> this process's group path, from /proc/self/cgroup."""
    found: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                found[name] = path
    return found


def _mounts() -> dict[str, Path]:
    """ "cgroup2" or a v1 controller name -> its mount point, from /proc/self/mountinfo."""
    found: dict[str, Path] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fstype, _, options = [*right.split(" "), "", ""][:3]
            point = Path(left.split(" ")[4])
            if fstype == "cgroup2":
                found.setdefault("cgroup2", point)
            elif fstype == "cgroup":
                for option in options.split(","):
                    if option in ("memory", "pids"):
                        found.setdefault(option, point)
    return found


def _writable(path: Path) -> bool:
    """Can a child group be made here? Tried for real: permission bits lie under user namespaces."""
    probe = path / f"polygym-probe-{os.getpid()}-{next(_SEQUENCE)}"
    try:
        probe.mkdir()
    except OSError:
        return False
    with contextlib.suppress(OSError):
        probe.rmdir()
    return True


def find_cgroups() -> CgroupLayout | None:
    """The hierarchy per-run groups can be made in, or None when no cgroup is writable here."""
    own, mounts = _own_cgroups(), _mounts()
    if "cgroup2" in mounts and "" in own:
        base = mounts["cgroup2"] / own[""].lstrip("/")
        with contextlib.suppress(OSError):
            delegated = (base / "cgroup.subtree_control").read_text().split()
            if {"memory", "pids"} <= set(delegated) and _writable(base):
                return CgroupLayout(2, base, base)
    if "memory" in mounts and "pids" in mounts:
        memory = mounts["memory"] / own.get("memory", "/").lstrip("/")
        pids = mounts["pids"] / own.get("pids", "/").lstrip("/")
        if _writable(memory) and _writable(pids):
            return CgroupLayout(1, memory, pids)
    return None


@dataclass
class Contained:
    """One run's limits as they are enforced; ``verdict`` says which one was exceeded, if any."""

    memory_bytes: int
    max_processes: int
    verdict: str | None = None
    join_files: list[str] = field(default_factory=list)

    async def watch(self, root_pid: int) -> None:
        """Runs while the submission does; kills it on excess (only process_tree needs to)."""

    def read_verdict(self) -> None:
        """After the run: record a limit the kernel enforced (only cgroups need to)."""

    async def kill(self, root_pid: int) -> None:
        """Kill every process of the submission, including those that left its process group.

        Only while the runner (``root_pid``) is not yet reaped: a reaped pid may be reused.
        """
        await _kill_tree(root_pid)
        await self.sweep()

    async def sweep(self) -> None:
        """Kill what is left once the runner is gone (only a cgroup still knows who that is)."""

    async def close(self) -> None:
        """Release what the run held."""


async def _kill_tree(root_pid: int) -> None:
    """Stop the whole tree (so nothing forks or re-parents meanwhile), then SIGKILL it.

    Killing the root first would hand its children to init, out of reach; stopped processes
    cannot fork, so a few rounds see the tree whole.
    """
    seen: set[int] = set()
    for _ in range(KILL_ROUNDS):
        members = set(_tree(root_pid))
        if members <= seen:
            break
        for pid in members - seen:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        seen |= members
    for pid in seen:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _tree(root_pid: int) -> list[int]:
    try:
        root = psutil.Process(root_pid)
        return [root_pid, *(child.pid for child in root.children(recursive=True))]
    except psutil.Error:
        return []


class ProcessTree(Contained):
    """Polls the runner's descendants: resident memory summed, processes counted."""

    async def watch(self, root_pid: int) -> None:
        while self.verdict is None:
            rss, count = _usage(root_pid)
            if count == 0:
                return
            if rss > self.memory_bytes and _proportional_memory(root_pid) > self.memory_bytes:
                self.verdict = "memory_limit"
            elif count > self.max_processes:
                self.verdict = "pids_limit"
            else:
                await asyncio.sleep(POLL_S)
                continue
            await self.kill(root_pid)


def _usage(root_pid: int) -> tuple[int, int]:
    """Resident bytes summed over the tree, and its size: cheap, but counts shared pages once per
    process (forked children share their parent's), so an excess is confirmed by PSS."""
    total, count = 0, 0
    for pid in _tree(root_pid):
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(pid).memory_info().rss
            count += 1
    return total, count


def _proportional_memory(root_pid: int) -> int:
    """PSS summed over the tree: each shared page split among its sharers (smaps, ~0.25 ms/process)."""
    total = 0
    for pid in _tree(root_pid):
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(pid).memory_full_info().pss
    return total


class Cgroup(Contained):
    """A fresh group per run with the memory and process limits written before anything joins."""

    def __init__(self, layout: CgroupLayout, memory_bytes: int, max_processes: int) -> None:
        super().__init__(memory_bytes, max_processes)
        self.layout = layout
        name = f"polygym-{os.getpid()}-{next(_SEQUENCE)}"
        self.memory_dir = layout.memory_parent / name
        self.pids_dir = layout.pids_parent / name
        self.dirs = sorted({self.memory_dir, self.pids_dir})
        for path in self.dirs:
            path.mkdir()
        if layout.version == 2:
            (self.memory_dir / "memory.max").write_text(str(memory_bytes))
            with contextlib.suppress(OSError):
                (self.memory_dir / "memory.swap.max").write_text("0")
        else:
            (self.memory_dir / "memory.limit_in_bytes").write_text(str(memory_bytes))
            with contextlib.suppress(OSError):
                (self.memory_dir / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
        (self.pids_dir / "pids.max").write_text(str(max_processes))
        self.join_files = [str(path / "cgroup.procs") for path in self.dirs]

    def read_verdict(self) -> None:
        if self.verdict is None and _counter(self._memory_events(), "oom_kill") > 0:
            self.verdict = "memory_limit"
        if self.verdict is None and _counter(self.pids_dir / "pids.events", "max") > 0:
            self.verdict = "pids_limit"

    def _memory_events(self) -> Path:
        return self.memory_dir / ("memory.events" if self.layout.version == 2 else "memory.oom_control")

    def _members(self) -> set[int]:
        pids: set[int] = set()
        for path in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in (path / "cgroup.procs").read_text().split())
        return pids

    async def sweep(self) -> None:
        """Every member, wherever it moved in the process tree; the group holds them all."""
        kill_file = self.memory_dir / "cgroup.kill"
        if self.layout.version == 2 and kill_file.exists():
            with contextlib.suppress(OSError):
                kill_file.write_text("1")
        for _ in range(KILL_ROUNDS):
            members = self._members()
            if not members:
                return
            for pid in members:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(POLL_S)

    async def close(self) -> None:
        """Remove the groups once empty (a killed process leaves its group only when reaped)."""
        deadline = time.monotonic() + 5
        for path in self.dirs:
            while True:
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    await asyncio.sleep(POLL_S)


def _counter(path: Path, key: str) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return 0


class Containment:
    """Chooses the enforcement once, at startup, and makes one ``Contained`` per run."""

    def __init__(self, wanted: Enforcement) -> None:
        self.layout = find_cgroups() if wanted != "process_tree" else None
        if wanted == "cgroup" and self.layout is None:
            raise ContainmentError(
                "enforcement: cgroup needs a writable cgroup (v2 with the memory and pids controllers "
                "delegated to this process's group, or the v1 memory and pids hierarchies); none is "
                "writable here. Set enforcement: process_tree (or auto) to poll the process tree instead"
            )
        self.enforcement: str = "cgroup" if self.layout is not None else "process_tree"

    def describe(self) -> str:
        return f"cgroup v{self.layout.version}" if self.layout is not None else "process_tree"

    def new_run(self, memory_bytes: int, max_processes: int) -> Contained:
        if self.layout is not None:
            return Cgroup(self.layout, memory_bytes, max_processes)
        return ProcessTree(memory_bytes, max_processes)


class ContainmentError(RuntimeError):
    """The enforcement asked for cannot be had on this machine."""
