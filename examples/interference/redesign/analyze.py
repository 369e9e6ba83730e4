"""Judge the redesigned experiment's pre-registered criteria (README.md) over every seed's run.

Usage: ``python examples/interference/redesign/analyze.py RUN/seed0 RUN/seed1 ...`` (each a
``gym train compare-mixes --output`` folder with the arms ``A-only`` and ``A+B``). For every arm and
environment: each prompt's change of validation reward from step 0 to the arm's end, averaged over
the seeds, its mean and 95% paired-bootstrap interval over the prompts (``collect.statistics``, as
``gym eval compare``), and each seed's own change. Then the criteria:

- **C1 (interference)**: B's change in A-only is at most -0.05 and its interval excludes 0;
- **C2 (the mix protects)**: B's change in A+B minus in A-only, per prompt, is at least +0.05 with
  an interval excluding 0, and A+B keeps at least half of A-only's gain on A, a gain whose interval
  excludes 0;
- sanity: step 0 is the same in every arm of a seed (same weights, greedy).

Writes ``analysis.md`` and ``analysis.json`` next to the seed folders and prints the Markdown.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from polygym.collect.regression import task_rewards
from polygym.collect.statistics import Estimate, paired_bootstrap, t_quantile

ENVS = {
    "reasoning_gym_simple_agent": "A",
    "keyword_constraints_simple_agent": "B",
    "keyword_constraints_heldout_simple_agent": "C",
}
ARMS = ("A-only", "A+B")
SMALLEST = 0.05
"""The smallest change the criteria count (well under the hypothesised 0.15: README, power)."""


def changes(seeds: list[Path], arm: str) -> dict[str, dict[int, list[float]]]:
    """Per environment, each prompt's change (end - step 0) in every seed, for prompts every seed scored."""
    out: dict[str, dict[int, list[float]]] = {env: {} for env in ENVS.values()}
    for seed in seeds:
        before = task_rewards(seed / arm / "validation_before.jsonl", ENVS)
        after = task_rewards(seed / arm / "validation_after.jsonl", ENVS)
        for env in out:
            for task, value in before[env].items():
                if task in after[env]:
                    out[env].setdefault(task, []).append(after[env][task] - value)
    return {env: {t: v for t, v in by.items() if len(v) == len(seeds)} for env, by in out.items()}


def averaged(per_prompt: dict[int, list[float]]) -> dict[int, float]:
    return {task: statistics.fmean(values) for task, values in per_prompt.items()}


def estimate(values: list[float]) -> Estimate:
    return paired_bootstrap({"": values})


def across_seeds(per_seed: list[float]) -> str:
    """Mean of the seeds' own changes with a Student t 95% interval, the seed as the unit: the
    prompt bootstrap above leaves out how much the seeds disagree (2026-12-06: one seed of three
    moved B the other way)."""
    if len(per_seed) < 2:
        return "-"
    mean = statistics.fmean(per_seed)
    half = t_quantile(0.975, len(per_seed) - 1) * statistics.stdev(per_seed) / len(per_seed) ** 0.5
    return f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]"


def same_start(seeds: list[Path]) -> bool:
    """Every arm of a seed starts from the same greedy replies' rewards."""
    for seed in seeds:
        starts = [task_rewards(seed / arm / "validation_before.jsonl", ENVS) for arm in ARMS]
        if any(start != starts[0] for start in starts[1:]):
            return False
    return True


def fmt(found: Estimate) -> str:
    if found.mean is None:
        return "-"
    if found.low is None or found.high is None:
        return f"{found.mean:+.3f} (no interval)"
    return f"{found.mean:+.3f} [{found.low:+.3f}, {found.high:+.3f}]"


def analyze(seeds: list[Path]) -> dict[str, Any]:
    by_arm = {arm: changes(seeds, arm) for arm in ARMS}
    rows = []
    for arm, envs in by_arm.items():
        for env, per_prompt in envs.items():
            per_seed = (
                [statistics.fmean(v[s] for v in per_prompt.values()) for s in range(len(seeds))]
                if per_prompt
                else []
            )
            found = estimate(list(averaged(per_prompt).values()))
            rows.append(
                {
                    "arm": arm,
                    "env": env,
                    "n": len(per_prompt),
                    "change": fmt(found),
                    "per_seed": per_seed,
                    "across_seeds": across_seeds(per_seed),
                    "estimate": found,
                }
            )
    got = {(r["arm"], r["env"]): r["estimate"] for r in rows}
    b_alone, b_mixed = averaged(by_arm["A-only"]["B"]), averaged(by_arm["A+B"]["B"])
    advantage = estimate([b_mixed[t] - b_alone[t] for t in b_alone if t in b_mixed])
    seed_advantage = [
        mixed - alone
        for mixed, alone in zip(
            next(r["per_seed"] for r in rows if (r["arm"], r["env"]) == ("A+B", "B")),
            next(r["per_seed"] for r in rows if (r["arm"], r["env"]) == ("A-only", "B")),
            strict=True,
        )
    ]
    c1 = got[("A-only", "B")]
    a_alone, a_mixed = got[("A-only", "A")], got[("A+B", "A")]
    verdicts = {
        "C1 interference": c1.mean is not None
        and c1.high is not None
        and c1.mean <= -SMALLEST
        and c1.high < 0,
        "C2 the mix protects B": advantage.mean is not None
        and advantage.low is not None
        and advantage.mean >= SMALLEST
        and advantage.low > 0
        and a_alone.mean is not None
        and a_alone.low is not None
        and a_alone.low > 0
        and a_mixed.mean is not None
        and a_mixed.mean >= 0.5 * a_alone.mean,
        "sanity: step 0 the same in every arm": same_start(seeds),
    }
    return {
        "seeds": [str(s) for s in seeds],
        "rows": rows,
        "mix_advantage_on_B": fmt(advantage),
        "mix_advantage_on_B_across_seeds": across_seeds(seed_advantage),
        "verdicts": verdicts,
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"{len(result['seeds'])} seeds: {', '.join(result['seeds'])}",
        "",
        "| arm | environment | prompts | change, seed-averaged [95% CI over prompts] | per seed |"
        " seeds as the unit [t 95% CI] |",
        "|---|---|---:|---|---|---|",
    ]
    for r in result["rows"]:
        per_seed = ", ".join(f"{v:+.3f}" for v in r["per_seed"])
        cells = [r["arm"], r["env"], str(r["n"]), r["change"], per_seed, r["across_seeds"]]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"A+B minus A-only on B, per prompt: {result['mix_advantage_on_B']};"
        f" seeds as the unit: {result['mix_advantage_on_B_across_seeds']}",
        "",
    ]
    lines += [f"- {name}: {'met' if ok else 'not met'}" for name, ok in result["verdicts"].items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    seeds = [Path(arg) for arg in sys.argv[1:]]
    if not seeds:
        sys.exit("usage: analyze.py SEED_FOLDER...")
    result = analyze(seeds)
    text = markdown(result)
    out = seeds[0].parent
    (out / "analysis.md").write_text(text)
    for r in result["rows"]:
        r.pop("estimate")
    (out / "analysis.json").write_text(json.dumps(result, indent=2) + "\n")
    print(text)


if __name__ == "__main__":
    main()
