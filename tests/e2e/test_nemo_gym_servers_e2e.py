"""NeMo Gym's own servers, unchanged, in a polygym stack — both ways.

NeMo Gym 0.7.0's environments that polygym does not ship run from the unpacked wheel
(``--nemo-gym-root``), each in the environment polygym builds for it (nemo-gym + the folder's
requirements, Python 3.13.0 from pyenv with ``--ignore-requires-python``, cached in
``POLYGYM_TEST_CACHE/envs``: the first run on a machine builds it, minutes; later runs reuse it):

* ``math_advanced_calculations`` (math, several tool-calling turns: its calculators are
  deliberately wrong, so only playing the tools gives NeMo Gym's ground truth),
  ``format_verification`` (instruction following: line formats checked by regex) and
  ``calendar`` (multi-turn conversations ending in a calendar that must meet every constraint;
  its ``rich`` requirement makes it a second environment), with their shipped ``example.jsonl``
  rows, under ``gym eval run`` with polygym's ``simple_agent`` and with NeMo Gym's
  (``nemo_gym: true``), and under ``gym env start`` joined by ``gym eval run --no-serve``;
* NeMo Gym's ``simple_agent`` against polygym's ``example_single_tool_call`` with NeMo Gym's rows.

Each row is played twice by the scripted model: the right play (NeMo Gym's verifier gives 1.0,
read from its app.py and restated here) and a wrong one (0.0).
"""

from __future__ import annotations

import ast
import json
import math
import os
import signal
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from polygym.collect.eval_run import METRICS_FALLBACK
from polygym.collect.run_files import RunFiles
from polygym.jsonl import iter_jsonl, write_jsonl
from polygym.stack.catalog import NEMO_GYM_ROOT_ENV_VAR, selector_paths
from polygym.stack.config import load_config
from polygym.stack.env_build import CACHE_ENV_VAR, PYTHON_ENV_VAR, ensure_env
from polygym.stack.nemo_gym_server import env_inputs, is_nemo_gym_server
from tests.conftest import gym_command, run_gym
from tests.nemo_gym_wheel import NEMO_GYM_PYTHON, env_cache, nemo_gym_tree

pytestmark = [pytest.mark.e2e, pytest.mark.nemo_gym]

Turns = list[dict[str, Any]]
BUILD_TIMEOUT_S = 1800
"""The first run on a machine builds NeMo Gym's environment (pip, ~300 packages)."""

# NeMo Gym's math_advanced_calculations tools (its math_advanced_calculations_tools.py), restated.
CALCULATORS: dict[str, Callable[..., float]] = {
    "multiply": lambda a, b: 1.1 * a * b,
    "divide": lambda a, b: 0.5 * a / b,
    "add": lambda a, b: a + b + 1.2,
    "subtract": lambda a, b: a - b - 3,
    "power": lambda a, b: a ** (b + 2),
    "log": lambda a, base: math.log(a, abs(base + 1.5)),
    "sin": lambda radians: math.cos(radians),
    "cos": lambda radians: math.sin(radians),
    "negate": lambda a: a,
    "pi": lambda: math.e,
    "return_constant": lambda a: a,
}
OPERATORS = {ast.Mult: "multiply", ast.Div: "divide", ast.Add: "add", ast.Sub: "subtract", ast.Pow: "power"}
ARGUMENTS = {"sin": ("radians",), "cos": ("radians",), "log": ("a", "base"), "negate": ("a",)}


def _call(name: str, values: list[float], plays: Turns) -> float:
    names = ARGUMENTS.get(name, ("a", "b")[: len(values)])
    plays.append({"tool": name, "arguments": dict(zip(names, values, strict=True))})
    return CALCULATORS[name](*values)


def _play(node: ast.expr, plays: Turns, top: bool = False) -> float:
    """Evaluate ``node`` with the tools, appending each call the model must make, innermost first."""
    if isinstance(node, ast.Constant):
        value = float(node.value)
        return _call("return_constant", [value], plays) if top else value
    if isinstance(node, ast.Name) and node.id == "pi":
        return _call("pi", [], plays)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _call("negate", [_play(node.operand, plays)], plays)
    if isinstance(node, ast.BinOp):
        return _call(OPERATORS[type(node.op)], [_play(node.left, plays), _play(node.right, plays)], plays)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return _call(node.func.id, [_play(arg, plays) for arg in node.args], plays)
    raise AssertionError(f"unexpected expression {ast.dump(node)}")


def calculations(row: dict[str, Any]) -> tuple[Turns, Turns]:
    """Every value asked for, computed with the tools (NeMo Gym rewards 1 when each ground-truth
    value is among the tool outputs); answering without tools gets 0."""
    prompt = row["responses_create_params"]["input"][-1]["content"]
    asked = prompt.split(" for ", 1)[1].rsplit(" using only", 1)[0].replace(", and ", ", ")
    plays: Turns = []
    values = [_play(node, plays, top=True) for node in ast.parse(f"({asked},)", mode="eval").body.elts]  # type: ignore[attr-defined]
    assert all(any(math.isclose(v, t) for v in values) for t in json.loads(row["ground_truth"])), prompt
    return [*plays, {"answer": "Done."}], [{"answer": "I cannot compute that."}]


FORMATS = {
    "mixed_inline_numbered_heading": '1. "Ada": a mathematician\n2. "Paris": a city\n3. "Nile": a river',
    "kv_equals": "alpha = 1\nbeta = 2\ngamma = 3",
    "bullet_double_dash": "-- one\n-- two\n-- three",
    "web_mixed_paragraphs_bullets": "Some context.\n- one\n- two\n- three",
    "bullet_arrow": "→ one\n→ two\n→ three",
}


def formatting(row: dict[str, Any]) -> tuple[Turns, Turns]:
    """Three lines in the asked format pass NeMo Gym's regex verifier; one plain sentence does not."""
    return [{"answer": FORMATS[row["verifier"]["pattern_id"]]}], [{"answer": "A single plain sentence."}]


def minutes(text: str) -> int:
    """``"11:45am"``, ``"1pm"`` or ``"13:00"`` as minutes after midnight (NeMo Gym's calendar formats)."""
    text = text.strip()
    half = 12 * 60 if text.endswith("pm") else 0
    hours, _, mins = text.removesuffix("am").removesuffix("pm").partition(":")
    hour = int(hours)
    if text.endswith(("am", "pm")) and hour == 12:
        hour = 0
    return hour * 60 + int(mins or 0) + half


def start_window(event: dict[str, Any]) -> tuple[int, int]:
    """The earliest and latest start that keep ``event`` inside its hours and its constraint."""
    low, high = minutes(event["min_time"]), minutes(event["max_time"]) - event["duration"]
    kind, _, when = (event.get("constraint") or "").partition(" ")
    if kind == "before":
        high = min(high, minutes(when) - event["duration"])
    elif kind == "after":
        low = max(low, minutes(when))
    elif kind == "between":
        first, second = when.split(" and ")
        low, high = max(low, minutes(first)), min(high, minutes(second) - event["duration"])
    elif kind == "at":
        low = high = minutes(when)
    return low, high


def schedule(events: list[dict[str, Any]], placed: dict[str, int]) -> dict[str, int] | None:
    """Start times for every event, none overlapping (backtracking over 5-minute steps)."""
    if len(placed) == len(events):
        return placed
    event = events[len(placed)]
    low, high = start_window(event)
    taken = [(placed[str(e["event_id"])], e["duration"]) for e in events[: len(placed)]]
    for start in range(low, high + 1, 5):
        if all(start + event["duration"] <= s or start >= s + d for s, d in taken):
            found = schedule(events, {**placed, str(event["event_id"]): start})
            if found is not None:
                return found
    return None


def scheduling(row: dict[str, Any]) -> tuple[Turns, Turns]:
    """The last turn of a multi-turn conversation: a calendar (JSON list) meeting every constraint
    gets 1 from NeMo Gym's grader; an answer with no calendar gets 0."""
    events = list(row["exp_cal_state"].values())
    starts = schedule(events, {})
    assert starts is not None, row["exp_cal_state"]
    calendar = [
        {
            "event_id": e["event_id"],
            "start_time": f"{starts[str(e['event_id'])] // 60:02d}:{starts[str(e['event_id'])] % 60:02d}",
            "duration": e["duration"],
        }
        for e in events
    ]
    return [{"answer": json.dumps(calendar)}], [{"answer": "I could not fit those in."}]


def weather(row: dict[str, Any]) -> tuple[Turns, Turns]:
    return [{"tool": "get_weather", "arguments": {"city": "Paris"}}, {"answer": "Cold."}], [{"answer": "No."}]


ENVIRONMENTS = {
    "math_advanced_calculations": ("math_advanced_calculations_simple_agent", calculations),
    "format_verification": ("freeform_formatting_simple_agent", formatting),
    "calendar": ("calendar_simple_agent", scheduling),
}
"""NeMo Gym environments polygym does not ship: folder -> (agent of its config, scripted plays)."""


def shipped_rows(root: Path, env: str) -> list[dict[str, Any]]:
    return list(iter_jsonl(root / "resources_servers" / env / "data" / "example.jsonl"))


def scripted(row: dict[str, Any], agent: str, case: str, turns: Turns) -> dict[str, Any]:
    params = {**row["responses_create_params"], "metadata": {"script": json.dumps(turns), "case": case}}
    agent_ref = {"type": "responses_api_agents", "name": agent}
    return {**row, "responses_create_params": params, "agent_ref": agent_ref, "nemo_gym_case": case}


def cases(
    root: Path, plays: dict[str, tuple[str, Callable[[dict[str, Any]], tuple[Turns, Turns]]]]
) -> list[dict[str, Any]]:
    rows = []
    for env, (agent, play) in plays.items():
        for index, row in enumerate(shipped_rows(root, env)):
            right, wrong = play(row)
            rows += [
                scripted(row, agent, f"{env}/{index}/right", right),
                scripted(row, agent, f"{env}/{index}/wrong", wrong),
            ]
    return rows


def build_environments(root: Path) -> None:
    """Every environment these tests use, built now if the cache lacks it (a stack's start then
    takes seconds, whichever test runs first)."""
    config = root / "resources_servers/format_verification/configs/freeform_formatting.yaml"
    paths = selector_paths(["math_advanced_calculations", "calendar"], ["scripted_model"], [str(config)])
    loaded = load_config(paths, ["++calendar_simple_agent.responses_api_agents.simple_agent.nemo_gym=true"])
    for spec in loaded.servers.values():
        if is_nemo_gym_server(spec):
            ensure_env(env_inputs(spec, loaded))


@pytest.fixture(scope="module")
def nemo_root() -> Iterator[Path]:
    """NeMo Gym 0.7.0's tree, its environments cached with the test cache, Python 3.13.0."""
    if not NEMO_GYM_PYTHON.is_file():
        pytest.fail(f"these tests need Python 3.13.0 at {NEMO_GYM_PYTHON} (pyenv install 3.13.0)")
    root = nemo_gym_tree()
    saved = {name: os.environ.get(name) for name in (NEMO_GYM_ROOT_ENV_VAR, CACHE_ENV_VAR, PYTHON_ENV_VAR)}
    os.environ[NEMO_GYM_ROOT_ENV_VAR] = str(root)
    os.environ[CACHE_ENV_VAR] = str(env_cache())
    os.environ[PYTHON_ENV_VAR] = str(NEMO_GYM_PYTHON)
    build_environments(root)
    yield root
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def run_eval(cwd: Path, *args: str) -> dict[str, dict[str, Any]]:
    done = subprocess.run(
        gym_command("eval", "run", *args, "--input", "in.jsonl", "--output", "out.jsonl"),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = RunFiles(cwd / "out.jsonl")
    assert list(iter_jsonl(files.failures)) == []
    # NeMo Gym's verifiers answer their own request model, which drops unknown row fields; the
    # case travels in the request's metadata, which every Response keeps.
    return {row["responses_create_params"]["metadata"]["case"]: row for row in iter_jsonl(files.output)}


def assert_environment_metrics(cwd: Path, agents: set[str]) -> None:
    """Each agent's entry holds its NeMo Gym environment's own metrics (NeMo Gym's reward
    profile: per-task ``reward_profile_completion_pct``, ``perf_summary``), not polygym's generic
    stand-in, which a failed ``/aggregate_metrics`` call would leave (marked ``metrics_fallback``)."""
    entries = {e["agent_ref"]["name"]: e for e in json.loads(RunFiles(cwd / "out.jsonl").metrics.read_text())}
    assert set(entries) == agents
    for entry in entries.values():
        assert METRICS_FALLBACK not in entry
        assert "perf_summary" in entry
        assert all("reward_profile_completion_pct" in task for task in entry["group_level_metrics"])
        assert entry["agent_metrics"]["mean/reward"] == 0.5


def expected_rewards(rows: list[dict[str, Any]]) -> dict[str, float]:
    return {row["nemo_gym_case"]: 1.0 if row["nemo_gym_case"].endswith("right") else 0.0 for row in rows}


@pytest.mark.parametrize("agent_from", ["polygym", "nemo_gym"])
def test_nemo_gym_environments_run_unchanged_under_eval_run(
    nemo_root: Path, tmp_path: Path, agent_from: str
) -> None:
    rows = cases(nemo_root, ENVIRONMENTS)
    write_jsonl(rows, tmp_path / "in.jsonl")
    # NeMo Gym's simple_agent has no step limit; polygym's stops at 10 model turns, fewer than the
    # longest calculation takes (and it would then report incomplete_details.reason "max_steps",
    # which NeMo Gym's Response model does not accept at /verify).
    mark = "nemo_gym=true" if agent_from == "nemo_gym" else "max_steps=40"
    marks = [f"++{agent}.responses_api_agents.simple_agent.{mark}" for agent, _ in ENVIRONMENTS.values()]
    config = nemo_root / "resources_servers/format_verification/configs/freeform_formatting.yaml"
    results = run_eval(
        tmp_path,
        *("--model-type", "scripted_model", "--resources-server", "math_advanced_calculations"),
        *("--resources-server", "calendar", "--config", str(config), *marks),
    )
    assert {case: row["reward"] for case, row in results.items()} == expected_rewards(rows)
    assert_environment_metrics(tmp_path, {agent for agent, _ in ENVIRONMENTS.values()})
    right = results["math_advanced_calculations/0/right"]["response"]["output"]
    outputs = [json.loads(item["output"]) for item in right if item["type"] == "function_call_output"]
    assert outputs == [
        {"solution": -3.0},
        {"solution": 0.5},
        {"solution": pytest.approx(9.9)},
        {"solution": pytest.approx(math.cos(5.0))},
    ]


def test_nemo_gym_simple_agent_against_a_polygym_server(nemo_root: Path, tmp_path: Path) -> None:
    agent = "example_single_tool_call_simple_agent"
    rows = cases(nemo_root, {"example_single_tool_call": (agent, weather)})
    write_jsonl(rows, tmp_path / "in.jsonl")
    results = run_eval(
        tmp_path,
        *("--model-type", "scripted_model", "--resources-server", "example_single_tool_call"),
        f"++{agent}.responses_api_agents.simple_agent.nemo_gym=true",
    )
    assert {case: row["reward"] for case, row in results.items()} == expected_rewards(rows)


def test_gym_env_start_serves_a_nemo_gym_environment(
    nemo_root: Path, tmp_path: Path, start_stack: Any
) -> None:
    stack = start_stack(
        *("--model-type", "scripted_model", "--resources-server", "math_advanced_calculations"),
        "++math_advanced_calculations_simple_agent.responses_api_agents.simple_agent.max_steps=40",
    )
    servers = {s["name"]: s for s in stack.record["servers"]}
    nemo = servers["math_advanced_calculations"]
    assert nemo.get("nemo_gym") is True and nemo["pid"] != stack.proc.pid
    with urllib.request.urlopen(f"{stack.record['head_url']}/server_instances", timeout=10) as reply:
        instances = {i["process_name"]: i for i in json.load(reply)}
    assert instances["math_advanced_calculations"]["url"] == nemo["url"]
    rows = cases(nemo_root, {"math_advanced_calculations": ENVIRONMENTS["math_advanced_calculations"]})
    write_jsonl(rows, tmp_path / "in.jsonl")
    results = run_eval(tmp_path, "--no-serve", "--head-url", stack.record["head_url"])
    assert {case: row["reward"] for case, row in results.items()} == expected_rewards(rows)
    os.kill(nemo["pid"], signal.SIGKILL)  # a NeMo Gym server that dies stops the stack, named
    assert stack.wait(60) == 1
    assert "NeMo Gym server 'math_advanced_calculations'" in stack.output()
    assert "killed by signal 9" in stack.output()


def test_gym_data_validate_checks_a_nemo_gym_environments_rows_without_importing_it(
    nemo_root: Path, tmp_path: Path
) -> None:
    """polygym's process has no fastapi nor nemo_gym: the rows get the generic checks, and the
    report says the server checks its own schema when it runs."""
    rows = nemo_root / "resources_servers/math_advanced_calculations/data/example.jsonl"
    done = run_gym("data", "validate", "--env", "math_advanced_calculations", str(rows), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 rows checked: no problems" in done.stdout
    assert "is a NeMo Gym server: its rows got the generic checks only" in " ".join(done.stdout.split())
    broken = tmp_path / "broken.jsonl"
    write_jsonl(
        [{"agent_ref": {"type": "responses_api_agents", "name": "math_advanced_calculations_simple_agent"}}],
        broken,
    )
    done = run_gym("data", "validate", str(broken), cwd=tmp_path)
    assert done.returncode == 1 and "responses_create_params" in done.stderr


def test_a_blend_with_a_nemo_gym_environment_runs_stepwise(nemo_root: Path, tmp_path: Path) -> None:
    agent, play = ENVIRONMENTS["math_advanced_calculations"]
    right = [
        row
        for row in cases(nemo_root, {"math_advanced_calculations": (agent, play)})
        if "right" in row["nemo_gym_case"]
    ]
    write_jsonl(right, tmp_path / "math.jsonl")
    (tmp_path / "spec.yaml").write_text(
        "environments:\n"
        "  - name: math_advanced_calculations\n    train: math.jsonl\n"
        "  - name: example_single_tool_call\n"
        "prompts_per_step: 4\nresponses_per_prompt: 1\nseed: 3\n"
    )
    done = run_gym(
        *("eval", "run", "--blend", "spec.yaml", "--steps", "1", "--model-type", "scripted_model"),
        f"++{agent}.responses_api_agents.simple_agent.max_steps=40",
        *("--output", "out.jsonl"),
        cwd=tmp_path,
        timeout=BUILD_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = RunFiles(tmp_path / "out.jsonl")
    assert list(iter_jsonl(files.failures)) == []
    rewards = {(row["agent_ref"]["name"], row["reward"]) for row in iter_jsonl(files.output)}
    assert rewards == {(agent, 1.0), ("example_single_tool_call_simple_agent", 1.0)}
    entries = {e["agent_ref"]["name"]: e for e in json.loads(files.metrics.read_text())}
    assert METRICS_FALLBACK not in entries[agent]
