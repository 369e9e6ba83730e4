"""One environment: its config, resources server, agents, datasets and reward range, loaded once.

Every command that needs an environment's own files reads them here: ``gym env check`` (which
probes it), ``gym list environments`` (which describes it), blends, step plans, dataset
validation, step-wise collection and training (which read its datasets and verifier). An
environment is loaded the way ``gym env start`` loads it (the normal config loader and the
catalog), so ``${...}`` interpolation and ``env.yaml`` values mean the same in every command and
what passes here also starts. The differences: only the config is read up front (the server class
is imported when first asked for, so reading datasets never imports ``app.py``), and any model
server its agents reference but its config leaves out gets a stand-in (``STUB_MODEL``) so that
the config still validates on its own.

Dataset paths (``jsonl_fpath``) are resolved by one function, ``find_file``, against one list of
roots (``Environment.dataset_roots``), so a path one command accepts every command accepts.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import yaml

from polygym.kinds import AGENT_KIND, MODEL_KIND, RESOURCES_KIND
from polygym.net.client import ServerClient
from polygym.servers.resources import ResourcesServer
from polygym.stack import catalog
from polygym.stack.config import ConfigError, StackConfig, load_config
from polygym.stack.loader import build_server, server_class
from polygym.stack.nemo_gym_server import is_nemo_gym_server
from polygym.stack.server_spec import ServerSpec

STUB_MODEL = "scripted_model"
"""Stands in for model servers that agents reference but the environment's config leaves out."""

Split = Literal["train", "validation"]


class EnvironmentNotFoundError(ConfigError):
    """No such environment folder, or no ``configs/<name>.yaml`` in it.

    Distinct from a config that exists but is broken: a blend may name an environment that has no
    config of its own when it gives the data files (its servers then come from ``--config``).
    """


def find_file(text: str, roots: Sequence[Path]) -> Path | None:
    """``text`` as given when absolute, else under the first root that has it (None: nowhere)."""
    path = Path(text).expanduser()
    if path.is_absolute():
        return path if path.is_file() else None
    for root in roots:
        if (root / path).is_file():
            return root / path
    return None


@dataclass(frozen=True)
class Dataset:
    """One ``datasets`` entry of an agent in the environment's config (NeMo Gym's format)."""

    agent: str
    name: str | None
    type: str | None
    jsonl_fpath: str

    def to_dict(self) -> dict[str, str]:
        """The entry as listed by ``gym list environments`` (unset keys left out)."""
        fields = {"name": self.name, "type": self.type, "jsonl_fpath": self.jsonl_fpath, "agent": self.agent}
        return {key: value for key, value in fields.items() if value is not None}


@dataclass
class Environment:
    """``resources_servers/<name>/``: its loaded config and everything read from it.

    ``resources`` is the environment's own resources server instance (the one named like the
    folder, else the first); ``agents`` are every agent instance of its config.
    """

    name: str
    directory: Path
    config_path: Path
    config: StackConfig
    resources: ServerSpec
    notes: list[str] = field(default_factory=list)

    @property
    def root(self) -> Path:
        """The folder that holds ``resources_servers/`` (what shipped ``jsonl_fpath``s start from)."""
        return self.directory.parent.parent

    @property
    def agents(self) -> dict[str, ServerSpec]:
        return {spec.name: spec for spec in self.config.by_kind(AGENT_KIND)}

    def default_agent(self) -> str | None:
        """``<name>_simple_agent``, else the config's only agent (e.g. a episodic_agent)."""
        agents = self.agents
        preferred = f"{self.name}_simple_agent"
        if preferred in agents:
            return preferred
        return next(iter(agents)) if len(agents) == 1 else None

    def resources_server_of(self, agent: str) -> ServerSpec | None:
        """The resources server instance ``agent`` refers to, when this config defines it."""
        name = _resources_ref(self.agents[agent])
        if name == self.resources.name:
            return self.resources
        spec = self.config.servers.get(str(name))
        return spec if spec is not None and spec.kind == RESOURCES_KIND else None

    def datasets(self, agent: str | None = None) -> list[Dataset]:
        """The datasets ``agent`` lists, or (no agent) those of every agent of this environment's
        resources server."""
        if agent is not None:
            agents = [self.agents[agent]]
        else:
            agents = [a for a in self.agents.values() if _resources_ref(a) == self.resources.name]
        return [
            Dataset(spec.name, _text(entry.get("name")), _text(entry.get("type")), entry["jsonl_fpath"])
            for spec in agents
            for entry in spec.config.get("datasets") or []
            if isinstance(entry, dict) and isinstance(entry.get("jsonl_fpath"), str) and entry["jsonl_fpath"]
        ]

    def split_datasets(self, agent: str, split: Split) -> list[Dataset]:
        """``agent``'s datasets for a split: ``type: validation`` ones, or for training ``type: train``
        ones, else every one that is not validation (such as the shipped ``type: example`` files)."""
        entries = self.datasets(agent)
        if split == "validation":
            return [d for d in entries if d.type == "validation"]
        return [d for d in entries if d.type == "train"] or [d for d in entries if d.type != "validation"]

    @property
    def dataset_roots(self) -> list[Path]:
        """Where a relative ``jsonl_fpath`` is looked for: the working directory, the folder holding
        ``resources_servers/`` (so shipped examples work from anywhere), then the environment folder."""
        return list(dict.fromkeys((Path.cwd(), self.root, self.directory)))

    def find_dataset(self, dataset: Dataset) -> Path | None:
        return find_file(dataset.jsonl_fpath, self.dataset_roots)

    def example_dataset(self) -> tuple[Path | None, str]:
        """The dataset to check with (an ``example`` one first) and a problem, if any."""
        entries = sorted(self.datasets(), key=lambda d: d.type != "example" and d.name != "example")
        for entry in entries:
            path = self.find_dataset(entry)
            if path is not None:
                return path, ""
        fallback = self.directory / "data" / "example.jsonl"
        if entries:
            listed = ", ".join(e.jsonl_fpath for e in entries)
            problem = f"dataset file(s) not found: {listed}"
        else:
            problem = f"no agent in {self.config_path.name} lists datasets for {self.resources.name}"
        return (fallback if fallback.is_file() else None), problem

    @cached_property
    def server_class(self) -> type[ResourcesServer]:
        """The resources server class (imports ``app.py``; ConfigError when that fails)."""
        return load_server_class(self.resources)

    @cached_property
    def reward_range(self) -> tuple[float, float]:
        return _reward_range(self.resources, self.server_class)

    def build(self) -> ResourcesServer:
        return build_server(self.resources, ServerClient())  # type: ignore[return-value]


def _resources_ref(agent: ServerSpec) -> str | None:
    """The name in an agent's ``resources_server: {type, name}`` reference."""
    ref = agent.config.get("resources_server")
    return ref.get("name") if isinstance(ref, dict) else None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def load_server_class(spec: ServerSpec) -> type:
    """``spec``'s class; an import failure becomes a ConfigError naming the ``app.py``."""
    try:
        return server_class(spec)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(
            [f"{spec.directory / 'app.py'}: cannot import: {type(exc).__name__}: {exc}"]
        ) from exc


def resolve_env_dir(env: str | Path) -> Path:
    """A name is looked up like ``--resources-server`` (working directory, then shipped); a path as is."""
    if isinstance(env, Path) or "/" in env or "\\" in env:
        path = Path(env).expanduser().resolve()
        if not path.is_dir():
            raise EnvironmentNotFoundError([f"environment folder {env} does not exist"])
        return path
    try:
        return catalog.find_implementation_dir(RESOURCES_KIND, env).resolve()
    except ConfigError as exc:
        raise EnvironmentNotFoundError(exc.problems) from None


def config_file(env: str | Path) -> Path:
    """``<folder>/configs/<name>.yaml`` of ``env`` (EnvironmentNotFoundError when there is none).

    NeMo Gym folders often have no config named after them: their configs declare servers under
    other names (``format_verification/configs/citation_format.yaml`` declares ``citation_format``).
    A name is then found as a resources server declared by a config of some folder, and a folder
    name stands for its one such config (several: the error names them)."""
    try:
        directory = resolve_env_dir(env)
    except EnvironmentNotFoundError:
        declared = None if isinstance(env, Path) else declaring_config(env)
        if declared is None:
            raise
        return declared
    if directory.parent.name != RESOURCES_KIND:
        raise ConfigError([f"{directory}: an environment folder must be inside a {RESOURCES_KIND}/ folder"])
    path = directory / "configs" / f"{directory.name}.yaml"
    if path.is_file():
        return path
    variants = declared_servers(directory)
    if isinstance(env, str) and env in variants:
        return variants[env]
    if len(set(variants.values())) == 1:
        return next(iter(variants.values()))
    names = ", ".join(sorted(variants)) or "none"
    raise EnvironmentNotFoundError(
        [f"{directory}: no config file configs/{directory.name}.yaml; its configs declare {names} (name one)"]
    )


def declared_servers(directory: Path) -> dict[str, Path]:
    """The resources server instances declared by a folder's config files, each with its file."""
    found: dict[str, Path] = {}
    for path in sorted((directory / "configs").glob("*.yaml")):
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # loading it reports the problem, when it is the one asked for
        if isinstance(data, dict):
            for name, block in data.items():
                if isinstance(block, dict) and RESOURCES_KIND in block:
                    found.setdefault(str(name), path)
    return found


def declaring_config(name: str) -> Path | None:
    """The config file, in any environment folder, that declares resources server ``name``."""
    for folder in catalog.list_implementations(RESOURCES_KIND):
        try:
            directory = catalog.find_implementation_dir(RESOURCES_KIND, folder)
        except ConfigError:
            continue
        declared = declared_servers(directory).get(name)
        if declared is not None:
            return declared
    return None


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


def _load_stack_config(config_path: Path) -> StackConfig:
    """The environment's config through ``load_config``, with stand-ins for missing model servers."""
    directory = config_path.parent.parent
    try:
        raw = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        raw = None  # load_config reports it with line and column
    # The loader finds implementations through the catalog (working directory first); a folder given
    # by path elsewhere is loaded from the folder that holds its resources_servers/.
    try:
        found = catalog.find_implementation_dir(RESOURCES_KIND, directory.name).resolve()
    except ConfigError:
        found = None
    context = contextlib.chdir(directory.parent.parent) if found != directory else contextlib.nullcontext()
    with context:
        return load_config([config_path], _stub_overrides(raw))


def load_environment(env: str | Path) -> Environment:
    """Load ``resources_servers/<env>/configs/<env>.yaml`` (a name or a folder); ConfigError listing
    every problem, EnvironmentNotFoundError when there is no such environment."""
    return _load_from(config_file(env), env)


def _load_from(config_path: Path, env: str | Path) -> Environment:
    directory = config_path.parent.parent
    config = _load_stack_config(config_path)
    specs = config.by_kind(RESOURCES_KIND)
    if not specs:
        raise ConfigError([f"{config_path}: defines no {RESOURCES_KIND} instance"])
    named = str(env) if isinstance(env, str) and env in config.servers else directory.name
    spec = next((s for s in specs if s.name == named), specs[0])
    notes = [f"{len(specs) - 1} more instance(s) not checked"] if len(specs) > 1 else []
    if spec.directory.resolve() != directory and spec.implementation == directory.name:
        spec = replace(spec, directory=directory)
    return Environment(named, directory, config_path, config, spec, notes)


def all_environments() -> dict[str, Environment]:
    """Every environment whose config loads, by name (broken ones are skipped)."""
    found: dict[str, Environment] = {}
    for name in catalog.list_implementations(RESOURCES_KIND):
        try:
            found[name] = load_environment(name)
        except EnvironmentNotFoundError:  # no config named after the folder: each one it declares
            found.update(_declared_environments(name))
        except ConfigError:
            continue
    return found


def _declared_environments(folder: str) -> dict[str, Environment]:
    try:
        directory = catalog.find_implementation_dir(RESOURCES_KIND, folder)
    except ConfigError:
        return {}
    loaded: dict[str, Environment] = {}
    for name, path in declared_servers(directory).items():
        with contextlib.suppress(ConfigError):
            loaded[name] = _load_from(path, name)
    return loaded


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


def describe_environment(name: str) -> dict[str, Any]:
    """Name, domain, description, tools and datasets of one environment (``gym list environments``).

    A NeMo Gym server is described from its config alone (``nemo_gym: true``, no tools): importing
    its app needs its own Python environment, and its tools are only known to the running server.
    """
    info: dict[str, Any] = {"name": name, "domain": "", "description": "", "tools": [], "datasets": []}
    try:
        env = load_environment(name)
        if is_nemo_gym_server(env.resources):
            return {**info, **_config_info(env), "nemo_gym": True}
        cls = env.server_class  # an app.py that does not import makes the environment broken
    except ConfigError as exc:
        return {**info, "error": "; ".join(exc.problems)}
    except Exception as exc:
        return {**info, "error": f"{type(exc).__name__}: {exc}"}
    info.update(_config_info(env))
    try:
        info["tools"] = [t["name"] for t in cls.tool_schemas()]
    except Exception as exc:
        info["error"] = f"tool schemas: {type(exc).__name__}: {exc}"
    return info


def _config_info(env: Environment) -> dict[str, Any]:
    return {
        "domain": str(env.resources.config.get("domain") or "other"),
        "description": str(env.resources.config.get("description") or ""),
        "directory": str(env.directory),
        "config": str(env.config_path),
        "datasets": [d.to_dict() for d in env.datasets()],
    }
