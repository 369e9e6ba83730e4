"""A training folder written step by step as ``gym train run`` writes it, for the training view's tests.

Two trained environments and one watched (``eval_only``) one, 24 steps, validation every 8 steps
(``validation.jsonl``, ``validation_before.jsonl``, ``validation/step_N.jsonl``,
``validation_after.jsonl``), the step log's lines in ``train_log.jsonl`` (the fields of the
example run's, ``examples/train_grpo/results``), every training rollout in
``rollouts/train.jsonl``, ``run.json`` (the settings) first and ``summary.json`` at the end.
The watched environment falls apart after step 8 (a validation regression alarm at 16 and 24);
guess_number's step 5 raises the masked-share alarm. One validation answer is an XSS attempt.

    python tests/view/train_run.py runs/train   # the whole run, for a look with gym view
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson

from polygym.training.checkpoint import write_run_record

XSS = "<script>alert('train')</script><img src=x onerror=alert(2)>"
ENVS = {"arithmetic": "reasoning_gym_simple_agent", "guess_number": "guess_number_gymnasium_agent"}
WATCHED = {"mcqa": "mcqa_simple_agent"}
STEPS, EVERY, VALIDATION_ROWS = 24, 8, 32
SETTINGS = {"max_regression": {"mcqa": 0.05}, "steps": STEPS}
"""What run.json (from the start) and summary.json (at the end) record."""


def _append(path: Path, lines: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as handle:
        handle.write(b"".join(orjson.dumps(line) + b"\n" for line in lines))


def _solved(env: str, step: int, task: int) -> bool:
    if env in WATCHED:  # forgets what it knew after step 8
        return task % 4 != 0 if step <= EVERY else task % 4 == 0
    speed = 40 if env == "arithmetic" else 80  # guess_number learns more slowly
    return task < VALIDATION_ROWS * min(0.9, 0.1 + step / speed)


def _rollout(env: str, agent: str, task: int, repeat: int, reward: float, answer: str) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": f"{env} question {task}"}]},
        "response": {
            "output": [
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]}
            ],
            "usage": {"input_tokens": 20, "output_tokens": 8, "total_tokens": 28},
        },
        "reward": reward,
        "agent_ref": {"type": "responses_api_agents", "name": agent},
        "_ng_task_index": task,
        "_ng_rollout_index": repeat,
        "_pg_env": env,
    }


def validate(folder: Path, step: int, final: bool = False) -> None:
    rows, curve = [], []
    task = 0
    for env, agent in {**ENVS, **WATCHED}.items():
        rewards = []
        for _ in range(VALIDATION_ROWS):
            reward = 1.0 if _solved(env, step, task % VALIDATION_ROWS) else 0.0
            answer = XSS if task == 3 else f"answer {task} at step {step}"
            rows.append(_rollout(env, agent, task, 0, reward, answer))
            rewards.append(reward)
            task += 1
        curve.append(
            {
                "step": step,
                "env": env,
                "eval_only": env in WATCHED,
                "reward_mean": sum(rewards) / len(rewards),
                "n": len(rewards),
            }
        )
    name = (
        "validation_after.jsonl"
        if final
        else ("validation_before.jsonl" if step == 0 else f"validation/step_{step}.jsonl")
    )
    _append(folder / name, rows)
    _append(folder / "validation.jsonl", curve)


def train_step(folder: Path, step: int) -> None:
    lines, rollouts = [], []
    for i, (env, agent) in enumerate(ENVS.items()):
        realized = 0.5 + (0.1 if step % 3 == 0 else 0.0) * (1 if i == 0 else -1)
        reward = min(0.9, 0.1 + step / 40) * (1.0 if i == 0 else 0.7)
        masked = 0.5 if env == "guess_number" and step == 5 else 0.0
        lines.append(
            {
                "step": step,
                "env": env,
                "agent": agent,
                "target_share": 0.5,
                "planned_share": 0.5,
                "realized_share": realized,
                "prompts": 2,
                "rollouts": 8,
                "completed": 8,
                "failures": 0,
                "stragglers": 0,
                "reward_mean": reward,
                "tokens": 400 + 40 * i,
                "masked_share": masked,
                "masked_alarm": int(masked > 0.25),
            }
        )
        rollouts += [
            _rollout(env, agent, step * 4 + p, r, float(r < 2), f"step {step}")
            for p in range(2)
            for r in range(4)
        ]
    lines.append(
        {
            "step": step,
            "env": "_all",
            "agent": None,
            "target_share": 1.0,
            "planned_share": 1.0,
            "realized_share": 1.0,
            "reward_mean": sum(line["reward_mean"] for line in lines) / len(lines),  # equal rollouts each
        }
    )
    _append(folder / "rollouts" / "train.jsonl", rollouts)
    _append(folder / "train_log.jsonl", lines)


def grow(folder: Path, done: int, upto: int) -> int:
    """Write steps ``done``..``upto - 1`` (validating before step 0, every 8 steps and at the end)."""
    for step in range(done, upto):
        if step == 0:
            folder.mkdir(parents=True, exist_ok=True)
            write_run_record(folder, SETTINGS)  # as gym train run does, before its first validation
            validate(folder, 0)
        elif step % EVERY == 0:
            validate(folder, step)
        train_step(folder, step)
    if upto == STEPS:
        validate(folder, STEPS, final=True)
        summary = {
            "settings": SETTINGS,
            "validation_regressions": [],
        }
        (folder / "summary.json").write_bytes(orjson.dumps(summary))
    return upto


if __name__ == "__main__":
    grow(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/train"), 0, STEPS)
