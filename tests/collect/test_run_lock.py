"""RunLock: one run writes an output at a time; a dead run never leaves its lock behind."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from polygym.collect.run_files import RunFileError, RunFiles
from polygym.collect.run_lock import OutputBusyError, RunLock
from tests.conftest import ROOT

HOLD = """
import sys
from pathlib import Path
from polygym.collect.run_files import RunFileError, RunFiles
from polygym.collect.run_lock import RunLock
with RunLock(RunFiles(Path(sys.argv[1]))):
    print("locked", flush=True)
    sys.stdin.read()
"""


def test_a_second_run_is_refused_naming_the_first(tmp_path: Path) -> None:
    files = RunFiles(tmp_path / "out.jsonl")
    with RunLock(files):
        assert files.lock.read_text() == str(os.getpid())
        with pytest.raises(OutputBusyError) as info, RunLock(files):
            pass
        assert str(info.value) == (
            f"{files.output} is being written by another run (pid {os.getpid()}); "
            "wait for it or choose another --output"
        )
    with RunLock(files):  # released on exit
        pass


def test_the_lock_dies_with_its_holder(tmp_path: Path) -> None:
    files = RunFiles(tmp_path / "out.jsonl")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(files.output)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        with pytest.raises(OutputBusyError, match=f"another run \\(pid {holder.pid}\\)"), RunLock(files):
            pass
    finally:
        holder.kill()
        holder.wait(10)
    with RunLock(files):  # kill -9 released it: no stale lock blocks the resume
        pass


def test_a_symlink_at_the_lock_is_refused_and_its_target_kept(tmp_path: Path) -> None:
    """A lock planted as a symlink to a user's file: that file is neither emptied nor written."""
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    files = RunFiles(tmp_path / "out.jsonl")
    files.lock.symlink_to(precious)
    with (
        pytest.raises(RunFileError, match="is a symlink; the run lock must be a regular file"),
        RunLock(files),
    ):
        pass
    assert precious.read_text() == "keep me"


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_lock_that_is_not_a_regular_file_is_refused(tmp_path: Path, kind: str) -> None:
    """A FIFO is refused without blocking on its open; a directory is refused by name."""
    files = RunFiles(tmp_path / "out.jsonl")
    if kind == "fifo":
        os.mkfifo(files.lock)
    else:
        files.lock.mkdir()
    with pytest.raises(RunFileError, match="the run lock"), RunLock(files):
        pass
