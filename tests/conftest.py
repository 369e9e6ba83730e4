"""Shared fixtures: an isolated state directory per test and real `gym env start` processes.

Readiness is detected by polling the stack record the launcher writes once every server has
registered — never by sleeping for a fixed time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from polygym.stack import records as stacks

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 60.0
TWO_ENV_SPEC = """
environments:
  - name: example_single_tool_call
    weight: 3
  - name: example_multi_step
    weight: 1
prompts_per_step: 4
responses_per_prompt: 2
seed: 13
"""
"""A small blend of both example environments (3:1, two responses per prompt) for CLI tests."""


@pytest.fixture(autouse=True)
def state_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test gets its own stack registry so parallel or leftover stacks never interfere."""
    path = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("POLYGYM_STATE_DIR", str(path))
    return path


def gym_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "polygym", *args]


class StackProcess:
    """A `gym env start` child process and the stack record it published."""

    def __init__(self, args: list[str], cwd: Path = ROOT) -> None:
        self.log = (Path(os.environ["POLYGYM_STATE_DIR"]) / f"launcher-{time.monotonic_ns()}.log").open("w+b")
        self.proc = subprocess.Popen(
            gym_command("env", "start", *args), cwd=cwd, stdout=self.log, stderr=subprocess.STDOUT
        )
        self.record = self._wait_ready()

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def _wait_ready(self) -> dict[str, Any]:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            for record in stacks.list_stacks():
                if record["pid"] == self.proc.pid:
                    return record
            if self.proc.poll() is not None:
                raise AssertionError(f"gym env start exited with {self.proc.returncode}:\n{self.output()}")
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"stack not ready within {READY_TIMEOUT_S}s:\n{self.output()}")

    def server(self, name: str) -> dict[str, Any]:
        return next(s for s in self.record["servers"] if s["name"] == name)

    def child_pids(self) -> list[int]:
        """The processes the stack started (an external server has no pid of ours)."""
        return sorted({s["pid"] for s in self.record["servers"] if s.get("pid")} - {self.proc.pid})

    def wait(self, timeout_s: float = 30.0) -> int:
        return self.proc.wait(timeout_s)

    def stop(self) -> None:
        """Stop the launcher we started (by its PID), then any of its children still alive."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in self.child_pids():
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        self.log.close()


@pytest.fixture
def start_stack() -> Iterator[Any]:
    started: list[StackProcess] = []

    def start(*args: str, cwd: Path = ROOT) -> StackProcess:
        stack = StackProcess(list(args), cwd)
        started.append(stack)
        return stack

    yield start
    for stack in started:
        stack.stop()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_until(predicate: Any, timeout_s: float = 15.0, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
