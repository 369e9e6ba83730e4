"""Where running stacks are recorded, so ``gym env status``/``stop`` and ``gym eval run
--no-serve`` can find them from another terminal.

Each ``gym env start`` writes one JSON file named by its stack id under the state directory
(``$POLYGYM_STATE_DIR``, default ``~/.local/state/polygym``) and removes it when it stops. A file
whose launcher process is gone is stale (the launcher was killed) and is cleaned up on read.

A record says where a stack's head server is, and ``gym eval run --no-serve`` sends rollouts
there, so only the user's own records count: the folder is created 0700, records are written
0600, and a record owned by another user (a shared ``$POLYGYM_STATE_DIR``) is ignored. Records hold
no secret: the stack secret never leaves the launcher's process and the servers it started, since
nothing that reads a record (status, stop, a joining collector) writes to the registry.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import orjson
import psutil


def state_dir() -> Path:
    root = os.environ.get("POLYGYM_STATE_DIR") or Path.home() / ".local" / "state" / "polygym"
    return Path(root)


PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def stacks_dir() -> Path:
    path = state_dir() / "stacks"
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    return path


def logs_dir(stack_id: str) -> Path:
    path = state_dir() / "logs" / stack_id
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    return path


def write_stack(record: dict[str, Any]) -> Path:
    """Atomically (re)write the record of one stack, readable by its user only."""
    path = stacks_dir() / f"{record['stack_id']}.json"
    tmp = path.with_suffix(".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
    with os.fdopen(fd, "wb") as out:
        out.write(orjson.dumps(record, option=orjson.OPT_INDENT_2))
    tmp.replace(path)
    return path


def _own(path: Path) -> bool:
    """True when ``path`` belongs to this user (another user's record must not steer our runs)."""
    try:
        return path.stat().st_uid == os.getuid()
    except OSError:
        return False


def remove_stack(stack_id: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        (stacks_dir() / f"{stack_id}.json").unlink()


def _alive(record: dict[str, Any]) -> bool:
    """True when the launcher that wrote ``record`` still runs (same pid, same start time)."""
    try:
        proc = psutil.Process(int(record["pid"]))
        return abs(proc.create_time() - float(record.get("process_started_at", proc.create_time()))) < 1.0
    except (psutil.Error, KeyError, ValueError):
        return False


def list_stacks() -> list[dict[str, Any]]:
    """Records of running stacks, oldest first; stale records are deleted."""
    records = []
    for path in sorted(stacks_dir().glob("*.json")):
        if not _own(path):
            continue
        try:
            record = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        if _alive(record):
            records.append(record)
        else:
            remove_stack(str(record.get("stack_id", path.stem)))
    return sorted(records, key=lambda r: r.get("started_at", 0))


def new_stack_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
