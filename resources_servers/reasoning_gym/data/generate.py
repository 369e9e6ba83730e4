"""Write reasoning_gym's datasets from reasoning-gym tasks: example.jsonl, train.jsonl, validation.jsonl.

Run from anywhere: ``python resources_servers/reasoning_gym/data/generate.py`` writes all three next
to this file (5 example rows, one per task of the first five; ``--size`` rows per task for train
and a fifth of that for validation). ``--split NAME --output PATH [--tasks a,b] [--size N]
[--seed S]`` writes one split elsewhere, from any task the package registers. Each row holds the
task name, the config the dataset was built with (``size``, ``seed``) and the generated entry, so
``verify`` needs nothing else; generation is deterministic for a given reasoning-gym version.
Validation drops any question that also appears in train.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if not __package__:  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import reasoning_gym

HERE = Path(__file__).parent
AGENT = "reasoning_gym_simple_agent"
# Cheap tasks: generated and scored in well under a millisecond, no optional dependencies.
DEFAULT_TASKS = [
    "basic_arithmetic",
    "letter_counting",
    "chain_sum",
    "spell_backward",
    "gcd",
    "word_sorting",
    "lcm",
    "leg_counting",
    "base_conversion",
    "count_bits",
    "caesar_cipher",
]
SEEDS = {"example": 7, "train": 1000, "validation": 2000}
DEFAULT_SIZE = 50

SYSTEM = (
    "Solve the problem. You may reason step by step first; then give only the final answer inside "
    "answer tags, exactly as the question asks for it, for example <answer>42</answer>."
)


def task_rows(task: str, size: int, seed: int) -> list[dict]:
    config = {"size": size, "seed": seed}
    dataset = reasoning_gym.create_dataset(task, **config)
    rows = []
    for index in range(size):
        entry = dataset[index]
        rows.append(
            {
                "responses_create_params": {
                    "input": [
                        {"role": "system", "content": SYSTEM},
                        {"role": "user", "content": entry["question"]},
                    ]
                },
                "agent_ref": {"type": "responses_api_agents", "name": AGENT},
                "task": task,
                "task_config": config,
                "entry": {
                    "question": entry["question"],
                    "answer": entry["answer"],
                    "metadata": entry["metadata"],
                },
            }
        )
    return rows


def build_split(split: str, tasks: list[str], size: int, seed: int | None = None) -> list[dict]:
    base = SEEDS[split] if seed is None else seed
    if split == "example":
        return [task_rows(task, 1, base + i)[0] for i, task in enumerate(tasks[:5])]
    rows = [row for i, task in enumerate(tasks) for row in task_rows(task, size, base + i)]
    if split == "validation":
        seen = {r["entry"]["question"] for r in build_split("train", tasks, size * 5)}
        rows = [r for r in rows if r["entry"]["question"] not in seen]
    return rows


def write(rows: list[dict], path: Path) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    print(f"wrote {len(rows)} rows to {path}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=sorted(SEEDS), help="write only this split")
    parser.add_argument("--output", type=Path, help="where to write --split (default: next to this file)")
    parser.add_argument("--tasks", help=f"comma-separated task names (default: {','.join(DEFAULT_TASKS)})")
    parser.add_argument(
        "--size", type=int, default=DEFAULT_SIZE, help="train rows per task (validation: 1/5)"
    )
    parser.add_argument("--seed", type=int, help="base seed of --split (task i uses seed + i)")
    args = parser.parse_args(argv)
    if (args.output or args.seed is not None) and not args.split:
        parser.error("--output and --seed need --split")
    tasks = args.tasks.split(",") if args.tasks else DEFAULT_TASKS
    unknown = sorted(set(tasks) - set(reasoning_gym.factory.DATASETS))
    if unknown:
        parser.error(f"unknown tasks: {', '.join(unknown)}")
    for split in [args.split] if args.split else ["example", "train", "validation"]:
        size = args.size if split == "train" else max(1, args.size // 5)
        write(build_split(split, tasks, size, args.seed), args.output or HERE / f"{split}.jsonl")


if __name__ == "__main__":
    main()
