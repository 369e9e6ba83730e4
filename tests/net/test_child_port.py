"""The port a NeMo Gym child is given, and the check that the child, not a stranger, holds it."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from polygym.net.child_port import EPHEMERAL_RANGE, holds_listener, port_for_a_child

LISTEN = (
    "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); "
    "s.listen(); print('up', flush=True); time.sleep(60)"
)
"""A process that binds the port given as its argument, says so, and waits to be killed."""


def started(command: str, port: int) -> subprocess.Popen[str]:
    """``command`` run with ``port``, once the listener in it (or in its child) says it is up."""
    proc = subprocess.Popen([sys.executable, "-c", command, str(port)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    return proc


def end(proc: subprocess.Popen[str]) -> None:
    for child in psutil.Process(proc.pid).children(recursive=True):
        child.kill()
    proc.kill()
    proc.wait()


@pytest.fixture
def listener() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A child process listening on a port chosen for it, as a NeMo Gym server does."""
    port = port_for_a_child("127.0.0.1")
    child = started(LISTEN, port)
    yield child, port
    end(child)


def test_the_port_is_free_and_below_the_ephemeral_range() -> None:
    port = port_for_a_child("127.0.0.1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # free: the child can bind it
    if EPHEMERAL_RANGE.is_file():
        assert port < int(EPHEMERAL_RANGE.read_text().split()[0])


def test_the_child_holds_its_port_and_a_stranger_does_not(
    listener: tuple[subprocess.Popen[str], int],
) -> None:
    child, port = listener
    assert holds_listener(child.pid, port)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:  # the port is open, but not the stranger's: as a NeMo Gym child that could not bind it
        assert not holds_listener(stranger.pid, port)
    finally:
        stranger.kill()
        stranger.wait()
    assert not holds_listener(child.pid, port + 1)


def test_a_listener_started_by_the_child_counts_as_the_childs() -> None:
    """A server may bind in a worker process it starts (uvicorn's): its descendants count."""
    port = port_for_a_child("127.0.0.1")
    spawner = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {LISTEN!r}, sys.argv[1]])"
    parent = started(spawner, port)
    try:
        assert holds_listener(parent.pid, port)
    finally:
        end(parent)


def test_a_process_that_is_gone_holds_nothing() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not holds_listener(proc.pid, 1)
