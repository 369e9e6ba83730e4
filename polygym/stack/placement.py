"""Where and how many: the placement keys of a server's config block.

A server block may say how it is to be placed, next to its own settings:

```yaml
example_multi_step:
  resources_servers:
    example_multi_step:
      replicas: 4          # copies of the server, one Ray actor each
      num_cpus: 1          # per replica, reserved from the cluster
      num_gpus: 0          # > 0: the replicas run in a Ray placement group
      resources: {}        # custom Ray resources per replica
      max_restarts: 3      # times Ray restarts a replica that died
```

The keys are read here, once, for every backend: the inline and subprocess backends run one copy
of each server and refuse ``replicas`` above 1 (a setting that cannot be honoured is an error,
never ignored), the Ray backend honours them all. ``--replicas NAME=N`` on the command line
overrides the config. Servers never see how they were placed, so these keys are also left in the
server's own config unchanged (server configs allow extra keys).

``--workers N|auto`` is the other way to more cores: N copies of the whole inline stack, one
process each (``auto``: one per core this process may use); see ``stack.launcher.WorkersBackend``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from polygym.errors import ConfigError

PLACEMENT_KEYS = ("replicas", "num_cpus", "num_gpus", "resources", "max_restarts")
DEFAULT_MAX_RESTARTS = 3


@dataclass(frozen=True)
class Placement:
    replicas: int = 1
    num_cpus: float = 0.0
    """CPUs reserved per replica; 0 by default, as HTTP servers mostly wait on the network."""
    num_gpus: float = 0.0
    resources: dict[str, float] = field(default_factory=dict)
    max_restarts: int = DEFAULT_MAX_RESTARTS


def _number(name: str, key: str, value: Any, integer: bool, minimum: float) -> float:
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok or value < minimum:
        kind = "an integer" if integer else "a number"
        raise ConfigError([f"{name}: {key} must be {kind} >= {minimum:g}, got {value!r}"])
    return value


def placement_of(name: str, config: Mapping[str, Any], replicas_override: int | None = None) -> Placement:
    """The placement of server ``name`` from its config block and a ``--replicas`` override."""
    replicas = replicas_override if replicas_override is not None else config.get("replicas", 1)
    resources = config.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise ConfigError([f"{name}: resources must be a mapping of resource name to amount"])
    return Placement(
        replicas=int(_number(name, "replicas", replicas, True, 1)),
        num_cpus=float(_number(name, "num_cpus", config.get("num_cpus", 0), False, 0)),
        num_gpus=float(_number(name, "num_gpus", config.get("num_gpus", 0), False, 0)),
        resources={str(k): float(_number(name, f"resources.{k}", v, False, 0)) for k, v in resources.items()},
        max_restarts=int(
            _number(name, "max_restarts", config.get("max_restarts", DEFAULT_MAX_RESTARTS), True, 0)
        ),
    )


def copy_placement(configs: Mapping[str, Mapping[str, Any]]) -> Placement:
    """What one copy of the whole stack reserves (``--workers N`` on Ray): the sum of its servers'
    CPUs and custom resources, by server name. A server asking for GPUs or for several replicas
    cannot be copied (every copy would need GPUs of its own; a copy holds one replica of each
    server): a ConfigError naming it, instead of copies that never start."""
    problems = []
    cpus = 0.0
    resources: dict[str, float] = {}
    for name, config in configs.items():
        placement = placement_of(name, config)
        if placement.num_gpus:
            problems.append(
                f"server '{name}' asks for num_gpus: --workers copies every server; run it without --workers"
            )
        if placement.replicas > 1:
            problems.append(
                f"server '{name}' asks for {placement.replicas} replicas: with --workers each copy holds one"
            )
        cpus += placement.num_cpus
        for key, amount in placement.resources.items():
            resources[key] = resources.get(key, 0.0) + amount
    if problems:
        raise ConfigError(problems)
    return Placement(num_cpus=cpus, resources=resources)


def parse_replicas(values: tuple[str, ...] | list[str], known: Mapping[str, Any]) -> dict[str, int]:
    """``--replicas NAME=N`` values; an unknown name or a bad count is a ConfigError naming it."""
    problems: list[str] = []
    counts: dict[str, int] = {}
    for value in values:
        name, sep, count = value.partition("=")
        if not sep or not count.isdigit() or int(count) < 1:
            problems.append(f"--replicas {value!r}: expected NAME=N with N >= 1")
        elif name not in known:
            problems.append(f"--replicas {value!r}: no server named '{name}' in this stack")
        else:
            counts[name] = int(count)
    if problems:
        raise ConfigError(problems)
    return counts


WORKERS_AUTO = "auto"


def cores_available() -> int:
    """The cores this process may run on: its CPU affinity where the OS has one (a container's or
    ``taskset``'s limit), else every core of the machine."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


BACKENDS = ("inline", "subprocess", "ray")
"""The backends that place a stack's servers (``--backend``); here rather than in the launcher so
that the options naming them import no server code."""


def parse_workers(value: str | None) -> int | None:
    """``--workers`` as a count: a positive integer, or ``auto`` for one per available core;
    None when not given. Anything else is a ConfigError naming the option."""
    if value is None:
        return None
    if value == WORKERS_AUTO:
        return cores_available()
    if not value.isdigit() or int(value) < 1:
        raise ConfigError([f"--workers {value!r}: expected a number >= 1 or '{WORKERS_AUTO}'"])
    return int(value)
