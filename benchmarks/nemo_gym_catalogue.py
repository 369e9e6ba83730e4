"""NeMo Gym's catalogue under polygym: every folder's stored rollouts, replayed (issue 35).

For each ``resources_servers/NAME`` of NeMo Gym's wheel that stores ``data/example_rollouts.jsonl``,
polygym starts the folder's stack from NeMo Gym's own config (``configs/NAME.yaml``, else the
folder's first config; the scripted model as policy, and with a fixed verdict as judge where the
config has a ``judge_model_server``), then NeMo Gym 0.7.0's own reverify and ``gym eval reverify``
replay the stored rollouts against that one stack (``tests/nemo_gym_replay.py``). Each folder lands
in one class:

- ``nemo gym's rewards``: NeMo Gym's reverify scored rows and polygym's gave the same reward on each;
- ``differs``: polygym's rewards differ from NeMo Gym's on some row (a polygym bug);
- ``fails under nemo gym too``: NeMo Gym's own reverify scores no row (a gymnasium server has no
  ``/verify``, stored rows lack input fields, ...);
- ``not testable here``: the stack does not start on this machine (a download, a GPU, a service).

Environments are built on first use (minutes each) and cached in ``POLYGYM_TEST_CACHE``.

    .venv/bin/python -m benchmarks.nemo_gym_catalogue                       # every folder
    .venv/bin/python -m benchmarks.nemo_gym_catalogue --folders circle_count proof_judge
"""

from __future__ import annotations

import argparse
import collections
import signal
import sys
import tempfile
import time
from pathlib import Path

from tests.nemo_gym_replay import Replay, replay
from tests.nemo_gym_wheel import nemo_gym_tree

SAME = "nemo gym's rewards"
DIFFERS = "differs"
BOTH_FAIL = "fails under nemo gym too"
NOT_TESTABLE = "not testable here"


def folder_config(folder: Path) -> Path | None:
    """The config a user starts the folder with: the one named after it, else its first."""
    named = folder / "configs" / f"{folder.name}.yaml"
    configs = sorted((folder / "configs").glob("*.yaml"))
    return named if named.is_file() else (configs[0] if configs else None)


def classify(result: Replay) -> str:
    if result.error:
        return NOT_TESTABLE
    if not result.nemo_gym:
        return BOTH_FAIL
    return SAME if result.equal_to_nemo_gym() == len(result.nemo_gym) else DIFFERS


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--folders", nargs="*", help="only these folders (default: every one with stored rollouts)"
    )
    parser.add_argument("--start-timeout", type=float, default=900.0, help="seconds for a stack to start")
    args = parser.parse_args()
    # a stopped benchmark (timeout, kill) still stops the stack it started: its finally runs
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    root = nemo_gym_tree()
    folders = [root / "resources_servers" / name for name in args.folders] if args.folders else None
    folders = folders or sorted(
        p.parent.parent for p in root.glob("resources_servers/*/data/example_rollouts.jsonl")
    )
    by_class: dict[str, list[str]] = collections.defaultdict(list)
    rows: collections.Counter[str] = collections.Counter()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="nemo-gym-catalogue-") as scratch:
        for folder in folders:
            config = folder_config(folder)
            if config is None:
                by_class[NOT_TESTABLE].append(f"{folder.name} (no config)")
                continue
            judge = "judge_model_server" in config.read_text()
            t0 = time.monotonic()
            result = replay(
                root, folder.name, config, Path(scratch) / folder.name, judge, start_s=args.start_timeout
            )
            kind = classify(result)
            note = f" ({' '.join(result.error.replace('|', '/').split())[:120]})" if result.error else ""
            note += " [judge: fixed verdict]" if judge else ""
            note += " [inputs: stored rows]" if result.inputs != "materialized" else ""
            by_class[kind].append(f"{folder.name}{note}")
            rows["stored"] += len(result.stored)
            rows["scored by NeMo Gym"] += len(result.nemo_gym)
            rows["equal to NeMo Gym"] += result.equal_to_nemo_gym()
            rows["NeMo Gym equal to stored"] += sum(
                1 for k, v in result.nemo_gym.items() if result.stored.get(k) == v
            )
            print(f"{folder.name}: {kind}{note} in {time.monotonic() - t0:.0f} s", flush=True)
    print(f"\n{len(folders)} folders in {time.monotonic() - started:.0f} s")
    print("| class | folders | which |\n|---|---|---|")
    for kind in (SAME, DIFFERS, BOTH_FAIL, NOT_TESTABLE):
        print(f"| {kind} | {len(by_class[kind])} | {', '.join(by_class[kind])} |")
    print("rows: " + ", ".join(f"{k} {v}" for k, v in rows.items()))


if __name__ == "__main__":
    main()
