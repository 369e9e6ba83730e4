"""Loading NeMo Gym-compatible YAML configs into a checked, fully resolved stack description.

Users bring config files written for NeMo Gym, so the format is theirs: top-level entries are either
server instances (``<name>: {<kind>: {<implementation>: {...}}}``) or global values used by
``${...}`` interpolation. Files are merged with OmegaConf (later files win, mappings merge deeply).

The loader's main job beyond merging is to fail *once* with *every* problem: a stack that needs five
fixes should not take five runs to discover them. So nothing is resolved until the whole merged config
has been scanned, and every problem names the file that set the offending key (provenance is tracked
per dotted key) and, for names, what the user probably meant.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import (
    InterpolationKeyError,
    InterpolationToMissingValueError,
    OmegaConfBaseException,
)

from polygym import redact
from polygym.errors import ConfigError
from polygym.kinds import (
    AGENT_KIND,
    ENVIRONMENT_KIND,
    ENVIRONMENT_ROUTES,
    FOLDER_KINDS,
    LEGACY_RELAY,
    SERVER_KINDS,
)
from polygym.stack import bounded_yaml, catalog
from polygym.stack.catalog import describe_unknown
from polygym.stack.directives import apply_directives
from polygym.stack.env_build import PACKAGE_KEY, PYTHON_KEY
from polygym.stack.external import EXTERNAL, NO_FOLDER
from polygym.stack.server_spec import ServerSpec, config_references, join_key
from polygym.suggest import closest

MISSING = "???"
COMMAND_LINE = "command line"
CONFIG_PATHS = "config_paths"
NEMO_GYM_SETTINGS = (catalog.NEMO_GYM_ROOT_KEY, PYTHON_KEY, PACKAGE_KEY, catalog.NEMO_GYM_FORK_KEY)
"""polygym's top-level keys for running NeMo Gym's servers (``stack.nemo_gym_server``); not
passed on to those servers, and "unused" only in a stack that runs none."""

_ABSENT = object()  # "no such key", distinct from a key whose value is None
_UNRESOLVED = object()  # a value that could not be resolved; its problem is already recorded
# ${a.b.c}: a plain absolute key (not a resolver call such as ${oc.env:X}, not a relative ${.x}).
_KEY_REFERENCE = re.compile(r"\$\{\s*([A-Za-z_][\w\-]*(?:\.[\w\-]+)*)\s*\}")
_OVERRIDE_KEY = re.compile(r"[^\s.=]+(?:\.[^\s.=]+)*")


@dataclass
class StackConfig:
    """The merged configuration: server instances in file order plus global values."""

    servers: dict[str, ServerSpec]
    globals: dict[str, Any]
    sources: list[str]
    warnings: list[str] = field(default_factory=list)
    """Top-level values no server uses (see ``_unused_globals``); the CLI prints them."""
    relays: dict[str, str] = field(default_factory=dict)
    """NeMo Gym ``legacy_agent`` environment servers -> the agent each relays to (not started)."""

    def by_kind(self, kind: str) -> list[ServerSpec]:
        """Servers of one kind, in file order."""
        if kind not in FOLDER_KINDS:
            raise ValueError(describe_unknown("server kind", kind, FOLDER_KINDS))
        return [spec for spec in self.servers.values() if spec.kind == kind]

    def to_dict(self, mask_secrets: bool = True) -> dict[str, Any]:
        """The merged config as plain data; secrets masked by default because this gets shown and served."""
        data: dict[str, Any] = {key: _copy(value) for key, value in self.globals.items()}
        for spec in self.servers.values():
            data[spec.name] = {spec.kind: {spec.implementation: _copy(spec.config)}}
        return redact.mask_secrets(data) if mask_secrets else data


def _copy(data: Any) -> Any:
    """Deep copy of plain data, so callers can edit what ``to_dict`` returns without touching specs."""
    if isinstance(data, Mapping):
        return {key: _copy(value) for key, value in data.items()}
    if isinstance(data, list):
        return [_copy(item) for item in data]
    return data


# ------------------------------------------------------------------------------------------ plain data


def _lookup(data: Any, dotted: str) -> Any:
    """The raw value at a dotted key (list items by index), or ``_ABSENT``."""
    node = data
    for part in dotted.split("."):
        if isinstance(node, Mapping):
            if part in node:
                node = node[part]
            elif part.lstrip("-").isdigit() and int(part) in node:
                node = node[int(part)]
            else:
                return _ABSENT
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _ABSENT
    return node


def _walk(data: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every ``(dotted key, value)`` pair, containers included, depth first."""
    items = data.items() if isinstance(data, Mapping) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        path = join_key(prefix, key)
        yield path, value
        yield from _walk(value, path)


def _referenced_keys(data: Any) -> set[str]:
    """Keys named by ``${key}`` interpolations anywhere, with their top-level parts."""
    keys: set[str] = set()
    for _, value in _walk(data):
        if isinstance(value, str):
            for match in _KEY_REFERENCE.finditer(value):
                keys.update({match.group(1), match.group(1).split(".")[0]})
    return keys


def _yaml_friendly(data: Any) -> Any:
    """YAML dates become ISO strings: OmegaConf cannot hold date objects and users meant the text."""
    if isinstance(data, dict):
        return {key: _yaml_friendly(value) for key, value in data.items()}
    if isinstance(data, list):
        return [_yaml_friendly(item) for item in data]
    if isinstance(data, (_dt.date, _dt.datetime)):
        return data.isoformat()
    return data


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _display(path: Path) -> str:
    """Paths under the working directory are shown relative to it: shorter, and what users typed."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# ------------------------------------------------------------------------------------------- loading


def _load_file(path: Path, problems: list[str]) -> dict[str, Any] | None:
    """Parse one file into a mapping, or record why it cannot be used and return None."""
    shown = _display(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        problems.append(f"{shown}: cannot read config file: {exc.strerror or exc}")
        return None
    try:
        data = bounded_yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        what = getattr(exc, "problem", None) or _first_line(exc)
        context = getattr(exc, "context", None)
        if context:
            what = f"{what} ({context})"
        where = f"{shown}:{mark.line + 1}:{mark.column + 1}" if mark else shown
        problems.append(f"{where}: invalid YAML: {what}")
        return None
    if data is None:
        return {}
    if not isinstance(data, dict):
        problems.append(
            f"{shown}: the top level must be a mapping of server instances and global values, "
            f"not a {type(data).__name__}"
        )
        return None
    data = _yaml_friendly(data)
    bad = _bad_interpolations(data)
    problems.extend(f"{shown}: {problem}" for problem in bad)
    return None if bad else data


def _bad_interpolations(data: Any) -> list[str]:
    """Strings whose ``${`` is not valid interpolation syntax (OmegaConf would reject the whole file)."""
    problems = []
    for key, value in _walk(data):
        if isinstance(value, str) and "${" in value:
            try:
                OmegaConf.create({"value": value})
            except OmegaConfBaseException:
                problems.append(f"{key}: invalid interpolation in {value!r}; write \\${{ for a literal ${{")
    return problems


def parse_override(text: str) -> tuple[str, Any, bool]:
    """Split ``key=value`` / ``+key=value`` / ``++key=value`` into ``(key, value, add)``.

    Hydra's meanings: ``key=`` changes a key that exists, ``+key=`` adds one, ``++key=`` adds or
    changes. ``add`` is true for both prefixed forms (neither needs the key to exist); a ``+key=``
    whose key exists is accepted as well, since in a merged stack which file set it is incidental.

    The value is read as a YAML scalar or flow collection (``3``, ``true``, ``[1, 2]``, ``{a: 1}``), so
    types match what the same text would mean in a file. Text that only looks like block YAML
    (``a: b``) or is not YAML at all stays a string, and an empty value is the empty string.
    """
    body = text.lstrip("+")
    add = body != text
    key, sep, raw = body.partition("=")
    key = key.strip()
    if len(text) - len(body) > 2 or not sep or not _OVERRIDE_KEY.fullmatch(key):
        raise ConfigError(
            [f"bad override '{text}': expected key=value, +key=value or ++key=value (key dotted, e.g. a.b=1)"]
        )
    return key, _override_value(raw, text), add


def _override_value(raw: str, text: str) -> Any:
    if raw.strip() == "":
        return ""
    flow = raw.lstrip().startswith(("[", "{"))
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        if flow:
            raise ConfigError(
                [f"bad override '{text}': value is not valid YAML: {_first_line(exc)}"]
            ) from None
        return raw
    if isinstance(value, (dict, list)) and not flow:
        return raw
    return _yaml_friendly(value)


class _Provenance:
    """Which source last set each dotted key; lookups fall back to the closest recorded parent."""

    def __init__(self) -> None:
        self._by_key: dict[str, str] = {}

    def record(self, key: str, value: Any, source: str, before: Any, keep_on_missing: bool) -> None:
        """Mirror OmegaConf's merge: mappings merge key by key, anything else replaces the whole subtree."""
        if keep_on_missing and value == MISSING and _lookup(before, key) not in (_ABSENT, MISSING):
            return  # OmegaConf keeps an existing value when a later file only says "required"
        if isinstance(value, Mapping):
            if key:
                self._by_key[key] = source
            for child, child_value in value.items():
                self.record(join_key(key, child), child_value, source, before, keep_on_missing)
            return
        prefix = f"{key}."
        for recorded in [k for k in self._by_key if k.startswith(prefix)]:
            del self._by_key[recorded]
        self._by_key[key] = source

    def source_of(self, key: str) -> str:
        parts = key.split(".")
        while parts:
            found = self._by_key.get(".".join(parts))
            if found is not None:
                return found
            parts.pop()
        return "unknown source"


@dataclass
class _Stack:
    """Working state while loading: the merged config, its provenance and the problems so far."""

    merged: DictConfig
    provenance: _Provenance
    problems: list[str]
    relays: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def raw(self) -> dict[str, Any]:
        return OmegaConf.to_container(self.merged, resolve=False)  # type: ignore[return-value]

    def origin(self, key: str) -> str:
        return self.provenance.source_of(key)


def _merge_files(stack: _Stack, files: list[tuple[str, dict[str, Any]]]) -> None:
    for source, data in files:
        before = stack.raw()
        try:
            stack.merged = OmegaConf.merge(stack.merged, OmegaConf.create(data))  # type: ignore[assignment]
        except (OmegaConfBaseException, ValueError, TypeError) as exc:
            stack.problems.append(f"{source}: cannot merge: {_first_line(exc)}")
            continue
        stack.provenance.record("", data, source, before, keep_on_missing=True)


def _apply_overrides(stack: _Stack, overrides: list[tuple[str, str, Any, bool]]) -> None:
    """Apply command-line overrides; a plain ``key=`` must hit a known key so typos do not pass silently."""
    for text, key, value, add in overrides:
        before = stack.raw()
        if not add and _lookup(before, key) is _ABSENT and key not in _referenced_keys(before):
            message = f"unknown key '{key}' in override '{text}'; use +{text} to add it"
            match = closest(key, [path for path, _ in _walk(before)])
            stack.problems.append(message + (f". Did you mean '{match[0]}'?" if match else ""))
            continue
        try:
            OmegaConf.update(stack.merged, key, value, merge=True)
        except (OmegaConfBaseException, ValueError, TypeError, KeyError, IndexError) as exc:
            stack.problems.append(f"cannot apply override '{text}': {_first_line(exc)}")
            continue
        stack.provenance.record(key, value, COMMAND_LINE, before, keep_on_missing=False)


# ------------------------------------------------------------------------------------------- checking


def _scan_values(stack: _Stack, node: DictConfig | ListConfig, prefix: str, raw: Any) -> Any:
    """Resolve every leaf on its own, recording each missing value and failed interpolation.

    Returns plain data with ``_UNRESOLVED`` where a value failed, so later checks can skip those.
    """
    keys: list[Any] = list(node.keys()) if isinstance(node, DictConfig) else list(range(len(node)))
    out: dict[Any, Any] = {}
    for key in keys:
        path = join_key(prefix, key)
        if OmegaConf.is_missing(node, key):
            stack.problems.append(f"{path}: missing required value (from {stack.origin(path)})")
            out[key] = _UNRESOLVED
        elif OmegaConf.is_interpolation(node, key):
            out[key] = _resolve_interpolation(stack, node, key, path, raw)
        else:
            child = node[key]
            is_container = isinstance(child, (DictConfig, ListConfig))
            out[key] = _scan_values(stack, child, path, raw) if is_container else child
    return out if isinstance(node, DictConfig) else list(out.values())


def _resolve_interpolation(stack: _Stack, node: Any, key: Any, path: str, raw: Any) -> Any:
    """Resolve one ``${...}`` value, or record a problem that says which key to set and where."""
    text = str(_lookup(raw, path))
    try:
        value = node[key]
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    except OmegaConfBaseException as exc:
        stack.problems.extend(_interpolation_problems(path, text, exc, raw, stack.origin(path)))
        return _UNRESOLVED


def _interpolation_problems(path: str, text: str, exc: Exception, raw: Any, origin: str) -> list[str]:
    """Name the unset keys (the usual cause: a missing env.yaml entry) or, failing that, the error."""
    named = list(dict.fromkeys(m.group(1) for m in _KEY_REFERENCE.finditer(text)))
    unset = [name for name in named if _lookup(raw, name) in (_ABSENT, MISSING)]
    if unset:
        return [
            f"{path}: needs '${{{name}}}', which is not set; add {name} to env.yaml "
            f"or pass {name}=... (from {origin})"
            for name in unset
        ]
    if named and isinstance(exc, (InterpolationKeyError, InterpolationToMissingValueError)):
        depends = ", ".join(f"'${{{name}}}'" for name in named)
        return [f"{path}: uses {depends}, which cannot be resolved either (from {origin})"]
    return [f"{path}: cannot resolve {text!r}: {_first_line(exc)} (from {origin})"]


@dataclass
class _Entry:
    """A top-level entry that looks like a server instance, before its values are checked."""

    name: str
    kind: str
    implementation: str
    directory: Path | None


def _classify(stack: _Stack, raw: dict[str, Any]) -> tuple[list[_Entry], dict[str, set[str]]]:
    """Split top-level entries into server instances and globals, recording shape problems.

    Returns usable entries and, per kind, every instance name (even broken ones, so that a reference to
    an instance with a typo inside is not reported twice).
    """
    entries: list[_Entry] = []
    instances: dict[str, set[str]] = {kind: set() for kind in SERVER_KINDS}
    for name, value in raw.items():
        if not isinstance(value, dict):
            continue
        if ENVIRONMENT_KIND in value:
            server = _check_environment_server(stack, str(name), value, raw)
            entries.extend([server] if server is not None else [])
            continue
        kinds = [key for key in value if key in SERVER_KINDS]
        if not kinds:
            _check_kind_typo(stack, str(name), value)
            continue
        for kind in kinds:
            instances[kind].add(str(name))
        if len(value) != 1:
            found = ", ".join(str(key) for key in value)
            stack.problems.append(
                f"{name}: a server instance holds exactly one server kind, found {found} "
                f"(from {stack.origin(str(name))})"
            )
            continue
        entry = _check_implementation(stack, str(name), kinds[0], value[kinds[0]])
        if entry is not None:
            entries.append(entry)
    return entries, instances


def _check_environment_server(
    stack: _Stack, name: str, value: dict[Any, Any], raw: dict[str, Any]
) -> _Entry | None:
    """NeMo Gym 0.7's ``environment_servers``: its ``legacy_agent`` relay, or one of its own servers.

    The relay forwards each rollout to one agent unchanged, which is what polygym does without it
    (rows reach their agent directly), so it is recorded in ``StackConfig.relays`` and not started.
    Any other environment server (``single_agent_turn``, ...) is a NeMo Gym folder that runs one
    episode per ``/run``: it is a server of the stack, started as NeMo Gym's servers are
    (``stack.nemo_gym_server``); polygym ships none, so a folder that is not NeMo Gym's is refused.
    """
    impls = value[ENVIRONMENT_KIND]
    impl = next(iter(impls), None) if isinstance(impls, dict) and len(impls) == 1 else None
    inner = impls.get(impl) if isinstance(impls, dict) and impl is not None else None
    target = inner.get("agent_server") if isinstance(inner, dict) else None
    agent = target.get("name") if isinstance(target, dict) else None
    block = raw.get(agent) if isinstance(agent, str) else None
    is_agent = isinstance(block, dict) and AGENT_KIND in block
    if impl == LEGACY_RELAY and len(value) == 1 and is_agent:
        stack.relays[name] = str(agent)
        return None
    if impl == LEGACY_RELAY or len(value) != 1:
        why = (
            f"its agent_server names '{agent}', which is not a responses_api_agents instance"
            if impl == LEGACY_RELAY
            else "a server instance holds exactly one server kind, found " + ", ".join(map(str, value))
        )
        stack.problems.append(f"{name}: '{ENVIRONMENT_KIND}': {why} (from {stack.origin(name)})")
        return None
    entry = _check_implementation(stack, name, ENVIRONMENT_KIND, impls)
    if entry is None or entry.directory is None or _runs_nemo_gym(entry, raw):
        return entry
    stack.problems.append(
        f"{name}: '{ENVIRONMENT_KIND}/{entry.implementation}' ({entry.directory}) is not NeMo Gym's: "
        f"polygym runs only NeMo Gym's environment servers (from {stack.origin(name)})"
    )
    return None


def _check_routes(stack: _Stack, raw: dict[str, Any], entries: list[_Entry]) -> None:
    """``environment_server_routes`` must map tasksets to environment servers of the stack."""
    routes = raw.get(ENVIRONMENT_ROUTES, {})
    if routes is None:
        return
    servers = [entry.name for entry in entries if entry.kind == ENVIRONMENT_KIND]
    if not isinstance(routes, dict):
        origin = stack.origin(ENVIRONMENT_ROUTES)
        stack.problems.append(f"{ENVIRONMENT_ROUTES}: must map tasksets to environment servers ({origin})")
        return
    for taskset, server in routes.items():
        key = f"{ENVIRONMENT_ROUTES}.{taskset}"
        if server not in servers:
            message = describe_unknown("environment server", str(server), servers, stack.origin(key))
            stack.problems.append(f"{key}: {message}")


def _check_kind_typo(stack: _Stack, name: str, value: dict[Any, Any]) -> None:
    """A single-key mapping shaped like a server whose key is close to a kind is almost surely a typo."""
    if len(value) != 1:
        return
    ((key, inner),) = value.items()
    if isinstance(inner, (dict, type(None))) and closest(str(key), SERVER_KINDS):
        stack.problems.append(
            f"{name}: " + describe_unknown("server kind", str(key), SERVER_KINDS, stack.origin(name))
        )


def _check_implementation(stack: _Stack, name: str, kind: str, impls: Any) -> _Entry | None:
    path = f"{name}.{kind}"
    origin = stack.origin(path)
    if not isinstance(impls, dict) or len(impls) != 1:
        found = ", ".join(str(key) for key in impls) if isinstance(impls, dict) and impls else "none"
        stack.problems.append(f"{path}: expected exactly one implementation, found {found} (from {origin})")
        return None
    ((implementation, inner),) = impls.items()
    implementation = str(implementation)
    if implementation == EXTERNAL:  # run by someone else: no folder (``stack.external``)
        return _Entry(name, kind, implementation, NO_FOLDER)
    if inner is not None and not isinstance(inner, dict):
        stack.problems.append(
            f"{path}.{implementation}: server config must be a mapping, not {type(inner).__name__} "
            f"(from {stack.origin(f'{path}.{implementation}')})"
        )
    if isinstance(inner, dict) and inner.get(catalog.NEMO_GYM_KEY) is True:
        try:
            return _Entry(
                name, kind, implementation, catalog.find_implementation_dir(kind, implementation, True)
            )
        except ConfigError as exc:
            stack.problems.extend(f"{path}: {problem} (from {origin})" for problem in exc.problems)
            return None
    try:
        directory: Path | None = catalog.find_implementation_dir(kind, implementation)
    except ConfigError:
        directory = catalog.folder_of_config(kind, Path(stack.origin(f"{path}.{implementation}")))
    if directory is None:
        stack.problems.append(
            f"{path}: " + catalog.describe_missing_implementation(kind, implementation, origin)
        )
    return _Entry(name, kind, implementation, directory)


def _check_references(
    stack: _Stack, entry: _Entry, inner: Any, instances: dict[str, set[str]], nemo_gym: bool
) -> None:
    """Every reference must name a server of the stack, except, in a NeMo Gym server, one nested
    below the server's own fields: NeMo Gym checks only the fields themselves, so its configs name
    servers that another config brings (``ns_tools``'s ``verifiers.math_with_judge``, a folder its
    usage says to add with ``--resources-server math_with_judge``). That one is a warning: the stack
    starts as NeMo Gym's does, and the server's calls to it fail until the config is added."""
    prefix = f"{entry.name}.{entry.kind}.{entry.implementation}"
    for key, kind, name in config_references(inner, prefix):
        if kind is _UNRESOLVED or name is _UNRESOLVED:
            continue
        origin = stack.origin(f"{key}.name")
        if kind not in SERVER_KINDS:
            message = describe_unknown("server kind", str(kind), SERVER_KINDS, stack.origin(f"{key}.type"))
            stack.problems.append(f"{key}: reference to {message}")
        elif name not in instances[kind]:
            message = f"{key}: " + describe_unknown(f"{kind} server", str(name), instances[kind], origin)
            if nemo_gym and "." in key.removeprefix(f"{prefix}."):
                stack.warnings.append(f"{message} (NeMo Gym starts it; its calls to '{name}' will fail)")
            else:
                stack.problems.append(message)


# ------------------------------------------------------------------------------------------- public


def _include_dirs(including: Path) -> list[Path]:
    """Where a relative ``config_paths`` entry of ``including`` is looked for, in NeMo Gym's order:
    the NeMo Gym roots named by ``--nemo-gym-root`` (NeMo Gym's ``--search-dir``), the working
    directory, then the install root, which for a NeMo Gym config is the tree the file lives in
    (an unpacked wheel, a checkout) or an installed nemo-gym; then polygym's project root and the
    including file's own folder. So NeMo Gym's configs include NeMo Gym's files from any working
    directory, as ``ng_run`` does."""
    installed = catalog.installed_nemo_gym_root()
    named = [root for root in catalog.nemo_gym_roots() if root != installed]
    tree = catalog.tree_root(including)
    candidates = [*named, Path.cwd(), *([tree] if tree else []), *([installed] if installed else [])]
    return [*candidates, catalog.project_root(), including.resolve().parent]


def _find_include(entry: Any, including: Path, problems: list[str]) -> Path | None:
    shown = _display(including)
    if not isinstance(entry, str) or not entry.strip():
        problems.append(f"{shown}: {CONFIG_PATHS} entries must be paths, got {entry!r}")
        return None
    path = Path(entry).expanduser()
    candidates = (
        [path]
        if path.is_absolute()
        else list(dict.fromkeys(root / path for root in _include_dirs(including)))
    )
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    looked = ", ".join(str(candidate) for candidate in candidates)
    problems.append(f"{shown}: {CONFIG_PATHS} entry '{entry}' not found (looked in {looked})")
    return None


def _include_list(value: Any, shown: str, problems: list[str]) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        problems.append(f"{shown}: {CONFIG_PATHS} must be a list of paths, got {value!r}")
        return []
    return value


def _with_includes(
    path: Path, problems: list[str], seen: set[Path], includes: Any = _ABSENT
) -> list[tuple[str, dict[str, Any]]]:
    """``path``'s ``config_paths`` files (each after its own), then ``path``: a file overrides what it
    includes, and a later include overrides an earlier one, as in NeMo Gym. A file already merged
    is not merged again, which also stops include cycles. ``includes`` given: only those files, for
    a ``config_paths`` override (``path`` then only names it in messages)."""
    shown = _display(path)
    data = _load_file(path, problems) if includes is _ABSENT else {}
    if data is None:
        return []
    out: list[tuple[str, dict[str, Any]]] = []
    listed = data.pop(CONFIG_PATHS, None) if includes is _ABSENT else includes
    for entry in _include_list(listed, shown, problems):
        found = _find_include(entry, path, problems)
        if found is not None and found.resolve() not in seen:
            seen.add(found.resolve())
            out.extend(_with_includes(found, problems, seen))
    return [*out, (shown, data)] if includes is _ABSENT else out


def _read_inputs(
    paths: Sequence[Path], overrides: Sequence[str], env_files: Sequence[Path]
) -> tuple[list[tuple[str, dict[str, Any]]], list[tuple[str, str, Any, bool]], list[str]]:
    """Parse files (with their ``config_paths``) and overrides; any failure here stops loading since
    the merged view would be wrong. A ``config_paths=[...]`` override names more files to merge
    after ``paths``, as in NeMo Gym, instead of becoming a value."""
    problems: list[str] = []
    parsed: list[tuple[str, str, Any, bool]] = []
    for text in overrides:
        try:
            parsed.append((text, *parse_override(text)))
        except ConfigError as exc:
            problems.extend(exc.problems)
    seen = {Path(path).resolve() for path in [*env_files, *paths]}
    files: list[tuple[str, dict[str, Any]]] = []
    for path in [*env_files, *paths]:
        files.extend(_with_includes(Path(path), problems, seen))
    for text, _, value, _ in [item for item in parsed if item[1] == CONFIG_PATHS]:
        files.extend(_with_includes(Path(text), problems, seen, value))
    return files, [item for item in parsed if item[1] != CONFIG_PATHS], problems


def load_config(
    paths: Sequence[Path], overrides: Sequence[str] = (), env_files: Sequence[Path] | None = None
) -> StackConfig:
    """Merge env.yaml files, then ``paths`` in order, then overrides; check everything; resolve.

    Raises one ``ConfigError`` carrying every problem found. ``env_files`` defaults to the env.yaml
    files of the project root and the working directory.
    """
    env = catalog.env_yaml_paths() if env_files is None else list(env_files)
    files, parsed, problems = _read_inputs(paths, overrides, env)
    if problems:
        raise ConfigError(problems)
    stack = _Stack(OmegaConf.create({}), _Provenance(), [])
    _merge_files(stack, files)
    _apply_overrides(stack, parsed)
    _apply_directives(stack)
    raw = stack.raw()
    root = raw.get(catalog.NEMO_GYM_ROOT_KEY)
    with catalog.config_nemo_gym_root(str(root) if isinstance(root, str) else None):
        entries, instances = _classify(stack, raw)
    scanned = _scan_values(stack, stack.merged, "", raw)
    nemo_gym = {entry.name for entry in entries if _runs_nemo_gym(entry, raw)}  # reads entrypoints
    for entry in entries:
        inner = scanned[entry.name][entry.kind][entry.implementation]
        _check_references(stack, entry, inner, instances, entry.name in nemo_gym)
    _check_routes(stack, raw, entries)
    if stack.problems:
        raise ConfigError(stack.problems)
    unused = _unused_globals(stack, raw, entries, {_display(Path(path)) for path in env}, bool(nemo_gym))
    refused = [name for name in unused if stack.origin(name) == COMMAND_LINE]
    if refused:
        raise ConfigError(
            [f"override of '{name}' cannot be honoured: no server of this stack uses it" for name in refused]
        )
    config = _build(stack, entries, [source for source, _ in files])
    config.warnings = stack.warnings + [
        f"{name}: not used by any server of this stack, ignored (from {stack.origin(name)})"
        for name in unused
    ]
    config.relays = dict(stack.relays)
    return config


def _apply_directives(stack: _Stack) -> None:
    """Run NeMo Gym's ``_inherit_from`` / ``_copy`` / ``_delete_key`` over the merged config (after
    the overrides, as NeMo Gym does, so an override can add a directive or change a source)."""
    raw = stack.raw()
    problems = apply_directives(raw)
    stack.problems.extend(f"{problem} (from {stack.origin(problem.split(':')[0])})" for problem in problems)
    stack.merged = OmegaConf.create(raw)


def _unused_globals(
    stack: _Stack, raw: dict[str, Any], entries: list[_Entry], env: set[str], runs_nemo_gym: bool
) -> list[str]:
    """Top-level values that are not servers and that no ``${...}`` uses.

    From a file these are a warning, not an error: NeMo Gym configs routinely carry values for
    other programs that read the same file (a trainer's settings, ``hf_token`` ...), so refusing
    them would refuse working configs; but a value polygym drops must not pass unmentioned either.
    From the command line they are an error: the user asked for this run to change. env.yaml
    values are exempt: that file is a shared store of values for many configs.
    """
    servers = {entry.name for entry in entries} | set(stack.relays)
    used = _referenced_keys(raw) | {ENVIRONMENT_ROUTES}
    if runs_nemo_gym:
        used |= {*NEMO_GYM_SETTINGS, catalog.RAY_HEAD_NODE_KEY}  # the last is read by NeMo Gym's servers
    return [
        str(name)
        for name in raw
        if name not in servers and name not in used and stack.origin(str(name)) not in env
    ]


def _runs_nemo_gym(entry: _Entry, raw: dict[str, Any]) -> bool:
    """Whether ``entry`` is a NeMo Gym server (marked ``nemo_gym: true``, or a NeMo Gym folder:
    ``catalog.is_nemo_gym_folder``)."""
    inner = raw[entry.name][entry.kind][entry.implementation]
    entrypoint = str(inner.get("entrypoint") or "app.py") if isinstance(inner, dict) else "app.py"
    marked = isinstance(inner, dict) and inner.get(catalog.NEMO_GYM_KEY) is True
    return marked or (entry.directory is not None and catalog.is_nemo_gym_folder(entry.directory, entrypoint))


def _build(stack: _Stack, entries: list[_Entry], sources: list[str]) -> StackConfig:
    resolved: dict[str, Any] = OmegaConf.to_container(stack.merged, resolve=True)  # type: ignore[assignment]
    by_name = {entry.name: entry for entry in entries}
    servers: dict[str, ServerSpec] = {}
    global_values: dict[str, Any] = {}
    for name, value in resolved.items():
        entry = by_name.get(str(name))
        if str(name) in stack.relays:
            continue
        if entry is None:
            global_values[str(name)] = value
            continue
        assert entry.directory is not None  # a missing directory was reported as a problem
        servers[entry.name] = ServerSpec(
            name=entry.name,
            kind=entry.kind,
            implementation=entry.implementation,
            config=value[entry.kind][entry.implementation] or {},
            source=stack.origin(entry.name),
            directory=entry.directory,
        )
    return StackConfig(servers=servers, globals=global_values, sources=sources)
