"""Power of the redesigned interference criteria, by simulation, written before any run.

The model of a validation (greedy, one verdict per prompt): at step 0 a prompt of the watched
environment B passes with probability ``P0``. After an arm's training, in each seed, a passing
prompt fails with probability ``noise + effect / P0`` and a failing one passes with probability
``noise x P0 / (1 - P0)``: with ``effect`` 0 the expected pass rate is unchanged and ``noise`` of the
prompts flip each way (the old run's B-only arm flipped 5 of 32 each way, 0.16; ``noise`` spans
0.05 to 0.15), and ``effect`` is the true drop of the pass rate. With probability ``shared`` a
prompt's outcome is the same in every seed (a prompt that training breaks tends to break in every
seed), which shrinks the effective number of samples.

Criteria judged (README.md):

- **new C1**: the per-prompt change averaged over the seeds has a mean at most -0.05 and a 95%
  interval (normal approximation of the paired bootstrap ``gym`` uses) that excludes 0;
- **old C1** (the first experiment): one seed, 32 prompts, a drop of at least 0.15 with McNemar's
  exact p < 0.05 — its threshold equals the effect it hoped to see, so its power stays under 50%;
- **new C2**: A+B's change of B minus A-only's, per prompt and averaged over seeds, at least +0.05
  with a 95% interval excluding 0 (A-only drops by ``effect``, A+B by nothing).

Run ``python examples/interference/redesign/power.py``: deterministic (seeded), about a minute.
"""

from __future__ import annotations

import math
import random
import statistics

P0 = 0.65
REPS = 1000
EFFECTS = (0.0, 0.05, 0.10, 0.15, 0.20)
NOISES = (0.05, 0.10, 0.15)
SHARED = (0.0, 0.5)


def verdicts(
    rng: random.Random, base: list[int], seeds: int, effect: float, noise: float, shared: float
) -> list[list[int]]:
    """Each seed's verdicts after training, prompt by prompt."""
    lose, gain = min(1.0, noise + effect / P0), noise * P0 / (1 - P0)
    out = [[0] * len(base) for _ in range(seeds)]
    for i, passed in enumerate(base):
        flip = lose if passed else gain
        common = rng.random() < shared
        first = rng.random() < flip
        for s in range(seeds):
            flipped = first if common or s == 0 else rng.random() < flip
            out[s][i] = passed ^ flipped
    return out


def excludes_zero_below(changes: list[float], at_most: float) -> bool:
    """Mean <= ``at_most`` and the 95% interval's upper end < 0."""
    mean = statistics.fmean(changes)
    half = 1.96 * statistics.stdev(changes) / math.sqrt(len(changes)) if len(changes) > 1 else math.inf
    return mean <= at_most and mean + half < 0


def mcnemar_p(lost: int, gained: int) -> float:
    n = lost + gained
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(lost, gained) + 1)) / 2**n
    return min(1.0, 2 * tail)


def new_c1(rng: random.Random, n: int, seeds: int, effect: float, noise: float, shared: float) -> bool:
    base = [int(rng.random() < P0) for _ in range(n)]
    after = verdicts(rng, base, seeds, effect, noise, shared)
    changes = [statistics.fmean(after[s][i] for s in range(seeds)) - base[i] for i in range(n)]
    return excludes_zero_below(changes, -0.05)


def old_c1(rng: random.Random, effect: float, noise: float) -> bool:
    base = [int(rng.random() < P0) for _ in range(32)]
    after = verdicts(rng, base, 1, effect, noise, 0.0)[0]
    lost = sum(b and not a for b, a in zip(base, after, strict=True))
    gained = sum(a and not b for b, a in zip(base, after, strict=True))
    return (gained - lost) / 32 <= -0.15 and mcnemar_p(lost, gained) < 0.05


def new_c2(rng: random.Random, n: int, seeds: int, effect: float, noise: float, shared: float) -> bool:
    base = [int(rng.random() < P0) for _ in range(n)]
    alone = verdicts(rng, base, seeds, effect, noise, shared)
    mixed = verdicts(rng, base, seeds, 0.0, noise, shared)
    changes = [statistics.fmean(mixed[s][i] - alone[s][i] for s in range(seeds)) for i in range(n)]
    return excludes_zero_below([-c for c in changes], -0.05)  # the mix's advantage, sign flipped


def rate(trial: object, *args: float) -> float:
    rng = random.Random(hash(args) & 0xFFFF)
    return sum(trial(rng, *args) for _ in range(REPS)) / REPS  # type: ignore[operator]


def main() -> None:
    print(f"P0 {P0}, {REPS} simulated experiments per cell; power = share of them meeting the criterion")
    print(
        "\n| criterion | design | noise | shared | " + " | ".join(f"effect {e:.2f}" for e in EFFECTS) + " |"
    )
    print("|---|---|---:|---:|" + "---:|" * len(EFFECTS))
    for noise in NOISES:
        cells = [rate(old_c1, e, noise) for e in EFFECTS]
        print(
            f"| old C1 | 32 prompts, 1 seed | {noise} | - | " + " | ".join(f"{c:.2f}" for c in cells) + " |"
        )
        for shared in SHARED:
            for n, seeds in ((120, 3), (120, 5)):
                cells = [rate(new_c1, n, seeds, e, noise, shared) for e in EFFECTS]
                print(
                    f"| new C1 | {n} prompts, {seeds} seeds | {noise} | {shared} | "
                    + " | ".join(f"{c:.2f}" for c in cells)
                    + " |"
                )
    for noise in NOISES:
        for shared in SHARED:
            cells = [rate(new_c2, 120, 3, e, noise, shared) for e in EFFECTS]
            print(
                f"| new C2 | 120 prompts, 3 seeds | {noise} | {shared} | "
                + " | ".join(f"{c:.2f}" for c in cells)
                + " |"
            )


if __name__ == "__main__":
    main()
