"""A real run for the viewer's browser tests and the README screenshots, made by the scripted model.

Rows: both example environments (one tool call; several lookups then a submit), two repeats each,
plus one weather row whose model call fails (a scripted error: a recorded failure) and one whose
user message is an XSS attempt (``<script>``, ``onerror=``), shown in the prompt.
``make_pair`` also writes a "new" run: the same rollouts with some
tasks' rewards changed, so that Compare has flips in both directions.

    python tests/view/demo_run.py runs    # runs/demo.jsonl, runs/demo_new.jsonl, runs/blend.jsonl
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
XSS = "<script>alert('xss')</script><img src=x onerror=alert(1)>"
ENVS = ("example_single_tool_call", "example_multi_step")


def _inputs() -> list[bytes]:
    lines: list[bytes] = []
    for env in ENVS:
        lines += (ROOT / "resources_servers" / env / "data" / "example.jsonl").read_bytes().splitlines()[:5]
    hostile = orjson.loads(lines[0])
    hostile["responses_create_params"]["input"][-1]["content"] = f"Please check the weather in {XSS}."
    broken = orjson.loads(lines[1])  # the model answers 400 on its first turn: a recorded failure
    broken["responses_create_params"]["metadata"] = {"script": orjson.dumps([{"error": 400}]).decode()}
    return [*lines, orjson.dumps(hostile), orjson.dumps(broken)]


def make_run(folder: Path, name: str = "demo") -> Path:
    """``gym eval run`` over the demo rows; returns the output path."""
    folder.mkdir(parents=True, exist_ok=True)
    inputs = folder / f"{name}_input.jsonl"
    inputs.write_bytes(b"\n".join(_inputs()) + b"\n")
    output = folder / f"{name}.jsonl"
    args = ["eval", "run", "--model-type", "scripted_model", "--input", inputs.name, "--output", output.name]
    args += [a for env in ENVS for a in ("--resources-server", env)] + ["--num-repeats", "2", "--overwrite"]
    args += ["--max-failures", "2"]  # the broken row's two repeats fail on purpose
    done = subprocess.run(
        [sys.executable, "-m", "polygym", *args], cwd=folder, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"gym eval run failed:\n{done.stderr[-2000:]}")
    return output


BLEND = """
environments:
  - name: example_single_tool_call
    weight: 3
  - name: example_multi_step
    weight: 1
prompts_per_step: 4
responses_per_prompt: 2
seed: 13
"""


def make_steps_run(folder: Path, steps: int = 6) -> Path:
    """A step-wise run (``gym eval run --blend``) of both environments, 3:1; returns its output."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "blend.yaml").write_text(BLEND)
    args = ["eval", "run", "--model-type", "scripted_model", "--blend", "blend.yaml", "--steps", str(steps)]
    args += ["--output", "blend.jsonl", "--overwrite"]
    done = subprocess.run(
        [sys.executable, "-m", "polygym", *args], cwd=folder, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"gym eval run --blend failed:\n{done.stderr[-2000:]}")
    return folder / "blend.jsonl"


def make_pair(folder: Path) -> tuple[Path, Path]:
    """The demo run and a changed copy: tasks 0 and 6 now fail, the XSS task (10) now passes."""
    base = make_run(folder)
    rows = [orjson.loads(line) for line in base.read_bytes().splitlines()]
    for row in rows:
        if row["_ng_task_index"] in (0, 6):
            row["reward"] = 0.0
        elif row["_ng_task_index"] == 10:
            row["reward"] = 1.0
    new = folder / "demo_new.jsonl"
    new.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return base, new


if __name__ == "__main__":
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "runs")
    print(*make_pair(folder), make_steps_run(folder))
