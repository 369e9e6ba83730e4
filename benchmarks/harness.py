"""Shared pieces of the benchmarks: processes, CPU and memory accounting, tables and JSON.

Every benchmark measures whole-stack cost: CPU seconds and RSS are summed over every process
involved (the benchmark's own process, each `gym env start` launcher and its server children, the
stand-in model endpoint), sampled from /proc through psutil.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

import polygym

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
TESTED = Path(polygym.__file__).resolve().parent.parent
"""The checkout of the polygym this process imported, which ``PYTHONPATH`` may take from another
folder than the one holding ``benchmarks/``. The processes a benchmark starts run from it:
``python -m`` puts the working folder first on ``sys.path``, so a stack started from ``ROOT`` ran
``ROOT``'s polygym whatever ``PYTHONPATH`` said, and a comparison of two checkouts measured one
stack twice."""


def tree(pids: Iterable[int]) -> list[psutil.Process]:
    """The processes and all their descendants (alive now)."""
    seen: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            proc = psutil.Process(pid)
        except psutil.NoSuchProcess:
            continue
        for p in [proc, *proc.children(recursive=True)]:
            seen[p.pid] = p
    return list(seen.values())


def cpu_seconds(pids: Iterable[int]) -> float:
    total = 0.0
    for proc in tree(pids):
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return total


def rss_bytes(pids: Iterable[int]) -> int:
    return _rss_of(tree(pids))


def _rss_of(procs: Iterable[psutil.Process]) -> int:
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


@dataclass
class MemorySampler:
    """Samples summed RSS of a process tree in a thread; keeps the peak and a time series.

    The tree is looked up again only every ``rescan_s``: finding children walks all of /proc, and
    at every sample that walk cost 6% of the measured process's CPU (py-spy, throughput.py at
    c=1,024), charged to the stack being measured. A process that starts between two scans is
    counted from the next scan; the stacks measured here start their processes before a cell.
    """

    pids: list[int]
    interval_s: float = 0.2
    rescan_s: float = 2.0
    peak: int = 0
    series: list[tuple[float, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> MemorySampler:
        self._began = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        procs: list[psutil.Process] = []
        scanned = -self.rescan_s
        while not self._stop.is_set():
            now = time.monotonic()
            if now - scanned >= self.rescan_s:
                procs, scanned = tree(self.pids), now
            value = _rss_of(procs)
            self.peak = max(self.peak, value)
            self.series.append((round(now - self._began, 2), value))
            self._stop.wait(self.interval_s)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


class GymStack:
    """A `gym env start` process; ready when its stack record appears (polled, not slept)."""

    def __init__(self, args: list[str], state_dir: Path, timeout_s: float = 60.0) -> None:
        self.state_dir = state_dir
        env = {**os.environ, "POLYGYM_STATE_DIR": str(state_dir)}
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the stack
        self.began = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "polygym", "env", "start", *args],
            cwd=TESTED,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.record = self._wait_ready(timeout_s)
        self.ready_s = time.perf_counter() - self.began

    def _wait_ready(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        stacks = self.state_dir / "stacks"
        while time.monotonic() < deadline:
            for path in stacks.glob("*.json") if stacks.exists() else []:
                try:
                    record = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue
                if record.get("pid") == self.proc.pid:
                    return record
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"gym env start failed:\n{self.log.read().decode(errors='replace')}")
            time.sleep(0.01)
        raise RuntimeError("stack not ready in time")

    def url_of(self, name: str) -> str:
        return next(s["url"] for s in self.record["servers"] if s["name"] == name)

    @property
    def pids(self) -> list[int]:
        return [self.proc.pid]

    def stop(self) -> tuple[float, list[int]]:
        """SIGTERM the launcher; returns (seconds to exit, pids of the tree still alive after)."""
        members = [p.pid for p in tree([self.proc.pid])]
        began = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        elapsed = time.perf_counter() - began
        deadline = time.monotonic() + 5
        left = [pid for pid in members if psutil.pid_exists(pid) and pid != self.proc.pid]
        while left and time.monotonic() < deadline:
            time.sleep(0.02)
            left = [pid for pid in left if _alive(pid)]
        return elapsed, left


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))]


def print_table(title: str, rows: list[dict[str, Any]]) -> None:
    """A plain fixed-width table (benchmarks must print readable text anywhere)."""
    if not rows:
        return
    columns = list(dict.fromkeys(column for row in rows for column in row))  # every row's, in order
    cells = [[_cell(r[c]) if c in r else "" for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print(f"\n{title}")
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def write_json(name: str, payload: Any) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(
        json.dumps({"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), **payload}, indent=2)
    )
    print(f"\nwrote {path}")
    return path
