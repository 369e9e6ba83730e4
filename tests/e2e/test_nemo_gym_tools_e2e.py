"""Each project's evaluation tools on the other's files, with NeMo Gym 0.7.0's own code.

One direction: a `gym eval run` of polygym (scripted model, loopback) is read by NeMo Gym's
``gym eval profile``, ``compare`` and ``health-check`` and by its reverify's planning (the pairing of
rollouts with materialized inputs, the payload, the resources server it picks from polygym's
config); and NeMo Gym's ``/aggregate_metrics`` statistics are computed from the same rollouts by
both projects and compared key by key. The other direction: the run's rows made into NeMo Gym
0.7's files *by NeMo Gym's code* (its collector's stamps, failure rows and aggregation) are read
by polygym's `gym eval compare`, `gym eval reverify --failed-only` and the viewer's index.

NeMo Gym's tools run in the environment of ``tests/nemo_gym_tools.py`` (built once, cached).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from polygym import metrics
from polygym.collect.run_files import RunFiles
from polygym.jsonl import iter_jsonl, write_jsonl
from polygym.stack.catalog import selector_paths
from polygym.stack.config import load_config
from polygym.view.index import open_index
from polygym.view.runs import discover
from tests.conftest import ROOT, run_gym
from tests.nemo_gym_tools import run_nemo_gym, run_nemo_gym_code, tools_python

pytestmark = [pytest.mark.e2e, pytest.mark.nemo_gym]

ENV = "example_single_tool_call"
AGENT = f"{ENV}_simple_agent"
STACK = ("--model-type", "scripted_model", "--resources-server", ENV)


@pytest.fixture(scope="module")
def ng_python() -> Path:
    return tools_python()


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five rows, two repeats each, collected by polygym once for the module (a stack's start and a
    run); each test reads a copy of its files."""
    folder = tmp_path_factory.mktemp("collected")
    data = ROOT / "resources_servers" / ENV / "data" / "example.jsonl"
    args = ("--input", str(data), "--output", "pg.jsonl", "--num-repeats", "2")
    done = run_gym("eval", "run", *STACK, *args, cwd=folder, timeout=300)
    assert done.returncode == 0, done.stderr
    return folder


def polygym_run(collected: Path, tmp_path: Path) -> RunFiles:
    """The module's polygym run, its files copied into ``tmp_path`` (the test's working folder)."""
    shutil.copytree(collected, tmp_path, dirs_exist_ok=True)
    return RunFiles(tmp_path / "pg.jsonl")


def polygym_metrics(files: RunFiles) -> dict[str, Any]:
    [entry] = orjson.loads(files.metrics.read_bytes())
    return entry["agent_metrics"]


REVERIFY_PLAN = """
import json, sys
from pathlib import Path
from nemo_gym.rollout_reverification import (
    OutputPaths, _build_agent_to_resources_server_mapping, _prepare_payloads, _rs_for_row)
inputs, rollouts, config = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text())
out = OutputPaths(output=Path("r.jsonl"), failures=Path("r_failures.jsonl"))
payloads = _prepare_payloads(inputs, rollouts, out, resume_from_cache=False)
mapping = _build_agent_to_resources_server_mapping(config)
print(json.dumps({"payloads": payloads, "servers": [_rs_for_row(p, mapping, config) for p in payloads]}))
"""


def test_nemo_gyms_tools_give_full_results_on_our_files(
    collected: Path, tmp_path: Path, ng_python: Path
) -> None:
    files = polygym_run(collected, tmp_path)
    ours = polygym_metrics(files)

    profile = run_nemo_gym(
        ng_python,
        "eval",
        "profile",
        "--inputs",
        str(files.materialized),
        "--rollouts",
        str(files.output),
        cwd=tmp_path,
    )
    assert profile.returncode == 0, profile.stderr[-3000:]
    assert "Reward profile completion: 10/10 rollout rows (100.00%)" in profile.stdout
    [theirs] = json.loads((tmp_path / "pg_agent_metrics.json").read_text())
    assert theirs["agent_ref"]["name"] == AGENT
    for key in ("mean/reward", "std/reward", "mean/input_tokens", "std/output_tokens", "max/total_tokens"):
        assert theirs[key] == pytest.approx(ours[key]), key

    compare = run_nemo_gym(
        ng_python,
        "eval",
        "compare",
        "--baseline",
        "pg.jsonl",
        "--candidates",
        "pg.jsonl",
        "-o",
        "cmp",
        cwd=tmp_path,
    )
    assert compare.returncode == 0, compare.stderr[-3000:]
    assert f"Agents compared: {AGENT}" in compare.stdout
    assert "Sample flips: 0 fail→pass, 0 pass→fail over 5 common tasks" in compare.stdout

    health = run_nemo_gym(
        ng_python,
        "eval",
        "health-check",
        str(tmp_path),
        "--rollouts-file",
        "pg.jsonl",
        "--json",
        cwd=tmp_path,
    )
    assert health.returncode == 0, health.stderr[-3000:]
    report = json.loads(health.stdout)["run"]
    assert report["artifacts"]["records"] == 10 and report["verdicts"]["unhealthy"] == 0
    assert not any(report["issues"].values())
    coverage = report["artifacts"]["coverage"]
    for check in ("record_unreadable", "rollout_duplicate_identity"):
        assert coverage[check]["evaluated"] == 10, check
    # Its turn-level checks read NeMo Gym's model-call capture (ng_trajectory), which polygym does
    # not write: they report the rollouts "unobserved", not unhealthy.
    assert coverage["agent_turn_hollow"]["unobserved"] == 10

    config = load_config(selector_paths([ENV], ["scripted_model"], []), env_files=[])
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    plan = run_nemo_gym_code(
        ng_python, REVERIFY_PLAN, str(files.materialized), str(files.output), "config.json", cwd=tmp_path
    )
    assert plan.returncode == 0, plan.stderr[-3000:]
    planned = json.loads(plan.stdout.splitlines()[-1])
    assert planned["servers"] == [ENV] * 10
    sent = {(r["_ng_task_index"], r["_ng_rollout_index"]): r for r in iter_jsonl(files.materialized)}
    for payload in planned["payloads"]:
        key = (payload["_ng_task_index"], payload["_ng_rollout_index"])
        assert {k: v for k, v in payload.items() if k != "response"} == sent[key]


AGGREGATE = """
import json, sys
from nemo_gym.reward_profile import compute_aggregate_metrics
rows = [json.loads(line) for line in open(sys.argv[1])]
print(json.dumps(compute_aggregate_metrics(rows).model_dump(mode="json")))
"""


def perf(task: int, repeat: int) -> dict[str, Any]:
    """An ``ng_perf`` record as polygym writes it; one rollout has none, one has no token counts."""
    if (task, repeat) == (0, 1):
        return {}
    record = {"total_latency_ms": 100.0 * task + 7 * repeat, "num_turns": 1 + task, "num_tool_calls": task}
    if (task, repeat) == (2, 2):
        return {"ng_perf": {**record, "token_observability_coverage": 0.0}}
    tokens = {"prompt_tokens": 10 + task, "completion_tokens": 3 * repeat + 1, "reasoning_tokens": task}
    return {"ng_perf": {**record, "token_observability_coverage": 1.0, **tokens}}


def test_our_statistics_are_nemo_gyms_on_the_same_rollouts(tmp_path: Path, ng_python: Path) -> None:
    """Sample std, ``mask_sample`` (left out, counted in ``coverage/*``), usage at the top level,
    and ``perf_summary`` over the ``ng_perf`` records (masked rollouts included)."""
    rollouts = [
        {
            "_ng_task_index": task,
            "_ng_rollout_index": repeat,
            "reward": [1.0, 0.0, 0.5][(task + repeat) % 3],
            "score": task * 1.5 + repeat,
            "mask_sample": task == 3 and repeat == 0,
            "response": {
                "usage": {"input_tokens": 10 + task, "output_tokens": 3 * repeat + 1, "total_tokens": 20}
            },
            **perf(task, repeat),
        }
        for task in range(4)
        for repeat in range(3)
    ]
    write_jsonl(rollouts, tmp_path / "rollouts.jsonl")
    done = run_nemo_gym_code(ng_python, AGGREGATE, "rollouts.jsonl", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    their_block = json.loads(done.stdout.splitlines()[-1])
    our_block = metrics.aggregate(rollouts)
    assert "total_latency_p99_ms" in their_block["perf_summary"]
    assert "mean_cached_prompt_tokens" not in their_block["perf_summary"]  # no record counts them
    assert our_block["perf_summary"] == pytest.approx(their_block["perf_summary"])
    theirs, ours = their_block["agent_metrics"], our_block["agent_metrics"]
    shared = sorted(
        k for k in theirs if k.split("/")[0] in ("mean", "std", "min", "max", "median", "coverage")
    )
    assert len(shared) > 20 and "std/reward" in shared and "coverage/masked_rollouts" in shared
    assert {k: ours.get(k) for k in shared} == pytest.approx({k: theirs[k] for k in shared})
    assert ours["num_repeats"] == theirs["num_repeats"]


AS_NEMO_GYM = """
import json, sys
from pathlib import Path
from nemo_gym.global_config import legacy_environment_server_name
from nemo_gym.reward_profile import compute_aggregate_metrics
from nemo_gym.rollout_collection import (
    NG_ENVIRONMENT_SERVER_KEY, NG_FAILURE_CLASS_KEY, NG_RESULT_TYPE_KEY, _agent_request_failure_row)
source, target = Path(sys.argv[1]), Path(sys.argv[2])
rows = [json.loads(line) for line in source.open()]
agent = rows[0]["agent_ref"]["name"]
server = legacy_environment_server_name(agent, "simple_agent")
stamp = lambda row, result: {**result, "_ng_task_index": row["_ng_task_index"],
    "_ng_rollout_index": row["_ng_rollout_index"], "agent_ref": {"name": agent},
    NG_ENVIRONMENT_SERVER_KEY: server, NG_RESULT_TYPE_KEY: "legacy_agent"}
judged, lost, kept = rows[0], rows[1], rows[2:]
failures = [
    stamp(judged, {**judged, NG_FAILURE_CLASS_KEY: "judge_failed", "reward": 0.0}),
    stamp(lost, _agent_request_failure_row(TimeoutError("no reply"), None)),
]
results = [stamp(row, row) for row in kept]
write = lambda path, items: path.write_text("".join(json.dumps(i) + "\\n" for i in items))
write(target, results)
write(target.with_name(target.stem + "_failures.jsonl"), failures)
inputs = source.with_name(source.stem + "_materialized_inputs.jsonl").read_text()
target.with_name(target.stem + "_materialized_inputs.jsonl").write_text(inputs)  # agent_ref as in the data
entry = {"agent_ref": {"name": agent}, NG_ENVIRONMENT_SERVER_KEY: server,
    **compute_aggregate_metrics(results).model_dump(mode="json", exclude_none=True)}
target.with_name(target.stem + "_aggregate_metrics.json").write_text(json.dumps([entry]))
"""


def test_our_tools_read_nemo_gyms_files(collected: Path, tmp_path: Path, ng_python: Path) -> None:
    files = polygym_run(collected, tmp_path)
    made = run_nemo_gym_code(ng_python, AS_NEMO_GYM, str(files.output), "ng.jsonl", cwd=tmp_path)
    assert made.returncode == 0, made.stderr[-3000:]
    nemo = RunFiles(tmp_path / "ng.jsonl")

    compare = run_gym("eval", "compare", "pg.jsonl", "ng.jsonl", "--format", "json", cwd=tmp_path)
    assert compare.returncode == 0, compare.stderr
    report = json.loads(compare.stdout)
    assert AGENT in json.dumps(report)

    index = open_index(discover(nemo.output))
    assert len(index) == 10
    assert {index.envs[e] for e in index.env} == {AGENT}
    assert sorted(index.classes[c] for c in index.failure_class if c >= 0) == [
        "agent_request_failed",
        "judge_failed",
    ]

    reverify = run_gym("eval", "reverify", *STACK, "--rollouts", "ng.jsonl", "--failed-only", cwd=tmp_path)
    assert reverify.returncode == 0, reverify.stderr
    out = list(iter_jsonl(tmp_path / "ng_reverified.jsonl"))
    assert len(out) == 9  # 8 carried, the judge_failed one verified again
    judged = next(f for f in iter_jsonl(nemo.failures) if f["_ng_failure_class"] == "judge_failed")
    key = (judged["_ng_task_index"], judged["_ng_rollout_index"])
    redone = next(r for r in out if (r["_ng_task_index"], r["_ng_rollout_index"]) == key)
    assert redone["reward"] == 1.0 and "_ng_failure_class" not in redone
    diff = json.loads((tmp_path / "ng_reverify_diff.json").read_text())
    assert diff["per_environment"]["_all"]["fixed"] == 1
    assert diff["not_reverifiable_no_response"] == 1
