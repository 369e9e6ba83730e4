"""On-policy collection for trainers: the blend's step N as token rollouts plus per-environment stats.

A trainer's loop is "collect step N with the current policy, compute advantages, update, repeat".
This module is the first third of it:

- ``stream_token_steps`` (async): step-wise collection (``polygym.blend.stepwise``: exact per-step
  quotas from the blend spec, per-environment concurrency, a step deadline) with token capture
  switched on (``return_token_ids: true`` in every request), each finished step returned as a
  ``TokenStep``: the step's ``TokenRollout`` s (``polygym.training.tokens``) ordered by prompt group
  then response, and an ``EnvTokenStats`` per environment plus an ``_all`` roll-up.
- ``TokenCollector`` (sync): the same for trainers written as plain synchronous Python (TRL,
  verl and NeMo RL drivers): ``collector.step(n)`` runs the collection on a private event loop in
  a background thread and returns the ``TokenStep``. It either starts the stack itself (inline, in
  this process) or talks to a running one through its head server URL — the remote-trainer path,
  where the trainer's generation server is the ``vllm_model`` upstream and the trainer pulls the
  rollouts through polygym's HTTP API.

Log-prob semantics: every token-carrying rollout says how its log-probs were taken (server,
temperature, raw or processed; ``TokenRollout.logprob_semantics``); a step whose rollouts disagree
is refused (``MixedLogprobSemanticsError``) unless ``allow_mixed_logprob_semantics``, and each step
line lists the semantics it saw.

Policy versions: each rollout is stamped with the version of the weights that generated it and
checked against the collector's ``staleness`` bound (``policy_version``: refused = masked, or only
reported); ``TokenStep.off_policy`` records the step's versions. ``submit(n)`` collects a step in
the background, for the one-step off-policy mode (``off_policy``).

Every rollout is also written to disk as by ``gym eval run --blend`` (``X.jsonl``, ``X_steps.jsonl``
... next to ``output``), so a training step can be inspected or replayed later.

The stats are what a training dashboard needs per environment and step: reward mean/std and pass
rate, the share of zero-variance prompt groups (no GRPO signal), tokens (all and generated), turns,
truncated episodes, masked rollouts (non-contiguous or without token ids) and their share (with an
alarm past ``max_masked_share``), turns rendered anew instead of token-in/token-out, failures and stragglers,
the realized vs target share of the step in prompts, and each environment's share of the step's
trained tokens (``trained_token_share``) and of its loss weight (``gradient_share``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import statistics
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from polygym.blend.dynamic_sampling import DynamicSampling
from polygym.blend.mix import Blend, load_blend
from polygym.blend.spec import BlendSpec
from polygym.blend.stepwise import EnvStepReport, StepFiles, StepReport, StepSettings, prepare_step_files
from polygym.blend.stepwise import stream_steps as _stream_steps
from polygym.collect.rollouts import Limits
from polygym.net.client import ServerClient
from polygym.row import ALL_ENVS, ENV_FIELD
from polygym.stack.config import StackConfig
from polygym.stack.session import StackSession, StackTarget
from polygym.training.advantages import zero_variance_groups
from polygym.training.policy_version import StalenessBound, check_staleness
from polygym.training.tokens import TokenRollout, assemble

T = TypeVar("T")
logger = logging.getLogger("polygym.training")
TOKEN_SAMPLING = {"return_token_ids": True}
_FOREVER = 1 << 40


@dataclass
class EnvTokenStats(EnvStepReport):
    """One environment in one training step (also the ``_all`` roll-up): the step report's fields
    (shares, counts, reward mean/std, pass rate, latency) plus what only token rollouts tell."""

    tokens: int
    """Here: tokens of the assembled sequences (prompt, environment and generated), what a trainer
    trains on; the step report counts the model servers' ``usage.total_tokens`` instead."""
    groups: int
    zero_variance_groups: int
    zero_variance_share: float | None
    """Share of prompt groups whose responses all got the same reward (no GRPO signal)."""
    generated_tokens: int
    turns_mean: float | None
    truncated: int
    """Rollouts cut short: the episode, or at least one of its model calls."""
    truncated_turns: int
    """Model calls that stopped at the token limit, over all rollouts."""
    masked: int
    """Rollouts whose loss mask was zeroed (non-contiguous, no token ids, inconsistent ids)."""
    non_contiguous: int
    masked_share: float | None = None
    """``masked`` over the rollouts: the share of this environment's rollouts trained on nothing."""
    retemplated_turns: int = 0
    """Later turns whose prompt was rendered anew instead of extending the exact ids
    (``polygym.training.continuation``): each one risks a masked rollout."""
    masked_alarm: int = 0
    """1 when ``masked_share`` passed the collector's ``max_masked_share`` this step."""
    reward_components: dict[str, float] = field(default_factory=dict)
    """Mean of each extra numeric verifier field over the completed rollouts."""
    trained_token_share: float | None = None
    """This environment's share of the step's trained tokens (``generated_tokens``: unmasked
    completion tokens), i.e. its share of a token-averaged loss. Quotas are exact in prompts, not
    in tokens: an environment with long episodes takes more of the gradient than of the prompts."""
    loss_weight: float = 1.0
    """Per-token loss weight the trainer gave this environment (``PolygymGRPO(gradient_share="plan")``)."""
    gradient_share: float | None = None
    """Share of the step's loss weight: ``generated_tokens x loss_weight`` over the step's total
    (equal to ``trained_token_share`` when every weight is 1)."""
    stale: int = 0
    """Rollouts over the collector's ``max_staleness`` (``policy_version``): masked when refused."""
    staleness_max: int | None = None
    """Most steps any rollout lagged the policy that trains on it (None: no version known)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def log_values(self) -> dict[str, float]:
        """Numeric fields for a trainer's logger (``None`` values left out)."""
        skip = {"step", "env", "agent", "reward_components"}
        out = {
            k: float(v)
            for k, v in asdict(self).items()
            if k not in skip and isinstance(v, int | float) and not isinstance(v, bool)
        }
        out.update({f"reward_components/{k}": v for k, v in self.reward_components.items()})
        return out


def env_token_stats(report: EnvStepReport, rollouts: list[TokenRollout]) -> EnvTokenStats:
    """Token statistics of one environment's rollouts in a step, on top of its step report."""
    rewards = [r.reward for r in rollouts]
    flat, groups = zero_variance_groups(rewards, [r.group_id for r in rollouts]) if rollouts else (0, 0)
    components: dict[str, list[float]] = {}
    for rollout in rollouts:
        for key, value in rollout.reward_components.items():
            components.setdefault(key, []).append(value)
    step_fields = {f.name: getattr(report, f.name) for f in fields(EnvStepReport)}
    return EnvTokenStats(
        **{**step_fields, "tokens": sum(len(r.input_ids) for r in rollouts)},
        groups=groups,
        zero_variance_groups=flat,
        zero_variance_share=flat / groups if groups else None,
        generated_tokens=sum(r.generated_tokens for r in rollouts),
        turns_mean=statistics.fmean(r.num_turns for r in rollouts) if rollouts else None,
        truncated=sum(r.truncated for r in rollouts),
        truncated_turns=sum(r.truncated_turns for r in rollouts),
        masked=sum(r.masked for r in rollouts),
        non_contiguous=sum(not r.contiguous for r in rollouts),
        masked_share=sum(r.masked for r in rollouts) / len(rollouts) if rollouts else None,
        retemplated_turns=sum(r.retemplated_turns for r in rollouts),
        reward_components={k: statistics.fmean(v) for k, v in components.items()},
        stale=sum(r.stale for r in rollouts),
        staleness_max=max((r.staleness for r in rollouts if r.staleness is not None), default=None),
    )


@dataclass
class TokenStep:
    """One collected training step."""

    step: int
    rollouts: list[TokenRollout]
    """Ordered by prompt group (task index), then response (rollout index)."""
    stats: dict[str, EnvTokenStats]
    """Per environment, in spec order, then ``_all``."""
    report: StepReport
    off_policy: dict[str, float] = field(default_factory=dict)
    """Policy versions of the step (``policy_version.StalenessSummary``) and, when the trainer
    corrects for them, its importance-sampling ratios (``off_policy``)."""

    @property
    def total(self) -> EnvTokenStats:
        return self.stats[ALL_ENVS]

    def set_loss_weights(self, weights: dict[str, float]) -> None:
        """Record the per-token loss weight of each environment (default 1.0) and the token and
        gradient shares that follow from it."""
        envs = {env: s for env, s in self.stats.items() if env != ALL_ENVS}
        trained = sum(s.generated_tokens for s in envs.values())
        weighted = sum(s.generated_tokens * weights.get(env, 1.0) for env, s in envs.items())
        for env, stats in envs.items():
            stats.loss_weight = weights.get(env, 1.0)
            stats.trained_token_share = stats.generated_tokens / trained if trained else None
            stats.gradient_share = stats.generated_tokens * stats.loss_weight / weighted if weighted else None
        self.total.trained_token_share = 1.0 if trained else None
        self.total.gradient_share = 1.0 if weighted else None

    def metrics(self, prefix: str = "polygym") -> dict[str, float]:
        """Flat ``{prefix}/{env}/{stat}`` values for a trainer's logs (``_all`` as ``all``)."""
        out = {}
        for env, stats in self.stats.items():
            name = "all" if env == ALL_ENVS else env
            out.update({f"{prefix}/{name}/{k}": v for k, v in stats.log_values().items()})
        out.update({f"{prefix}/off_policy/{k}": v for k, v in self.off_policy.items()})
        return out

    def check_masked_share(self, bound: float) -> list[str]:
        """Environments whose masked share passed ``bound`` this step (their ``masked_alarm`` set,
        a warning logged): drift the model servers could not avoid, or token capture missing."""
        over = []
        for env, stats in self.stats.items():
            if env != ALL_ENVS and stats.masked_share is not None and stats.masked_share > bound:
                stats.masked_alarm = 1
                over.append(env)
                logger.warning(
                    "step %d: %s has %d of %d rollouts masked (%.0f%% > max_masked_share %.0f%%); %s",
                    self.step,
                    env,
                    stats.masked,
                    sum(r.env == env for r in self.rollouts),
                    100 * stats.masked_share,
                    100 * bound,
                    next((r.problem for r in self.rollouts if r.env == env and r.masked), ""),
                )
        self.total.masked_alarm = int(bool(over))
        return over

    @property
    def logprob_semantics(self) -> list[dict[str, Any]]:
        """The distinct log-prob semantics of the step's token-carrying rollouts (one when sound)."""
        return distinct_semantics(self.rollouts)

    def log_lines(self) -> list[dict[str, Any]]:
        """One JSON-ready line per environment and the roll-up, with the step's wall time."""
        semantics = self.logprob_semantics
        return [
            {
                **stats.to_dict(),
                **self.report.env_extra(env),
                "logprob_semantics": semantics,
                "off_policy": self.off_policy,
            }
            for env, stats in self.stats.items()
        ]


class MixedLogprobSemanticsError(ValueError):
    """One step's rollouts carry log-probs taken in different ways (another server, temperature or
    processing): an importance ratio or KL over them would compare different distributions."""


def distinct_semantics(rollouts: list[TokenRollout]) -> list[dict[str, Any]]:
    """Each different ``logprob_semantics`` among rollouts that stated one, in first-seen order."""
    seen: list[dict[str, Any]] = []
    for rollout in rollouts:
        if rollout.logprob_semantics is not None and rollout.logprob_semantics not in seen:
            seen.append(rollout.logprob_semantics)
    return seen


def token_step(
    report: StepReport,
    input_keys: dict[str, set[str]] | None = None,
    allow_mixed_semantics: bool = False,
    staleness: StalenessBound | None = None,
    window: tuple[int | None, int | None] = (None, None),
) -> TokenStep:
    """Assemble a step report's rollouts and compute its per-environment token stats.

    Each rollout is stamped with the policy version that generated it and checked against
    ``staleness`` (``policy_version.check_staleness``; step ``n`` is trained by version ``n``).
    Raises ``MixedLogprobSemanticsError`` when rollouts state different log-prob semantics,
    unless ``allow_mixed_semantics`` (then ``TokenStep.logprob_semantics`` lists them)."""
    input_keys = input_keys or {}
    rollouts = [
        assemble(r, env=r.get(ENV_FIELD), input_keys=input_keys.get(str(r.get(ENV_FIELD)), ()))
        for r in report.rollouts
    ]
    versions = check_staleness(rollouts, report.rollouts, report.step, staleness or StalenessBound(), window)
    rollouts.sort(key=lambda r: (r.group_id, r.rollout_index))
    kinds = distinct_semantics(rollouts)
    if len(kinds) > 1 and not allow_mixed_semantics:
        parts = [
            f"{k} ({', '.join(sorted({r.env for r in rollouts if r.logprob_semantics == k}))})" for k in kinds
        ]
        raise MixedLogprobSemanticsError(f"step {report.step} mixes log-probs taken as " + "; ".join(parts))
    stats = {
        env: env_token_stats(env_report, [r for r in rollouts if r.env == env])
        for env, env_report in report.envs.items()
    }
    stats[ALL_ENVS] = env_token_stats(report.total, rollouts)
    step = TokenStep(report.step, rollouts, stats, report, versions.values())
    step.set_loss_weights({})
    return step


def _input_keys(blend: Blend) -> dict[str, set[str]]:
    return {env: {key for row in rows for key in row.data} for env, rows in blend.rows.items()}


async def stream_token_steps(
    client: ServerClient,
    blend: Blend,
    output: Path,
    settings: StepSettings,
    overwrite: bool = False,
    allow_mixed_semantics: bool = False,
    staleness: StalenessBound | None = None,
) -> AsyncGenerator[TokenStep, None]:
    """Collect steps ``start_step, start_step + 1, ...`` (``settings.steps`` of them, or fewer when
    the caller stops iterating) with token capture on; yields each finished step as a ``TokenStep``.

    ``start_step > 0`` continues a run in ``output`` (earlier steps kept, later ones dropped);
    ``start_step == 0`` needs ``overwrite`` when ``output`` already holds a run. ``staleness``
    stamps and bounds each step's rollouts (its ``published`` version read around each step).
    """
    settings = replace(settings, sampling={**settings.sampling, **TOKEN_SAMPLING})
    files = StepFiles(output)
    prepare_step_files(files, blend.sampler(), settings, overwrite)
    keys = _input_keys(blend)
    reports = _stream_steps(client, blend, files, settings)
    published = staleness.published if staleness is not None else None
    began = published.current if published is not None else None
    async with contextlib.aclosing(reports) as stream:
        async for report in stream:
            ended = published.current if published is not None else None
            yield token_step(report, keys, allow_mixed_semantics, staleness, (began, ended))
            began = published.current if published is not None else None


class TokenCollector:
    """Step-at-a-time token collection for synchronous trainers (see the module docstring).

    Give it a running stack (``head_url``) or a ``stack_config`` to start in this process; use it
    as a context manager, or call ``start``/``close``. ``step()`` collects the next step;
    ``step(n)`` jumps to step ``n`` (later steps in ``output`` are dropped first, as on resume).
    """

    def __init__(
        self,
        spec: BlendSpec | Blend,
        output: Path,
        head_url: str | None = None,
        stack_config: StackConfig | None = None,
        limits: Limits | None = None,
        sampling: dict[str, Any] | None = None,
        step_timeout_s: float | None = None,
        overwrite: bool = False,
        backend: str = "inline",
        allow_mixed_logprob_semantics: bool = False,
        max_masked_share: float | None = None,
        staleness: StalenessBound | None = None,
        dynamic_sampling: DynamicSampling | None = None,
    ) -> None:
        self.blend = spec if isinstance(spec, Blend) else load_blend(spec)
        self.output = Path(output)
        self.target = StackTarget(stack_config, head_url, backend, record=False)
        self.limits = limits or Limits()
        self.sampling = sampling
        self.step_timeout_s = step_timeout_s
        self.overwrite = overwrite
        self.allow_mixed_logprob_semantics = allow_mixed_logprob_semantics
        self.max_masked_share = max_masked_share
        """Each step checks it (``TokenStep.check_masked_share``); the caller decides to stop."""
        self.staleness = staleness or StalenessBound()
        self.dynamic_sampling = dynamic_sampling
        self.client: ServerClient | None = None
        self._session: StackSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stream: AsyncIterator[TokenStep] | None = None
        self._next = 0

    # -- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> TokenCollector:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        if self._loop is not None:
            return
        loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="polygym-collector", daemon=True)
        self._thread.start()
        self._loop = loop
        try:
            self.run(self._open())
        except BaseException:
            self.close()
            raise

    async def _open(self) -> None:
        self._session = StackSession(self.target, self.limits.concurrency)
        await self._session.__aenter__()
        self._session.require_agents({f"environment {e.name}": e.agent for e in self.blend.environments})
        self.client = await self._session.connect()

    def close(self) -> None:
        if self._loop is None:
            return
        with contextlib.suppress(Exception):
            self.run(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._loop.close()
        self._loop = None

    async def _shutdown(self) -> None:
        await self._close_stream()
        if self._session is not None:
            await self._session.close()
        self._session = None
        self.client = None

    async def _close_stream(self) -> None:
        if self._stream is not None:
            await self._stream.aclose()  # type: ignore[attr-defined]
            self._stream = None

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the collector's loop (where its client lives) and wait for it."""
        if self._loop is None:
            raise RuntimeError("the collector is not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    # -- steps ---------------------------------------------------------------------------------
    def step(self, number: int | None = None) -> TokenStep:
        """Collect step ``number`` (default: the one after the last collected) and return it."""
        return self.run(self._step(self._next if number is None else number))

    def submit(self, number: int) -> concurrent.futures.Future[TokenStep]:
        """Start collecting step ``number`` in the background (``off_policy``); one at a time."""
        if self._loop is None:
            raise RuntimeError("the collector is not started")
        return asyncio.run_coroutine_threadsafe(self._step(number), self._loop)

    async def _step(self, number: int) -> TokenStep:
        if number < 0:
            raise ValueError("step numbers start at 0")
        if self._stream is None or number != self._next:
            await self._close_stream()
            assert self.client is not None
            settings = StepSettings(
                _FOREVER,
                number,
                self.limits,
                self.step_timeout_s,
                dict(self.sampling or {}),
                dynamic_sampling=self.dynamic_sampling,
            )
            self._stream = stream_token_steps(
                self.client,
                self.blend,
                self.output,
                settings,
                self.overwrite,
                self.allow_mixed_logprob_semantics,
                self.staleness,
            )
            self.overwrite = True  # this collector's own files from here on
        result = await anext(self._stream)
        self._next = number + 1
        if self.max_masked_share is not None:
            result.check_masked_share(self.max_masked_share)
        return result
