"""NeMo Gym's stored rollouts replayed by NeMo Gym's own reverify and by ``gym eval reverify``.

One folder at a time: polygym starts the folder's stack from NeMo Gym's own config (its servers
unchanged, in their cached environments, the scripted model as policy and as any judge), then
both reverifies run against that one stack, so the only difference is the reverify itself.
NeMo Gym's runs in the folder's environment with NeMo Gym 0.7.0's ``RolloutReverificationHelper``
(``nemo_gym_reverify.py``; its CLI would start a stack of its own first), with ``++force=true``
since most of NeMo Gym's servers leave ``reverify_mode`` unknown. polygym's is
``gym eval reverify --no-serve --head-url ... --force``.

NeMo Gym's reverify needs the run's materialized inputs; a folder that stores none is replayed
on its stored rows less ``response`` and ``reward`` (numbered by line where they carry no
indices) in both systems, and says so (``inputs``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from polygym.jsonl import iter_jsonl, write_jsonl
from polygym.row import ROLLOUT_INDEX, TASK_INDEX
from polygym.stack.directives import DELETE_KEY
from polygym.stack.env_build import CACHE_ENV_VAR, PYTHON_ENV_VAR
from tests.nemo_gym_wheel import NEMO_GYM_PYTHON, env_cache

NEMO_GYM_REVERIFY = Path(__file__).with_name("nemo_gym_reverify.py")
READY = re.compile(r"head server (http://127\.0\.0\.1:\d+)")
STORED = "stored"
MATERIALIZED = "materialized"
RESULTS = ("response", "reward")
JUDGE_CONFIG = Path(__file__).with_name("nemo_gym_fixed_judge.yaml")
"""The scripted model's rule that answers every judge prompt with one fixed verdict."""
POLICY = "policy_model"
REVERIFY_S = 600
"""Per reverify: a judge environment's verifier on a loaded 2-core machine took over 300 s."""
POLICY_VALUES = ("policy_base_url", "policy_api_key", "policy_model_name")
MODELS = "responses_api_models"


@dataclass
class Replay:
    """One folder's stored rollouts and the rewards each reverify gave them, by ``(task, rollout)``."""

    folder: str
    inputs: str = MATERIALIZED
    stored: dict[tuple[int, int], float | None] = field(default_factory=dict)
    nemo_gym: dict[tuple[int, int], float] = field(default_factory=dict)
    polygym: dict[tuple[int, int], float] = field(default_factory=dict)
    error: str = ""
    """Why nothing was replayed (the stack did not start, NeMo Gym refused, ...)."""

    def equal_to_nemo_gym(self) -> int:
        return sum(1 for k, v in self.nemo_gym.items() if self.polygym.get(k) == v)


def _key(row: dict[str, Any]) -> tuple[int, int]:
    return int(row[TASK_INDEX]), int(row[ROLLOUT_INDEX])


def config_agent(config: Path) -> str | None:
    """The first agent instance of a NeMo Gym config (the one its example rows name)."""
    loaded = yaml.safe_load(config.read_text()) or {}
    for name, block in loaded.items():
        if isinstance(block, dict) and "responses_api_agents" in block:
            return str(name)
    return None


def _model_refs(block: Any) -> Iterator[str]:
    """The names of every model server a config block points at (``{type: responses_api_models, name}``)."""
    if isinstance(block, dict):
        if block.get("type") == MODELS and isinstance(block.get("name"), str):
            yield block["name"]
        for value in block.values():
            yield from _model_refs(value)
    elif isinstance(block, list):
        for value in block:
            yield from _model_refs(value)


def undefined_models(config: Path) -> set[str]:
    """The model servers ``config`` names and does not define, besides the policy: the judges of
    configs that name their own (``genrm_model``, ``judge_model``, ...), user simulators.
    ``???`` (a value the user must give) is not one, so such a config still says why it fails."""
    loaded = yaml.safe_load(config.read_text()) or {}
    return set(_model_refs(loaded)) - set(loaded) - {POLICY, "???"}


def defined_models(config: Path) -> dict[str, list[str]]:
    """The model servers ``config`` defines, with their implementations: a judge or user simulator
    pointed at an outside endpoint (``judge_model: {openai_model: {openai_base_url:
    ${judge_base_url}}}``, the URL left null or unset until the user supplies one)."""
    loaded = yaml.safe_load(config.read_text()) or {}
    return {
        str(name): list(block[MODELS])
        for name, block in loaded.items()
        if isinstance(block, dict) and isinstance(block.get(MODELS), dict)
    }


def stands_in_for(config: Path) -> set[str]:
    """The model servers the fixed judge serves besides the policy: those ``config`` names without
    defining them, which would have no server on this stack, and those it defines, whose outside
    endpoint this machine does not have (the same judge then answers both reverifies)."""
    return (undefined_models(config) | set(defined_models(config))) - {POLICY}


def judge_config(config: Path, work: Path) -> Path:
    """The fixed-verdict judge as ``policy_model`` (NeMo Gym's default judge) and as every model
    server it stands in for; a server ``config`` defines has its own implementation removed by
    NeMo Gym's ``_delete_key``, so one implementation is left under its name."""
    fixed = yaml.safe_load(JUDGE_CONFIG.read_text())[POLICY]
    defined = defined_models(config)
    blocks: dict[str, Any] = {}
    for name in sorted({POLICY, *stands_in_for(config)}):
        block = copy.deepcopy(fixed)
        replaced = [impl for impl in defined.get(name, []) if impl not in block[MODELS]]
        if replaced:
            block[MODELS][DELETE_KEY] = ", ".join(replaced)
        blocks[name] = block
    path = work / "fixed_judge.yaml"
    path.write_text(yaml.safe_dump(blocks))
    return path


def prepare(folder: Path, work: Path, agent: str | None) -> tuple[Path, str]:
    """The folder's stored rollouts and their inputs copied into ``work``; which inputs they are.
    Stored rows without indices are numbered by line (NeMo Gym's reverify needs them). Where the
    folder stores no materialized inputs, the stored rows less their results stand in, routed to
    ``agent`` where they name none; the stored rollouts are left as they are otherwise, so a row
    that only its materialized input routes stays so."""
    data = folder / "data"
    numbered = [
        row if TASK_INDEX in row and ROLLOUT_INDEX in row else {**row, TASK_INDEX: i, ROLLOUT_INDEX: 0}
        for i, row in enumerate(iter_jsonl(data / "example_rollouts.jsonl"))
    ]
    rollouts = work / "example_rollouts.jsonl"
    write_jsonl(numbered, rollouts)
    materialized = data / "example_rollouts_materialized_inputs.jsonl"
    inputs = work / "example_rollouts_materialized_inputs.jsonl"
    if materialized.is_file():
        inputs.write_bytes(materialized.read_bytes())
        return rollouts, MATERIALIZED
    route = {"agent_ref": {"type": "responses_api_agents", "name": agent}} if agent else {}
    write_jsonl([{**route, **{k: v for k, v in r.items() if k not in RESULTS}} for r in numbered], inputs)
    return rollouts, STORED


def nemo_gym_python() -> Path | None:
    """An environment polygym built with nemo-gym in it (the reverify code is the same in each)."""
    for env in sorted(env_cache().glob("py*")):
        if (env / "bin" / "python").is_file() and list(env.glob("lib/python*/site-packages/nemo_gym")):
            return env / "bin" / "python"
    return None


def _gym(*args: str) -> list[str]:
    return [sys.executable, "-m", "polygym", *args]


def _start(
    root: Path,
    configs: list[Path],
    work: Path,
    deadline_s: float,
    ray_dir: str,
    overrides: Sequence[str] = (),
) -> tuple[subprocess.Popen[str], str]:
    """``gym env start`` on any free port; its head URL once it says ready (else its log, raised).
    NeMo Gym's servers that use Ray and are given no cluster join the machine's latest one (named
    in Ray's temporary folder); on a shared machine that is another user's, of another Ray version,
    so the stack gets a temporary folder of its own (``ray_dir``) and its servers a new cluster."""
    args = ["env", "start", "--head-port", "0", "--nemo-gym-root", str(root)]
    # the replay never calls the policy: NeMo Gym's check that an environment's declared model
    # types include it (asr_with_pc: vllm_model only) is about a policy this run does not have
    args += ["--model-type", "scripted_model", "--allow-unsupported-pairing"]
    for config in configs:
        args += ["--config", str(config)]
    args += overrides
    env = {**os.environ, CACHE_ENV_VAR: str(env_cache()), PYTHON_ENV_VAR: str(NEMO_GYM_PYTHON)}
    env["RAY_TMPDIR"] = ray_dir
    with (work / "stack.log").open("w") as log:
        stack = subprocess.Popen(
            _gym(*args),
            cwd=work,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    try:
        return stack, _head_url(stack, work / "stack.log", deadline_s)
    except BaseException:  # a failed start, and a run stopped meanwhile, stop the stack too
        _stop(stack)
        raise


def _head_url(stack: subprocess.Popen[str], log: Path, deadline_s: float) -> str:
    """The head URL once the stack's log says it is ready; its log's tail, raised, if it never does."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        found = READY.search(log.read_text(errors="replace"))
        if found:
            return found.group(1)
        if stack.poll() is not None:
            break
        time.sleep(0.2)  # a start takes seconds; reading its short log costs ~nothing
    raise RuntimeError("stack did not start: " + " | ".join(_why(log.read_text(errors="replace"))))


def _why(log: str) -> list[str]:
    """polygym's error line and the last two lines after it (a server's log tail), else the log's
    last three: notes printed before the error would otherwise hide it."""
    lines = log.strip().splitlines()
    errors = [i for i, line in enumerate(lines) if line.startswith("error:")]
    return [lines[errors[-1]], *lines[errors[-1] + 1 :][-2:]] if errors else lines[-3:]


def policy_values(config: Path) -> list[str]:
    """The values ``config`` takes from what NeMo Gym's ``env.yaml`` holds for the policy's
    endpoint (``verifif``'s judge calls ``${policy_base_url}``; ``speed_bench`` takes that alone)."""
    text = config.read_text()
    return [key for key in POLICY_VALUES if f"${{{key}}}" in text]


@contextlib.contextmanager
def policy_endpoint(
    root: Path, work: Path, deadline_s: float, ray_dir: str, keys: list[str]
) -> Iterator[list[str]]:
    """The fixed judge on a stack of its own, as the overrides of ``keys`` that make it the
    policy's endpoint (env.yaml's values for NeMo Gym: an OpenAI-style base URL, a key, a model
    name), so a server that calls that endpoint directly gets the same judge as every other judge
    of the replay. Only the keys the config uses: an override nothing uses is refused."""
    (work / "endpoint").mkdir()
    stack, head = _start(root, [JUDGE_CONFIG], work / "endpoint", deadline_s, ray_dir)
    try:
        with urllib.request.urlopen(f"{head}/servers", timeout=30) as reply:
            urls = {entry["name"]: entry["url"] for entry in json.load(reply)}
        values = dict(zip(POLICY_VALUES, (f"{urls[POLICY]}/v1", "unused", "fixed_judge"), strict=True))
        yield [f"++{key}={values[key]}" for key in keys]
    finally:
        _stop(stack)


def _stop(stack: subprocess.Popen[str]) -> None:
    if stack.poll() is None:
        os.killpg(stack.pid, signal.SIGINT)
        try:
            stack.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(stack.pid, signal.SIGKILL)
            stack.wait(timeout=30)


def _rewards(path: Path) -> dict[tuple[int, int], float]:
    return (
        {_key(r): float(r["reward"]) for r in iter_jsonl(path) if isinstance(r.get("reward"), int | float)}
        if path.is_file()
        else {}
    )


def nemo_gym_reverify(python: Path, head: str, work: Path, timeout_s: float) -> dict[tuple[int, int], float]:
    host, port = head.removeprefix("http://").split(":")
    args = [
        *(str(python), str(NEMO_GYM_REVERIFY), "+rollouts_jsonl_fpath=example_rollouts.jsonl"),
        "+materialized_inputs_jsonl_fpath=example_rollouts_materialized_inputs.jsonl",
        *("+output_jsonl_fpath=nemo_gym.jsonl", "++force=true"),
        *(f"++head_server.host={host}", f"++head_server.port={port}"),
    ]
    done = subprocess.run(args, cwd=work, capture_output=True, text=True, timeout=timeout_s)
    (work / "nemo_gym.log").write_text(done.stdout + done.stderr)
    return _rewards(work / "unsafe_nemo_gym.jsonl") or _rewards(work / "nemo_gym.jsonl")


def polygym_reverify(head: str, rollouts: Path, timeout_s: float) -> dict[tuple[int, int], float]:
    args = ["eval", "reverify", "--no-serve", "--head-url", head, "--rollouts", str(rollouts)]
    args += ["--force", "--max-failures", "100%", "--overwrite"]
    done = subprocess.run(_gym(*args), cwd=rollouts.parent, capture_output=True, text=True, timeout=timeout_s)
    (rollouts.parent / "polygym.log").write_text(done.stdout + done.stderr)
    return _rewards(rollouts.with_name("example_rollouts_reverified.jsonl"))


def replay(
    root: Path,
    folder: str,
    config: Path,
    work: Path,
    judge: bool = False,
    with_nemo_gym: bool = True,
    start_s: float = 1800,
) -> Replay:
    """Both reverifies of ``folder``'s stored rollouts on one stack started from ``config``
    (polygym's alone when not ``with_nemo_gym``: the catalogue test compares with recorded data)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rollouts, inputs = prepare(root / "resources_servers" / folder, work, config_agent(config))
    result = Replay(folder, inputs)
    for row in iter_jsonl(rollouts):
        reward = row.get("reward")
        result.stored[_key(row)] = float(reward) if isinstance(reward, int | float) else None
    configs = [config, *([judge_config(config, work)] if judge else [])]
    # short: Ray's socket paths under it must fit in 107 characters
    with (
        tempfile.TemporaryDirectory(prefix="ray-", dir="/tmp", ignore_cleanup_errors=True) as ray_dir,
        contextlib.ExitStack() as endpoint,
    ):
        try:
            keys = policy_values(config)
            overrides = (
                endpoint.enter_context(policy_endpoint(root, work, start_s, ray_dir, keys)) if keys else []
            )
            stack, head = _start(root, configs, work, start_s, ray_dir, overrides)
        except RuntimeError as exc:
            result.error = str(exc)
            return result
        which = "NeMo Gym's"
        try:
            if with_nemo_gym:
                python = nemo_gym_python()
                if python is None:
                    result.error = f"no environment with nemo-gym under {env_cache()}"
                    return result
                result.nemo_gym = nemo_gym_reverify(python, head, work, REVERIFY_S)
            which = "polygym's"
            result.polygym = polygym_reverify(head, rollouts, REVERIFY_S)
        except subprocess.TimeoutExpired as late:  # one folder's slow verifier does not end the catalogue
            result.error = f"{which} reverify did not finish in {late.timeout:g} s"
        finally:
            _stop(stack)
    return result
