"""Run inside a NeMo Gym environment: the process that owns the one Ray cluster of a stack's NeMo
Gym servers there, as NeMo Gym's ``ng_run`` owns the cluster it starts for its servers.

It starts a local cluster with the environment's own Ray (the version the servers import), on
127.0.0.1 only, without a dashboard (Ray 2.60 still starts its minimal dashboard process, with no
web frontend), in the folder it is given (``argv[1]``, a short private one: Ray's socket paths
are bounded to ~107 characters, and nothing of it goes under ``/tmp/ray``, where a server that
starts a cluster of its own would otherwise find it, or a stale one). It answers one JSON line on
stdout, ``{"address": "127.0.0.1:PORT", "env": {...}}`` or ``{"error": "..."}``, then waits for
stdin to close (the stack stopped, or its launcher was killed), shuts the cluster down (~2 s: all
of its processes end) and removes the folder. Killed itself, Ray's core processes end with it
(``PR_SET_PDEATHSIG``) and the stack kills what is left of its process group.

Ray keeps a loopback address loopback only with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, which the
stack sets here and in every server that joins. ``env`` is the ``RAY_*`` variables Ray's start set
in this process (Ray 2.60 turns token authentication on for a new local cluster,
``RAY_AUTH_MODE=token``): ``ng_run``'s servers inherit them from the process that started their
cluster, so the stack gives them to its servers too.
It imports nothing from polygym, which is not installed in that environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from typing import Any

LOOPBACK = "127.0.0.1"


def _send(reply_fd: int, message: dict[str, Any]) -> None:
    with contextlib.suppress(BrokenPipeError):  # the stack is gone; the cluster is ended below
        os.write(reply_fd, json.dumps(message).encode() + b"\n")


def _start_cluster(folder: str) -> dict[str, Any]:
    """A new local cluster (never one Ray finds recorded on the machine): its GCS address, and
    what its start set in this process's environment for the processes that join it."""
    before = dict(os.environ)
    import ray  # the environment's Ray, imported only here: the servers import the same one

    ray.init(
        address="local",
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address=LOOPBACK,
        _temp_dir=folder,
    )
    changed = {k: v for k, v in os.environ.items() if k.startswith("RAY_") and before.get(k) != v}
    return {"address": str(ray.get_runtime_context().gcs_address), "env": changed}


def _stop_cluster() -> None:
    import ray  # already imported by _start_cluster

    ray.shutdown()


def _wait_for_eof() -> None:
    while os.read(0, 4096):
        pass


def main() -> int:
    folder = sys.argv[1]
    reply_fd = os.dup(1)
    os.dup2(2, 1)  # what Ray prints goes to the log; stdout carries the one reply
    try:
        try:
            started = _start_cluster(folder)
        except Exception as exc:  # the stack names the servers that needed it, with this reason
            _send(reply_fd, {"error": f"{type(exc).__name__}: {exc}"})
            return 1
        _send(reply_fd, started)
        with contextlib.suppress(KeyboardInterrupt):
            _wait_for_eof()
        _stop_cluster()
        return 0
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
