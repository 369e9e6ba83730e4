"""Mean ± sd of every (arm, environment) delta over several `gym train compare-mixes` runs.

Usage: ``python examples/interference/seeds_summary.py results-seed0 results-seed1 ...`` (each a
compare-mixes ``--output`` folder, e.g. one per ``--seed``). Prints a Markdown table: per arm and
environment, the mean and sample standard deviation of the delta vs step 0, how many runs had
McNemar p < 0.05, and each arm's mean worst-environment delta. One run gives no sd ("-").
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def summarize(folders: list[Path]) -> str:
    deltas: dict[tuple[str, str], list[float]] = {}
    significant: dict[tuple[str, str], int] = {}
    worst: dict[str, list[float]] = {}
    for folder in folders:
        for arm in json.loads((folder / "table.json").read_text()):
            if arm["worst_delta"] is not None:
                worst.setdefault(arm["arm"], []).append(arm["worst_delta"])
            for row in arm["environments"]:
                key = (arm["arm"], row["env"])
                if row["delta"] is not None:
                    deltas.setdefault(key, []).append(row["delta"])
                significant[key] = significant.get(key, 0) + (row["mcnemar_p"] < 0.05)

    def spread(values: list[float]) -> str:
        sd = f"{statistics.stdev(values):.3f}" if len(values) > 1 else "-"
        return f"{statistics.fmean(values):+.3f} ± {sd}"

    lines = [
        f"{len(folders)} runs",
        "",
        "| arm | environment | delta mean ± sd | runs with p < 0.05 |",
        "|---|---|---:|---:|",
    ]
    lines += [f"| {a} | {e} | {spread(v)} | {significant[(a, e)]}/{len(v)} |" for (a, e), v in deltas.items()]
    lines += ["", "| arm | worst-environment delta mean ± sd |", "|---|---:|"]
    lines += [f"| {a} | {spread(v)} |" for a, v in worst.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print(summarize([Path(arg) for arg in sys.argv[1:]]))
