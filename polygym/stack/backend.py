"""What every backend shares: the contract, its errors, and the spec a server is started from.

The launcher (``stack.launcher``) chooses a backend and drives it; the backends (inline and
subprocess there, Ray in ``stack.ray_backend``) implement ``Backend``. These pieces live apart
from the launcher so that a backend module never has to import the launcher that imports it.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from polygym.net.client import ServerClient

if TYPE_CHECKING:  # the head server's app (Starlette), the config loader (OmegaConf): not for a
    # collector that only joins a stack
    from polygym.stack.head import Registry
    from polygym.stack.server_spec import ServerSpec

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 5.0
LOG_TAIL_LINES = 20
NO_POOL_LIMIT = 0
"""aiohttp's ``TCPConnector(limit=0)``: no limit on connections."""


class ChildProcess(Protocol):
    """A server's process as the stack watches it: ``asyncio.subprocess.Process``, or a NeMo Gym
    server its fork server started (``stack.nemo_gym_forks``)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


Child = TypeVar("Child", bound=ChildProcess)


def stack_client(head_url: str | None, pool_size: int | None) -> ServerClient:
    """The client a stack's server (or the inline stack's collector) reaches the others with.

    ``pool_size`` is the stack's concurrency when it has one. ``None`` (a stack serving whatever
    collectors come, ``gym env start``) means no limit: the collector that drives the stack bounds
    the rollouts in flight, so connections here are bounded by it, and any fixed number would be a
    hidden cap below a collector's ``--concurrency``.
    """
    return ServerClient(head_url, pool_size=NO_POOL_LIMIT if pool_size is None else pool_size)


def how_it_ended(returncode: int) -> str:
    return f"killed by signal {-returncode}" if returncode < 0 else f"exited with code {returncode}"


def log_tail(path: Path | None) -> str:
    """The end of a server's log, for the message that reports its death."""
    try:
        lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:] if path else []
    except OSError:
        lines = []
    body = "\n".join(f"    {line}" for line in lines) or "    (log is empty)"
    return f"  last lines of {path}:\n{body}"


async def first_exit(procs: Mapping[str, ChildProcess]) -> str:
    """The name of the first of ``procs`` to exit (never returns when there are none)."""
    waits = {asyncio.ensure_future(p.wait()): name for name, p in procs.items()}
    if not waits:
        await asyncio.Event().wait()
    done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    return waits[next(iter(done))]


async def stop_processes(procs: Sequence[Child], send: Callable[[Child, signal.Signals], None]) -> None:
    """``send`` SIGTERM to each live process, then SIGKILL to what has not exited by the deadline
    (``send`` decides what is signalled: the child alone, or the process group it leads)."""
    alive = [p for p in procs if p.returncode is None]
    for proc in alive:
        send(proc, signal.SIGTERM)
    try:
        await asyncio.wait_for(asyncio.gather(*(p.wait() for p in alive)), STOP_TIMEOUT_S)
    except TimeoutError:
        for proc in alive:
            if proc.returncode is None:
                send(proc, signal.SIGKILL)
        await asyncio.gather(*(p.wait() for p in alive))


class LaunchError(RuntimeError):
    """The stack could not start, or a server died; the message says which and why."""


@dataclass
class ServerFailure:
    name: str
    """The server, or the worker, that died."""
    message: str
    down: tuple[str, ...] | None = None
    """The servers this death left with no live replica. None: ``name`` alone (a server's one
    process); empty when every server goes on, in its other replicas or restarted in place."""

    @property
    def servers_down(self) -> tuple[str, ...]:
        return (self.name,) if self.down is None else self.down


@dataclass
class RunningServer:
    name: str
    kind: str
    implementation: str
    url: str
    pid: int
    pool_size: int | None = None
    """The server's connection pool to the rest of the stack; None: no limit."""


class Backend(Protocol):
    name: str

    async def start(
        self, specs: list[ServerSpec], registry: Registry, head_url: str, stack_id: str, secret: str
    ) -> None: ...

    async def wait_failure(self) -> ServerFailure: ...

    async def stop(self) -> None: ...


@runtime_checkable
class ReplicatedBackend(Backend, Protocol):
    """A backend whose servers run as several replicas (workers, Ray), one of which may die while
    the others serve on: ``wait_death`` reports every such death, ``wait_failure`` only those
    that leave a server down."""

    async def wait_death(self) -> ServerFailure: ...


def spec_to_dict(spec: ServerSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "kind": spec.kind,
        "implementation": spec.implementation,
        "config": spec.config,
        "source": spec.source,
        "directory": str(spec.directory),
    }


def spec_from_dict(data: dict[str, Any]) -> ServerSpec:
    from polygym.stack.server_spec import ServerSpec

    return ServerSpec(
        name=data["name"],
        kind=data["kind"],
        implementation=data["implementation"],
        config=data["config"],
        source=data["source"],
        directory=Path(data["directory"]),
    )
