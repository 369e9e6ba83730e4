"""``gym train watch``: polygym's validation curves and regression alarms beside any trainer.

A team training with NeMo RL, TRL, verl or anything else keeps its trainer; this watcher runs next
to it. It serves the blend spec's environments (trained and ``eval_only``) behind ``vllm_model``
pointed at the trainer's policy endpoint (any OpenAI-compatible URL: the trainer's vLLM server),
evaluates every environment's validation rows greedily, once at the start (the baseline, "step
0") and again whenever it is told the policy changed:

- a new entry in ``--checkpoints DIR`` (a trainer's ``checkpoint-N`` / ``step_N``: the evaluation
  is labelled with the last number in its name),
- ``SIGUSR1`` (from a trainer's hook: ``kill -USR1 PID``), or
- every ``--every-minutes`` minutes;

(signal and timer label the evaluation one past the previous label). Each evaluation is judged by
``polygym.training.validation.regressions``, the rule ``gym train run --max-regression`` applies (one
implementation: an environment regressed when the paired-bootstrap interval of its change since
the baseline, over the same rows, lies wholly below ``-DELTA``, or when none of its rollouts was
scored). An alarm is printed, appended to ``alarms.jsonl``, handed to ``--hook`` (a command run with
the alarms as JSON in ``POLYGYM_ALARMS``) and, with ``--on-alarm exit`` (the default), ends the
watch with exit status 1.

It writes what ``gym train run`` writes for its validations, in the same places and formats:
``validation_before.jsonl`` (the baseline) and ``validation/step_N.jsonl`` (each a ``gym eval run``
file set, which ``gym view`` opens), ``validation.jsonl`` (one line per environment and evaluation:
step, env, eval_only, reward_mean, n), and TensorBoard scalars ``polygym/<env>/validation_reward``
under ``tensorboard/`` when ``tensorboard`` is installed; and ``run.json`` at the start, its
settings (the API key left out), as ``gym train run`` does: the viewer reads the limits there.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from polygym.blend.mix import Blend, load_blend
from polygym.blend.spec import load_spec
from polygym.blend.stepwise import environments_to_serve
from polygym.collect.eval_run import run_eval
from polygym.collect.regression import Regression
from polygym.collect.rollouts import Limits
from polygym.collect.run_files import RunFiles
from polygym.jsonl import append_jsonl, iter_jsonl
from polygym.net.client import ServerClient
from polygym.row import reward
from polygym.settings import cli
from polygym.stack.catalog import selector_paths
from polygym.stack.config import StackConfig, load_config
from polygym.stack.session import StackSession, StackTarget
from polygym.training.checkpoint import write_run_record
from polygym.training.validation import (
    regressions,
    require_scored,
    validation_file,
    validation_jobs,
    validation_lines,
)

OnAlarm = Literal["exit", "continue"]

NO_BASELINE = "no baseline to watch against: is the policy endpoint up?"
"""What the watch says when an environment scored nothing at the start (it refuses to go on)."""
POLL_S = 0.2
HOOK_TIMEOUT_S = 300.0
_NUMBER = re.compile(r"\d+")


@dataclass(kw_only=True)
class WatchSettings:
    """What ``gym train watch`` watches and how, each setting declared once (``polygym.settings``):
    ``polygym.cli.watch`` generates the command's options from these fields, in this order."""

    spec_path: Path = field(metadata=cli("", argument=True, metavar="SPEC"))
    policy_url: str = field(
        metadata=cli("The trainer's OpenAI-compatible base URL (http://host:8000/v1).", required=True)
    )
    policy_model: str = field(metadata=cli("The model name the policy endpoint serves.", required=True))
    policy_api_key: str = field(default="", metadata=cli("API key of the policy endpoint, if it wants one."))
    output_dir: Path = field(metadata=cli("Folder to write.", "--output", "-o", required=True))
    checkpoints: Path | None = field(
        default=None,
        metadata=cli(
            "Evaluate when a new entry appears in this folder (labelled with the last number in its name).",
            metavar="DIRECTORY",
        ),
    )
    every_minutes: float | None = field(
        default=None, metadata=cli("Also evaluate every N minutes.", min=0, min_open=True)
    )
    max_regression: dict[str, float] = field(
        default_factory=dict,
        metadata=cli("As gym train run's (repeatable).", multiple=True, metavar="ENV=DELTA"),
    )
    on_alarm: OnAlarm = field(default="exit", metadata=cli("exit: stop at the first alarm."))
    hook: str | None = field(
        default=None, metadata=cli("Command run on an alarm, the alarms as JSON in POLYGYM_ALARMS.")
    )
    max_evaluations: int | None = field(
        default=None, metadata=cli("Stop after N evaluations past the baseline.", min=0)
    )
    """Evaluations after the baseline before the watch ends (None: until interrupted)."""
    validation_limit: int | None = field(
        default=None, metadata=cli("Validation rows per environment.", min=1)
    )
    max_output_tokens: int | None = field(default=None, metadata=cli("Per request.", min=1))
    concurrency: int = field(default=64, metadata=cli("Rollouts in flight at once.", min=1))
    configs: tuple[str, ...] = field(
        default=(), metadata=cli("More stack config files (repeatable).", "--config")
    )
    overrides: tuple[str, ...] = field(default=(), metadata=cli("", argument=True, metavar="[KEY=VALUE]..."))

    def to_record(self) -> dict[str, Any]:
        """The settings ``run.json`` records: all but the endpoint's API key (a secret)."""
        record = dataclasses.asdict(self)
        del record["policy_api_key"]
        return record

    @property
    def every_s(self) -> float | None:
        """``--every-minutes`` in seconds, the clock's period."""
        return None if self.every_minutes is None else self.every_minutes * 60


@dataclass
class WatchResult:
    evaluations: list[int] = field(default_factory=list)
    """The step label of every evaluation done, the baseline (0) first."""
    alarms: list[dict[str, Any]] = field(default_factory=list)


class Triggers:
    """What asks for the next evaluation: a new checkpoint entry, SIGUSR1, or the clock."""

    def __init__(self, checkpoints: Path | None, every_s: float | None) -> None:
        self.checkpoints = checkpoints
        self.every_s = every_s
        self.signalled = False
        self.seen = self._entries()
        self.last = time.monotonic()

    def _entries(self) -> set[str]:
        if self.checkpoints is None or not self.checkpoints.is_dir():
            return set()
        return {entry.name for entry in self.checkpoints.iterdir()}

    def poll(self, previous: int) -> int | None:
        """The label of the evaluation to run now, or None: nothing asked for one yet."""
        new = sorted(self._entries() - self.seen)
        if new:
            self.seen.update(new)
            self.last = time.monotonic()
            numbers = _NUMBER.findall(new[-1])
            label = int(numbers[-1]) if numbers else previous + 1
            return label if label > previous else previous + 1
        due = self.every_s is not None and time.monotonic() - self.last >= self.every_s
        if self.signalled or due:
            self.signalled = False
            self.last = time.monotonic()
            return previous + 1
        return None


def stack_config(settings: WatchSettings, spec_envs: list[str]) -> StackConfig:
    """The spec's environments behind ``vllm_model`` in front of the trainer's endpoint."""
    paths = selector_paths(spec_envs, ["vllm_model"], list(settings.configs))
    base = [
        f"policy_base_url={settings.policy_url}",
        f"policy_api_key={settings.policy_api_key}",
        f"policy_model_name={settings.policy_model}",
    ]
    return load_config(paths, [*base, *settings.overrides])


async def evaluate(
    client: ServerClient, blend: Blend, output: Path, settings: WatchSettings
) -> dict[str, list[float]]:
    """Greedy rollouts of every environment's validation rows into ``output``; rewards per env."""
    sampling: dict[str, Any] = {"temperature": 0.0}
    if settings.max_output_tokens is not None:
        sampling["max_output_tokens"] = settings.max_output_tokens
    jobs = validation_jobs(blend, settings.validation_limit, sampling)
    limits = Limits(concurrency=settings.concurrency)
    await run_eval(client, jobs, RunFiles(output), limits, overwrite=True, progress_interval_s=60)
    agents = {env.agent: env.name for env in blend.environments}
    rewards: dict[str, list[float]] = {env.name: [] for env in blend.environments}
    for rollout in iter_jsonl(output):
        env = agents.get((rollout.get("agent_ref") or {}).get("name", ""))
        if env is not None:
            rewards[env].append(reward(rollout))
    return rewards


def run_hook(command: str, alarms: list[dict[str, Any]], out: Path, echo: Callable[[str], None]) -> None:
    """Run ``--hook`` with the alarms in ``POLYGYM_ALARMS``; a failing hook is reported, not fatal."""
    env = {**os.environ, "POLYGYM_ALARMS": json.dumps(alarms), "POLYGYM_WATCH_DIR": str(out)}
    try:
        done = subprocess.run(shlex.split(command), env=env, timeout=HOOK_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        echo(f"warning: --hook failed: {exc}")
        return
    if done.returncode != 0:
        echo(f"warning: --hook exited with status {done.returncode}")


class TensorBoard:
    """Scalars under ``out/tensorboard`` when ``tensorboard`` is installed; else nothing."""

    def __init__(self, out: Path) -> None:
        self.writer: Any = None
        with contextlib.suppress(ImportError):
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(out / "tensorboard"))

    def add(self, step: int, means: dict[str, float | None]) -> None:
        if self.writer is None:
            return
        for env, value in means.items():
            if value is not None:
                self.writer.add_scalar(f"polygym/{env}/validation_reward", value, step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def watch(settings: WatchSettings, echo: Callable[[str], None] = print) -> WatchResult:
    """Evaluate at the start and at every trigger until ``max_evaluations`` or an exiting alarm."""
    spec = load_spec(settings.spec_path)
    blend = load_blend(spec, split="validation")
    missing = [env.name for env in blend.environments if not blend.rows[env.name]]
    if missing:
        raise ValueError(f"{settings.spec_path}: no validation rows for {', '.join(missing)}")
    unknown = sorted(set(settings.max_regression) - {env.name for env in blend.environments})
    if unknown:
        raise ValueError(f"--max-regression: no environment {', '.join(unknown)} in {settings.spec_path}")
    out = settings.output_dir
    out.mkdir(parents=True, exist_ok=True)
    write_run_record(out, settings.to_record())
    agents = {env.name: env.agent for env in blend.environments}
    triggers = Triggers(settings.checkpoints, settings.every_s)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, lambda: setattr(triggers, "signalled", True))
    board = TensorBoard(out)
    result = WatchResult()
    target = StackTarget(config=stack_config(settings, environments_to_serve(spec)), record=False)
    try:
        async with StackSession(target, pool_size=settings.concurrency) as session:
            client = await session.connect()
            label = 0
            while True:
                rewards = await evaluate(client, blend, validation_file(out, label), settings)
                lines = validation_lines(label, rewards, blend)
                append_jsonl(lines, out / "validation.jsonl")
                board.add(label, {line["env"]: line["reward_mean"] for line in lines})
                result.evaluations.append(label)
                echo(f"step {label}: " + ", ".join(_mean_text(line) for line in lines))
                if label == 0:
                    require_scored(rewards, validation_file(out, 0), blend, NO_BASELINE)
                found = [alarm_record(r) for r in _judge(label, out, settings, agents)] if label else []
                if found:
                    result.alarms.extend(found)
                    append_jsonl(found, out / "alarms.jsonl")
                    for alarm in found:
                        echo(f"alarm: {alarm['message']}")
                    if settings.hook:
                        run_hook(settings.hook, found, out, echo)
                    if settings.on_alarm == "exit":
                        return result
                if (
                    settings.max_evaluations is not None
                    and len(result.evaluations) > settings.max_evaluations
                ):
                    return result
                label = await _next_label(triggers, label)
    finally:
        loop.remove_signal_handler(signal.SIGUSR1)
        board.close()


async def _next_label(triggers: Triggers, previous: int) -> int:
    while (label := triggers.poll(previous)) is None:
        await asyncio.sleep(POLL_S)
    return label


def alarm_record(verdict: Regression) -> dict[str, Any]:
    """An alarm as ``alarms.jsonl`` and the hook's ``POLYGYM_ALARMS`` carry it: the verdict's
    fields and the line ``gym train run`` prints for it."""
    return {**dataclasses.asdict(verdict), "message": verdict.describe()}


def _judge(label: int, out: Path, settings: WatchSettings, agents: dict[str, str]) -> list[Regression]:
    return regressions(
        label, validation_file(out, 0), validation_file(out, label), settings.max_regression, agents
    )


def _mean_text(line: dict[str, Any]) -> str:
    value = line["reward_mean"]
    shown = "no scored rollout" if value is None else f"{value:.3f}"
    return f"{line['env']} {shown} (mean of {line['n']})"
