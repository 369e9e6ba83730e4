"""``gym env init``: a new environment folder that runs, checks and tests clean from the first minute.

The template is a small but complete task (multiply two numbers with a tool, then answer) rather
than a skeleton of TODOs, so that every piece can be run before it is changed: ``gym env check``
passes on it, its tests pass, and ``gym eval run`` with the scripted model collects rollouts. An
author then replaces the task one piece at a time and keeps a green check.

Generated files import ``app.py`` by path, never as ``resources_servers.<name>``: a user's folder
outside this checkout is not part of the installed ``resources_servers`` package (the loader loads
it from its file too). The folder is written under a hidden staging name and renamed into place
only once the dataset has been generated, so a failed init leaves nothing half-made behind.

Templates live here as strings (not package data) so an installed wheel always carries them.
"""

from __future__ import annotations

import keyword
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from polygym.kinds import RESOURCES_KIND

NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,63}")
GENERATE_TIMEOUT_S = 120.0


class ScaffoldError(Exception):
    """The environment cannot be created; the message says why and what to do."""


def check_name(name: str) -> None:
    """Raise ScaffoldError unless ``name`` is a lowercase identifier usable as a folder and config key."""
    if not NAME_PATTERN.fullmatch(name) or keyword.iskeyword(name):
        raise ScaffoldError(
            f"invalid environment name {name!r}: use 1-64 lowercase letters, digits and underscores, "
            "starting with a letter (e.g. 'my_env'); it names the folder, the config instance and "
            "the agent '<name>_simple_agent'"
        )


def class_name(name: str) -> str:
    """``my_env`` -> ``MyEnv``: the server class name in the generated ``app.py``."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part)


def render(name: str) -> dict[str, str]:
    """Every generated file except the dataset: relative path -> text."""
    check_name(name)
    files = {
        "__init__.py": "",
        "app.py": APP,
        f"configs/{name}.yaml": CONFIG,
        "data/generate.py": GENERATE,
        "README.md": README,
        f"tests/test_{name}.py": TESTS,
    }
    cls = class_name(name)
    return {path: text.replace("__CLASS__", cls).replace("__NAME__", name) for path, text in files.items()}


def create_environment(name: str, base_dir: Path | str | None = None) -> Path:
    """Create ``<base_dir>/resources_servers/<name>/`` (base_dir defaults to the working directory).

    Refuses to touch an existing folder. Runs ``data/generate.py`` to write ``data/example.jsonl``,
    so the shipped dataset is exactly what the generator produces.
    """
    files = render(name)
    kind_dir = Path(base_dir or Path.cwd()).expanduser().resolve() / RESOURCES_KIND
    target = kind_dir / name
    if target.exists() or target.is_symlink():
        raise ScaffoldError(f"{target} already exists; choose another name or remove the folder first")
    kind_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=kind_dir))  # hidden from the catalog
    try:
        for relative, text in files.items():
            path = staging / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        _generate(staging)
        if target.exists():
            raise ScaffoldError(f"{target} appeared while it was being created; nothing was written")
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _generate(env_dir: Path) -> None:
    script = env_dir / "data" / "generate.py"
    try:
        done = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=GENERATE_TIMEOUT_S,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        )
    except subprocess.TimeoutExpired:
        raise ScaffoldError(f"data/generate.py did not finish within {GENERATE_TIMEOUT_S:g}s") from None
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise ScaffoldError(f"data/generate.py failed (exit {done.returncode}):\n{tail}")


APP = '''\
"""__NAME__: multiply two numbers with a tool, then answer with the product.

Made by ``gym env init`` as a starting point that already works end to end: one tool, a verifier,
per-rollout state in the session, and ``example_solution``, which ``gym env check`` uses to make
sure a correct answer earns more than a wrong one. Replace the task with yours piece by piece and
keep ``gym env check __NAME__`` green. README.md describes the contract.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, Field

from polygym import (
    ResourcesServer,
    Session,
    VerifyRequest,
    VerifyResponse,
    function_call_item,
    function_call_output_item,
    message_item,
    tool,
)

LIMIT = 1_000_000
INTEGER = re.compile(r"-?\\d+")


class MultiplyRequest(BaseModel):
    # The tool's arguments. Their JSON schema (types, bounds, descriptions) is what the model sees,
    # and a call that breaks it is answered with a 422 before the tool runs.
    a: int = Field(ge=-LIMIT, le=LIMIT, description="The first factor.")
    b: int = Field(ge=-LIMIT, le=LIMIT, description="The second factor.")


class MultiplyResponse(BaseModel):
    product: int


class __CLASS__VerifyRequest(VerifyRequest):
    """The dataset row fields the verifier needs; a row without them gets a 422 naming the field."""

    expected_answer: int


class __CLASS__VerifyResponse(__CLASS__VerifyRequest, VerifyResponse):
    extracted_answer: int | None
    multiply_calls: int


def extract_answer(text: str) -> int | None:
    """The last integer in the text (thousands separators allowed), or None."""
    found = INTEGER.findall(text.replace(",", ""))
    return int(found[-1]) if found else None


class __CLASS__(ResourcesServer):
    @tool
    async def multiply(self, body: MultiplyRequest, session: Session) -> MultiplyResponse:
        """Multiply two integers and return the product."""
        session.state["multiply_calls"] = session.state.get("multiply_calls", 0) + 1
        return MultiplyResponse(product=body.a * body.b)

    async def verify(self, body: __CLASS__VerifyRequest, session: Session) -> __CLASS__VerifyResponse:
        """Reward 1.0 when the last integer of the final answer is the expected product, else 0.0."""
        answer = extract_answer(body.response.output_text())
        return __CLASS__VerifyResponse.of(
            body,
            reward=1.0 if answer == body.expected_answer else 0.0,
            extracted_answer=answer,
            multiply_calls=session.state.get("multiply_calls", 0),
        )

    @classmethod
    def example_solution(cls, row: dict[str, Any]) -> list[dict[str, Any]]:
        """Output items of a rollout that deserves reward 1.0 (for ``gym env check`` and the tests)."""
        a, b = row["factors"]
        call = function_call_item("multiply", {"a": a, "b": b})
        return [
            call,
            function_call_output_item(call["call_id"], json.dumps({"product": a * b})),
            message_item(f"{a} times {b} is {a * b}."),
        ]
'''

CONFIG = """\
__NAME__:
  resources_servers:
    __NAME__:
      entrypoint: app.py
      domain: math
      description: Multiply two numbers with the multiply tool, then answer with the product.
__NAME___simple_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: __NAME__}
      model_server: {type: responses_api_models, name: policy_model}
      max_steps: 4
      datasets:
      - {name: example, type: example, jsonl_fpath: resources_servers/__NAME__/data/example.jsonl}
"""

GENERATE = '''\
"""Write data/example.jsonl: five multiplication tasks for __NAME__.

Run from anywhere: ``python resources_servers/__NAME__/data/generate.py`` (``--output PATH`` to
write elsewhere). Seeded, so re-running reproduces the file byte for byte; the tool schemas come
from the server class, so the dataset cannot drift from the code. Edit ``build_rows`` for your task.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from polygym import generator_main

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # app.py, importable as a script

from app import __CLASS__

SEED = 20240607
NUM_ROWS = 5
DATA_DIR = Path(__file__).resolve().parent
AGENT = "__NAME___simple_agent"

SYSTEM = (
    "You are a careful assistant. Use the multiply tool for every multiplication, "
    "then reply with one short sentence that ends with the result."
)
TEMPLATES = [
    "What is {a} times {b}?",
    "Please compute {a} x {b} and tell me the result.",
    "I need the product of {a} and {b}.",
]


def build_rows(seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    tools = __CLASS__.tool_schemas()
    rows: list[dict] = []
    seen: set[tuple[int, int]] = set()
    while len(rows) < NUM_ROWS:
        a, b = rng.randint(12, 999), rng.randint(12, 999)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        prompt = TEMPLATES[len(rows) % len(TEMPLATES)].format(a=a, b=b)
        rows.append(
            {
                "responses_create_params": {
                    "input": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}],
                    "tools": tools,
                },
                "agent_ref": {"type": "responses_api_agents", "name": AGENT},
                "factors": [a, b],
                "expected_answer": a * b,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    generator_main(lambda _: {"example": build_rows()}, ["example"], DATA_DIR, __doc__, argv)


if __name__ == "__main__":
    main()
'''

TESTS = '''\
"""Tests for __NAME__: the tool, the verifier, the dataset, and ``gym env check``'s checks.

Run: ``pytest resources_servers/__NAME__/tests``. Most tests call the server's methods directly with
synthetic rollouts; the last one runs the conformance checker, which serves the environment on a
loopback socket and probes it the way agents do.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

import pytest

from polygym import Session, check_env, function_call_item, message_item, new_response
from polygym.testing import assert_generator_reproduces, read_jsonl

ENV_DIR = Path(__file__).resolve().parents[1]
ROWS = read_jsonl(ENV_DIR / "data" / "example.jsonl")


def load_app():
    """Import app.py by path, under a name of its own (the folder need not be an importable package)."""
    spec = importlib.util.spec_from_file_location("__NAME___app_under_test", ENV_DIR / "app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


app = load_app()


def verify(row: dict, output: list[dict], session: Session | None = None):
    server = app.__CLASS__("__NAME__", {})
    body = app.__CLASS__VerifyRequest.model_validate({**row, "response": new_response(output, model="test")})
    return asyncio.run(server.verify(body, session or Session(id="test")))


def test_multiply_tool_counts_calls_in_the_session():
    server = app.__CLASS__("__NAME__", {})
    session = Session(id="test")
    result = asyncio.run(server.multiply(app.MultiplyRequest(a=12, b=-34), session))
    assert result.product == -408
    assert session.state["multiply_calls"] == 1


@pytest.mark.parametrize("row", ROWS, ids=[str(row["expected_answer"]) for row in ROWS])
def test_example_solution_gets_reward_one(row):
    result = verify(row, app.__CLASS__.example_solution(row))
    assert result.reward == 1.0
    assert result.extracted_answer == row["expected_answer"]


@pytest.mark.parametrize(
    ("make_output", "extracted"),
    [
        (lambda row: [], None),
        (lambda row: [message_item("I am not sure.")], None),
        (lambda row: [message_item(f"It is {row['expected_answer'] + 1}.")], "off by one"),
        (lambda row: [function_call_item("multiply", {"a": 1, "b": 2})], None),
    ],
    ids=["no-output", "no-number", "off-by-one", "no-final-answer"],
)
def test_wrong_answers_get_reward_zero(make_output, extracted):
    row = ROWS[0]
    result = verify(row, make_output(row))
    assert result.reward == 0.0
    expected = row["expected_answer"] + 1 if extracted == "off by one" else None
    assert result.extracted_answer == expected


def test_answer_with_thousands_separators_counts():
    row = ROWS[0]
    result = verify(row, [message_item(f"The product is {row['expected_answer']:,}.")])
    assert result.reward == 1.0


def test_dataset_rows_match_the_code():
    assert len(ROWS) == 5
    for row in ROWS:
        a, b = row["factors"]
        assert row["expected_answer"] == a * b
        assert row["responses_create_params"]["tools"] == app.__CLASS__.tool_schemas()
        assert row["agent_ref"] == {"type": "responses_api_agents", "name": "__NAME___simple_agent"}


def test_generator_reproduces_the_file_byte_for_byte(tmp_path):
    assert_generator_reproduces(ENV_DIR / "data", tmp_path)


def test_gym_env_check_passes():
    report = check_env(app.__CLASS__)  # its folder, config and example data
    assert report.ok, report.summary()
'''

README = """\
# __NAME__

Made by `gym env init __NAME__`. The task is a placeholder that already works end to end: the user
asks for the product of two numbers, the model calls the `multiply` tool and answers with the
result. Replace it with your task one piece at a time, keeping `gym env check __NAME__` green.

## Tool

| Tool | Arguments | Returns |
|------|-----------|---------|
| `multiply` | `a: int`, `b: int` (each within ±1,000,000) | `{"product": int}` |

Arguments outside the schema are answered with HTTP 422 naming the field. Each call is counted in
the rollout's session (`session.state`), which `verify` reports as `multiply_calls`.

## Dataset rows

`data/example.jsonl` holds 5 rows written by `data/generate.py` (seeded: run it again and the file
comes out byte for byte the same; `--output PATH` writes elsewhere). Each row has:

- `responses_create_params`: a system message, the question, and `tools` from
  `__CLASS__.tool_schemas()` (so the schemas cannot drift from the code);
- `agent_ref`: `__NAME___simple_agent`;
- `factors` and `expected_answer` (the verifier's fields, declared on `__CLASS__VerifyRequest`).

## Reward

`reward = 1.0` when the last integer in the final assistant message equals `expected_answer`
(thousands separators are ignored), else `0.0`. Extra fields: `extracted_answer`, `multiply_calls`.

## Run

From the folder that holds `resources_servers/`:

```bash
gym env check __NAME__                       # conformance: tools, verify, sessions, timeouts
pytest resources_servers/__NAME__/tests      # this environment's tests
gym eval run --model-type scripted_model --resources-server __NAME__ \\
    --input resources_servers/__NAME__/data/example.jsonl --output results/__NAME__.jsonl
```

The scripted model needs no key: without a rule for this task it calls `multiply` with
placeholder arguments and answers `done` (reward 0), which is enough to see the whole loop run.
Use `--model-type openai_model` (with `policy_base_url`, `policy_api_key`, `policy_model_name`) for
a real policy.

## Make it yours

1. `app.py`: your tools (`@tool` methods with a pydantic request model and a docstring), your
   verifier fields on the `VerifyRequest` subclass, your `verify`, and an `example_solution` that
   returns the output items of a correct rollout for a row.
2. `data/generate.py`: rows for your task, with the fields your verifier needs.
3. Run `python data/generate.py`, then `gym env check __NAME__` and the tests.
"""
