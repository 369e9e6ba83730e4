"""What the example run did, read back from its output folder, so the README's claims can be checked.

The run's own files hold every number, but not in the form a reader asks about: how many steps
trained on nothing (every prompt group's rewards equal, so GRPO's advantages and gradient are
zero), how many groups per environment had no reward spread, how much was masked or truncated,
and what the greedy validation replies look like before, during and after training. This reads
``train_log.jsonl``, ``trainer_log.jsonl``, the validation files and ``rollouts/train.jsonl`` and
writes two small files into the run's folder (or a DEST folder): ``report.json`` (the numbers) and
``samples.md`` (validation replies side by side and a few training groups, as text, without the
token ids that make ``rollouts/`` too large to commit).

Run ``python examples/train_grpo/report.py RUN_FOLDER [DEST]`` (``run.sh`` runs it on its folder).
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from polygym.jsonl import iter_jsonl
from resources_servers.guess_number.app import parse_guess

GAME = "guess_number"
ARITHMETIC = "reasoning_gym"
ENV_OF_AGENT = {"guess_number_gymnasium_agent": GAME, "reasoning_gym_simple_agent": ARITHMETIC}
SAMPLE_ROWS = 4
"""Validation rows shown per environment in ``samples.md`` (the same rows at every validation)."""
LAST_INTEGER = re.compile(r"-?\d+")
HINT = re.compile(r"is too (low|high)")
EQUATION = re.compile(r"\s*-?\d+\s*[-+]\s*-?\d+\s*=\s*(-?\d+)")
"""A reply opening ``a op b = c`` (the trained format): ``c``."""


def env_of(row: dict[str, Any]) -> str:
    return ENV_OF_AGENT.get((row.get("agent_ref") or {}).get("name", ""), "?")


def messages(row: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """``(role, text)`` of every message of the rollout's output, in order."""
    for item in row["response"]["output"]:
        if item.get("type") == "message":
            text = "".join(part.get("text", "") for part in item.get("content") or [])
            yield item.get("role", "?"), text


def mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


# -- training: zero-gradient steps, groups without spread, masking, truncation --------------------


def training_stats(out: Path) -> dict[str, Any]:
    lines = list(iter_jsonl(out / "train_log.jsonl"))
    per_env: dict[str, dict[str, Any]] = {}
    for line in lines:
        if line["env"] == "_all":
            continue
        env = per_env.setdefault(line["env"], Counter())
        for key in (
            "rollouts",
            "groups",
            "zero_variance_groups",
            "truncated",
            "truncated_turns",
            "masked",
            "non_contiguous",
            "retemplated_turns",
            "failures",
            "generated_tokens",
        ):
            env[key] += line[key]
        env["turns"] += line["turns_mean"] * line["rollouts"]
        env["steps_without_spread"] += line["zero_variance_groups"] == line["groups"]
    envs = {}
    for name, totals in per_env.items():
        envs[name] = {
            **{k: v for k, v in totals.items() if k != "turns"},
            "turns": round(totals["turns"]),
            "zero_variance_share": mean([totals["zero_variance_groups"] / totals["groups"]]),
            "masked_share": mean([totals["masked"] / totals["rollouts"]]),
            "truncated_share": mean([totals["truncated"] / totals["rollouts"]]),
            "truncated_turn_share": mean([totals["truncated_turns"] / totals["turns"]]),
        }
    all_lines = [line for line in lines if line["env"] == "_all"]
    trainer = [r for r in iter_jsonl(out / "trainer_log.jsonl") if "grad_norm" in r]
    return {
        "steps": len(all_lines),
        # blend step k is TRL's optimizer step k + 1
        "steps_without_spread": [
            line["step"] for line in all_lines if line["zero_variance_groups"] == line["groups"]
        ],
        "steps_with_zero_grad_norm": [r["step"] - 1 for r in trainer if r["grad_norm"] == 0],
        "steps_with_zero_loss": [r["step"] - 1 for r in trainer if r["loss"] == 0],
        "env": envs,
    }


# -- validation: what the greedy replies do -----------------------------------------------------------


def game_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Rewards, and whether the guesses are numbers at all and follow the hints."""
    sequences, followed, hinted, first_invalid = [], 0, 0, 0
    for row in rows:
        guesses: list[int | None] = []
        hint = None
        for role, text in messages(row):
            if role == "assistant":
                guess = parse_guess(text)
                if hint is not None and guess is not None and guesses and guesses[-1] is not None:
                    hinted += 1
                    followed += (guess > guesses[-1]) if hint == "low" else (guess < guesses[-1])
                guesses.append(guess)
            else:
                found = HINT.search(text)
                hint = found.group(1) if found else None
        first_invalid += not guesses or guesses[0] is None
        sequences.append(",".join("-" if g is None else str(g) for g in guesses))
    return {
        "reward": mean([row["reward"] for row in rows]),
        "first_guess_not_a_number": first_invalid,
        "hinted_guesses": hinted,
        "hinted_guesses_in_the_hinted_direction": followed,
        "guess_sequences": dict(Counter(sequences).most_common(5)),
    }


def arithmetic_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Rewards, how often the reply's last number is the right answer whatever its format, and how
    often a reply opening ``a op b = c`` has ``c`` right: accuracy once the policy answers at all,
    which tells a better format (more answers) from better arithmetic (more right answers)."""
    right = equations = equations_right = 0
    for row in rows:
        text = "".join(t for role, t in messages(row) if role == "assistant")
        numbers = LAST_INTEGER.findall(text)
        right += bool(numbers) and numbers[-1] == row["entry"]["answer"]
        if found := EQUATION.match(text):
            equations += 1
            equations_right += found.group(1) == row["entry"]["answer"]
    return {
        "reward": mean([row["reward"] for row in rows]),
        "pass@1": mean([float(row["reward"] == 1.0) for row in rows]),
        "last_number_right": right,
        "opening_equations": equations,
        "opening_equations_right": equations_right,
        "rows": len(rows),
    }


def validations(out: Path) -> dict[str, list[dict[str, Any]]]:
    """Every validation of the run, in step order: ``before``, ``step_N``..., ``after``."""
    paths = {"before": out / "validation_before.jsonl"}
    steps = sorted((out / "validation").glob("step_*.jsonl"), key=lambda p: int(p.stem.split("_")[1]))
    paths.update({p.stem: p for p in steps if not p.stem.endswith(("_failures", "_materialized_inputs"))})
    paths["after"] = out / "validation_after.jsonl"
    return {name: list(iter_jsonl(path)) for name, path in paths.items() if path.is_file()}


def validation_stats(found: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {
        name: {
            GAME: game_summary([r for r in rows if env_of(r) == GAME]),
            ARITHMETIC: arithmetic_summary([r for r in rows if env_of(r) == ARITHMETIC]),
        }
        for name, rows in found.items()
    }


# -- samples.md -----------------------------------------------------------------------------------------


def transcript(row: dict[str, Any]) -> str:
    """The episode as the model and the environment said it, one line per message."""
    return "\n".join(f"{role}: {text.strip()}" for role, text in messages(row))


def sample_lines(found: dict[str, list[dict[str, Any]]], train: list[dict[str, Any]]) -> list[str]:
    lines = ["# Rollout samples of the example run", "", "Written by `examples/train_grpo/report.py`.", ""]
    for env in (ARITHMETIC, GAME):
        lines += [f"## {env}: the first {SAMPLE_ROWS} validation rows at every validation (greedy)", ""]
        # rows are written as they finish: matched across validations by task index
        by_task = {
            name: {r["_ng_task_index"]: r for r in rows if env_of(r) == env} for name, rows in found.items()
        }
        for index in sorted(by_task["before"])[:SAMPLE_ROWS]:
            first = by_task["before"][index]
            task = first["entry"]["question"] if env == ARITHMETIC else f"secret {first['game']['secret']}"
            lines += [f"### validation row {index}: {task}", ""]
            for name, rows_of_task in by_task.items():
                row = rows_of_task[index]
                lines += [f"{name} (reward {row['reward']:.3f}):", "```", transcript(row), "```", ""]
    last = max(row["_pg_step"] for row in train)
    for step in (0, last):
        lines += [f"## training step {step}: the first prompt group of each environment (sampled, T = 1)", ""]
        for env in (ARITHMETIC, GAME):
            rows = [r for r in train if r["_pg_step"] == step and r["_pg_env"] == env]
            group = [r for r in rows if r["_ng_task_index"] == rows[0]["_ng_task_index"]]
            for row in group:
                lines += [f"{env}, reward {row['reward']:.3f}:", "```", transcript(row), "```", ""]
    return lines


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "results/train_grpo")
    dest = Path(sys.argv[2]) if len(sys.argv) > 2 else out
    found = validations(out)
    train = list(iter_jsonl(out / "rollouts" / "train.jsonl"))
    report = {"training": training_stats(out), "validation": validation_stats(found)}
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (dest / "samples.md").write_text("\n".join(sample_lines(found, train)))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
