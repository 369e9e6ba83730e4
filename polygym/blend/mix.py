"""Blend specs: which environments a training run mixes, with which data, weights and step shape.

One YAML file (docs/blend_spec.md) drives ``gym data blend``, ``gym train plan``, step-wise
collection and training, so a mix can be reproduced offline. This module loads and checks the
spec (every problem at once, each as ``file: key: problem``), finds each environment's data (the
files the spec names, or the ``datasets`` its agent's config lists), reads and checks the rows,
and checks rows against the verifier of the environment they target.

Rows are routed by stamping ``agent_ref`` on each, exactly as the hand-written recipe
``jq -c '. + {"agent_ref": {"type": "responses_api_agents", "name": "<env>_simple_agent"}}'``
does: an existing ``agent_ref`` is replaced in place, every other field is kept as is.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from polygym.blend.planner import DEFAULT_WARN_BELOW, EnvDemand, Plan, make_plan
from polygym.blend.sampler import StepSampler
from polygym.collect.dataset import DatasetError, Row, agent_of, check_row, read_rows
from polygym.errors import BlendSpecError
from polygym.protocol import AGENT_KIND, RESOURCES_KIND
from polygym.stack import catalog
from polygym.stack.config import ConfigError, ServerSpec
from polygym.suggest import closest, unknown_name_message

Order = Literal["concat", "shuffled", "steps"]
ORDERS: tuple[str, ...] = ("concat", "shuffled", "steps")
Split = Literal["train", "validation"]
ROLLOUT_FIELDS = frozenset({"response"})
"""Verify-request fields a rollout adds; a dataset row never carries them."""
CHARS_PER_TOKEN = 4


def _paths(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


class EnvironmentSpec(BaseModel):
    """One environment of a blend."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    agent: str | None = None
    """Agent that runs this environment's rows; default ``<name>_simple_agent``, or the only
    agent of the environment's config when it has one of another name (e.g. a gymnasium_agent)."""
    train: list[str] = Field(default_factory=list)
    """JSONL files (relative to the spec file, else the working directory); default: the
    ``datasets`` of the agent's config (type ``train``, else every type but ``validation``)."""
    validation: list[str] = Field(default_factory=list)
    weight: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    min_per_step: int = Field(default=0, ge=0)

    _check_paths = field_validator("train", "validation", mode="before")(_paths)

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if value.startswith(("_", ".")) or "/" in value or "\\" in value or value != value.strip():
            raise ValueError("must be a plain name (no '/', no leading '_' or '.', no spaces around)")
        return value

    @property
    def agent_name(self) -> str:
        return self.agent or f"{self.name}_simple_agent"


class BlendSpec(BaseModel):
    """A blend of environments and the shape of a training step."""

    model_config = ConfigDict(extra="forbid")

    environments: list[EnvironmentSpec] = Field(min_length=1)
    prompts_per_step: int = Field(ge=1)
    responses_per_prompt: int = Field(default=1, ge=1)
    seed: int = 0
    base_dir: Path = Field(default_factory=Path.cwd, exclude=True)
    """Folder that relative data paths are resolved against first (the spec file's folder)."""
    source: str = Field(default="command line", exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _environments_map(cls, data: Any) -> Any:
        """``environments: {math: {weight: 2}}`` is the same as a list with ``name: math``."""
        if isinstance(data, dict) and isinstance(data.get("environments"), dict):
            envs = []
            for name, body in data["environments"].items():
                body = {} if body is None else body
                envs.append({"name": name, **body} if isinstance(body, dict) else body)
            data = {**data, "environments": envs}
        return data

    @field_validator("environments")
    @classmethod
    def _unique(cls, environments: list[EnvironmentSpec]) -> list[EnvironmentSpec]:
        names = [env.name for env in environments]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"environment names must be unique, repeated: {', '.join(duplicates)}")
        return environments

    @property
    def global_batch_size(self) -> int:
        return self.prompts_per_step * self.responses_per_prompt

    def environment(self, name: str) -> EnvironmentSpec:
        for env in self.environments:
            if env.name == name:
                return env
        raise KeyError(unknown_name_message("environment", name, [e.name for e in self.environments]))

    def plan(self, rows: dict[str, int] | None = None, warn_below: int = DEFAULT_WARN_BELOW) -> Plan:
        """The step plan (raises planner.InfeasiblePlanError when the minimums cannot fit)."""
        rows = rows or {}
        demands = [EnvDemand(e.name, e.weight, e.min_per_step, rows.get(e.name)) for e in self.environments]
        return make_plan(demands, self.prompts_per_step, self.responses_per_prompt, warn_below)


# ---------------------------------------------------------------------------------- loading specs


def _key(loc: Sequence[Any], raw: Any) -> str:
    """``environments[1].weight``, or ``environments.math.weight`` for the map form."""
    names = (
        list(raw["environments"])
        if isinstance(raw, dict) and isinstance(raw.get("environments"), dict)
        else None
    )
    text = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            if i == 1 and loc[0] == "environments" and names is not None and part < len(names):
                text += f".{names[part]}"
            else:
                text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "(spec)"


def _problem(source: str, err: dict[str, Any], raw: Any) -> str:
    loc = tuple(err.get("loc", ()))
    key = _key(loc, raw)
    kind = err.get("type")
    if kind == "missing":
        return f"{source}: {key}: required"
    if kind == "extra_forbidden" and loc:
        fields = EnvironmentSpec.model_fields if "environments" in loc[:1] else BlendSpec.model_fields
        known = [k for k in fields if k not in ("base_dir", "source")]
        match = closest(str(loc[-1]), known)
        hint = f" Did you mean '{match[0]}'?" if match else ""
        return f"{source}: {key}: unknown key.{hint} Known: {', '.join(known)}"
    message = str(err.get("msg", "invalid"))
    message = message.removeprefix("Value error, ")
    return f"{source}: {key}: {message}"


def parse_spec(raw: Any, source: str, base_dir: Path) -> BlendSpec:
    """Check plain data as a spec; raises BlendSpecError listing every problem."""
    if not isinstance(raw, dict):
        raise BlendSpecError([f"{source}: (spec): must be a mapping with an 'environments' key"])
    for reserved in ("base_dir", "source"):
        if reserved in raw:
            raise BlendSpecError([f"{source}: {reserved}: unknown key"])
    try:
        return BlendSpec.model_validate({**raw, "base_dir": base_dir, "source": source})
    except ValidationError as exc:
        raise BlendSpecError([_problem(source, err, raw) for err in exc.errors(include_url=False)]) from None


def load_spec(path: Path) -> BlendSpec:
    """Read a blend spec YAML file; relative data paths resolve against its folder first."""
    if not path.is_file():
        raise BlendSpecError([f"{path}: no such file"])
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise BlendSpecError([f"{path}: invalid YAML: {exc}"]) from None
    return parse_spec(raw, str(path), path.resolve().parent)


def parse_env_flag(text: str) -> tuple[str, float]:
    """``NAME`` or ``NAME=WEIGHT`` (as given to ``--env``)."""
    name, sep, weight = text.partition("=")
    if not sep:
        return name, 1.0
    try:
        value = float(weight)
    except ValueError:
        raise ValueError(f"'{text}': WEIGHT must be a number") from None
    return name, value


def spec_from_flags(
    envs: Sequence[str], prompts_per_step: int | None = None, responses_per_prompt: int = 1, seed: int = 0
) -> BlendSpec:
    """A spec for ``--env NAME[=WEIGHT]`` flags; each environment reads its configured datasets."""
    problems: list[str] = []
    entries: list[dict[str, Any]] = []
    for text in envs:
        try:
            name, weight = parse_env_flag(text)
        except ValueError as exc:
            problems.append(f"--env {exc}")
            continue
        entries.append({"name": name, "weight": weight})
    if problems:
        raise BlendSpecError(problems)
    raw = {
        "environments": entries,
        "prompts_per_step": prompts_per_step or max(1, len(entries)),
        "responses_per_prompt": responses_per_prompt,
        "seed": seed,
    }
    return parse_spec(raw, "--env", Path.cwd())


# ------------------------------------------------------------------------------ environment configs


@dataclass
class EnvironmentConfig:
    """The instances defined in ``resources_servers/<env>/configs/<env>.yaml`` (read as plain YAML:
    the policy model it refers to is not part of this file, so it is not checked as a stack)."""

    name: str
    path: Path
    root: Path
    agents: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    resources: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)

    def resources_server_of(self, agent: str) -> str | None:
        ref = self.agents[agent][1].get("resources_server")
        return ref.get("name") if isinstance(ref, dict) else None

    def datasets(self, agent: str) -> list[dict[str, Any]]:
        entries = self.agents[agent][1].get("datasets") or []
        return [e for e in entries if isinstance(e, dict) and e.get("jsonl_fpath")]

    def default_agent(self) -> str | None:
        preferred = f"{self.name}_simple_agent"
        if preferred in self.agents:
            return preferred
        return next(iter(self.agents)) if len(self.agents) == 1 else None

    def server_spec(self, resources_server: str) -> ServerSpec:
        implementation, config = self.resources[resources_server]
        return ServerSpec(
            name=resources_server,
            kind=RESOURCES_KIND,
            implementation=implementation,
            config=config,
            source=str(self.path),
            directory=catalog.find_implementation_dir(RESOURCES_KIND, implementation),
        )


def environment_config(name: str) -> EnvironmentConfig:
    """The config of environment ``name``; ConfigError (with did-you-mean) when there is none."""
    folder = catalog.find_implementation_dir(RESOURCES_KIND, name)
    path = folder / "configs" / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError([f"environment {name}: {folder} has no config file configs/{name}.yaml"])
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: invalid YAML: {exc}"]) from None
    config = EnvironmentConfig(name, path, folder.parent.parent)
    for instance, body in raw.items() if isinstance(raw, dict) else ():
        if not isinstance(body, dict) or len(body) != 1:
            continue
        kind, impls = next(iter(body.items()))
        if not isinstance(impls, dict) or len(impls) != 1:
            continue
        implementation, block = next(iter(impls.items()))
        block = block if isinstance(block, dict) else {}
        if kind == AGENT_KIND:
            config.agents[str(instance)] = (str(implementation), block)
        elif kind == RESOURCES_KIND:
            config.resources[str(instance)] = (str(implementation), block)
    return config


def all_environment_configs() -> dict[str, EnvironmentConfig]:
    """Every environment with a readable config, by name (broken ones are skipped)."""
    found: dict[str, EnvironmentConfig] = {}
    for name in catalog.list_implementations(RESOURCES_KIND):
        try:
            found[name] = environment_config(name)
        except ConfigError:
            continue
    return found


# ------------------------------------------------------------------------------------ resolving data


@dataclass
class ResolvedEnvironment:
    spec: EnvironmentSpec
    agent: str
    train: list[Path]
    validation: list[Path]
    config: EnvironmentConfig | None

    @property
    def name(self) -> str:
        return self.spec.name

    def files(self, split: Split) -> list[Path]:
        return self.train if split == "train" else self.validation


def _find_file(text: str, roots: Sequence[Path]) -> Path | None:
    path = Path(text).expanduser()
    if path.is_absolute():
        return path if path.is_file() else None
    for root in roots:
        if (root / path).is_file():
            return root / path
    return None


def _configured(config: EnvironmentConfig, agent: str, split: Split) -> list[dict[str, Any]]:
    entries = config.datasets(agent)
    if split == "validation":
        return [e for e in entries if e.get("type") == "validation"]
    train = [e for e in entries if e.get("type") == "train"]
    return train or [e for e in entries if e.get("type") != "validation"]


def resolve(spec: BlendSpec) -> list[ResolvedEnvironment]:
    """Find every environment's agent and data files; raises BlendSpecError with every problem."""
    problems: list[str] = []
    resolved: list[ResolvedEnvironment] = []
    spec_roots = [spec.base_dir, Path.cwd()]
    for i, env in enumerate(spec.environments):
        where = f"{spec.source}: environments[{i}] ({env.name})"
        config: EnvironmentConfig | None = None
        try:
            config = environment_config(env.name)
        except ConfigError as exc:
            if not env.train:
                problems.append(f"{where}: no train files given and {'; '.join(exc.problems)}")
                continue
        agent = env.agent or (config.default_agent() if config is not None else None) or env.agent_name
        if config is not None and agent not in config.agents:
            known = list(config.agents)
            problems.append(f"{where}.agent: {unknown_name_message('agent', agent, known)}")
            continue
        files: dict[str, list[Path]] = {"train": [], "validation": []}
        for split in ("train", "validation"):
            given = getattr(env, split)
            if given:
                for j, text in enumerate(given):
                    found = _find_file(text, spec_roots)
                    if found is None:
                        looked = ", ".join(str(r) for r in dict.fromkeys(spec_roots))
                        problems.append(f"{where}.{split}[{j}]: file not found: {text} (looked in {looked})")
                    else:
                        files[split].append(found)
                continue
            if config is None:
                continue
            entries = _configured(config, agent, split)
            if split == "train" and not entries:
                problems.append(f"{where}.train: none given and {config.path} lists no datasets for {agent}")
            for entry in entries:
                found = _find_file(str(entry["jsonl_fpath"]), [Path.cwd(), config.root])
                if found is None:
                    problems.append(
                        f"{where}.{split}: dataset '{entry.get('name', '?')}' of {config.path} not found: "
                        f"{entry['jsonl_fpath']} (looked in {Path.cwd()}, {config.root})"
                    )
                else:
                    files[split].append(found)
        resolved.append(ResolvedEnvironment(env, agent, files["train"], files["validation"], config))
    if problems:
        raise BlendSpecError(problems)
    return resolved


# ----------------------------------------------------------------------------- verifier requirements


@dataclass
class Verifier:
    """What the verifier of one agent's environment needs from a row."""

    env: str
    model: type[BaseModel] | None
    required: list[str]
    problem: str | None = None


def verifier_for(config: EnvironmentConfig, agent: str) -> Verifier:
    """The verify request model of ``agent``'s resources server and its required row fields."""
    from polygym.servers.base import body_model
    from polygym.stack.loader import server_class

    server = config.resources_server_of(agent)
    if server is None or server not in config.resources:
        return Verifier(config.name, None, [], f"{agent} refers to no resources server in {config.path}")
    try:
        cls = server_class(config.server_spec(server))
    except Exception as exc:  # a broken app.py is reported, the other rows are still checked
        return Verifier(config.name, None, [], f"cannot load resources server {server}: {exc}")
    model = body_model(cls.verify) if hasattr(cls, "verify") else None
    if model is None:
        return Verifier(config.name, None, [])
    required = [
        name for name, info in model.model_fields.items() if info.is_required() and name not in ROLLOUT_FIELDS
    ]
    return Verifier(config.name, model, required)


def check_verifier_fields(row: Row, verifier: Verifier, problems: list[str]) -> None:
    """Fields the verifier requires, and their types, checked with its own request model."""
    if verifier.model is None:
        return
    data = {"response": {}, **{k: v for k, v in row.data.items() if k not in ROLLOUT_FIELDS}}
    try:
        verifier.model.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            loc = tuple(err.get("loc", ()))
            if not loc or loc[0] in ROLLOUT_FIELDS:
                continue
            if loc[0] == "responses_create_params" and (len(loc) < 2 or loc[1] in ("input", "tools")):
                continue  # shape problems already reported by dataset.check_row
            key = ".".join(str(p) for p in loc)
            if err.get("type") == "missing":
                problems.append(f"{row.where}: {key}: missing (required by the {verifier.env} verifier)")
            else:
                problems.append(f"{row.where}: {key}: {err.get('msg', 'invalid')} ({verifier.env} verifier)")


# -------------------------------------------------------------------------------------- reading rows


def stamp(data: dict[str, Any], agent: str) -> dict[str, Any]:
    """The row with ``agent_ref`` set (replaced in place when present, appended otherwise)."""
    return {**data, "agent_ref": {"type": AGENT_KIND, "name": agent}}


@dataclass
class Blend:
    """A resolved spec with its rows: everything needed to plan, sample, blend and collect."""

    spec: BlendSpec
    environments: list[ResolvedEnvironment]
    rows: dict[str, list[Row]]
    split: Split = "train"

    def agent(self, env: str) -> str:
        return next(e.agent for e in self.environments if e.name == env)

    def stamped(self, env: str) -> list[dict[str, Any]]:
        agent = self.agent(env)
        return [stamp(row.data, agent) for row in self.rows[env]]

    def plan(self, warn_below: int = DEFAULT_WARN_BELOW) -> Plan:
        return self.spec.plan({env: len(rows) for env, rows in self.rows.items()}, warn_below)

    def sampler(self, plan: Plan | None = None) -> StepSampler:
        """A sampler over the stamped rows (``StepItem.row`` is the row as sent, with agent_ref)."""
        return StepSampler(
            plan or self.plan(), {e.name: self.stamped(e.name) for e in self.environments}, self.spec.seed
        )

    def ordered(self, order: Order, steps: int | None = None) -> Iterator[dict[str, Any]]:
        """Stamped rows in ``concat`` (spec then file order), ``shuffled`` (by the seed) or
        ``steps`` order (the sampler's steps 0..steps-1; default: until every row was used)."""
        if order == "concat":
            for env in self.environments:
                yield from self.stamped(env.name)
        elif order == "shuffled":
            rows = [row for env in self.environments for row in self.stamped(env.name)]
            random.Random(self.spec.seed).shuffle(rows)
            yield from rows
        elif order == "steps":
            sampler = self.sampler()
            count = sampler.steps_to_cover() if steps is None else steps
            for step in sampler.steps(0, count):
                for item in step.items:
                    yield item.row
        else:
            raise ValueError(f"unknown order '{order}'; choose one of {', '.join(ORDERS)}")


def load_blend(spec: BlendSpec, split: Split = "train", check_verifiers: bool = True) -> Blend:
    """Resolve ``spec`` and read every row of ``split``; raises DatasetError listing bad rows."""
    environments = resolve(spec)
    problems: list[str] = []
    rows: dict[str, list[Row]] = {}
    for env in environments:
        verifier = verifier_for(env.config, env.agent) if check_verifiers and env.config else None
        if verifier is not None and verifier.problem:
            problems.append(f"{spec.source}: environments ({env.name}): {verifier.problem}")
        env_rows: list[Row] = []
        for path in env.files(split):
            for row in read_rows(path, problems):
                check_row(row, problems)
                if verifier is not None:
                    check_verifier_fields(row, verifier, problems)
                env_rows.append(row)
        if split == "train" and not env_rows:
            problems.append(f"{spec.source}: environments ({env.name}): no training rows")
        rows[env.name] = env_rows
    if problems:
        raise DatasetError(problems)
    return Blend(spec, environments, rows, split)


# --------------------------------------------------------------------------------- validating files


@dataclass
class EnvStats:
    """Per-environment counts of a checked dataset (tokens estimated as characters / 4)."""

    env: str
    agent: str
    rows: int = 0
    tools: set[str] = field(default_factory=set)
    turns: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    def add(self, data: dict[str, Any]) -> None:
        params = data.get("responses_create_params")
        params = params if isinstance(params, dict) else {}
        self.rows += 1
        for tool in params.get("tools") or []:
            if isinstance(tool, dict):
                self.tools.add(str(tool.get("name", tool.get("type"))))
        prompt = params.get("input")
        self.turns.append(1 if isinstance(prompt, str) else len(prompt) if isinstance(prompt, list) else 0)
        chars = len(orjson.dumps(prompt)) + len(orjson.dumps(params.get("tools") or []))
        self.tokens.append(math.ceil(chars / CHARS_PER_TOKEN))

    def to_dict(self) -> dict[str, Any]:
        def spread(values: list[int]) -> dict[str, float]:
            if not values:
                return {"min": 0, "mean": 0.0, "max": 0}
            return {"min": min(values), "mean": sum(values) / len(values), "max": max(values)}

        return {
            "env": self.env,
            "agent": self.agent,
            "rows": self.rows,
            "tools": sorted(self.tools),
            "turns": spread(self.turns),
            "est_tokens": spread(self.tokens),
        }


@dataclass
class ValidationReport:
    problems: list[str]
    stats: list[EnvStats]
    rows: int


def validate_files(paths: Sequence[Path], envs: Sequence[str] = ()) -> ValidationReport:
    """Check rows against the environments they target (all known ones, or only ``envs``).

    A row targets the environment whose config defines its ``agent_ref`` agent; with one ``env``
    given, rows without ``agent_ref`` target it.
    """
    problems: list[str] = []
    configs = all_environment_configs()
    if envs:
        selected: dict[str, EnvironmentConfig] = {}
        for name in envs:
            if name in configs:
                selected[name] = configs[name]
            else:
                problems.append(f"--env {name}: {unknown_name_message('environment', name, configs)}")
        configs = selected
    agent_env = {agent: cfg for cfg in configs.values() for agent in cfg.agents}
    default_agent = None
    if len(envs) == 1 and envs[0] in configs:
        default_agent = configs[envs[0]].default_agent()
    verifiers: dict[str, Verifier] = {}
    stats: dict[str, EnvStats] = {}
    total = 0
    for path in paths:
        if not path.is_file():
            problems.append(f"{path}: no such file")
            continue
        rows = read_rows(path, problems)
        if not rows:
            problems.append(f"{path}: no rows")
        for row in rows:
            total += 1
            check_row(row, problems)
            if row.data.get("agent_ref") is None and default_agent is None:
                problems.append(
                    f"{row.where}: agent_ref: missing; add it, or pass --env NAME for rows of one environment"
                )
                continue
            agent = agent_of(row, default_agent, agent_env, problems)
            if agent is None or agent not in agent_env:
                continue  # reported: unknown agent, or no usable --env was given
            config = agent_env[agent]
            if agent not in verifiers:
                verifiers[agent] = verifier_for(config, agent)
                if verifiers[agent].problem:
                    problems.append(f"{config.path}: {agent}: {verifiers[agent].problem}")
            check_verifier_fields(row, verifiers[agent], problems)
            stats.setdefault(agent, EnvStats(config.name, agent)).add(row.data)
    return ValidationReport(problems, list(stats.values()), total)
