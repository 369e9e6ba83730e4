"""Write code_exec's datasets: example.jsonl (5 rows), train.jsonl and validation.jsonl.

Run from anywhere: ``python resources_servers/code_exec/data/generate.py`` writes all three next
to this file; ``--split NAME --output PATH`` writes one split elsewhere. Each row is one problem of
``problems.py``; expected outputs come from running its reference solution, so re-running
reproduces the files byte for byte. Train and validation hold disjoint problems; example holds the
first five train problems.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from polygym import generator_main, per_split
from resources_servers.code_exec.problems import SPLITS, Problem, reference_outputs

HERE = Path(__file__).parent
AGENT = "code_exec_simple_agent"
NUM_EXAMPLE_ROWS = 5
SPLIT_NAMES = ["example", "train", "validation"]

SYSTEM = (
    "You are an expert Python programmer. Answer with the complete function in a single ```python "
    "code block. Use only the standard library; do not read input or print: the function is called "
    "directly by hidden tests."
)


def _call(problem: Problem, args: list) -> str:
    return f"{problem.entry_point}({', '.join(repr(a) for a in args)})"


def build_row(problem: Problem) -> dict:
    outputs = reference_outputs(problem)
    examples = "\n".join(
        f"    {_call(problem, args)} == {output!r}"
        for args, output in list(zip(problem.inputs, outputs, strict=True))[: problem.num_examples]
    )
    prompt = (
        f"Write a Python function `{problem.signature}`.\n\n{problem.description}\n\n"
        f"For example:\n{examples}\n\nThe function will be checked against hidden tests."
    )
    return {
        "responses_create_params": {
            "input": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
        },
        "agent_ref": {"type": "responses_api_agents", "name": AGENT},
        "problem_id": problem.problem_id,
        "entry_point": problem.entry_point,
        "tests": [{"args": args, "expected": out} for args, out in zip(problem.inputs, outputs, strict=True)],
        "reference_solution": problem.reference,
    }


def build_split(split: str) -> list[dict]:
    if split == "example":
        return [build_row(p) for p in SPLITS["train"][:NUM_EXAMPLE_ROWS]]
    return [build_row(p) for p in SPLITS[split]]


def main(argv: list[str] | None = None) -> None:
    generator_main(per_split(build_split), SPLIT_NAMES, HERE, __doc__, argv)


if __name__ == "__main__":
    main()
