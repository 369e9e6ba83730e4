"""One server instance of a stack as a launcher starts it, apart from the config loader that makes it.

A server process (``stack.serve``) receives its ``ServerSpec`` as data and needs nothing of config
loading (OmegaConf, YAML, interpolation, the checks): keeping the spec here keeps that out of every
server's start (~0.1 s of CPU each).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polygym.kinds import SERVER_KINDS


@dataclass(frozen=True)
class ServerSpec:
    """One server instance, resolved and checked, ready for a launcher to start."""

    name: str
    kind: str
    implementation: str
    config: dict[str, Any]
    source: str
    directory: Path

    def references(self) -> list[tuple[str, str, str]]:
        """``(dotted key, kind, name)`` for each ``{type, name}`` reference, so launchers can order starts."""
        found = config_references(self.config, "")
        return [(key, kind, name) for key, kind, name in found if kind in SERVER_KINDS]


def join_key(prefix: str, key: Any) -> str:
    """``prefix.key``, or ``key`` at the top."""
    return f"{prefix}.{key}" if prefix else str(key)


def config_references(data: Any, prefix: str) -> Iterator[tuple[str, Any, Any]]:
    """``{type, name}`` mappings (exactly those two keys, so dataset entries are not mistaken for them)."""
    if isinstance(data, Mapping):
        if set(data) == {"type", "name"}:
            yield prefix, data["type"], data["name"]
            return
        for key, value in data.items():
            yield from config_references(value, join_key(prefix, key))
    elif isinstance(data, list):
        for index, item in enumerate(data):
            yield from config_references(item, join_key(prefix, index))
