"""``gym env``: start, inspect, stop and resolve stacks of servers."""

from __future__ import annotations

import ipaddress
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import click
import orjson
import psutil
import yaml
from rich.markup import escape
from rich.table import Table

from polygym.cli.base import (
    EXIT_FAILURE,
    EXIT_USAGE,
    SuggestingGroup,
    console,
    fail,
    load_stack_config,
    selector_options,
)
from polygym.cli.interrupt import Interrupted, until_interrupted
from polygym.cli.placement_options import placement_options, replica_counts
from polygym.cli.server_health import ping_servers, upstream_problems
from polygym.cli.settings_options import settings_from, settings_options
from polygym.event_loop import run_async
from polygym.net.client import ServerCallError, ServerClient
from polygym.net.replicas import slot_of
from polygym.settings import cli
from polygym.stack import records as stacks
from polygym.stack.backend import LaunchError
from polygym.stack.config import ConfigError
from polygym.stack.external import EXTERNAL
from polygym.stack.launcher import BACKENDS, Stack
from polygym.stack.placement import parse_workers
from polygym.suggest import unknown_name_message

DEFAULT_BACKEND = "inline"


@click.group(cls=SuggestingGroup)
def env() -> None:
    """Start, inspect and stop stacks of environments, agents and model servers."""


REGISTRY_TIMEOUT_S = 2.0
SERVER_COLUMNS = ("name", "kind", "implementation", "url", "pid", "registered by", "pool")
REPLICA_COLUMNS = ("replica", "node", "restarts")
"""Shown when the stack places replicas (Ray, ``--workers``): where each one runs, how often it died."""


def _cell(entry: dict[str, Any], field: str) -> str:
    return escape(str(entry.get(field) if entry.get(field) is not None else "?"))


def node_of(entry: dict[str, Any]) -> str:
    """The node a replica runs on: the one Ray reports, else the host of its URL."""
    return str(entry.get("node_ip") or urlsplit(str(entry.get("url", ""))).hostname or "?")


def server_table(
    servers: list[dict[str, Any]],
    title: str,
    health: dict[str, str] | None = None,
    in_flight: dict[str, Any] | None = None,
) -> Table:
    """One row per registry entry (each replica its own row); every value came over the wire, so
    all of it is escaped. ``health`` and ``in_flight``: what each replica's own ``GET /`` said,
    by registry slot."""
    table = Table(title=escape(title), title_justify="left")
    replicas = any("replica" in entry for entry in servers)
    extra = REPLICA_COLUMNS if replicas else ()
    for column in (*SERVER_COLUMNS, *extra, *(["in flight", "health"] if health is not None else [])):
        # A value wider than its column folds onto the next line: a name or URL cut short with
        # "…" could not be told apart from another one, or typed into a command.
        table.add_column(column, overflow="fold")
    for entry in servers:
        row = [_cell(entry, f) for f in ("name", "kind", "implementation", "url", "pid", "registered_by")]
        row.append(
            "-" if entry.get("implementation") == EXTERNAL else escape(pool_label(entry.get("pool_size")))
        )
        if replicas:
            row.extend(
                [_cell(entry, "replica"), escape(node_of(entry)), escape(str(entry.get("restarts", 0)))]
            )
        if health is not None:
            count = (in_flight or {}).get(slot_of(entry))
            row.append(escape(str(count if count is not None else "?")))
            status = escape(health.get(slot_of(entry), "?"))
            row.append(f"[green]{status}[/]" if status.startswith("ok") else f"[red]{status}[/]")
        table.add_row(*row)
    return table


def pool_label(pool_size: Any) -> str:
    """A server's connection pool to the rest of its stack; no size means no limit."""
    return "unlimited" if pool_size in (None, 0) else str(pool_size)


@dataclass(frozen=True)
class StartSettings:
    """How ``gym env start`` serves the merged stack, each setting declared once (``polygym.settings``);
    the selectors and placement are the option groups other commands share."""

    backend: str = field(
        default=DEFAULT_BACKEND,
        metadata=cli(
            "inline: one process, in-process calls; subprocess: one process per server; ray: one Ray "
            "actor per server replica (pip install 'polygym[ray]').",
            choices=tuple(sorted(BACKENDS)),
        ),
    )
    head_host: str = field(
        default="127.0.0.1",
        metadata=cli(
            "Address the head server listens on; any other than loopback is warned about (docs/security.md)."
        ),
    )
    head_port: int | None = field(
        default=None,
        metadata=cli(
            "Port of the head server [default: 11000, or any free port if taken].", min=0, max=65535
        ),
    )
    concurrency: int | None = field(
        default=None,
        metadata=cli(
            "Most requests the servers make to each other at once: the size of their connection "
            "pools [default: no limit; the collectors' --concurrency bounds the load].",
            min=1,
        ),
    )


@env.command("start")
@selector_options
@settings_options(StartSettings, ("backend",))
@placement_options
@settings_options(StartSettings, ("head_host", "head_port", "concurrency"))
def start(
    resources_servers: tuple[str, ...],
    model_types: tuple[str, ...],
    configs: tuple[str, ...],
    overrides: tuple[str, ...],
    ray_address: str | None,
    replicas: tuple[str, ...],
    workers: str | None,
    **values: Any,
) -> None:
    """Start every server of the merged config in the foreground; Ctrl-C stops them all.

    \b
    Example:
      gym env start --model-type openai_model \\
          --resources-server example_single_tool_call --resources-server example_multi_step
    """
    settings = settings_from(StartSettings, values)
    exposed = exposure_warning(settings.head_host)
    if exposed:
        console(stderr=True).print("[yellow]warning:[/]", escape(exposed))
    config = load_stack_config(resources_servers, model_types, configs, overrides)
    try:
        stack = Stack(
            config,
            settings.backend,
            settings.head_host,
            settings.head_port,
            pool_size=settings.concurrency,
            ray_address=ray_address,
            replicas=replica_counts(replicas, config),
            workers=parse_workers(workers),
        )
    except (LaunchError, ConfigError) as exc:
        fail(str(exc), EXIT_USAGE)
    sys.exit(run_async(_serve_foreground(stack)))


def exposure_warning(host: str) -> str | None:
    """Why listening on ``host`` deserves a warning, or None for loopback: the head answers anyone
    who reaches it (its reads are open; only registration needs the stack secret)."""
    name = host.strip("[]").lower()
    try:
        loopback = name == "localhost" or ipaddress.ip_address(name).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return None
    everywhere = " (every network interface)" if name in ("0.0.0.0", "::") else ""
    return (
        f"--head-host {host}{everywhere}: the head server is reachable from other machines, which can "
        "read the stack's server addresses and its config (secrets masked); use it only on a network "
        "you trust, and set POLYGYM_ALLOWED_HOSTS to the names clients use (docs/security.md)"
    )


async def _serve_foreground(stack: Stack) -> int:
    """Run until Ctrl-C/SIGTERM (exit 0) or until a server dies (exit 1, the rest stopped)."""
    try:
        return await until_interrupted(_serve_until_failure(stack))
    except Interrupted:
        return 0


async def _serve_until_failure(stack: Stack) -> int:
    """Start the stack and wait for a server to die; a cancel (a signal) stops it all the same."""
    out, err = console(), console(stderr=True)
    try:
        await stack.start()
    except (LaunchError, ConfigError) as exc:
        err.print("[red]error:[/]", escape(f"could not start the stack: {exc}"))
        return EXIT_FAILURE
    out.print(server_table(stack.servers(), f"polygym stack {stack.stack_id} ({stack.backend.name} backend)"))
    for line in stack.nemo_gym.ray_lines():
        out.print(escape(line))
    out.print(await _ready_line(stack))
    try:
        failure = await stack.wait_failure()
        err.print("[red]error:[/]", escape(failure.message))
        out.print("stopping the other servers...")
        return EXIT_FAILURE
    finally:
        began = time.perf_counter()
        await stack.stop()
        out.print(f"stopped {len(stack.config.servers)} servers in {time.perf_counter() - began:.2f}s")


async def _ready_line(stack: Stack) -> str:
    """``ready:``, and which model servers cannot reach their upstream (each asked through its
    ``GET /``): a stack whose policy nobody can reach is up, not ready to collect."""
    problems = await upstream_problems(stack.servers())
    up = f"{len(stack.servers())} servers up in {stack.started_in_s:.2f}s"
    where = f"head server {stack.head_url}. Press Ctrl-C to stop."
    if not problems:
        return f"[bold green]ready:[/] {up}; {escape(where)}"
    return f"[bold red]ready:[/] {up}, [red]but {escape('; '.join(problems))}[/]; {escape(where)}"


async def _registry(head_url: str) -> list[dict[str, Any]] | None:
    """What the head server's registry really holds; None when the head does not answer."""
    client = ServerClient(head_url, pool_size=4, timeout_s=REGISTRY_TIMEOUT_S)
    try:
        entries = await client.servers()
    except ServerCallError:
        return None
    finally:
        await client.close()
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else None


def _unexpected(registry: list[dict[str, Any]], launched: list[dict[str, Any]]) -> list[str]:
    """Registry slots the launcher did not record (a name it never started, another url or pid)."""
    known = {slot_of(s): (s.get("url"), s.get("pid")) for s in launched}
    return [slot_of(e) for e in registry if known.get(slot_of(e)) != (e.get("url"), e.get("pid"))]


async def _inspect(record: dict[str, Any]) -> None:
    """Add the live registry, what in it the launcher did not start, and each replica's health."""
    registry = await _registry(record["head_url"])
    record["registry"] = registry
    record["unexpected"] = _unexpected(registry, record["servers"]) if registry is not None else []
    probes = await ping_servers(registry if registry is not None else record["servers"])
    record["health"] = {slot: probe["status"] for slot, probe in probes.items()}
    record["in_flight"] = {slot: probe.get("in_flight") for slot, probe in probes.items()}


@env.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def status(as_json: bool) -> None:
    """List running stacks, what each head server's registry holds, and each server's health.

    The table is the live registry (name, url, pid, who registered it; for replicas their node and
    restarts), not the launcher's record of what it started, so a server that should not be there
    would show; entries that differ from the record are named below the table. Every replica is
    pinged at its own URL for its health and the requests it has in flight.
    """
    records = stacks.list_stacks()
    for record in records:
        run_async(_inspect(record))
    if as_json:
        click.echo(orjson.dumps(records, option=orjson.OPT_INDENT_2).decode())
        return
    out = console()
    if not records:
        out.print("no running polygym stacks")
        return
    for record in records:
        title = (
            f"stack {record['stack_id']} (pid {record['pid']}, {record['backend']} backend, "
            f"head {record['head_url']})"
        )
        if record["registry"] is None:
            head = escape(record["head_url"])
            out.print(f"[red]head server {head} does not answer;[/] the servers it started:")
        out.print(
            server_table(
                record["registry"] or record["servers"], title, record["health"], record["in_flight"]
            )
        )
        if record["unexpected"]:
            names = ", ".join(record["unexpected"])
            out.print(f"[red]not started by this stack's launcher (or moved):[/] {escape(names)}")


def _select(stack_id: str | None, stop_all: bool) -> list[dict[str, Any]]:
    records = stacks.list_stacks()
    if stack_id:
        chosen = [r for r in records if r["stack_id"] == stack_id]
        if not chosen:
            fail(unknown_name_message("stack", stack_id, [r["stack_id"] for r in records]))
        return chosen
    if len(records) > 1 and not stop_all:
        ids = ", ".join(r["stack_id"] for r in records)
        fail(f"{len(records)} stacks are running ({ids}); pass --stack ID or --all")
    return records


@env.command("stop")
@click.option("--stack", "stack_id", default=None, help="Stack id (see gym env status).")
@click.option("--all", "stop_all", is_flag=True, help="Stop every running stack.")
@click.option(
    "--timeout", "timeout_s", default=15.0, show_default=True, help="Seconds to wait for a clean stop."
)
def stop(stack_id: str | None, stop_all: bool, timeout_s: float) -> None:
    """Stop a running stack started by ``gym env start`` (SIGTERM to its launcher)."""
    records = _select(stack_id, stop_all)
    if not records:
        click.echo("no running polygym stacks")
        return
    for record in records:
        _stop_launcher(record, timeout_s)


def _exited(proc: psutil.Process) -> bool:
    """Gone, or a zombie waiting for its own parent (the shell) to reap it."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _stop_launcher(record: dict[str, Any], timeout_s: float) -> None:
    try:
        proc = psutil.Process(int(record["pid"]))
        proc.send_signal(signal.SIGTERM)
    except psutil.NoSuchProcess:
        proc = None
    deadline = time.monotonic() + timeout_s
    while proc is not None and not _exited(proc):
        if time.monotonic() > deadline:
            fail(f"stack {record['stack_id']} (pid {record['pid']}) did not stop within {timeout_s:g}s")
        time.sleep(0.05)
    stacks.remove_stack(record["stack_id"])
    click.echo(f"stopped stack {record['stack_id']} ({len(record['servers'])} servers)")


@env.command("resolve")
@selector_options
def resolve(
    resources_servers: tuple[str, ...],
    model_types: tuple[str, ...],
    configs: tuple[str, ...],
    overrides: tuple[str, ...],
) -> None:
    """Print the merged, interpolated config with secrets masked."""
    config = load_stack_config(resources_servers, model_types, configs, overrides)
    click.echo(yaml.safe_dump(config.to_dict(mask_secrets=True), sort_keys=False), nl=False)
