"""Stack records: private to their user, and another user's record never steers a run."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from polygym.stack import records as stacks


def own_record(stack_id: str = "s1") -> dict:
    return {"stack_id": stack_id, "pid": os.getpid(), "process_started_at": psutil.Process().create_time()}


def test_records_are_private(state_dir: Path) -> None:
    path = stacks.write_stack(own_record())
    assert path.stat().st_mode & 0o777 == 0o600
    assert stacks.stacks_dir().stat().st_mode & 0o777 == 0o700
    stacks.write_stack(own_record())  # rewriting keeps it private
    assert path.stat().st_mode & 0o777 == 0o600
    assert [r["stack_id"] for r in stacks.list_stacks()] == ["s1"]


def test_a_record_of_another_user_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    stacks.write_stack(own_record())
    monkeypatch.setattr(os, "getuid", lambda: os.stat(stacks.stacks_dir()).st_uid + 1)
    assert stacks.list_stacks() == []
