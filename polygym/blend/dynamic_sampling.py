"""Dynamic sampling: a step's prompt groups whose rewards do not vary are replaced from the same environment.

GRPO scores each response against the other responses to its prompt, so a group whose responses
all got the same reward (all right, or all wrong) has advantage 0 everywhere: it costs a
generation batch slot and adds nothing to the gradient (in the recorded example run, half the
groups and two whole steps of 24). Dynamic sampling keeps the slot and changes its prompt:

1. The step's planned groups are collected as always.
2. Every slot whose group has no signal (fewer than two completed responses, or all rewards
   equal) gets an extra prompt drawn from the *same* environment; the extra groups of all
   environments are collected together, one round at a time, and an extra group with signal takes
   its slot.
3. An environment stops when each of its slots has signal, when it has drawn ``max_extra_prompts``
   extras in this step, or at the step deadline. A slot still without signal keeps its planned group
   (advantage 0, as without dynamic sampling) and is counted as ``unfilled`` in the step line: the
   bound is reached and said, never looped past.

So every environment's quota stays exact: the trained batch holds exactly its planned number of
groups of it, whichever prompts they are. The bound is per environment, so one environment that
always scores 0 or 1 spends only its own extra draws, not the others'.

Extra prompts are deterministic and stateless: draw ``j`` of environment ``e`` in step ``s`` is
element ``j`` of a shuffle of ``e``'s rows seeded by (blend seed, ``e``, step), with the rows the step
already holds moved last. A resumed run therefore draws the same extras without any saved state.
Task indices: a step owns ``prompts_per_step + max_extra_prompts x environments`` of them (the
planned prompts first, then a block of ``max_extra_prompts`` per environment in spec order), so
extras never collide with another step's indices.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field

from polygym.blend.planner import Plan
from polygym.blend.sampler import Step, StepItem, StepSampler, derived_seed
from polygym.collect.rollouts import Result
from polygym.row import Job, reward


@dataclass(frozen=True)
class DynamicSampling:
    """The bound: extra prompts each environment may draw per step."""

    max_extra_prompts: int

    def __post_init__(self) -> None:
        if self.max_extra_prompts < 1:
            raise ValueError("dynamic sampling needs max_extra_prompts >= 1")


def task_stride(plan: Plan, dynamic: DynamicSampling | None) -> int:
    """Task indices one step owns (step ``s`` starts at ``s x stride``)."""
    extra = dynamic.max_extra_prompts * len(plan.environments) if dynamic is not None else 0
    return plan.prompts_per_step + extra


def has_signal(rewards: Sequence[float]) -> bool:
    """A group carries GRPO signal when at least two responses completed with different rewards."""
    return len(rewards) >= 2 and max(rewards) != min(rewards)


def extra_item(sampler: StepSampler, env: str, step: Step, draw: int) -> StepItem:
    """Extra prompt ``draw`` of ``env`` in ``step`` (see the module doc), as a ``StepItem``."""
    rows = sampler.rows[env]
    order = list(range(len(rows)))
    random.Random(derived_seed(sampler.seed, f"{env}\x00extra", step.number)).shuffle(order)
    used = {item.index for item in step.items if item.env == env}
    order.sort(key=lambda index: index in used)  # stable: the step's own rows last
    index = order[draw % len(order)]
    return StepItem(env, rows[index], index, epoch=-1, position=draw)


@dataclass
class EnvDraws:
    """What dynamic sampling did for one environment in one step (the step line's ``dynamic_sampling``)."""

    extra_prompts: int = 0
    """Extra prompts drawn (at most ``max_extra_prompts``)."""
    zero_variance_seen: int = 0
    """Groups collected without signal, planned and extra."""
    zero_variance_dropped: int = 0
    """Of those, groups left out of the trained batch (replaced, or extras that had no signal either)."""
    unfilled: int = 0
    """Slots still without signal at the end: the bound (or the step deadline) was reached."""

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class _Slot:
    env: str
    group: int
    """Task index of the group that fills the slot now (the planned one until replaced)."""
    candidate: int | None = None
    """Task index of the extra group being tried for it."""


@dataclass
class Refill:
    """One step's slots and the extra rounds that fill them; ``stepwise.stream_steps`` drives it."""

    step: Step
    plan: Plan
    sampler: StepSampler
    dynamic: DynamicSampling
    jobs_for: Callable[[StepItem, int], list[Job]]
    """The jobs of one extra prompt given its task index (the step's sampling and seed)."""
    slots: list[_Slot] = field(init=False)
    draws: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        first = self.step.number * task_stride(self.plan, self.dynamic)
        self.slots = [_Slot(item.env, first + i) for i, item in enumerate(self.step.items)]
        self.draws = {env.name: 0 for env in self.plan.environments}

    def _extra_task(self, env: str, draw: int) -> int:
        block = [e.name for e in self.plan.environments].index(env) * self.dynamic.max_extra_prompts
        first = self.step.number * task_stride(self.plan, self.dynamic) + self.plan.prompts_per_step
        return first + block + draw

    def settle(self, results: dict[str, list[Result]]) -> dict[int, list[float]]:
        """An extra group with signal takes its slot; the completed rewards by task index."""
        rewards = group_rewards(results)
        for slot in self.slots:
            if slot.candidate is not None and has_signal(rewards.get(slot.candidate, [])):
                slot.group = slot.candidate
            slot.candidate = None
        return rewards

    def next_round(self, results: dict[str, list[Result]]) -> dict[str, list[Job]]:
        """Settle the last round, then the jobs of the next one by environment (empty: done)."""
        rewards = self.settle(results)
        round_jobs: dict[str, list[Job]] = defaultdict(list)
        for slot in self.slots:
            draw = self.draws[slot.env]
            if has_signal(rewards.get(slot.group, [])) or draw >= self.dynamic.max_extra_prompts:
                continue
            self.draws[slot.env] += 1
            slot.candidate = self._extra_task(slot.env, draw)
            item = extra_item(self.sampler, slot.env, self.step, draw)
            round_jobs[slot.env].extend(self.jobs_for(item, slot.candidate))
        return dict(round_jobs)

    def finish(self, results: dict[str, list[Result]]) -> dict[str, EnvDraws]:
        """Settle the last round; what each environment drew, saw and dropped."""
        rewards = self.settle(results)
        kept = self.kept_groups()
        out = {env.name: EnvDraws(extra_prompts=self.draws[env.name]) for env in self.plan.environments}
        for env, env_results in results.items():
            for task in {r.job.task_index for r in env_results}:
                if not has_signal(rewards.get(task, [])):
                    out[env].zero_variance_seen += 1
                    out[env].zero_variance_dropped += task not in kept
        for slot in self.slots:
            out[slot.env].unfilled += not has_signal(rewards.get(slot.group, []))
        return out

    def kept_groups(self) -> dict[int, int]:
        """Task index of each trained group -> its slot (0 .. prompts_per_step - 1)."""
        return {slot.group: i for i, slot in enumerate(self.slots)}


def group_rewards(results: dict[str, list[Result]]) -> dict[int, list[float]]:
    """Completed rewards by task index."""
    by_task: dict[int, list[float]] = defaultdict(list)
    for env_results in results.values():
        for result in env_results:
            if result.rollout is not None:
                by_task[result.job.task_index].append(reward(result.rollout))
    return by_task


def total_draws(draws: Iterable[EnvDraws]) -> EnvDraws:
    """The all-environments roll-up of a step's draws."""
    total = EnvDraws()
    for env in draws:
        for name, value in env.to_dict().items():
            setattr(total, name, getattr(total, name) + value)
    return total
