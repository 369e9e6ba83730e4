"""Blend specs: which environments a training run mixes, with which data, weights and step shape.

One YAML file (docs/blend_spec.md) drives ``gym data blend``, ``gym train plan``, step-wise
collection and training, so a mix can be reproduced offline. This module loads and checks the
spec, every problem at once, each as ``file: key: problem``. A spec says what the user wants from
each environment (``EnvironmentSpec``); what an environment is and holds is
``polygym.stack.environment.Environment``, and ``polygym.blend.mix`` joins the two.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from polygym.blend.planner import DEFAULT_WARN_BELOW, DEFAULT_WARN_BELOW_ROLLOUTS, EnvDemand, Plan, make_plan
from polygym.errors import BlendSpecError
from polygym.stack import bounded_yaml
from polygym.suggest import closest, unknown_name_message

MAX_ENVIRONMENTS = 10_000
MAX_PROMPTS_PER_STEP = 1_000_000
MAX_RESPONSES_PER_PROMPT = 100_000
"""The bound of ``gym eval run --num-repeats``: a group is the repeats of one prompt."""
MAX_ROLLOUTS_PER_STEP = 10_000_000
"""One step's rollouts are planned, collected and held together: far above any real batch, far
below what a mistyped size (``prompts_per_step: 1000000000``) would ask of memory."""


def _paths(value: Any) -> Any:
    """``train: a.jsonl`` is the same as ``train: [a.jsonl]``."""
    return [value] if isinstance(value, str) else value


class EnvironmentSpec(BaseModel):
    """One environment of a blend."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    agent: str | None = None
    """Agent that runs this environment's rows; default ``<name>_simple_agent``, or the only
    agent of the environment's config when it has one of another name (e.g. a episodic_agent)."""
    train: list[str] = Field(default_factory=list)
    """JSONL files (relative to the spec file, else the working directory); default: the
    ``datasets`` of the agent's config (type ``train``, else every type but ``validation``)."""
    validation: list[str] = Field(default_factory=list)
    weight: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    min_per_step: int = Field(default=0, ge=0)
    eval_only: bool = False
    """Watched, not trained: served and validated (``gym train run``) but given no training quota,
    so a run can show whether training on the others hurts it. Takes no weight nor minimum."""

    _check_paths = field_validator("train", "validation", mode="before")(_paths)

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if value.startswith(("_", ".")) or "/" in value or "\\" in value or value != value.strip():
            raise ValueError("must be a plain name (no '/', no leading '_' or '.', no spaces around)")
        return value

    @model_validator(mode="after")
    def _eval_only_takes_no_quota(self) -> EnvironmentSpec:
        if self.eval_only:
            given = sorted({"weight", "min_per_step"} & self.model_fields_set)
            if given:
                raise ValueError(
                    f"an eval_only environment gets no training quota: remove {', '.join(given)}"
                )
        return self

    @property
    def agent_name(self) -> str:
        return self.agent or f"{self.name}_simple_agent"


class BlendSpec(BaseModel):
    """A blend of environments and the shape of a training step."""

    model_config = ConfigDict(extra="forbid")

    environments: list[EnvironmentSpec] = Field(min_length=1, max_length=MAX_ENVIRONMENTS)
    prompts_per_step: int = Field(ge=1, le=MAX_PROMPTS_PER_STEP)
    responses_per_prompt: int = Field(default=1, ge=1, le=MAX_RESPONSES_PER_PROMPT)
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
        if all(env.eval_only for env in environments):
            raise ValueError("every environment is eval_only: at least one must be trained")
        return environments

    @model_validator(mode="after")
    def _step_sizes(self) -> BlendSpec:
        """A step that cannot be held, or a minimum no step can meet, is refused with the spec."""
        if self.global_batch_size > MAX_ROLLOUTS_PER_STEP:
            raise ValueError(
                f"prompts_per_step x responses_per_prompt is {self.global_batch_size:,} rollouts per "
                f"step; at most {MAX_ROLLOUTS_PER_STEP:,}"
            )
        over = [f"{e.name}: {e.min_per_step}" for e in self.trained if e.min_per_step > self.prompts_per_step]
        if over:
            raise ValueError(
                f"min_per_step above prompts_per_step ({self.prompts_per_step}), which no step can "
                f"meet: {', '.join(over)}"
            )
        return self

    @property
    def trained(self) -> list[EnvironmentSpec]:
        """The environments that get a training quota (all but the ``eval_only`` ones)."""
        return [env for env in self.environments if not env.eval_only]

    @property
    def global_batch_size(self) -> int:
        return self.prompts_per_step * self.responses_per_prompt

    def environment(self, name: str) -> EnvironmentSpec:
        for env in self.environments:
            if env.name == name:
                return env
        raise KeyError(unknown_name_message("environment", name, [e.name for e in self.environments]))

    def plan(
        self,
        rows: dict[str, int] | None = None,
        warn_below: int = DEFAULT_WARN_BELOW,
        warn_below_rollouts: int = DEFAULT_WARN_BELOW_ROLLOUTS,
    ) -> Plan:
        """The step plan of the trained environments (raises planner.InfeasiblePlanError when the
        minimums cannot fit)."""
        rows = rows or {}
        demands = [EnvDemand(e.name, e.weight, e.min_per_step, rows.get(e.name)) for e in self.trained]
        return make_plan(
            demands, self.prompts_per_step, self.responses_per_prompt, warn_below, warn_below_rollouts
        )


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


def _problem(source: str, err: Mapping[str, Any], raw: Any) -> str:
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
        raw = bounded_yaml.safe_load(path.read_text())
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
