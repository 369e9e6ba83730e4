"""A port for a child process that binds it itself, and the check that the child holds it.

polygym binds its own listeners and never hands a port number on (DESIGN §4), but NeMo Gym's
servers read their port from the config their parent writes, so a number has to be chosen before
the child starts and is free only until then. Two things make that window safe:

* **Below the ephemeral range.** A port from ``bind(0)`` is an ephemeral one, the same range every
  outgoing connection on the machine draws its local port from; in the seconds before the child
  binds (NeMo Gym's imports take that long) a client connection, of this stack or of anything else,
  can take it. Ports below ``ip_local_port_range`` are only ever taken by an explicit bind, so the
  choice is made there (Linux; elsewhere, ``bind(0)`` as before).
* **Owned, not just open.** A port that accepts connections may be another process's, the child
  then failing to bind it; registering it would send the stack's calls to a stranger. A child
  counts as listening only when it, or a process it started, holds the listening socket.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

import psutil

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 20_000
"""Stay above the ports servers are commonly configured on (8000, 8080, 11000, ...)."""
TRIES = 64


def port_for_a_child(host: str) -> int:
    """A port free now on ``host`` that no outgoing connection will take before a child binds it."""
    below = _ephemeral_start()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    candidates = random.sample(range(LOWEST, below), min(TRIES, below - LOWEST)) if below > LOWEST else []
    for port in [*candidates, 0]:
        with socket.socket(family) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise OSError(f"no free port on {host}")


def _ephemeral_start() -> int:
    """The first port of the OS's ephemeral range (Linux), or 0 where it cannot be read."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def holds_listener(pid: int, port: int) -> bool:
    """Whether process ``pid`` or one of its descendants listens on TCP ``port``."""
    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.Error:
        return False
    for proc in family:
        try:
            connections = proc.net_connections(kind="tcp")
        except psutil.Error:
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in connections):
            return True
    return False
