"""`gym view` on large runs, as a person starts it: time to the URL, to the Compare page, and memory.

Writes synthetic runs shaped like the scripted model's (``view_pages.write_run``: four
environments, 8 repeats per task, 1% failures), then starts ``python -m polygym view ...`` as a
subprocess, reads the URL it prints and times, from the start of the process:

* **two 100,000-rollout runs**: the URL, and the Compare page with its numbers (fetched until
  it is no longer the "computing" page);
* **one 1,000,000-rollout run**: the URL, the first rollout list page, the Overview with its
  numbers, and the viewer's peak resident memory (``psutil``, its process and children).

With each wall time the viewer's CPU seconds so far: on a machine shared with other work the wall
times stretch, the CPU time does not.

``--pythonpath DIR`` runs another checkout's ``polygym`` (e.g. ``git archive`` of an older commit)
for a before/after comparison; the process is stopped by its PID at the end.

    python benchmarks/view_scale.py [--rows 100000] [--big-rows 1000000] [--dir /tmp/view_scale]
Targets (issue #34): two 100,000-rollout runs: URL < 5 s, Compare < 10 s; 1,000,000: browsable.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from view_pages import write_run

ROOT = Path(__file__).resolve().parents[1]
WAITING = 'id="progress"'
DEADLINE_S = 1800.0


def _rss(process: psutil.Process) -> int:
    try:
        return process.memory_info().rss + sum(c.memory_info().rss for c in process.children(recursive=True))
    except psutil.Error:
        return 0


class Viewer:
    """``gym view`` started as a subprocess; ``url`` once printed; peak RSS sampled every 0.2 s."""

    def __init__(self, paths: list[Path], pythonpath: str) -> None:
        env = {**os.environ, "PYTHONPATH": pythonpath}
        self.began = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "polygym", "view", *map(str, paths)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=paths[0].parent,  # not a checkout: `python -m` puts the working folder first
        )
        self.peak = 0
        self._stop = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()
        self.url = self._read_url()
        self.url_s = time.perf_counter() - self.began

    def _sample(self) -> None:
        process = psutil.Process(self.proc.pid)
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, _rss(process))

    def _read_url(self) -> str:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("gym view exited before printing its URL")
            found = re.search(r"http://127\.0\.0\.1:\d+", line)
            if found:
                return found.group(0)

    def until_shown(self, path: str, text: str = "") -> float:
        """Seconds from the start until ``path`` shows its numbers (not the computing page)."""
        end = time.monotonic() + DEADLINE_S
        while time.monotonic() < end:
            with urllib.request.urlopen(self.url + path, timeout=DEADLINE_S) as reply:
                page = reply.read().decode()
            if WAITING not in page and text in page:
                return time.perf_counter() - self.began
            time.sleep(0.25)
        raise TimeoutError(f"{path} not shown within {DEADLINE_S:.0f} s")

    def cpu_s(self) -> float:
        """CPU seconds the viewer has used so far: what the wall times cost on an idle machine
        (a machine shared with other work stretches the wall times, not this)."""
        times = psutil.Process(self.proc.pid).cpu_times()
        return float(times.user + times.system)

    def stop(self) -> None:
        self._stop.set()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def ensure_run(path: Path, rows: int, seed: int) -> None:
    marker = path.with_suffix(f".{rows}")
    if not marker.exists():
        began = time.perf_counter()
        write_run(path, rows, seed)
        marker.touch()
        print(
            f"wrote {path} ({rows} rows, {path.stat().st_size / 1e6:.0f} MB)"
            f" in {time.perf_counter() - began:.0f} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000, help="0: skip the two runs")
    parser.add_argument("--big-rows", type=int, default=1_000_000, help="0: skip the large run")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/view_scale"))
    parser.add_argument(
        "--pythonpath", default=str(ROOT), help="the polygym checkout to run (default: this one)"
    )
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    base, new, big = args.dir / "base.jsonl", args.dir / "new.jsonl", args.dir / "big.jsonl"
    if args.rows:
        pair(base, new, args.rows, args.pythonpath)
    if args.big_rows:
        big_run(big, args.big_rows, args.pythonpath)


def pair(base: Path, new: Path, rows: int, pythonpath: str) -> None:
    ensure_run(base, rows, 1)
    ensure_run(new, rows, 2)
    viewer = Viewer([base, new], pythonpath)
    try:
        compare_s = viewer.until_shown("/compare/0/1", "Flips")
        print(
            f"two {rows}-rollout runs: URL {viewer.url_s:.1f} s (target < 5),"
            f" Compare {compare_s:.1f} s (target < 10), viewer CPU {viewer.cpu_s():.1f} s"
        )
    finally:
        viewer.stop()


def big_run(big: Path, rows: int, pythonpath: str) -> None:
    ensure_run(big, rows, 3)
    viewer = Viewer([big], pythonpath)
    try:
        rows_s = viewer.until_shown("/run/0/rollouts", 'data-row="0"')
        overview_s = viewer.until_shown("/run/0", "mean reward")
        print(
            f"one {rows}-rollout run: URL {viewer.url_s:.1f} s, first rollout page {rows_s:.1f} s, "
            f"Overview {overview_s:.1f} s (viewer CPU {viewer.cpu_s():.1f} s), "
            f"peak RSS {viewer.peak / 2**20:.0f} MiB"
        )
    finally:
        viewer.stop()


if __name__ == "__main__":
    main()
