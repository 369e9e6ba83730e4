"""The settings of ``gym eval run``, each declared once: its default, its flag and its help text
(``polygym.settings``); ``polygym.cli.eval`` generates the command's options from them.

The settings ``gym eval reverify`` shares with it (``--allow-stack-change``,
``--disable-aggregation``, and ``--max-failures`` from ``failure_budget``) are declared once, as
the ``cli(...)`` metadata both dataclasses' fields carry. Stack selection (selectors,
``--no-serve``, ``--backend``) is not a setting of the collection: it becomes the ``StackTarget``
the run starts or joins.

Fields are in the order ``--help`` lists them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polygym.collect.failure_budget import MAX_FAILURES, NO_FAILURES, FailureBudget
from polygym.collect.health import DEFAULT_QUARANTINE_MIN, DEFAULT_QUARANTINE_RATE
from polygym.collect.job_plan import MAX_NUM_REPEATS, Materialization
from polygym.collect.rollouts import DEFAULT_CONCURRENCY, DEFAULT_TIMEOUT_S, MAX_CONCURRENCY, Limits
from polygym.settings import cli

ALLOW_STACK_CHANGE = cli(
    "With --resume: continue even if the policy or environments differ from the run's (recorded)."
)
"""``--allow-stack-change`` of every command that resumes a run against a stack."""
DISABLE_AGGREGATION = cli("Do not compute or write the aggregate metrics file.")
"""NeMo Gym's ``--disable-aggregation`` of every command that writes an aggregate metrics file."""


@dataclass(frozen=True)
class PerAgent:
    """An ``N|AGENT=N`` setting: ``N`` for every agent, ``AGENT=N`` for one (both repeatable)."""

    default: int | None = None
    per_agent: dict[str, int] = field(default_factory=dict)

    @classmethod
    def parse(cls, values: tuple[str, ...], maximum: int) -> PerAgent:
        """Each N is 1..``maximum``; raises ``ValueError`` naming the bad value."""
        default: int | None = None
        per_agent: dict[str, int] = {}
        for value in values:
            name, sep, number = value.rpartition("=")
            try:
                parsed = int(number)
            except ValueError:
                raise ValueError(f"'{value}' is not N or AGENT=N") from None
            if not 1 <= parsed <= maximum:
                raise ValueError(f"'{value}' must be from 1 to {maximum}")
            if sep:
                per_agent[name] = parsed
            else:
                default = parsed
        return cls(default, per_agent)


SAMPLING_OPTIONS = ("temperature", "top_p", "max_output_tokens")
"""The settings that override a sampling field of every row (NeMo Gym's overrides set them too)."""


@dataclass(frozen=True)
class EvalRunSettings:
    """What one ``gym eval run`` collects and how; ``from_options`` in ``polygym.cli.eval`` builds
    it from the parsed options (``N|AGENT=N`` values and sampling overrides checked)."""

    input_path: Path | None = field(
        default=None, metadata=cli("Dataset JSONL; exactly one of --input and --blend.", "--input", "-i")
    )
    blend_path: Path | None = field(
        default=None,
        metadata=cli("Collect step by step from a blend spec instead of --input (needs --steps).", "--blend"),
    )
    steps: int | None = field(default=None, metadata=cli("Steps to collect with --blend.", min=1))
    start_step: int = field(
        default=0,
        metadata=cli("First step with --blend (--resume continues after the last finished step).", min=0),
    )
    step_timeout_s: float | None = field(
        default=None,
        metadata=cli(
            "Seconds per step with --blend; unfinished rollouts are recorded as stragglers.",
            "--step-timeout",
            min=0,
            min_open=True,
        ),
    )
    output_path: Path | None = field(
        default=None,
        metadata=cli(
            "Rollouts JSONL (required); the failures, inputs and metrics files are written next to it.",
            "--output",
            "-o",
        ),
    )
    agent: str | None = field(
        default=None,
        metadata=cli("Agent for rows without agent_ref [default: the only agent].", "--agent", "-a"),
    )
    limit: int | None = field(default=None, metadata=cli("Use only the first N rows.", min=1))
    num_repeats: PerAgent = field(
        default_factory=PerAgent,
        metadata=cli(
            f"Rollouts per row, at most {MAX_NUM_REPEATS:,} (repeatable; AGENT=N for one agent).",
            metavar="N|AGENT=N",
            multiple=True,
        ),
    )
    concurrency: PerAgent = field(
        default_factory=PerAgent,
        metadata=cli(
            f"Rollouts in flight [default: {DEFAULT_CONCURRENCY}, at most {MAX_CONCURRENCY:,}]; "
            "AGENT=N caps one agent.",
            metavar="N|AGENT=N",
            multiple=True,
        ),
    )
    timeout_s: float = field(
        default=DEFAULT_TIMEOUT_S,
        metadata=cli(
            "Seconds per rollout, retries included; a rollout still running then is cancelled.",
            "--timeout",
            min=0,
            min_open=True,
        ),
    )
    resume: bool = field(default=False, metadata=cli("Finish an interrupted run: only the missing rollouts."))
    allow_stack_change: bool = field(default=False, metadata=ALLOW_STACK_CHANGE)
    overwrite: bool = field(default=False, metadata=cli("Replace existing output files."))
    max_failures: FailureBudget = field(default=NO_FAILURES, metadata=MAX_FAILURES)
    """With ``--blend``, stragglers count as failed."""
    quarantine_rate: float = field(
        default=DEFAULT_QUARANTINE_RATE,
        metadata=cli(
            "Stop an environment's rollouts once more than this share failed or was unhealthy "
            "(see gym eval health-check); the others go on and the run exits 1. 1: never.",
            min=0,
            max=1,
            min_open=True,
        ),
    )
    quarantine_min: int = field(
        default=DEFAULT_QUARANTINE_MIN,
        metadata=cli("Rollouts of an environment seen before it can be quarantined.", min=1),
    )
    temperature: float | None = field(default=None, metadata=cli("Override every row's temperature."))
    top_p: float | None = field(default=None, metadata=cli("Override every row's top_p."))
    max_output_tokens: int | None = field(
        default=None, metadata=cli("Override every row's max_output_tokens.")
    )
    seed: int | None = field(default=None, metadata=cli("Sampling seed; repeat r of a row uses SEED + r."))
    interleave_repeats: bool = field(
        default=False,
        metadata=cli("Send the repeats round by round (abcabc), not each row's back to back (aabbcc)."),
    )
    disable_aggregation: bool = field(default=False, metadata=DISABLE_AGGREGATION)
    progress_interval_s: float = field(
        default=10.0,
        metadata=cli(
            "Seconds between progress lines when not on a terminal.",
            "--progress-interval",
            min=0,
            min_open=True,
        ),
    )
    sampling: dict[str, Any] = field(default_factory=dict)
    """The sampling fields laid over every row: NeMo Gym's ``responses_create_params`` overrides,
    then ``--temperature``, ``--top-p``, ``--max-output-tokens`` (no option of its own)."""

    @property
    def output(self) -> Path:
        """``--output``, which the command requires before it builds the settings."""
        assert self.output_path is not None, "--output is required"
        return self.output_path

    @property
    def materialization(self) -> Materialization:
        """How rows become requests: ``--num-repeats``, the sampling fields and ``--seed``."""
        repeats = self.num_repeats
        return Materialization(
            repeats.default or 1, repeats.per_agent, self.sampling, self.seed, self.interleave_repeats
        )

    @property
    def limits(self) -> Limits:
        """``--concurrency`` (global and per agent) and ``--timeout`` per rollout."""
        concurrency = self.concurrency
        return Limits(concurrency.default or DEFAULT_CONCURRENCY, concurrency.per_agent, self.timeout_s)
