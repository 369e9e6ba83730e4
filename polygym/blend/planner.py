"""The step planner: how many prompts of each environment go into every training step.

A multi-environment step must hold enough prompts of every environment, or the gradient of that
step is skewed towards whichever environment happened to dominate it. The planner turns weights
and per-environment minimums into one exact quota per environment, the same in every step:

1. Minimums first. An environment whose weight share of ``prompts_per_step`` falls below its
   ``min_per_step`` is given exactly its minimum and leaves the pool; the remaining prompts are
   shared among the remaining environments by weight, and this repeats until no share falls
   below its minimum. A pinned environment never gets more than its minimum.
2. Largest remainder (Hamilton) among the others: each gets the floor of its share, and the prompts
   left over go to the largest fractional parts (ties: the earlier environment in the spec).

Shares are computed with exact fractions, so the plan is the same on every machine. Quotas sum to
``prompts_per_step`` exactly, every minimum is honoured, and without binding minimums every quota
is within one prompt of its weight share (the property of largest remainder).

Quotas are fixed per step rather than rotated between steps: a trainer then sees the same mix in
every step, and a step can be sampled on its own (resume from step N without replaying). The price
is rounding: three equal environments in a step of 4 prompts get 2, 1, 1. The plan warns when the
planned share strays from the weight share and suggests a step size that fits the weights.

How much of a step each environment needs is counted in prompts *and* rollouts (prompts x
responses): an environment warns below ``warn_below`` prompts (distinct tasks: one prompt's group is
one task's signal) or below ``warn_below_rollouts`` rollouts (the samples its share of the gradient
averages over). With equal weights, every environment added raises the suggested step by the same
amount: ``n`` environments need ``n x max(warn_below, ceil(warn_below_rollouts / responses))``
prompts (docs/multi_env_batches.md). An environment with quota 0 is starved in *every* step, since
quotas are fixed: ``Plan.starved`` names them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

from polygym.row import ALL_ENVS_LABEL

DEFAULT_WARN_BELOW = 2
"""Fewest prompts (distinct tasks) per step and environment that raise no warning."""
DEFAULT_WARN_BELOW_ROLLOUTS = 8
"""Fewest rollouts (prompts x responses) per step and environment that raise no warning."""
SHARE_DRIFT_WARNING = Fraction(1, 5)
"""Warn when an environment's planned share differs from its weight share by more than 20%."""


class InfeasiblePlanError(ValueError):
    """The minimums cannot fit in a step; the message says which step size would work."""

    def __init__(self, message: str, min_prompts_per_step: int) -> None:
        super().__init__(message)
        self.min_prompts_per_step = min_prompts_per_step


@dataclass(frozen=True)
class EnvDemand:
    """What one environment asks of a step: a weight (> 0) and an optional minimum of prompts."""

    name: str
    weight: float
    min_per_step: int = 0
    rows: int | None = None
    """Prompts in the environment's training data, when known (for steps per epoch)."""


@dataclass(frozen=True)
class EnvPlan:
    name: str
    weight: float
    target_share: float
    quota: int
    planned_share: float
    min_per_step: int
    pinned: bool
    """True when the quota was raised to the environment's minimum above its weight share."""
    rows: int | None
    steps_per_epoch: float | None
    """Steps until every prompt of the environment has been used once (None: unknown or starved)."""
    rollouts_per_step: int


@dataclass(frozen=True)
class Plan:
    prompts_per_step: int
    responses_per_prompt: int
    environments: list[EnvPlan]
    warnings: list[str] = field(default_factory=list)
    min_prompts_per_step: int = 1
    """The smallest step that gives every environment its minimum (with minimums enforced)."""
    suggested_prompts_per_step: int = 1
    """The smallest step whose plain weight shares already reach every minimum and the warning
    thresholds, so no quota has to be forced and no environment is starved."""

    @property
    def global_batch_size(self) -> int:
        return self.prompts_per_step * self.responses_per_prompt

    @property
    def starved(self) -> list[str]:
        """Environments with no prompt in any step (quotas are the same in every step)."""
        return [env.name for env in self.environments if env.quota == 0]

    @property
    def quotas(self) -> dict[str, int]:
        return {env.name: env.quota for env in self.environments}

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompts_per_step": self.prompts_per_step,
            "responses_per_prompt": self.responses_per_prompt,
            "global_batch_size": self.global_batch_size,
            "environments": [asdict(env) for env in self.environments],
            "warnings": list(self.warnings),
            "min_prompts_per_step": self.min_prompts_per_step,
            "suggested_prompts_per_step": self.suggested_prompts_per_step,
            "starved": self.starved,
        }


def _fractions(demands: Sequence[EnvDemand]) -> list[Fraction]:
    weights = []
    for demand in demands:
        if not (demand.weight > 0 and math.isfinite(demand.weight)):
            raise ValueError(f"{demand.name}: weight must be a finite number > 0, got {demand.weight}")
        if demand.min_per_step < 0:
            raise ValueError(f"{demand.name}: min_per_step must be >= 0, got {demand.min_per_step}")
        weights.append(Fraction(demand.weight))
    return weights


def largest_remainder(weights: Sequence[Fraction], total: int) -> list[int]:
    """Hamilton apportionment of ``total`` by ``weights``; ties go to the earlier index."""
    if not weights:
        return []
    whole = sum(weights, Fraction(0))
    ideal = [w * total / whole for w in weights]
    quotas = [math.floor(x) for x in ideal]
    left = total - sum(quotas)
    order = sorted(range(len(weights)), key=lambda i: (-(ideal[i] - quotas[i]), i))
    for i in order[:left]:
        quotas[i] += 1
    return quotas


def apportion(demands: Sequence[EnvDemand], total: int) -> list[int]:
    """Exact quotas for one step of ``total`` prompts (see the module docstring for the rule)."""
    return _apportion(demands, total)[0]


def _apportion(demands: Sequence[EnvDemand], total: int) -> tuple[list[int], set[int]]:
    """Quotas, and which environments were pinned to their minimum on the way."""
    if total < 1:
        raise ValueError(f"prompts_per_step must be at least 1, got {total}")
    weights = _fractions(demands)
    names = [d.name for d in demands]
    if len(set(names)) != len(names):
        raise ValueError(f"environment names must be unique: {names}")
    minimums = [d.min_per_step for d in demands]
    needed = sum(minimums)
    if needed > total:
        raise InfeasiblePlanError(
            f"infeasible plan: the minimums add up to {needed} prompts "
            f"({', '.join(f'{d.name}: {d.min_per_step}' for d in demands if d.min_per_step)}) but "
            f"prompts_per_step is {total}; raise prompts_per_step to at least {needed}"
            f" ({suggest_prompts_per_step(demands, 0)} meets them by weight alone)",
            needed,
        )
    pinned: set[int] = set()
    while True:
        free = [i for i in range(len(demands)) if i not in pinned]
        remaining = total - sum(minimums[i] for i in pinned)
        free_weight = sum((weights[i] for i in free), Fraction(0))
        newly = {i for i in free if weights[i] * remaining / free_weight < minimums[i]}
        if not newly:
            break
        pinned |= newly
    quotas = [0] * len(demands)
    for i in pinned:
        quotas[i] = minimums[i]
    free = [i for i in range(len(demands)) if i not in pinned]
    for i, quota in zip(free, largest_remainder([weights[i] for i in free], remaining), strict=True):
        quotas[i] = quota
    return quotas, pinned


def _integer_weights(weights: Sequence[Fraction]) -> list[int]:
    """The same proportions as integers (exact), so a candidate step size costs no fractions."""
    denominator = math.lcm(*(w.denominator for w in weights))
    return [w.numerator * (denominator // w.denominator) for w in weights]


def _plain_quotas(weights: Sequence[int], whole: int, total: int) -> list[int]:
    """``largest_remainder`` for integer weights."""
    scaled = [w * total for w in weights]
    quotas = [x // whole for x in scaled]
    order = sorted(range(len(weights)), key=lambda i: (-(scaled[i] % whole), i))
    for i in order[: total - sum(quotas)]:
        quotas[i] += 1
    return quotas


def drifts(quota: int, total: int, share: Fraction) -> bool:
    """Whether ``quota`` of ``total`` strays from ``share`` by more than SHARE_DRIFT_WARNING."""
    return abs(Fraction(quota, total) - share) > SHARE_DRIFT_WARNING * share


def prompts_needed(responses_per_prompt: int, warn_below: int, warn_below_rollouts: int) -> int:
    """Fewest prompts of one environment per step that raise no warning: ``warn_below`` prompts and
    ``warn_below_rollouts`` rollouts of ``responses_per_prompt`` each."""
    return max(warn_below, math.ceil(warn_below_rollouts / responses_per_prompt))


def suggest_prompts_per_step(
    demands: Sequence[EnvDemand],
    warn_below: int = DEFAULT_WARN_BELOW,
    responses_per_prompt: int = 1,
    warn_below_rollouts: int = DEFAULT_WARN_BELOW_ROLLOUTS,
) -> int:
    """Smallest step size that needs no warning: every weight share reaches its min_per_step
    without forcing, every quota reaches ``prompts_needed`` (prompts and rollouts), and no planned
    share strays more than 20% from its weight share.

    Largest remainder is not monotone in the step size (Alabama paradox), so sizes are tried
    upwards from a lower bound (every environment needs a prompt, so P >= 5 / (6 * share)) to an
    upper bound that always fits (shares reach every need, and rounding, under one prompt,
    drifts less than 20% from P >= 5 / share on). Past 4096 candidates the upper bound is returned.
    """
    if not demands:
        return 1
    fractions = _fractions(demands)
    weights = _integer_weights(fractions)
    whole = sum(weights)
    shares = [Fraction(w, whole) for w in weights]
    enough = prompts_needed(responses_per_prompt, warn_below, warn_below_rollouts)
    needs = [max(d.min_per_step, enough) for d in demands]
    smallest = min(shares)
    upper = max(
        max(1, sum(needs)),
        max(math.ceil(n / t) for n, t in zip(needs, shares, strict=True)),
        math.ceil(1 / (smallest * SHARE_DRIFT_WARNING)),
    )
    lower = max(
        1,
        sum(needs),
        math.ceil(Fraction(1) / (smallest * (1 + SHARE_DRIFT_WARNING))),
        max(math.ceil(d.min_per_step / t) for d, t in zip(demands, shares, strict=True)),
    )
    for total in range(lower, min(upper, lower + 4096)):
        quotas = _plain_quotas(weights, whole, total)
        if all(q >= n and not drifts(q, total, t) for q, n, t in zip(quotas, needs, shares, strict=True)):
            return total
    return upper


def make_plan(
    demands: Sequence[EnvDemand],
    prompts_per_step: int,
    responses_per_prompt: int = 1,
    warn_below: int = DEFAULT_WARN_BELOW,
    warn_below_rollouts: int = DEFAULT_WARN_BELOW_ROLLOUTS,
) -> Plan:
    """The plan of one step shape; raises InfeasiblePlanError when the minimums cannot fit."""
    if not demands:
        raise ValueError("a plan needs at least one environment")
    if responses_per_prompt < 1:
        raise ValueError(f"responses_per_prompt must be at least 1, got {responses_per_prompt}")
    quotas, pinned_set = _apportion(demands, prompts_per_step)
    weights = _fractions(demands)
    whole = sum(weights, Fraction(0))
    pinned = [i in pinned_set for i in range(len(demands))]
    suggested = suggest_prompts_per_step(demands, warn_below, responses_per_prompt, warn_below_rollouts)
    shape = StepShape(responses_per_prompt, warn_below, warn_below_rollouts, suggested)
    envs: list[EnvPlan] = []
    warnings: list[str] = []
    for demand, weight, quota, is_pinned in zip(demands, weights, quotas, pinned, strict=True):
        target = float(weight / whole)
        planned = quota / prompts_per_step
        steps_per_epoch = demand.rows / quota if demand.rows is not None and quota > 0 else None
        envs.append(
            EnvPlan(
                name=demand.name,
                weight=demand.weight,
                target_share=target,
                quota=quota,
                planned_share=planned,
                min_per_step=demand.min_per_step,
                pinned=is_pinned,
                rows=demand.rows,
                steps_per_epoch=steps_per_epoch,
                rollouts_per_step=quota * responses_per_prompt,
            )
        )
        drift = quota > 0 and drifts(quota, prompts_per_step, weight / whole)
        warnings.extend(_warnings(demand, quota, target, planned, is_pinned, drift, shape))
    return Plan(
        prompts_per_step=prompts_per_step,
        responses_per_prompt=responses_per_prompt,
        environments=envs,
        warnings=warnings,
        min_prompts_per_step=max(1, sum(d.min_per_step for d in demands)),
        suggested_prompts_per_step=suggested,
    )


@dataclass(frozen=True)
class StepShape:
    """What the warnings of one plan measure each environment against."""

    responses_per_prompt: int
    warn_below: int
    warn_below_rollouts: int
    suggested: int

    @property
    def hint(self) -> str:
        r = self.responses_per_prompt
        return (
            f"prompts_per_step {self.suggested} ({self.suggested} x {r} = {self.suggested * r} rollouts) "
            "fits every environment by weight"
        )

    def shortfall(self, quota: int) -> str | None:
        """Which threshold ``quota`` prompts fall below (None: neither)."""
        below = []
        if quota < self.warn_below:
            below.append(f"fewer than {self.warn_below} prompts")
        if quota * self.responses_per_prompt < self.warn_below_rollouts:
            below.append(f"fewer than {self.warn_below_rollouts} rollouts")
        return " and ".join(below) or None


def _warnings(
    demand: EnvDemand, quota: int, target: float, planned: float, pinned: bool, drift: bool, shape: StepShape
) -> list[str]:
    out: list[str] = []
    hint = shape.hint
    r = shape.responses_per_prompt
    if quota < demand.min_per_step:  # cannot happen for a feasible plan; kept as a safety net
        out.append(f"{demand.name}: {quota} prompts per step, below its min_per_step {demand.min_per_step}")
    elif quota == 0:
        out.append(f"{demand.name}: starved, 0 prompts in every step (weight share {target:.1%}); {hint}")
    elif below := shape.shortfall(quota):
        out.append(
            f"{demand.name}: only {quota} prompt{'s' if quota != 1 else ''} x {r} responses = {quota * r} "
            f"rollouts per step ({below}); its gradient signal per step is noisy; {hint}"
        )
    if pinned:
        out.append(
            f"{demand.name}: raised to its min_per_step {demand.min_per_step} "
            f"(planned share {planned:.1%}, weight share {target:.1%})"
        )
    elif drift:
        out.append(
            f"{demand.name}: rounding gives a planned share of {planned:.1%} against a weight share of "
            f"{target:.1%}; {hint}"
        )
    return out


def plan_summary_rows(plan: Plan) -> list[dict[str, Any]]:
    """Rows for a table: one per environment plus the all-environments total."""
    rows = [asdict(env) for env in plan.environments]
    rows.append(
        {
            "name": ALL_ENVS_LABEL,
            "weight": sum(env.weight for env in plan.environments),
            "target_share": 1.0,
            "quota": plan.prompts_per_step,
            "planned_share": 1.0,
            "min_per_step": sum(env.min_per_step for env in plan.environments),
            "pinned": False,
            "rows": None,
            "steps_per_epoch": None,
            "rollouts_per_step": plan.global_batch_size,
        }
    )
    return rows


def demands_from_weights(
    weights: Mapping[str, float],
    minimums: Mapping[str, int] | None = None,
    rows: Mapping[str, int] | None = None,
) -> list[EnvDemand]:
    """Convenience for callers that hold plain mappings (order of ``weights`` is kept)."""
    minimums = minimums or {}
    rows = rows or {}
    return [EnvDemand(name, w, minimums.get(name, 0), rows.get(name)) for name, w in weights.items()]
