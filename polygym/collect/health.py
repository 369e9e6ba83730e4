"""Health of a run: rollouts that earned a reward but say something is wrong with the run itself.

A mean reward hides the rollouts that should never have counted: a model that was never called
(an agent bug), turns with neither text nor a tool call, completions of zero tokens, generation
that ran into its token limit, tool calls whose arguments the tool's own schema rejects, a
(task, repeat) written twice, a task that no repeat ever passes (often a broken row or verifier).
Each is a *finding* on one rollout or one task, with its kind and a short detail.

``HealthMonitor`` takes rollouts and failures one at a time, so the same code serves a finished
run (``gym eval health-check RUN``) and collection in progress (rates per environment as rows
arrive, and ``quarantine`` once an environment's failure or unhealthy rate passes a threshold over enough
rollouts: the collector then stops sending its rollouts, recorded as ``Quarantined``, while the
other environments go on). Task-level findings need every repeat, so ``finish`` adds them.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from polygym.collect.stack_watch import SERVER_DIED
from polygym.items import item_text
from polygym.json_schema import validation_errors
from polygym.row import ENVIRONMENT_SERVER, PASS_THRESHOLD, ROLLOUT_INDEX, TASK_INDEX, reward

MODEL_ITEMS = frozenset({"message", "function_call", "reasoning"})
"""Output item types the model writes (``function_call_output`` is the environment's)."""

MODEL_NOT_CALLED = "model_not_called"
HOLLOW_TURN = "hollow_turn"
ZERO_TOKENS = "zero_token_completion"
RUNAWAY = "runaway_generation"
BAD_TOOL_ARGUMENTS = "tool_arguments_rejected"
DUPLICATE = "duplicate_identity"
NEVER_SOLVED = "task_never_solved"
ALWAYS_FAILED = "task_always_failed"
ROLLOUT_KINDS = (MODEL_NOT_CALLED, HOLLOW_TURN, ZERO_TOKENS, RUNAWAY, BAD_TOOL_ARGUMENTS, DUPLICATE)
TASK_KINDS = (NEVER_SOLVED, ALWAYS_FAILED)

DEFAULT_QUARANTINE_RATE = 0.5
DEFAULT_QUARANTINE_MIN = 20
QUARANTINED = "Quarantined"
"""``error_class`` of a rollout not run because its environment was quarantined."""
NOT_THE_ENVIRONMENTS = frozenset({QUARANTINED, SERVER_DIED})
"""Failure classes that say nothing new about the environment (they follow from a decision made)."""


@dataclass(frozen=True)
class Finding:
    env: str
    kind: str
    detail: str
    task_index: int | None = None
    rollout_index: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "env": self.env,
            "kind": self.kind,
            "detail": self.detail,
            TASK_INDEX: self.task_index,
            ROLLOUT_INDEX: self.rollout_index,
        }


def env_of(row: Mapping[str, Any]) -> str:
    """The environment a rollout or failure belongs to: the environment server stamped on it (an
    episode's, grouped by that server as NeMo Gym 0.7's ``rollout_run_key`` does), else its agent."""
    server = row.get(ENVIRONMENT_SERVER)
    if isinstance(server, str):
        return server
    ref = row.get("agent_ref")
    return str(ref.get("name", "?")) if isinstance(ref, dict) else "?"


def model_turns(items: list[Any]) -> Iterator[list[dict[str, Any]]]:
    """Runs of consecutive model-written items: one model call's output each."""
    turn: list[dict[str, Any]] = []
    for item in items:
        if (
            isinstance(item, dict)
            and item.get("type", "message") in MODEL_ITEMS
            and item.get("role") != "user"
        ):
            turn.append(item)
        elif turn:
            yield turn
            turn = []
    if turn:
        yield turn


def _offered_schemas(row: Mapping[str, Any]) -> dict[str, Any]:
    params = row.get("responses_create_params")
    tools = params.get("tools") if isinstance(params, dict) else None
    return {
        str(t.get("name")): t.get("parameters") or {"type": "object"}
        for t in tools or []
        if isinstance(t, dict) and t.get("type", "function") == "function"
    }


def _argument_problems(call: dict[str, Any], schemas: dict[str, Any]) -> str | None:
    """Why the tool's schema rejects this call's arguments, or None (unknown tools are the agent's)."""
    name = str(call.get("name", ""))
    if name not in schemas:
        return None
    try:
        arguments = orjson.loads(call.get("arguments") or "{}")
    except orjson.JSONDecodeError:
        return f"{name}: arguments are not JSON"
    errors = validation_errors(arguments, schemas[name])
    return f"{name}: {errors[0]}" if errors else None


def _hollow(turn: list[dict[str, Any]]) -> bool:
    """A turn with neither text nor a tool call (reasoning alone, an empty message)."""
    return not any(
        it.get("type") == "function_call"
        or (it.get("type", "message") == "message" and bool(item_text(it).strip()))
        for it in turn
    )


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def rollout_findings(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(kind, detail)`` for everything unhealthy in one verified rollout."""
    response = _object(row.get("response"))
    output = [it for it in response.get("output") or [] if isinstance(it, dict)]
    turns = list(model_turns(output))
    if not turns:
        return [(MODEL_NOT_CALLED, "the response holds no item the model wrote")]
    found: list[tuple[str, str]] = []
    hollow = sum(map(_hollow, turns))
    if hollow:
        found.append((HOLLOW_TURN, f"{hollow} of {len(turns)} turn(s) with no text and no tool call"))
    if _object(response.get("usage")).get("output_tokens") == 0:
        found.append((ZERO_TOKENS, "usage.output_tokens is 0"))
    if _object(response.get("incomplete_details")).get("reason") == "max_output_tokens":
        found.append((RUNAWAY, "generation stopped at max_output_tokens"))
    schemas = _offered_schemas(row)
    calls = [it for it in output if it.get("type") == "function_call"]
    rejected = [problem for call in calls if (problem := _argument_problems(call, schemas))]
    if rejected:
        found.append((BAD_TOOL_ARGUMENTS, f"{len(rejected)} call(s); first: {rejected[0]}"))
    return found


@dataclass
class EnvHealth:
    """Counts for one environment: rollouts seen, failures, rollouts with at least one finding."""

    rollouts: int = 0
    failures: int = 0
    unhealthy: int = 0
    kinds: Counter[str] = field(default_factory=Counter)

    @property
    def seen(self) -> int:
        return self.rollouts + self.failures

    def rates(self) -> dict[str, float]:
        seen = max(1, self.seen)
        return {
            "failure_rate": self.failures / seen,
            "unhealthy_rate": self.unhealthy / max(1, self.rollouts),
        }


MAX_BITMAP_REPEAT = 1 << 24
"""Repeat indices below this are remembered as one bit each (2 MiB for a task at the limit);
others (negative, larger, not integers) in a set."""


class TaskOutcomes:
    """One task's repeats so far: how many, failed and passed, and which repeat indices were seen.

    Counts and a bit per repeat index, not an entry per rollout: a set of ``(env, task, repeat)``
    tuples and a list of outcomes per task cost about 150 bytes per rollout, so the monitor of a
    run at 400 rollouts/s grew by some 4 MiB a minute for as long as the run lasted.
    """

    __slots__ = ("_bits", "_other", "failed", "passed", "repeats")

    def __init__(self) -> None:
        self.repeats = 0
        self.failed = 0
        self.passed = 0
        self._bits: bytearray | None = None
        self._other: set[Any] | None = None

    def seen_before(self, repeat: Any) -> bool:
        """Remember repeat index ``repeat``; True when it was already there (a duplicate)."""
        if type(repeat) is int and 0 <= repeat < MAX_BITMAP_REPEAT:
            if self._bits is None:
                self._bits = bytearray()
            byte, mask = repeat >> 3, 1 << (repeat & 7)
            if byte >= len(self._bits):
                self._bits.extend(bytes(byte + 1 - len(self._bits)))
            seen = bool(self._bits[byte] & mask)
            self._bits[byte] |= mask
            return seen
        if self._other is None:
            self._other = set()
        seen = repeat in self._other
        self._other.add(repeat)
        return seen


@dataclass
class HealthMonitor:
    """Findings and rates per environment, fed one rollout or failure at a time.

    What it keeps grows with the tasks and environments, not with the rollouts (a bit per repeat
    for duplicates), so it can watch a run of millions of rollouts; only ``findings`` holds one
    entry per unhealthy rollout, and ``keep_findings=False`` (a live run's monitor, whose findings
    nobody lists: ``gym eval health-check`` reads the files) counts them per kind only.
    """

    quarantine_rate: float = DEFAULT_QUARANTINE_RATE
    quarantine_min: int = DEFAULT_QUARANTINE_MIN
    findings: list[Finding] = field(default_factory=list)
    quarantined: dict[str, str] = field(default_factory=dict)
    """Environment -> why its rollouts stopped (``quarantine`` decides, once per environment)."""
    envs: dict[str, EnvHealth] = field(default_factory=lambda: defaultdict(EnvHealth))
    keep_findings: bool = True
    _tasks: dict[tuple[str, Any], TaskOutcomes] = field(default_factory=lambda: defaultdict(TaskOutcomes))
    """(environment, task) -> its repeats, for duplicates and the task-level findings."""

    def observe(self, row: Mapping[str, Any]) -> list[Finding]:
        """Record one verified rollout; returns its findings."""
        env, task, repeat = env_of(row), row.get(TASK_INDEX), row.get(ROLLOUT_INDEX)
        kinds = rollout_findings(row)
        outcomes = self._tasks[(env, task)]
        if outcomes.seen_before(repeat):
            kinds.append((DUPLICATE, f"task {task} repeat {repeat} appears more than once"))
        outcomes.repeats += 1
        outcomes.passed += reward(row) >= PASS_THRESHOLD
        health = self.envs[env]
        health.rollouts += 1
        found = [Finding(env, kind, detail, task, repeat) for kind, detail in kinds]
        if found:
            health.unhealthy += 1
            health.kinds.update(f.kind for f in found)
        if self.keep_findings:
            self.findings.extend(found)
        return found

    def observe_failure(self, failure: Mapping[str, Any]) -> None:
        """Record one failed rollout (a ``_failures.jsonl`` record)."""
        env = env_of(failure)
        if failure.get("error_class") in NOT_THE_ENVIRONMENTS:
            return
        self.envs[env].failures += 1
        outcomes = self._tasks[(env, failure.get(TASK_INDEX))]
        outcomes.repeats += 1
        outcomes.failed += 1

    def quarantine_reason(self, env: str) -> str | None:
        """Why ``env`` should stop (its failure or unhealthy rate over the threshold), or None."""
        health = self.envs.get(env)
        if health is None or health.seen < self.quarantine_min:
            return None
        for name, rate in health.rates().items():
            if rate > self.quarantine_rate:
                what = name.replace("_", " ")
                return f"{what} {rate:.0%} over {health.seen} rollouts (threshold {self.quarantine_rate:.0%})"
        return None

    def quarantine(self, env: str) -> str | None:
        """Quarantine ``env`` when ``quarantine_reason`` says so; returns the reason if quarantined."""
        if env not in self.quarantined and (reason := self.quarantine_reason(env)) is not None:
            self.quarantined[env] = reason
        return self.quarantined.get(env)

    def finish(self) -> list[Finding]:
        """Add the task-level findings (every repeat known); returns them."""
        found = self.task_findings()
        for finding in found:
            self.envs[finding.env].kinds[finding.kind] += 1
        if self.keep_findings:
            self.findings.extend(found)
        return found

    def task_findings(self) -> list[Finding]:
        """The task-level findings so far, not recorded: a live run's monitor reports them in the
        metrics file without being changed (``metrics(env, late=...)``)."""
        found = []
        for (env, task), outcomes in self._tasks.items():
            if outcomes.repeats < 2:
                continue
            if outcomes.failed == outcomes.repeats:
                found.append(Finding(env, ALWAYS_FAILED, f"all {outcomes.repeats} repeats failed", task))
            elif not outcomes.passed:
                found.append(Finding(env, NEVER_SOLVED, f"none of {outcomes.repeats} repeats passed", task))
        return found

    def metrics(self, env: str, late: Iterable[Finding] = ()) -> dict[str, int]:
        """``health/...`` counts of one environment, for its entry in ``_aggregate_metrics.json``;
        ``late`` findings (``task_findings``) are counted as if ``finish`` had recorded them."""
        health = self.envs.get(env, EnvHealth())
        kinds = health.kinds + Counter(f.kind for f in late if f.env == env)
        return {
            "health/unhealthy_rollouts": health.unhealthy,
            **{f"health/{k}": n for k, n in sorted(kinds.items())},
        }

    def summary(self) -> dict[str, Any]:
        """Per environment: counts, rates and findings by kind (what the report and metrics show)."""
        return {
            env: {
                "rollouts": h.rollouts,
                "failures": h.failures,
                "unhealthy": h.unhealthy,
                **h.rates(),
                "findings": dict(sorted(h.kinds.items())),
            }
            for env, h in sorted(self.envs.items())
        }


def check_run(rollouts: Iterable[Mapping[str, Any]], failures: Iterable[Mapping[str, Any]]) -> HealthMonitor:
    """The health of a finished run from its rollout and failure records."""
    monitor = HealthMonitor()
    for row in rollouts:
        monitor.observe(row)
    for failure in failures:
        monitor.observe_failure(failure)
    monitor.finish()
    return monitor
