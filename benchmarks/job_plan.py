"""Job plan: memory and time to plan a run before its first rollout, by repeat count.

``gym eval run`` used to build every job (rows x ``--num-repeats``) as a list and encode them all
into the materialized-inputs file before the first rollout. The lazy ``JobPlan`` keeps the rows
only. For 400 rows and each repeat count this prints the peak Python memory (tracemalloc) and the
time of what a run does up front (read + check + plan, count per agent, fingerprint, first 1,000
jobs), and, for the counts where it fits, the same for the old way (the list and its encoding).

    python -m benchmarks.job_plan --repeats 100 1000 100000
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import print_table, write_json
from benchmarks.throughput import AGENTS, mixed_input
from polygym.collect.dataset import load_jobs
from polygym.collect.job_plan import Materialization
from polygym.jsonl import encode_jsonl, iter_jsonl, write_jsonl

ROWS = 400
OLD_WAY_LIMIT = 1_000
"""Repeat counts above this are not run the old way: 400 x 10,000 jobs is gigabytes."""


def dataset(folder: Path) -> Path:
    """400 distinct rows of the two example environments."""
    base = list(iter_jsonl(mixed_input(folder / "base.jsonl")))
    rows = [{**row, "copy": i} for i, row in zip(range(ROWS), itertools.cycle(base), strict=False)]
    path = folder / "in.jsonl"
    write_jsonl(rows, path)
    return path


def measured(work: Callable[[], Any]) -> tuple[float, float]:
    """(seconds, peak MiB) of ``work``."""
    tracemalloc.start()
    began = time.perf_counter()
    try:
        work()
        return time.perf_counter() - began, tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def lazy(path: Path, repeats: int) -> None:
    plan = load_jobs(path, AGENTS, options=Materialization(num_repeats=repeats))
    assert len(plan) == ROWS * repeats and sum(plan.totals().values()) == len(plan)
    plan.fingerprint()
    assert len(list(itertools.islice(plan, 1_000))) == 1_000


def old_way(path: Path, repeats: int) -> None:
    jobs = list(load_jobs(path, AGENTS, options=Materialization(num_repeats=repeats)))
    encode_jsonl(job.row for job in jobs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, nargs="+", default=[10, 1_000, 100_000])
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        path = dataset(Path(tmp))
        for repeats in args.repeats:
            seconds, peak = measured(lambda: lazy(path, repeats))  # noqa: B023 (called at once)
            row: dict[str, Any] = {"repeats": repeats, "jobs": ROWS * repeats, "plan_s": seconds}
            row["plan_peak_mib"] = peak
            if repeats <= OLD_WAY_LIMIT:
                old_s, old_peak = measured(lambda: old_way(path, repeats))  # noqa: B023
                row.update(old_s=old_s, old_peak_mib=old_peak)
            results.append(row)
    print_table(f"planning {ROWS} rows x repeats before the first rollout", results)
    write_json("job_plan", {"rows": ROWS, "results": results})


if __name__ == "__main__":
    main()
