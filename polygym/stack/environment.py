"""Finding, loading and describing one environment: its config, server class, reward range and datasets.

Shared by ``gym env check`` (which probes what is loaded here) and ``gym list environments``
(which describes it). An environment is loaded the way ``gym env start`` loads it (the normal
config loader and the catalog), so what passes here also starts; the differences are that only
its resources server is wanted, and any model server its agents reference but its config leaves
out gets a stand-in (``STUB_MODEL``) so that the config still validates on its own.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from polygym.net.client import ServerClient
from polygym.protocol import AGENT_KIND, MODEL_KIND, RESOURCES_KIND
from polygym.servers.resources import ResourcesServer
from polygym.stack import catalog
from polygym.stack.config import ConfigError, ServerSpec, load_config
from polygym.stack.loader import build_server, server_class

STUB_MODEL = "scripted_model"
"""Stands in for model servers that agents reference but the environment's config leaves out."""


@dataclass
class LoadedEnv:
    """An environment's resources server spec, class, reward range and example datasets."""

    name: str
    directory: Path
    config_path: Path
    spec: ServerSpec
    server_class: type[ResourcesServer]
    reward_range: tuple[float, float]
    datasets: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    def build(self) -> ResourcesServer:
        return build_server(self.spec, ServerClient())  # type: ignore[return-value]


def resolve_env_dir(env: str | Path) -> Path:
    """A name is looked up like ``--resources-server`` (working directory, then shipped); a path as is."""
    if isinstance(env, Path) or "/" in env or "\\" in env:
        path = Path(env).expanduser().resolve()
        if not path.is_dir():
            raise ConfigError([f"environment folder {env} does not exist"])
        return path
    return catalog.find_implementation_dir(RESOURCES_KIND, env).resolve()


def _stub_overrides(raw: Any) -> list[str]:
    """``+name...`` overrides adding a stand-in for every model server referenced but not defined."""
    if not isinstance(raw, dict):
        return []
    missing: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if set(node) == {"type", "name"} and node["type"] == MODEL_KIND and node["name"] not in raw:
                missing.add(str(node["name"]))
                return
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(raw)
    return [f"+{name}.{MODEL_KIND}.{STUB_MODEL}.entrypoint=app.py" for name in sorted(missing)]


def load_environment(env: str | Path) -> LoadedEnv:
    """Load ``resources_servers/<env>/configs/<env>.yaml`` and the server class (or raise ConfigError)."""
    directory = resolve_env_dir(env)
    name = directory.name
    if directory.parent.name != RESOURCES_KIND:
        raise ConfigError([f"{directory}: an environment folder must be inside a {RESOURCES_KIND}/ folder"])
    config_path = directory / "configs" / f"{name}.yaml"
    if not config_path.is_file():
        raise ConfigError([f"{directory}: no config file configs/{name}.yaml"])
    try:
        raw = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        raw = None  # load_config reports it with line and column
    # The loader finds implementations through the catalog (working directory first); a folder given
    # by path elsewhere is loaded from the folder that holds its resources_servers/.
    try:
        found = catalog.find_implementation_dir(RESOURCES_KIND, name).resolve()
    except ConfigError:
        found = None
    context = contextlib.chdir(directory.parent.parent) if found != directory else contextlib.nullcontext()
    with context:
        config = load_config([config_path], _stub_overrides(raw))
    specs = config.by_kind(RESOURCES_KIND)
    if not specs:
        raise ConfigError([f"{config_path}: defines no {RESOURCES_KIND} instance"])
    spec = next((s for s in specs if s.name == name), specs[0])
    notes = [f"{len(specs) - 1} more instance(s) not checked"] if len(specs) > 1 else []
    if spec.directory.resolve() != directory and spec.implementation == name:
        spec = replace(spec, directory=directory)
    try:
        cls = server_class(spec)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(
            [f"{spec.directory / 'app.py'}: cannot import: {type(exc).__name__}: {exc}"]
        ) from exc
    low, high = _reward_range(spec, cls)
    datasets = []
    for agent in config.by_kind(AGENT_KIND):
        ref = agent.config.get("resources_server")
        if isinstance(ref, dict) and ref.get("name") == spec.name:
            datasets += [
                {**d, "agent": agent.name} for d in agent.config.get("datasets") or [] if isinstance(d, dict)
            ]
    return LoadedEnv(name, directory, config_path, spec, cls, (low, high), datasets, notes)  # type: ignore[arg-type]


def _reward_range(spec: ServerSpec, cls: type) -> tuple[float, float]:
    config_cls = getattr(cls, "config_class", None)
    try:
        config = config_cls.model_validate(spec.config) if config_cls is not None else None
    except ValueError as exc:
        raise ConfigError([f"{spec.name} ({spec.source}): {exc}"]) from exc
    value = getattr(config, "reward_range", (0.0, 1.0))
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ConfigError([f"{spec.name}: reward_range must be [low, high], not {value!r}"]) from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ConfigError([f"{spec.name}: reward_range must be finite with low < high, not {value!r}"])
    return low, high


def dataset_path(entry: dict[str, Any], env_dir: Path) -> Path | None:
    """A dataset's ``jsonl_fpath``: absolute, or relative to the working directory, the root that
    holds ``resources_servers/``, or the environment folder (first that exists)."""
    text = entry.get("jsonl_fpath")
    if not isinstance(text, str) or not text:
        return None
    path = Path(text).expanduser()
    if path.is_absolute():
        return path if path.is_file() else None
    for base in (Path.cwd(), env_dir.parent.parent, env_dir):
        if (base / path).is_file():
            return base / path
    return None


def example_dataset(loaded: LoadedEnv) -> tuple[Path | None, str]:
    """The dataset to check with (the agent's ``example`` one first) and a problem, if any."""
    entries = sorted(loaded.datasets, key=lambda d: d.get("type") != "example" and d.get("name") != "example")
    for entry in entries:
        path = dataset_path(entry, loaded.directory)
        if path is not None:
            return path, ""
    fallback = loaded.directory / "data" / "example.jsonl"
    if entries:
        listed = ", ".join(str(e.get("jsonl_fpath")) for e in entries)
        problem = f"dataset file(s) not found: {listed}"
    else:
        problem = f"no agent in {loaded.config_path.name} lists datasets for {loaded.spec.name}"
    return (fallback if fallback.is_file() else None), problem


def describe_environment(name: str) -> dict[str, Any]:
    """Name, domain, description, tools and datasets of one environment (``gym list environments``)."""
    info: dict[str, Any] = {"name": name, "domain": "", "description": "", "tools": [], "datasets": []}
    try:
        loaded = load_environment(name)
    except ConfigError as exc:
        return {**info, "error": "; ".join(exc.problems)}
    except Exception as exc:
        return {**info, "error": f"{type(exc).__name__}: {exc}"}
    info.update(
        domain=str(loaded.spec.config.get("domain") or "other"),
        description=str(loaded.spec.config.get("description") or ""),
        directory=str(loaded.directory),
        config=str(loaded.config_path),
        datasets=[
            {k: d.get(k) for k in ("name", "type", "jsonl_fpath", "agent") if d.get(k) is not None}
            for d in loaded.datasets
        ],
    )
    try:
        info["tools"] = [t["name"] for t in loaded.server_class.tool_schemas()]
    except Exception as exc:
        info["error"] = f"tool schemas: {type(exc).__name__}: {exc}"
    return info
