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

import sys
from pathlib import Path

if not __package__:  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import reasoning_gym

from polygym import generator_parser, per_split, write_splits

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


def main(argv: list[str] | None = None) -> None:
    parser = generator_parser(__doc__, SEEDS, HERE)
    parser.add_argument("--tasks", help=f"comma-separated task names (default: {','.join(DEFAULT_TASKS)})")
    parser.add_argument(
        "--size", type=int, default=DEFAULT_SIZE, help="train rows per task (validation: 1/5)"
    )
    parser.add_argument("--seed", type=int, help="base seed of --split (task i uses seed + i)")
    args = parser.parse_args(argv)
    if args.seed is not None and not args.split:
        parser.error("--seed needs --split")
    tasks = args.tasks.split(",") if args.tasks else DEFAULT_TASKS
    unknown = sorted(set(tasks) - set(reasoning_gym.factory.DATASETS))
    if unknown:
        parser.error(f"unknown tasks: {', '.join(unknown)}")

    def build(split: str) -> list[dict]:
        size = args.size if split == "train" else max(1, args.size // 5)
        return build_split(split, tasks, size, args.seed)

    write_splits(args, SEEDS, per_split(build))


if __name__ == "__main__":
    main()
