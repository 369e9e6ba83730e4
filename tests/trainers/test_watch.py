"""`gym train watch` beside a trainer it knows nothing of: a policy endpoint whose answers get worse.

The "trainer" is a Chat Completions server defined here, answering every turn of the three-turn
test game with a reply that earns the turn's reward ("B", even) until the test flips it to one that
earns nothing ("A", odd). The watch evaluates at the start, on SIGUSR1 and on a new checkpoint
folder, and must raise the alarm (exit 1, alarms.jsonl, the hook) at the evaluation where the
reward fell, by gym train run's --max-regression rule.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from starlette.requests import Request
from starlette.responses import Response

from polygym.jsonl import iter_jsonl
from tests.conftest import ChatEndpoint, gym_command, wait_until
from tests.trainers.stacks import agent_row, write_environments, write_jsonl

pytestmark = pytest.mark.e2e


class SwitchablePolicy(ChatEndpoint):
    """An OpenAI-compatible endpoint on its own thread; ``good`` decides what it answers."""

    def __init__(self) -> None:
        super().__init__()
        self.good = True
        self.calls = 0

    async def chat(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        self.calls += 1
        text = "B" if self.good else "A"
        completion = {
            "id": f"c{self.calls}",
            "object": "chat.completion",
            "model": body["model"],
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1},
        }
        return Response(orjson.dumps(completion), media_type="application/json")


def curve(path: Path) -> list[tuple[int, str, float | None]]:
    return (
        [(line["step"], line["env"], line["reward_mean"]) for line in iter_jsonl(path)]
        if path.exists()
        else []
    )


def write_spec(root: Path) -> Path:
    rows = write_jsonl(root / "rows.jsonl", [agent_row("parity_gymnasium_agent", i=i) for i in range(4)])
    spec = {
        "environments": {
            "parity": {"agent": "parity_gymnasium_agent", "train": [str(rows)], "validation": [str(rows)]}
        },
        "prompts_per_step": 1,
    }
    path = root / "spec.yaml"
    path.write_bytes(orjson.dumps(spec))  # JSON is YAML
    return path


def test_watch_raises_the_alarm_when_the_policy_regresses(tmp_path: Path) -> None:
    write_environments(tmp_path, "parity")
    spec = write_spec(tmp_path)
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    save = "import os, pathlib; pathlib.Path('hook.json').write_text(os.environ['POLYGYM_ALARMS'])"
    hook = f'{sys.executable} -c "{save}"'
    out = tmp_path / "watch"
    with SwitchablePolicy() as policy:
        args = [
            "train", "watch", str(spec), "--policy-url", policy.url, "--policy-model", "policy",
            "-o", str(out), "--checkpoints", str(checkpoints), "--max-regression", "parity=0.1",
            "--hook", hook,
        ]  # fmt: skip
        log = (tmp_path / "watch.log").open("w+b")
        proc = subprocess.Popen(gym_command(*args), cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
        try:
            curves = out / "validation.jsonl"
            assert wait_until(lambda: len(curve(curves)) == 1 or proc.poll() is not None, 90), "no baseline"
            assert proc.poll() is None, (tmp_path / "watch.log").read_text()
            os.kill(proc.pid, signal.SIGUSR1)  # the trainer's hook: "evaluate now"
            assert wait_until(lambda: len(curve(curves)) == 2 or proc.poll() is not None, 60)
            policy.good = False
            (checkpoints / "checkpoint-20").mkdir()  # the trainer saved step 20
            code = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    output = (tmp_path / "watch.log").read_text()
    assert code == 1, output
    assert curve(curves) == [(0, "parity", 1.0), (1, "parity", 1.0), (20, "parity", 0.0)]
    [alarm] = list(iter_jsonl(out / "alarms.jsonl"))
    assert alarm["env"] == "parity" and alarm["step"] == 20 and alarm["drop"] == pytest.approx(1.0)
    assert orjson.loads((tmp_path / "hook.json").read_bytes()) == [alarm]
    assert "alarm: parity validation reward fell +1.000 since step 0" in output
    # each evaluation is a gym eval run file set, as gym train run's validations are
    assert len(list(iter_jsonl(out / "validation_before.jsonl"))) == 4
    assert [r["reward"] for r in iter_jsonl(out / "validation" / "step_20.jsonl")] == [0.0] * 4


def test_watch_needs_a_trigger(tmp_path: Path) -> None:
    done = subprocess.run(
        gym_command(
            "train", "watch", "spec.yaml", "--policy-url", "http://x/v1", "--policy-model", "m", "-o", "w"
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--checkpoints DIR or --every-minutes N" in done.stderr


def test_triggers_label_each_evaluation(tmp_path: Path) -> None:
    from polygym.training.watch import Triggers

    (tmp_path / "checkpoint-5").mkdir()
    triggers = Triggers(tmp_path, every_s=None)
    assert triggers.poll(0) is None  # what was there at the start is not new
    (tmp_path / "checkpoint-200").mkdir()
    assert triggers.poll(0) == 200 and triggers.poll(200) is None
    (tmp_path / "checkpoint-100").mkdir()  # a number at or below the last label: one past it
    assert triggers.poll(200) == 201
    (tmp_path / "latest").mkdir()
    assert triggers.poll(201) == 202
    triggers.signalled = True
    assert triggers.poll(202) == 203 and triggers.poll(203) is None
    assert Triggers(None, every_s=0.0).poll(7) == 8  # the clock is always due at period 0


class RefusingPolicy(ChatEndpoint):
    """A policy endpoint that refuses every request (400: not retried), so nothing is scored."""

    async def chat(self, request: Request) -> Response:
        return Response(b'{"error": {"message": "no such model"}}', 400, media_type="application/json")


def test_watch_refuses_a_baseline_that_scored_nothing(tmp_path: Path) -> None:
    """The watch's baseline check is ``gym train run``'s (validation.require_scored): it names the
    environment, its first failure and the failures file, with the watch's own hint."""
    write_environments(tmp_path, "parity")
    spec = write_spec(tmp_path)
    with RefusingPolicy() as policy:
        args = [
            "train", "watch", str(spec), "--policy-url", policy.url, "--policy-model", "policy",
            "-o", "watch", "--every-minutes", "60",
        ]  # fmt: skip
        done = subprocess.run(gym_command(*args), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    message = " ".join(done.stderr.split())
    assert done.returncode == 1, done.stdout + done.stderr
    assert "parity: no validation rollout was scored (" in message
    assert "no baseline to watch against: is the policy endpoint up?" in message
    assert "validation_before_failures.jsonl" in message
