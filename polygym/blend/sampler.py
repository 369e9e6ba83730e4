"""The step sampler: which rows make up training step N, for any N, without replaying steps 0..N-1.

Every environment is an endless stream of its rows: epoch after epoch, each epoch a fresh
permutation. Because the planner gives every environment a fixed quota ``q`` per step, step ``s``
takes stream positions ``s*q .. s*q + q - 1`` of that environment, and position ``p`` is row
``perm(e)[p % n]`` of epoch ``e = p // n`` (``n`` rows). ``perm(e)`` is a shuffle seeded by
``(seed, environment name, e)`` alone, so any step is computed directly: resuming a run at step
100,000 costs one or two shuffles per environment, not 100,000 steps of replay.

Consequences worth knowing:

- Within an epoch every row of an environment is used exactly once; a small dataset simply
  cycles, reshuffled each epoch, while a large one is still in its first epoch.
- A quota larger than the dataset spans several epochs in one step, so a row may then appear more
  than once in that step (never more often than the epochs it spans).
- The same seed, spec and data give the same steps on any machine (SHA-256 derived seeds, not
  Python's salted ``hash``). Adding an environment does not change the others' streams.
- Rows of a step are grouped by environment in spec order; shuffle within the step if the
  trainer cares about order.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from polygym.blend.planner import Plan

_CACHE_LIMIT = 256


@dataclass(frozen=True)
class StepItem:
    """One prompt of a step: the row, its environment, and where it came from in the stream."""

    env: str
    row: Any
    index: int
    """Index of the row in the environment's data (file order)."""
    epoch: int
    position: int
    """Position in the environment's endless stream (``epoch * n + offset``)."""


@dataclass(frozen=True)
class Share:
    target: float
    """The environment's weight share."""
    planned: float
    """Its quota over prompts_per_step."""
    realized: float
    """Its prompts in this step over all prompts in this step."""
    prompts: int


@dataclass(frozen=True)
class Step:
    number: int
    items: list[StepItem]
    shares: dict[str, Share]

    def by_env(self) -> dict[str, list[StepItem]]:
        grouped: dict[str, list[StepItem]] = {env: [] for env in self.shares}
        for item in self.items:
            grouped[item.env].append(item)
        return grouped


def derived_seed(seed: int, env: str, epoch: int) -> int:
    """A 64-bit seed for one environment's epoch, stable across processes and platforms."""
    digest = hashlib.sha256(f"{seed}\x00{env}\x00{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


class StepSampler:
    """Steps of rows with the plan's exact quotas; ``step(n)`` is O(prompts_per_step)."""

    def __init__(self, plan: Plan, rows: Mapping[str, Sequence[Any]], seed: int = 0) -> None:
        missing = [env.name for env in plan.environments if env.name not in rows]
        if missing:
            raise ValueError(f"no rows given for environment(s): {', '.join(missing)}")
        empty = [env.name for env in plan.environments if env.quota > 0 and not rows[env.name]]
        if empty:
            raise ValueError(f"environment(s) with a quota but no rows: {', '.join(empty)}")
        self.plan = plan
        self.rows = {env.name: rows[env.name] for env in plan.environments}
        self.seed = seed
        self._permutations: dict[tuple[str, int], list[int]] = {}

    def permutation(self, env: str, epoch: int) -> list[int]:
        """The order of ``env``'s rows in ``epoch``; a shuffle seeded by (seed, env, epoch)."""
        key = (env, epoch)
        cached = self._permutations.get(key)
        if cached is None:
            if len(self._permutations) >= _CACHE_LIMIT:
                self._permutations.clear()
            cached = list(range(len(self.rows[env])))
            random.Random(derived_seed(self.seed, env, epoch)).shuffle(cached)
            self._permutations[key] = cached
        return cached

    def item_at(self, env: str, position: int) -> StepItem:
        """The row at ``position`` of ``env``'s endless stream."""
        size = len(self.rows[env])
        epoch, offset = divmod(position, size)
        index = self.permutation(env, epoch)[offset]
        return StepItem(env, self.rows[env][index], index, epoch, position)

    def epoch_at(self, env: str, number: int) -> int:
        """The epoch ``env`` is in when step ``number`` starts."""
        quota = self.plan.quotas[env]
        return (number * quota) // len(self.rows[env]) if self.rows[env] else 0

    def step(self, number: int) -> Step:
        if number < 0:
            raise ValueError(f"step numbers start at 0, got {number}")
        items: list[StepItem] = []
        for env in self.plan.environments:
            start = number * env.quota
            items.extend(self.item_at(env.name, start + i) for i in range(env.quota))
        counts = Counter(item.env for item in items)
        total = len(items)
        shares = {
            env.name: Share(
                target=env.target_share,
                planned=env.planned_share,
                realized=counts[env.name] / total if total else 0.0,
                prompts=counts[env.name],
            )
            for env in self.plan.environments
        }
        return Step(number, items, shares)

    def steps(self, start: int = 0, count: int | None = None) -> Iterator[Step]:
        """Steps ``start, start+1, ...`` (``count`` of them, or forever)."""
        number = start
        while count is None or number < start + count:
            yield self.step(number)
            number += 1

    def steps_to_cover(self) -> int:
        """Steps until every environment with a quota has used each of its rows at least once."""
        needed = [
            -(-len(self.rows[env.name]) // env.quota) for env in self.plan.environments if env.quota > 0
        ]
        return max(needed, default=0)
