"""Group-relative advantages (GRPO): each response is scored against the other responses to its prompt.

For a prompt group ``g`` with rewards ``r_1 .. r_n`` (the ``responses_per_prompt`` rollouts of
one prompt)::

    A_i = (r_i - mean(r_g)) / (std(r_g) + eps)        scale="group"   (GRPO, the default)
    A_i = (r_i - mean(r_g)) / (std(all r) + eps)      scale="batch"   (one scale for the step)
    A_i =  r_i - mean(r_g)                            scale="none"    (Dr. GRPO: no std division)

``std`` is the population standard deviation (``ddof=0``) unless ``ddof=1`` is asked for (TRL's
``GRPOTrainer`` uses the sample std). A group whose rewards are all equal (a *zero-variance
group*: every response right, or every response wrong) has advantage 0 for every member under
every scale: it carries no learning signal, which is why the step statistics report its share.

Rollouts are grouped by an arbitrary hashable id (polygym uses the task index), not by position,
so a step whose rollouts arrive out of order or with some failed ones still groups correctly. A
group of one gets advantage 0 (no baseline to compare against).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence
from typing import Literal

Scale = Literal["group", "batch", "none"]
DEFAULT_EPS = 1e-6


def _std(values: Sequence[float], ddof: int) -> float:
    if len(values) <= ddof:
        return 0.0
    return statistics.pstdev(values) if ddof == 0 else statistics.stdev(values)


def group_advantages(
    rewards: Sequence[float],
    groups: Sequence[Hashable],
    scale: Scale = "group",
    eps: float = DEFAULT_EPS,
    ddof: int = 0,
) -> list[float]:
    """One advantage per reward (same order), normalized within each group as the module says."""
    if len(rewards) != len(groups):
        raise ValueError(f"{len(rewards)} rewards but {len(groups)} group ids")
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale must be 'group', 'batch' or 'none', not {scale!r}")
    if ddof not in (0, 1):
        raise ValueError("ddof must be 0 or 1")
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, group in enumerate(groups):
        members[group].append(i)
    values = [float(r) for r in rewards]
    if any(not math.isfinite(v) for v in values):
        raise ValueError("rewards must be finite numbers")
    batch_std = _std(values, ddof) if scale == "batch" else 0.0
    advantages = [0.0] * len(values)
    for indices in members.values():
        group_rewards = [values[i] for i in indices]
        if len(indices) < 2 or max(group_rewards) == min(group_rewards):
            continue  # zero-variance group (or a single response): no signal
        mean = statistics.fmean(group_rewards)
        if scale == "group":
            divisor = _std(group_rewards, ddof) + eps
        elif scale == "batch":
            divisor = batch_std + eps
        else:
            divisor = 1.0
        for i in indices:
            advantages[i] = (values[i] - mean) / divisor
    return advantages


def zero_variance_groups(rewards: Sequence[float], groups: Sequence[Hashable]) -> tuple[int, int]:
    """``(zero-variance groups, groups)``: how many prompt groups carry no learning signal."""
    by_group: dict[Hashable, list[float]] = defaultdict(list)
    for reward, group in zip(rewards, groups, strict=True):
        by_group[group].append(float(reward))
    flat = sum(1 for rs in by_group.values() if max(rs) == min(rs))
    return flat, len(by_group)


def plan_token_weights(tokens: Mapping[str, int], shares: Mapping[str, float]) -> dict[str, float]:
    """Per-token loss weight of each environment so that its share of the step's weighted trained
    tokens equals its planned share (``shares``, renormalized over the environments that trained
    at least one token this step).

    Why: the blend's quotas are exact in prompts, but a token-averaged loss gives each environment
    a gradient share proportional to its generated tokens, so an environment with long episodes
    dominates the update (measured: 50% of the prompts, 71% of the trained tokens). The weights keep
    the step's total weight equal to its token count, so the loss scale is unchanged. An environment
    with no trained tokens gets weight 1.0 (it has nothing to scale); one with a zero share, 0.0.
    """
    present = {env: float(shares.get(env, 0.0)) for env, count in tokens.items() if count > 0}
    share_sum = sum(present.values())
    trained = sum(tokens[env] for env in present)
    weights = {env: 1.0 for env in tokens}
    for env, share in present.items():
        weights[env] = share / share_sum * trained / tokens[env] if share_sum > 0 else 1.0
    return weights
