"""NeMo Gym's catalogue under polygym: every folder's stored rollouts, replayed (issue 35).

For each ``resources_servers/NAME`` of NeMo Gym's wheel that stores ``data/example_rollouts.jsonl``,
polygym starts the folder's stack from NeMo Gym's own config (``configs/NAME.yaml``, else the
folder's first config; the scripted model as policy, and with a fixed verdict as judge where the
config has a ``judge_model_server``, also under each model server's name the config uses without
defining it), then NeMo Gym 0.7.0's own reverify and ``gym eval reverify``
replay the stored rollouts against that one stack (``tests/nemo_gym_replay.py``). Each folder lands
in one class:

- ``nemo gym's rewards``: NeMo Gym's reverify scored rows and polygym's gave the same reward on each;
- ``differs``: polygym's rewards differ from NeMo Gym's on some row, or polygym scores a row that
  NeMo Gym's reverify refuses (a polygym bug, or a documented difference);
- ``fails under nemo gym too``: NeMo Gym's own reverify scores no row (a gymnasium server has no
  ``/verify``, stored rows lack input fields, ...);
- ``not testable here``: the stack does not start on this machine (a download, a GPU, a service).

The whole catalogue takes hours on a loaded machine (environments are built on first use, minutes
each, and cached in ``POLYGYM_TEST_CACHE``), so the run is incremental: each folder's result is
appended to ``--results`` as soon as it is measured, a later run skips the folders recorded there
(``--fresh`` measures them again), ``--budget-minutes`` stops starting new folders after that long,
and the table is printed over everything recorded, so the catalogue can be completed across runs.

    .venv/bin/python -m benchmarks.nemo_gym_catalogue --budget-minutes 60   # resume, at most 1 h
    .venv/bin/python -m benchmarks.nemo_gym_catalogue --folders circle_count proof_judge --fresh
    .venv/bin/python -m benchmarks.nemo_gym_catalogue --table               # print, measure nothing
"""

from __future__ import annotations

import argparse
import collections
import signal
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS
from polygym.jsonl import append_jsonl, iter_jsonl
from tests.nemo_gym_replay import Replay, policy_values, replay, stands_in_for
from tests.nemo_gym_wheel import nemo_gym_tree

SAME = "nemo gym's rewards"
DIFFERS = "differs"
BOTH_FAIL = "fails under nemo gym too"
NOT_TESTABLE = "not testable here"
CLASSES = (SAME, DIFFERS, BOTH_FAIL, NOT_TESTABLE)
RESULTS_FILE = RESULTS / "nemo_gym_catalogue.jsonl"
ROW_COUNTS = (
    "stored",
    "scored by NeMo Gym",
    "scored by polygym",
    "equal to NeMo Gym",
    "NeMo Gym equal to stored",
)


def folder_config(folder: Path) -> Path | None:
    """The config a user starts the folder with: the one named after it, else its first."""
    named = folder / "configs" / f"{folder.name}.yaml"
    configs = sorted((folder / "configs").glob("*.yaml"))
    return named if named.is_file() else (configs[0] if configs else None)


def classify(result: Replay) -> str:
    """A row polygym scores where NeMo Gym's reverify refuses it is a difference too."""
    if result.error:
        return NOT_TESTABLE
    if result.polygym.keys() - result.nemo_gym.keys():
        return DIFFERS
    if not result.nemo_gym:
        return BOTH_FAIL
    return SAME if result.equal_to_nemo_gym() == len(result.nemo_gym) else DIFFERS


def own_requirements(folder: Path) -> list[str]:
    """The folder's requirements besides nemo-gym (``requirements.txt`` or ``pyproject.toml``)."""
    listed = folder / "requirements.txt"
    project = folder / "pyproject.toml"
    if listed.is_file():
        lines = [line.split("#")[0].strip() for line in listed.read_text().splitlines()]
    elif project.is_file():
        lines = tomllib.loads(project.read_text()).get("project", {}).get("dependencies", [])
    else:
        lines = []
    return [line for line in lines if line and "nemo-gym" not in line.lower().replace("_", "-")]


def catalogue(root: Path) -> list[Path]:
    """Every folder of the wheel that stores rollouts to replay, the quick ones first: those with
    no requirements of their own share the base environment, the others build one each (minutes),
    so a run bounded in time covers as many folders as it can."""
    folders = [p.parent.parent for p in root.glob("resources_servers/*/data/example_rollouts.jsonl")]
    return sorted(folders, key=lambda folder: (len(own_requirements(folder)), folder.name))


def recorded(path: Path) -> dict[str, dict[str, Any]]:
    """Each folder's latest record in the results file (a re-measured folder's last line wins)."""
    return {str(r["folder"]): r for r in iter_jsonl(path) if r.get("class") in CLASSES}


def measure(folder: Path, scratch: Path, start_s: float) -> dict[str, Any]:
    """One folder replayed by both reverifies, as the record the results file keeps."""
    t0 = time.monotonic()
    config = folder_config(folder)
    if config is None:
        return {"folder": folder.name, "class": NOT_TESTABLE, "note": "no config", "seconds": 0.0}
    judge = "judge_model_server" in config.read_text() or bool(stands_in_for(config))
    result = replay(nemo_gym_tree(), folder.name, config, scratch / folder.name, judge, start_s=start_s)
    notes = [" ".join(result.error.replace("|", "/").split())[:240]] if result.error else []
    notes += ["judge: fixed verdict"] if judge else []
    notes += ["policy endpoint: the fixed judge"] if policy_values(config) else []
    notes += ["inputs: stored rows"] if result.inputs != "materialized" else []
    counts = (
        len(result.stored),
        len(result.nemo_gym),
        len(result.polygym),
        result.equal_to_nemo_gym(),
        sum(1 for k, v in result.nemo_gym.items() if result.stored.get(k) == v),
    )
    return {
        "folder": folder.name,
        "class": classify(result),
        "note": "; ".join(notes),
        "config": config.name,
        "rows": dict(zip(ROW_COUNTS, counts, strict=True)),
        "seconds": round(time.monotonic() - t0, 1),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def run(folders: Iterable[Path], results: Path, start_s: float, budget_s: float) -> int:
    """Measure ``folders`` in turn, appending each record; no new folder starts after ``budget_s``.
    Returns how many were measured."""
    results.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    measured = 0
    with tempfile.TemporaryDirectory(prefix="nemo-gym-catalogue-") as scratch:
        for folder in folders:
            if time.monotonic() - started > budget_s:
                print(f"budget spent: stopping before {folder.name}", flush=True)
                break
            record = measure(folder, Path(scratch), start_s)
            append_jsonl([record], results)
            measured += 1
            note = f" ({record['note']})" if record["note"] else ""
            print(f"{record['folder']}: {record['class']}{note} in {record['seconds']:.0f} s", flush=True)
    return measured


def print_table(records: dict[str, dict[str, Any]], total: int) -> None:
    """The classes over every recorded folder, each with its folders and their notes."""
    by_class: dict[str, list[str]] = collections.defaultdict(list)
    rows: collections.Counter[str] = collections.Counter()
    for name, record in sorted(records.items()):
        note = f" ({record['note']})" if record.get("note") else ""
        by_class[record["class"]].append(f"{name}{note}")
        rows.update(record.get("rows", {}))
    print(f"\n{len(records)} of {total} folders recorded")
    print("| class | folders | which |\n|---|---|---|")
    for kind in CLASSES:
        print(f"| {kind} | {len(by_class[kind])} | {', '.join(by_class[kind])} |")
    print("rows: " + ", ".join(f"{k} {rows[k]}" for k in ROW_COUNTS))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--folders", nargs="*", help="only these folders (default: every one with stored rollouts)"
    )
    parser.add_argument("--start-timeout", type=float, default=900.0, help="seconds for a stack to start")
    parser.add_argument("--results", type=Path, default=RESULTS_FILE, help="the records, one folder a line")
    parser.add_argument("--fresh", action="store_true", help="measure folders already recorded again")
    parser.add_argument(
        "--budget-minutes", type=float, default=float("inf"), help="start no new folder after this long"
    )
    parser.add_argument("--table", action="store_true", help="print the recorded table, measure nothing")
    args = parser.parse_args()
    # a stopped benchmark (timeout, kill) still stops the stack it started: its finally runs
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    root = nemo_gym_tree()
    everything = catalogue(root)
    chosen = [root / "resources_servers" / name for name in args.folders] if args.folders else everything
    done = {} if args.fresh else recorded(args.results)
    todo = [folder for folder in chosen if folder.name not in done]
    if not args.table:
        print(f"{len(todo)} of {len(chosen)} folders to measure ({len(chosen) - len(todo)} recorded)")
        run(todo, args.results, args.start_timeout, args.budget_minutes * 60)
    print_table(recorded(args.results), len(everything))


if __name__ == "__main__":
    main()
