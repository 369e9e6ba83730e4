"""Rows routed by ``task_source`` instead of ``agent_ref`` (NeMo Gym's newer datasets).

A dataset prepared by a current NeMo Gym carries no ``agent_ref``: each row names the config
instance that declared its dataset in ``task_source`` (a resources server or an agent), and the
collector resolves the agent from the running config. The rule is NeMo Gym 0.7.0's
(``nemo_gym.global_config.resolve_dataset_agent``, used by its ``resolve_task_sources``):

1. an agent instance runs its own rows;
2. a resources server's rows go to the agent its datasets pin (``agent:`` on a dataset entry),
   which must reference it; two different pins are an error (the row cannot tell them apart);
3. else to the one agent whose ``resources_server`` is it; none or several is an error.

A row with an ``agent_ref`` keeps it (``task_source`` is then ignored), as in NeMo Gym.

A materialized task row (``task_id.taskset`` and ``task_input``) is routed by its taskset instead,
whatever else it carries: ``environment_server_routes[taskset]`` names the environment server that
runs it (NeMo Gym 0.7's ``_environment_server_for_config_row``); ``collect.episodes`` speaks to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from polygym.collect.head_config import head_config
from polygym.kinds import AGENT_KIND, ENVIRONMENT_KIND, ENVIRONMENT_ROUTES, RESOURCES_KIND
from polygym.net.client import ServerCallError, ServerClient

TASK_SOURCE = "task_source"


@dataclass
class TaskRoutes:
    """``task_source`` -> agent for every instance of a config, and why the others cannot route."""

    agents: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    unreadable: str | None = None
    """Why the running config could not be read (a head that serves no ``GET /config``)."""
    tasksets: dict[str, str] = field(default_factory=dict)
    """Materialized taskset -> the environment server that runs its rows (``environment_server_routes``)."""
    result_types: dict[str, str] = field(default_factory=dict)
    """Environment server -> its implementation, stamped on its results as ``_ng_result_type``."""

    def agent_for(self, task_source: str) -> str | None:
        return self.agents.get(task_source)

    def why_no_route(self, taskset: str) -> str:
        """Why a taskset's rows cannot run: the unreadable config, or the routes there are."""
        if self.unreadable:
            return self.unreadable
        known = ", ".join(f"{name} -> {server}" for name, server in sorted(self.tasksets.items()))
        return f"no {ENVIRONMENT_ROUTES} entry names it (routes: {known or 'none'})"

    def why_not(self, task_source: str) -> str:
        return self.unreadable or self.refused.get(task_source, "not a server instance of the running config")


def _implementation(block: Any, kind: str) -> tuple[str, dict[str, Any]] | None:
    """The one implementation of a ``{kind: {implementation: {...}}}`` block, and its settings."""
    impls = block.get(kind) if isinstance(block, Mapping) else None
    if not isinstance(impls, Mapping) or len(impls) != 1:
        return None
    name, inner = next(iter(impls.items()))
    return str(name), dict(inner) if isinstance(inner, Mapping) else {}


def _inner(block: Any, kind: str) -> dict[str, Any] | None:
    """The one implementation's settings of a ``{kind: {implementation: {...}}}`` block."""
    found = _implementation(block, kind)
    return found[1] if found is not None else None


def _pins(inner: Mapping[str, Any]) -> list[str]:
    """Distinct ``agent:`` pins of an instance's datasets, in declaration order."""
    pins: list[str] = []
    for dataset in inner.get("datasets") or []:
        pin = dataset.get("agent") if isinstance(dataset, Mapping) else None
        if isinstance(pin, str) and pin not in pins:
            pins.append(pin)
    return pins


def task_routes(config: Mapping[str, Any]) -> TaskRoutes:
    """Resolve every instance of ``config`` (a merged config as data, e.g. the head's ``/config``)."""
    referencing: dict[str, list[str]] = {}
    for name, block in config.items():
        inner = _inner(block, AGENT_KIND)
        ref = inner.get("resources_server") if inner is not None else None
        if isinstance(ref, Mapping) and isinstance(ref.get("name"), str):
            referencing.setdefault(ref["name"], []).append(str(name))
    routes = TaskRoutes()
    for name, block in config.items():
        if (server := _implementation(block, ENVIRONMENT_KIND)) is not None:
            routes.result_types[str(name)] = server[0]
    declared = config.get(ENVIRONMENT_ROUTES)
    if isinstance(declared, Mapping):
        routes.tasksets = {str(k): str(v) for k, v in declared.items() if str(v) in routes.result_types}
    for name, block in config.items():
        if _inner(block, AGENT_KIND) is not None:
            routes.agents[str(name)] = str(name)
            continue
        inner = _inner(block, RESOURCES_KIND)
        if inner is None:
            continue
        candidates = referencing.get(str(name), [])
        pins = _pins(inner)
        if len(pins) > 1:
            routes.refused[str(name)] = f"its datasets pin several agents ({', '.join(pins)})"
        elif pins and pins[0] not in candidates:
            routes.refused[str(name)] = f"its datasets pin agent '{pins[0]}', which does not reference it"
        elif pins:
            routes.agents[str(name)] = pins[0]
        elif len(candidates) == 1:
            routes.agents[str(name)] = candidates[0]
        else:
            several = f"{len(candidates)} agents reference it ({', '.join(sorted(candidates))})"
            which = several if candidates else "no agent references it"
            routes.refused[str(name)] = f"{which}; give the rows an agent_ref or pin one on its dataset"
    return routes


async def head_task_routes(client: ServerClient) -> TaskRoutes:
    """The routes of a joined stack, from its head's config (``collect.head_config``: polygym's or
    NeMo Gym's head), so rows reach the servers of either project's stack by the same rules."""
    try:
        config = await head_config(client)
    except (ServerCallError, ValueError) as exc:
        return TaskRoutes(unreadable=f"the stack's config is not readable ({exc})")
    if config is None:
        why = "the stack serves no config (no head server, or none at /config or /global_config_dict_yaml)"
        return TaskRoutes(unreadable=why)
    return task_routes(config)
