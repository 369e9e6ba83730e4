"""No-skill baselines of the example run, on its validation rows, scored by the environments' own code.

A reward only means something next to what a policy with no skill gets on the same rows:

- ``guess_number`` (1 to 8, 3 guesses): a player that ignores the hints wins when the secret is one
  of its three guesses. Three distinct random guesses win 3/8 = 0.375 of games in expectation; a
  fixed triple wins the share of secrets it covers, which on 32 rows varies by chance: ``1, 2, 3``
  (what the trained policy in the old run converged to), the best triple chosen on the training
  secrets (an honest fixed-guess policy), and the best triple chosen on the validation secrets
  themselves (hindsight: the most any fixed triple can score here). Interval halving, which uses
  the hints, is the ceiling (7 of 8 secrets: 3 halvings of 1..8 leave 8 unreachable).
- ``reasoning_gym`` (one-digit ``a + b`` / ``a - b``, partial credit ``len(answer) / len(reply)``
  when the right number is inside a longer reply): always answering the most common training
  answer (and, in hindsight, the most common validation answer), and echoing the question's
  expression (``9 - 2 =``), which scores only when the answer happens to be one of its digits:
  the credit the trained format gets without doing arithmetic.

Every game is played through ``guess_number``'s ``judge`` and every answer scored through the
reasoning_gym server's answer extraction and reasoning-gym's own scorer, as the servers do.

Run ``python examples/train_grpo/baseline.py [FOLDER]``: prints the table and writes
``FOLDER/baselines.json`` (default: this example's committed ``results/``; ``run.sh`` gives its run's
folder).
"""

from __future__ import annotations

import itertools
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from resources_servers.guess_number.app import GameSpec, binary_search_guesses, judge
from resources_servers.reasoning_gym.app import AnswerFormat, extract_answer
from resources_servers.reasoning_gym.scoring import score

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
ANSWER_FORMAT: AnswerFormat = "tag_or_last_line"  # stack.yaml's setting for reasoning_gym


def rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


def play(spec: GameSpec, guesses: Sequence[int]) -> float:
    """The game's reward when the player says ``guesses`` in order, whatever the hints."""
    for made, guess in enumerate(guesses[: spec.max_guesses]):
        _, reward, over, _ = judge(spec, made, f"<guess>{guess}</guess>")
        if over:
            return reward
    return 0.0


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def best_triple(specs: Sequence[GameSpec]) -> tuple[int, ...]:
    """The fixed guesses that win most of ``specs`` (ties: the smallest numbers)."""
    spec = specs[0]
    candidates = itertools.combinations(range(spec.low, spec.high + 1), spec.max_guesses)
    return max(candidates, key=lambda triple: (sum(play(s, triple) for s in specs), [-g for g in triple]))


def guess_baselines() -> dict[str, dict[str, Any]]:
    train = [GameSpec(**row["game"]) for row in rows("guess_train.jsonl")]
    validation = [GameSpec(**row["game"]) for row in rows("guess_validation.jsonl")]
    chosen_on_train, hindsight = best_triple(train), best_triple(validation)
    return {
        "random distinct guesses (expected)": {
            "reward": mean([s.max_guesses / (s.high - s.low + 1) for s in validation])
        },
        "always 1, 2, 3": {"reward": mean([play(s, (1, 2, 3)) for s in validation])},
        "best fixed triple on the training secrets": {
            "guesses": list(chosen_on_train),
            "reward": mean([play(s, chosen_on_train) for s in validation]),
        },
        "best fixed triple on the validation secrets (hindsight)": {
            "guesses": list(hindsight),
            "reward": mean([play(s, hindsight) for s in validation]),
        },
        "interval halving (uses the hints: the ceiling)": {
            "reward": mean([play(s, binary_search_guesses(s)) for s in validation])
        },
    }


def reply_score(row: dict[str, Any], reply: str) -> float:
    """The reasoning_gym server's reward for ``reply`` (0 without an extractable answer)."""
    answer = extract_answer(reply, ANSWER_FORMAT)
    if answer is None:
        return 0.0
    status, value = score(row["task"], json.dumps(row["task_config"], sort_keys=True), row["entry"], answer)
    if status != "ok":
        raise RuntimeError(f"{row['entry']['question']}: {status}: {value}")
    return float(value)


def mode(arithmetic: Sequence[dict[str, Any]]) -> str:
    return Counter(row["entry"]["answer"] for row in arithmetic).most_common(1)[0][0]


def arithmetic_baselines() -> dict[str, dict[str, Any]]:
    train, validation = rows("arithmetic_train.jsonl"), rows("arithmetic_validation.jsonl")

    def constant(answer: str) -> dict[str, Any]:
        return {
            "answer": answer,
            "reward": mean([reply_score(row, f"<answer>{answer}</answer>") for row in validation]),
            "pass@1": mean([float(row["entry"]["answer"] == answer) for row in validation]),
        }

    # most_common breaks ties by first occurrence: deterministic for these files
    return {
        "always the most common training answer": constant(mode(train)),
        "always the most common validation answer (hindsight)": constant(mode(validation)),
        "echo the expression ('9 - 2 =')": {
            "reward": mean(
                [reply_score(row, f"{row['entry']['metadata']['expression']} =") for row in validation]
            ),
            "pass@1": 0.0,
        },
    }


def main() -> None:
    baselines = {"guess_number": guess_baselines(), "reasoning_gym": arithmetic_baselines()}
    for env, found in baselines.items():
        for name, values in found.items():
            details = ", ".join(f"{k} {v}" for k, v in values.items() if k != "reward")
            print(f"{env:14} {values['reward']:.4f}  {name}" + (f" ({details})" if details else ""))
    out = Path(sys.argv[1] if len(sys.argv) > 1 else HERE / "results") / "baselines.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(baselines, indent=2) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
