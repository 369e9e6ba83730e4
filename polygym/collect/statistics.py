"""Intervals for one run's mean and for the difference of two runs, over per-task values.

Everything here works on **one value per task** (a task's rewards averaged over its repeats, or
its pass@k estimate), never on single rollouts: the repeats of one task are correlated (an easy
task passes every time), so treating 8 repeats of 50 tasks as 400 independent samples would make
every interval far too narrow. Tasks are identified by whatever key the caller uses (the task
index, ``polygym.collect.compare.task_identity``); this module only needs them hashable.

* ``mean_interval``: one run's mean, normal approximation, cut to the range of the task values
  (a mean never leaves it).
* ``paired_bootstrap``: the difference of two runs over the tasks both ran. Resampling *tasks*
  keeps each task's two values together, so a task's difficulty cancels out and the interval is
  much tighter than comparing two independent means. Percentile interval; seeded draws
  (``Resampler``: numpy's generator where numpy is installed) make it reproducible. Several
  strata (environments) are resampled each within itself and their means averaged, every
  stratum counting once: the macro average.
* ``welch``: the difference when the runs share no task (Welch's t interval, unequal variances).
* ``delta`` picks between the two; ``flips`` lists the tasks solved in one run and not the other.
* ``mcnemar``: whether two runs' pass/fail verdicts on the same tasks differ by more than chance
  (exact two-sided binomial test on the tasks that flipped).
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import random
import statistics
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Generic, TypeVar

from polygym.row import PASS_THRESHOLD

K = TypeVar("K", bound=Hashable)

DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0

PAIRED = "paired-bootstrap"
WELCH = "welch"
NORMAL = "normal"
MAX_LEVELS = 256
"""Values with at most this many distinct levels (0/1 rewards and their differences, pass@k of a
few repeats) are resampled as multinomial counts of the levels (``_numpy_means``)."""
CHUNK_POSITIONS = 2_000_000
"""Bootstrap positions drawn at once (16 MB of int64): bounded memory whatever the task count."""


@dataclass(frozen=True)
class Estimate:
    mean: float | None
    low: float | None
    high: float | None
    n: int
    """Samples (tasks) behind it; for a paired delta, the tasks both runs have."""
    method: str = ""
    """How the interval was made (``paired-bootstrap``, ``welch``, ``normal``); empty: no interval."""


NOTHING = Estimate(None, None, None, 0)


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence}")


def mean_interval(values: Sequence[float], confidence: float = DEFAULT_CONFIDENCE) -> Estimate:
    """Mean and interval (normal approximation) of independent samples; none below two samples."""
    _check_confidence(confidence)
    if not values:
        return NOTHING
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Estimate(mean, None, None, 1)
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
    half = z * statistics.stdev(values) / math.sqrt(len(values))
    return Estimate(mean, max(min(values), mean - half), min(max(values), mean + half), len(values), NORMAL)


def rollout_mean_interval(
    tasks: Sequence[Sequence[float]], confidence: float = DEFAULT_CONFIDENCE
) -> Estimate:
    """The mean over all rollouts of the tasks' rewards (the metrics file's ``mean/reward``), with
    an interval over tasks: the rollouts of one task are correlated, so the task is the unit
    (the ratio estimator's normal interval, sum over tasks of ``(sum_t - mean * n_t)^2``). With as
    many rollouts per task this is ``mean_interval`` of the task means exactly."""
    _check_confidence(confidence)
    found = [t for t in tasks if t]
    if not found:
        return NOTHING
    sums, counts = [math.fsum(t) for t in found], [len(t) for t in found]
    mean = math.fsum(sums) / sum(counts)
    if len(found) < 2:
        return Estimate(mean, None, None, 1)
    per_task = sum(counts) / len(found)
    residual = math.fsum((s - mean * n) ** 2 for s, n in zip(sums, counts, strict=True))
    half = (
        statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
        * math.sqrt(residual / (len(found) * (len(found) - 1)))
        / per_task
    )
    means = [s / n for s, n in zip(sums, counts, strict=True)]
    return Estimate(mean, max(min(means), mean - half), min(max(means), mean + half), len(found), NORMAL)


class Resampler:
    """Bootstrap draws of task positions, one seeded stream per stratum and size.

    Every metric of an environment, every candidate against the same base and the
    all-environments roll-up draw the same positions for the same (environment, task count): the
    intervals of one comparison are consistent with each other. Each stratum's draws come from a
    generator seeded by (seed, stratum, size), so strata are resampled independently and the
    result does not depend on the order in which they are asked for.

    With numpy (the ``[view]`` extra; most installs have it) the draws are numpy's PCG64: values
    with few distinct levels (rewards of 0/1, their per-task differences) are resampled as
    multinomial counts of the levels, which is the same bootstrap at a cost independent of the
    task count; others as positions, a gather and a row mean in chunks of about two million
    positions (12,500 tasks x 2,000 resamples in about 0.4 s). Without it (the slim core) a
    seeded ``random.Random`` draws in pure Python, several times slower and with other draws:
    intervals from the two agree to within the bootstrap's own noise, and each is reproducible
    on its own.
    """

    def __init__(self, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED) -> None:
        if resamples < 1:
            raise ValueError(f"resamples must be >= 1, got {resamples}")
        self.resamples, self.seed = resamples, seed
        self._means: dict[tuple[str, tuple[float, ...]], list[float]] = {}

    def _stream_seed(self, stratum: str, n: int) -> int:
        digest = hashlib.blake2b(f"{self.seed}/{stratum}/{n}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little")

    def means(self, values: Sequence[float], stratum: str = "") -> list[float]:
        """The mean of ``values`` in every resample (remembered: pass@1 and the mean reward of
        0/1 rewards are the same values, and the roll-up asks again for every environment's)."""
        key = (stratum, tuple(values))
        found = self._means.get(key)
        if found is None:
            seed = self._stream_seed(stratum, len(key[1]))
            draw = _numpy_means if importlib.util.find_spec("numpy") is not None else _python_means
            found = self._means[key] = draw(key[1], seed, self.resamples)
        return found


def _numpy_means(values: tuple[float, ...], seed: int, resamples: int) -> list[float]:
    import numpy as np  # here, not at the top: every `gym` command imports this module

    n = len(values)
    data = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    levels, counts = np.unique(data, return_counts=True)
    if len(levels) <= MAX_LEVELS:
        # a resample of n tasks is a multinomial count of each distinct value: drawing the counts
        # is the same bootstrap in O(levels) per resample instead of O(tasks)
        drawn = rng.multinomial(n, counts / n, size=resamples)
        return [float(x) for x in drawn @ levels / n]
    out = np.empty(resamples)
    chunk = max(1, CHUNK_POSITIONS // n)
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        positions = rng.integers(0, n, size=(stop - start, n), dtype=np.int64 if n > 2**31 else np.int32)
        out[start:stop] = data[positions].mean(axis=1)
    return [float(x) for x in out]


def _python_means(values: tuple[float, ...], seed: int, resamples: int) -> list[float]:
    n = len(values)
    rng = random.Random(seed)
    # int(u * n) for uniform u in [0, 1), iterated in C: 20x faster than random.choices
    uniform = iter(rng.random, 2.0)  # random() never returns 2.0: an endless stream
    scale = float(n).__mul__
    get = values.__getitem__
    return [sum(map(get, map(int, map(scale, islice(uniform, n))))) / n for _ in range(resamples)]


def paired_bootstrap(
    strata: Mapping[str, Sequence[float]],
    confidence: float = DEFAULT_CONFIDENCE,
    resampler: Resampler | None = None,
) -> Estimate:
    """Percentile bootstrap interval of the mean of per-task differences (new - base).

    ``strata`` holds each environment's differences by its name; the statistic is the average of
    the strata's means, so one large environment cannot drown a small one. One stratum is a plain
    mean.
    """
    _check_confidence(confidence)
    groups = {name: list(g) for name, g in strata.items() if g}
    if not groups:
        return NOTHING
    point = statistics.fmean(statistics.fmean(g) for g in groups.values())
    n = sum(len(g) for g in groups.values())
    if all(len(g) < 2 for g in groups.values()):
        return Estimate(point, None, None, n)
    resampler = resampler or Resampler()
    columns = [resampler.means(g, name) for name, g in groups.items()]
    draws = sorted(sum(row) / len(columns) for row in zip(*columns, strict=True))
    tail = (1 - confidence) / 2
    low = draws[min(len(draws) - 1, math.floor(tail * len(draws)))]
    high = draws[max(0, math.ceil((1 - tail) * len(draws)) - 1)]
    return Estimate(point, low, high, n, PAIRED)


def welch(base: Sequence[float], new: Sequence[float], confidence: float = DEFAULT_CONFIDENCE) -> Estimate:
    """Welch's t interval of ``mean(new) - mean(base)`` for two independent samples."""
    _check_confidence(confidence)
    if not base or not new:
        return NOTHING
    diff = statistics.fmean(new) - statistics.fmean(base)
    n = min(len(base), len(new))
    if len(base) < 2 or len(new) < 2:
        return Estimate(diff, None, None, n)
    va, vb = statistics.variance(base) / len(base), statistics.variance(new) / len(new)
    se = math.sqrt(va + vb)
    if se == 0:
        return Estimate(diff, diff, diff, n, WELCH)
    df = (va + vb) ** 2 / (va**2 / (len(base) - 1) + vb**2 / (len(new) - 1))
    half = t_quantile(0.5 + confidence / 2, df) * se
    return Estimate(diff, diff - half, diff + half, n, WELCH)


def delta(
    base: Mapping[K, float],
    new: Mapping[K, float],
    confidence: float = DEFAULT_CONFIDENCE,
    resampler: Resampler | None = None,
    stratum: str = "",
) -> Estimate:
    """``new - base`` over per-task values: paired over the shared tasks when there are any (the
    others are left out: a task one run never ran says nothing about the change), else Welch."""
    shared = [k for k in base if k in new]
    if shared:
        return paired_bootstrap({stratum: [new[k] - base[k] for k in shared]}, confidence, resampler)
    return welch(list(base.values()), list(new.values()), confidence)


def solved(rewards: Sequence[float]) -> bool:
    """A task is solved when at least half of its rollouts pass (reward >= ``PASS_THRESHOLD``)."""
    return bool(rewards) and sum(r >= PASS_THRESHOLD for r in rewards) * 2 >= len(rewards)


@dataclass(frozen=True)
class Flips(Generic[K]):
    lost: list[K]
    """Solved in base, not in new."""
    gained: list[K]
    """Not solved in base, solved in new."""


def flips(base: Mapping[K, Sequence[float]], new: Mapping[K, Sequence[float]]) -> Flips[K]:
    """The shared tasks (rewards of their rollouts on each side) whose solved state differs, in
    ``base``'s order."""
    lost, gained = [], []
    for key, rewards in base.items():
        if key in new:
            was, now = solved(rewards), solved(new[key])
            if was and not now:
                lost.append(key)
            elif now and not was:
                gained.append(key)
    return Flips(lost, gained)


@dataclass(frozen=True)
class McNemar:
    lost: int
    """Tasks that passed in base and fail in new."""
    gained: int
    """Tasks that failed in base and pass in new."""
    n: int
    """Tasks both runs have."""
    p_value: float
    """Two-sided; 1.0 when nothing flipped."""


def mcnemar(base: Mapping[K, bool], new: Mapping[K, bool]) -> McNemar:
    """McNemar's exact test of paired pass/fail verdicts (the tasks both runs have).

    Only the tasks that flipped say anything about a change: under "no change" each flip is as
    likely to be a loss as a gain, so the count of losses among ``lost + gained`` flips is
    Binomial(flips, 1/2), and the p-value is the two-sided tail of what was seen. Exact rather
    than the chi-square approximation because a validation set of a few dozen prompts flips a
    handful of times, where the approximation is poor.
    """
    shared = [k for k in base if k in new]
    lost = sum(1 for k in shared if base[k] and not new[k])
    gained = sum(1 for k in shared if new[k] and not base[k])
    flipped = lost + gained
    tail = sum(math.comb(flipped, i) for i in range(min(lost, gained) + 1)) / 2**flipped
    return McNemar(lost, gained, len(shared), min(1.0, 2 * tail) if flipped else 1.0)


# Student's t quantile: no scipy in the core dependencies, and Welch needs it at fractional df.


def _beta_fraction(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1) < eps:
            break
    return result


def _incomplete_beta(a: float, b: float, x: float) -> float:
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1 - math.exp(log_front) * _beta_fraction(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    tail = 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with ``t_cdf(t, df) == p`` (bisection: monotone, and exact enough in 100 halvings)."""
    low, high = -1.0, 1.0
    while t_cdf(low, df) > p:
        low *= 2
    while t_cdf(high, df) < p:
        high *= 2
    for _ in range(100):
        mid = (low + high) / 2
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
    return (low + high) / 2
