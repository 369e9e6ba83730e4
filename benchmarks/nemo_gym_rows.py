"""How many of NeMo Gym's own example rows ``gym data validate`` accepts (issue #12, "rows").

Checks every ``resources_servers/NAME/data/example.jsonl`` of an unpacked NeMo Gym wheel as a user
would, ``gym data validate --env NAME FILE``, with the wheel's root as a NeMo Gym root (so NAME is
NeMo Gym's folder, or polygym's same-named one, which wins). A row is accepted when no problem
names its line; an environment whose config does not load rejects all its rows. Rejections are
counted by reason, so the remaining gaps are visible.

    pip download nemo-gym==0.7.0 --no-deps -d /tmp/ng && (cd /tmp/ng && unzip -q nemo_gym-*.whl)
    .venv/bin/python -m benchmarks.nemo_gym_rows /tmp/ng
"""

from __future__ import annotations

import argparse
import collections
import os
import re
from pathlib import Path

from polygym.blend.validate import validate_files
from polygym.jsonl import count_rows
from polygym.stack.catalog import NEMO_GYM_ROOT_ENV_VAR


def reason(problem: str) -> str:
    """A problem's kind, without file, line and names, so rejections group."""
    text = re.sub(r"^\S+?:(\d+:)? ", "", problem)
    text = re.sub(r"'[^']*'|/\S+", "…", text)
    return text[:100]


def rejected_rows(path: Path, problems: list[str]) -> int:
    """Rows of ``path`` that a problem names by line; all of them when a problem names no line."""
    lines = set()
    for problem in problems:
        match = re.match(rf"{re.escape(str(path))}:(\d+):", problem)
        if match is None:
            return count_rows(path)
        lines.add(match.group(1))
    return len(lines)


def measure(root: Path) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """Row counts (accepted / rejected) and rejection reasons (each rejected file's first problem,
    weighted by its rejected rows) for the example files under ``root``."""
    os.environ[NEMO_GYM_ROOT_ENV_VAR] = str(root)
    counts: collections.Counter[str] = collections.Counter()
    reasons: collections.Counter[str] = collections.Counter()
    for path in sorted(root.glob("resources_servers/*/data/example.jsonl")):
        report = validate_files([path], [path.parent.parent.name])
        rejected = rejected_rows(path, report.problems)
        counts["accepted"] += count_rows(path) - rejected
        counts["rejected"] += rejected
        if rejected:
            reasons[reason(report.problems[0])] += rejected
    return counts, reasons


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("wheel_root", type=Path, help="An unpacked NeMo Gym wheel.")
    counts, reasons = measure(parser.parse_args().wheel_root.resolve())
    print(f"{counts.total()} rows: accepted {counts['accepted']}, rejected {counts['rejected']}")
    for text, count in reasons.most_common(20):
        print(f"{count:5d}  {text}")


if __name__ == "__main__":
    main()
