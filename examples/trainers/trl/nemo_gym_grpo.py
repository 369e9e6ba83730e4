"""TRL's ``GRPOTrainer`` trained through a NeMo Gym stack (``gym env start``), unchanged.

This is TRL's own NeMo Gym integration, re-stated as a contract, not polygym's trainer: the team
keeps TRL, its config and its launch; polygym is only the stack behind ``/run``. TRL shipped the
integration as ``examples/scripts/nemo_gym/train_multi_environment.py`` (v0.28 to v1.5; removed,
marked broken, in huggingface/trl commit 107803e2e). What it does, and what this module does too:

1. **Discovery**: ``GET /global_config_dict_yaml`` on the head server (TRL's default
   ``127.0.0.1:11000``, which ``gym env start`` takes when it is free), a YAML document sent as a
   JSON string; every top-level entry holding ``responses_api_agents`` is an agent, reached at its
   ``host``/``port`` (a loopback host stands for the head's host).
2. **Data**: the dataset's ``prompt`` is the row's index (as text) and ``metadata`` the row's JSON;
   each row goes to the agent its ``agent_ref`` names, as the body of ``POST /run``.
3. **Tokens**: every model turn in ``response.output`` carries ``prompt_token_ids``,
   ``generation_token_ids`` and ``generation_log_probs``; the first turn's prompt ids are the
   prompt, and each later turn's prompt ids must start with everything seen so far (prompt +
   generations + the observations between them) or the rollout is refused ("Non-contiguous
   messages"). Observation tokens are masked out of the loss (``env_mask`` 0), generated ones in.

Three things differ from the last version TRL shipped, each because TRL 1.16 or polygym's failure
contract requires it:

- TRL (since v1.0, and already in v0.29's server mode) hands ``rollout_func`` every prompt
  ``num_generations`` times; the old script repeated each one ``num_generations`` times again
  and returned one ``prompt_ids`` per unique prompt, so TRL 1.16 gets ``G x G`` completions for
  ``G`` prompts and fails. Here: one ``/run`` per prompt TRL passes, one ``prompt_ids`` per
  completion.
- A rollout that failed (``/run`` answered an error, the connection failed, no model turn came
  back) was a reward of 0.0 there: indistinguishable from a rollout the policy lost, so an outage
  teaches the policy. Here it is a failure: reward ``None`` (TRL leaves it out of its group's
  baseline, advantage 0), its class in ``env_failure``, and a step where every rollout failed
  raises.
- A row whose agent the head does not list raises before anything is sent (as TRL's did), naming
  the agents that exist.
- A non-contiguous rollout ("Non-contiguous messages": the history was re-tokenized differently
  from what the policy generated) is a failure of class ``non_contiguous``, left out like the
  others and counted, instead of an exception that ends the training run; every batch prints how
  many rollouts were contiguous and which failures it had.

Run (a stack must be up: ``gym env start ...``)::

    python examples/trainers/trl/nemo_gym_grpo.py --config examples/trainers/trl/config.yaml
"""

from __future__ import annotations

import argparse
import asyncio
import json
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import yaml

DEFAULT_HEAD_URL = "http://127.0.0.1:11000"
NON_CONTIGUOUS_KIND = "non_contiguous"
LOOPBACK = ("127.0.0.1", "0.0.0.0", "localhost", "::1")
MAX_REPLY_BYTES = 64 * 1024 * 1024
NON_CONTIGUOUS = "Non-contiguous messages"


class RolloutFailure(RuntimeError):
    """A rollout that produced nothing trainable; ``kind`` is its class (``HTTP 502``, ...)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


def agent_urls(head_url: str = DEFAULT_HEAD_URL, timeout_s: float = 10.0) -> dict[str, str]:
    """``{agent name: base URL}`` from the head's ``/global_config_dict_yaml`` (TRL's discovery)."""
    with urllib.request.urlopen(
        f"{head_url.rstrip('/')}/global_config_dict_yaml", timeout=timeout_s
    ) as reply:
        text = json.loads(reply.read(MAX_REPLY_BYTES))
    config = yaml.safe_load(text)
    head_host = urlsplit(head_url).hostname or "127.0.0.1"
    found: dict[str, str] = {}
    for name, block in (config or {}).items():
        agents = block.get("responses_api_agents") if isinstance(block, dict) else None
        for inner in (agents or {}).values():
            if isinstance(inner, dict) and "host" in inner and "port" in inner:
                host = head_host if inner["host"] in LOOPBACK else inner["host"]
                found[name] = f"http://{host}:{inner['port']}"
    if not found:
        raise RuntimeError(f"the head at {head_url} lists no agent")
    return found


def dataset_rows(rows: Sequence[dict[str, Any]]) -> Any:
    """TRL's dataset of a NeMo Gym JSONL: ``prompt`` = the row's index, ``metadata`` = the row."""
    from datasets import Dataset

    return Dataset.from_list([{"prompt": str(i), "metadata": json.dumps(row)} for i, row in enumerate(rows)])


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


@dataclass
class Trajectory:
    """One rollout as TRL trains it: the first prompt, then every later token, masked."""

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: int = 0


def trajectory(result: dict[str, Any]) -> Trajectory:
    """The token trajectory of one ``/run`` result; RolloutFailure when it has no model turn or a
    turn's prompt does not extend the history (``Non-contiguous messages``)."""
    turns = [
        item
        for item in (result.get("response") or {}).get("output") or []
        if isinstance(item, dict) and "prompt_token_ids" in item and "generation_token_ids" in item
    ]
    if not turns:
        raise RolloutFailure("no_model_turn", "the rollout has no model turn with token ids")
    out = Trajectory(prompt_ids=list(turns[0]["prompt_token_ids"]))
    seen = list(out.prompt_ids)
    for number, turn in enumerate(turns, start=1):
        prompt, generated = list(turn["prompt_token_ids"]), list(turn["generation_token_ids"])
        logprobs = list(turn.get("generation_log_probs") or [])
        if prompt[: len(seen)] != seen:
            raise RolloutFailure(
                NON_CONTIGUOUS_KIND,
                f"[turn {number}] {NON_CONTIGUOUS}: the prompt ({len(prompt)} ids) does not start with "
                f"the {len(seen)} ids seen so far",
            )
        if len(logprobs) != len(generated):
            raise RolloutFailure(
                "misaligned_logprobs",
                f"[turn {number}] {len(logprobs)} log-probs for {len(generated)} generated ids",
            )
        observation = prompt[len(seen) :]
        out.completion_ids += observation + generated
        out.env_mask += [0] * len(observation) + [1] * len(generated)
        out.logprobs += [0.0] * len(observation) + [float(x) for x in logprobs]
        out.turns += 1
        seen = prompt + generated
    return out


async def _post(session: aiohttp.ClientSession, url: str, row: dict[str, Any], timeout_s: float) -> Any:
    try:
        async with session.post(
            f"{url}/run", json=row, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as reply:
            body = await reply.read()
            if reply.status != 200:
                error = _error_of(body)
                kind = (reply.headers.get("x-polygym-failure") or f"HTTP {reply.status}")[:64]
                return RolloutFailure(kind, error)
            return json.loads(body)
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        return RolloutFailure(type(exc).__name__, str(exc) or repr(exc))


def _error_of(body: bytes) -> str:
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return body[:500].decode(errors="replace")
    if isinstance(error, dict):
        return f"{error.get('type')}: {error.get('message')}"[:500]
    return str(error)[:500]


async def run_rows(
    rows: Sequence[dict[str, Any]], agents: dict[str, str], timeout_s: float
) -> list[dict[str, Any] | RolloutFailure]:
    """``POST /run`` every row to its agent at once; a failure is returned in its slot, typed."""
    urls = []
    for row in rows:
        ref = row.get("agent_ref")
        name = ref.get("name") if isinstance(ref, dict) else None
        if name not in agents:
            raise ValueError(
                f"row names agent {name!r}, which the head does not list; agents: {sorted(agents)}"
            )
        urls.append(agents[name])
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:
        return list(
            await asyncio.gather(*(_post(session, u, r, timeout_s) for u, r in zip(urls, rows, strict=True)))
        )


def request_rows(
    prompts: Sequence[Any], dataset: Any, temperature: float, top_p: float, max_tokens: int
) -> list[dict[str, Any]]:
    """The ``/run`` bodies of the prompts TRL passed (dataset indices), its sampling settings set."""
    rows = []
    for prompt in prompts:
        row = json.loads(dataset[int(prompt)]["metadata"])
        params = row.setdefault("responses_create_params", {})
        params.setdefault("max_output_tokens", max_tokens)
        params["temperature"] = temperature
        params["top_p"] = top_p
        rows.append(row)
    return rows


def rollout_outputs(results: Sequence[dict[str, Any] | RolloutFailure], pad_id: int) -> dict[str, list[Any]]:
    """TRL's ``rollout_func`` answer for the results, in order: one entry per completion."""
    out: dict[str, list[Any]] = {
        key: []
        for key in ("prompt_ids", "completion_ids", "env_mask", "logprobs", "env_reward", "env_failure")
    }
    out["num_turns"] = []
    for result in results:
        try:
            if isinstance(result, RolloutFailure):
                raise result
            path = trajectory(result)
        except RolloutFailure as failure:
            for key, value in (("prompt_ids", [pad_id]), ("completion_ids", [pad_id]), ("env_mask", [0])):
                out[key].append(value)
            out["logprobs"].append([0.0])
            out["env_reward"].append(None)
            out["env_failure"].append(failure.kind)
            out["num_turns"].append(0)
            continue
        out["prompt_ids"].append(path.prompt_ids)
        out["completion_ids"].append(path.completion_ids)
        out["env_mask"].append(path.env_mask)
        out["logprobs"].append(path.logprobs)
        out["env_reward"].append(float(result["reward"]))
        out["env_failure"].append(None)
        out["num_turns"].append(path.turns)
    if all(kind is not None for kind in out["env_failure"]):
        raise RuntimeError(f"every rollout of the batch failed: {sorted(set(out['env_failure']))}")
    return out


def make_rollout_func(
    agents: dict[str, str], dataset: Any, timeout_s: float = 10_800.0
) -> Callable[[list[Any], Any], dict[str, list[Any]]]:
    """A ``rollout_func`` for ``GRPOTrainer`` over ``dataset`` (from ``dataset_rows``)."""

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        args = trainer.args
        rows = request_rows(prompts, dataset, args.temperature, args.top_p, args.max_completion_length)
        results = asyncio.run(run_rows(rows, agents, timeout_s))
        tokenizer = trainer.processing_class
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        out = rollout_outputs(results, pad or 0)
        failed = Counter(kind for kind in out["env_failure"] if kind is not None)
        scored = len(results) - sum(failed.values())
        print(f"rollouts: {scored} of {len(results)} contiguous and scored; failed: {dict(failed)}")
        return out

    return rollout_func


def env_reward(completions: list[Any], **kwargs: Any) -> list[float | None]:
    """TRL reward function: the environment's reward; None (not 0) for a failed rollout."""
    return list(kwargs["env_reward"])


def main(argv: Sequence[str] | None = None) -> None:
    """Train from a TRL-style YAML (``model_name``, ``dataset_path``, GRPOConfig fields)."""
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="YAML: model_name, dataset_path, GRPOConfig fields")
    parser.add_argument("--head-url", default=DEFAULT_HEAD_URL, help="the stack's head server")
    parser.add_argument("--model", help="overrides the config's model_name")
    parser.add_argument("--dataset", help="overrides the config's dataset_path")
    parser.add_argument("--output-dir", help="overrides the config's output_dir")
    args = parser.parse_args(argv)
    settings = yaml.safe_load(Path(args.config).read_text())
    model_name = args.model or settings.pop("model_name")
    settings.pop("model_name", None)
    dataset = dataset_rows(read_jsonl(args.dataset or settings.pop("dataset_path")))
    settings.pop("dataset_path", None)
    if args.output_dir:
        settings["output_dir"] = args.output_dir
    timeout_s = float(settings.pop("request_timeout", 10_800))
    settings.setdefault("shuffle_dataset", False)  # the step-ordered file's order is the plan
    config = GRPOConfig(**settings)
    tokenizer = AutoTokenizer.from_pretrained(model_name, padding_side="left")
    trainer = GRPOTrainer(
        model=model_name,
        processing_class=tokenizer,
        reward_funcs=env_reward,
        train_dataset=dataset,
        rollout_func=make_rollout_func(agent_urls(args.head_url), dataset, timeout_s),
        args=config,
    )
    trainer.train()


if __name__ == "__main__":
    main()
