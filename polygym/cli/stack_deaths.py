"""What ``gym eval run`` learns and says when a server of the stack it started dies mid-run.

The same contract for every backend: the death is named (server or worker, pid or node, log
tail), the rollouts it cut are recorded failures with their class, and the exit status says
whether rollouts were lost. A server with no live replica left stops the agents that need it
(``collect.stack_watch``) and the run exits 1; a replica whose server goes on (another worker,
another Ray replica, the same one restarted) stops nothing, and the run exits 1 only when
rollouts failed, since then ``--resume`` has work to do.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from rich.markup import escape

from polygym.cli.base import EXIT_FAILURE, console
from polygym.collect.eval_run import RunSummary
from polygym.collect.stack_watch import SERVER_DIED, Death, StackHealth
from polygym.kinds import AGENT_KIND, ENVIRONMENT_KIND
from polygym.stack.backend import ReplicatedBackend, ServerFailure

if TYPE_CHECKING:
    from polygym.stack.config import StackConfig
    from polygym.stack.launcher import Stack, SubprocessBackend


def server_needs(config: StackConfig) -> dict[str, set[str]]:
    """Agent (or environment server, for episodes) -> every server its rollouts go through: its
    references, followed transitively."""
    needs: dict[str, set[str]] = {}
    for agent in [*config.by_kind(AGENT_KIND), *config.by_kind(ENVIRONMENT_KIND)]:
        seen = {agent.name}
        todo = [agent.name]
        while todo:
            for _, _, name in config.servers[todo.pop()].references():
                if name in config.servers and name not in seen:
                    seen.add(name)
                    todo.append(name)
        needs[agent.name] = seen
    return needs


def server_deaths(stack: Stack) -> list[AsyncIterator[Death]]:
    """The deaths the stack can report: every replica death of a replicated backend (workers,
    Ray); each child process of a subprocess stack on its own (so a second death is seen too);
    an inline stack's first stopped server."""
    from polygym.stack.launcher import SubprocessBackend  # only a stack this run started gets here

    backend = stack.backend
    if isinstance(backend, ReplicatedBackend):
        return [_every_death(backend)]
    if isinstance(backend, SubprocessBackend):
        return [_exit_of(backend, name, proc) for name, proc in backend.procs.items()]
    return [_first_failure(stack)]


def _death(failure: ServerFailure) -> Death:
    return failure.name, failure.message, failure.servers_down


async def _every_death(backend: ReplicatedBackend) -> AsyncIterator[Death]:
    while True:
        yield _death(await backend.wait_death())


async def _exit_of(
    backend: SubprocessBackend, name: str, proc: asyncio.subprocess.Process
) -> AsyncIterator[Death]:
    yield name, backend.describe_death(name, await proc.wait()), (name,)


async def _first_failure(stack: Stack) -> AsyncIterator[Death]:
    yield _death(await stack.wait_failure())


def report_deaths(health: StackHealth, summary: RunSummary) -> int | None:
    """Name every death of the run; EXIT_FAILURE when it lost rollouts, else None (go on)."""
    if health.dead:
        _print_server_deaths(health, summary)
        return EXIT_FAILURE
    if health.replica_deaths:
        return _print_replica_deaths(health, summary)
    return None


def _print_server_deaths(health: StackHealth, summary: RunSummary) -> None:
    err = console(stderr=True)
    for name, how in health.dead.items():
        err.print(f"[red]error:[/] server '{escape(name)}' died during the run:", escape(how))
    stopped = sorted(agent for agent in health.needs if health.blocker(agent) is not None)
    if not stopped:
        return
    err.print(
        f"{summary.failures_by_class.get(SERVER_DIED, 0)} rollouts of {', '.join(stopped)} were not run "
        f"({SERVER_DIED} in the failures file); the other environments finished."
    )


def _print_replica_deaths(health: StackHealth, summary: RunSummary) -> int | None:
    err = console(stderr=True)
    lost = summary.failed > 0
    label = "[red]error:[/]" if lost else "[yellow]warning:[/]"
    for who, how in health.replica_deaths:
        err.print(label, f"{escape(who)} died during the run (its servers went on):", escape(how))
    if not lost:
        err.print("no rollout was lost: the calls it had in flight were retried on another replica.")
        return None
    classes = ", ".join(f"{name} {count}" for name, count in summary.failures_by_class.most_common())
    err.print(
        f"{summary.failed} rollouts failed ({escape(classes)}; see the failures file); "
        "--resume runs them again."
    )
    return EXIT_FAILURE
