"""The remote-trainer path: a trainer's generation server is the vllm_model upstream of a running
stack (`gym env start`, its own process), and the trainer pulls token-level rollouts over HTTP.

The "trainer's generation server" is a fake vLLM-like upstream defined here: it renders chats to
UTF-8 bytes (ChatML-like), answers deterministically, and returns vLLM's token fields
(``prompt_token_ids``, ``choices[0].token_ids``, ``logprobs.content[i].logprob``). With ``drift``
on it re-renders earlier assistant turns stripped of trailing whitespace, as some chat templates
do, so the history no longer matches what was generated: the contiguity check must catch it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.requests import Request
from starlette.responses import Response

from polygym.blend.spec import parse_spec
from polygym.row import ALL_ENVS
from polygym.training.collector import TokenCollector
from polygym.training.tokens import TokenRollout
from tests.conftest import ChatEndpoint

pytestmark = pytest.mark.e2e

END = "<|end|>"
SECRET = 2  # every game below hides 2 in 1..8; the fake policy guesses 1, then 2


def render(messages: list[dict[str, Any]], drift: bool) -> str:
    text = ""
    for message in messages:
        content = message.get("content") or ""
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if drift and message.get("role") == "assistant":
            content = content.rstrip()
        text += f"<|{message.get('role')}|>{content}{END}"
    return text + "<|assistant|>"


def answer(messages: list[dict[str, Any]]) -> str:
    """mcqa: a boxed letter; the guessing game: guess 1, then 2 (with a trailing space)."""
    first_user = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
    if "A)" in str(first_user):
        return "\\boxed{A}"
    turns = sum(1 for m in messages if m.get("role") == "assistant")
    return f"<guess>{turns + 1}</guess> "


class FakeVLLM(ChatEndpoint):
    """A Chat Completions server on its own thread, speaking vLLM's token-id extensions."""

    def __init__(self, drift: bool = False) -> None:
        super().__init__()
        self.drift = drift
        self.requests: list[dict[str, Any]] = []

    async def chat(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        self.requests.append(body)
        messages = body["messages"]
        text = answer(messages)
        prompt = list(render(messages, self.drift).encode())
        generated = list((text + END).encode())
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop",
        }
        completion: dict[str, Any] = {"id": "x", "object": "chat.completion", "model": body["model"]}
        if body.get("return_token_ids"):
            completion["prompt_token_ids"] = prompt
            choice["token_ids"] = generated
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": f"token_id:{t}", "logprob": -0.5} for t in generated]}
        completion["choices"] = [choice]
        completion["usage"] = {"prompt_tokens": len(prompt), "completion_tokens": len(generated)}
        return Response(orjson.dumps(completion), media_type="application/json")


@pytest.fixture
def game_rows(tmp_path: Path) -> Path:
    path = tmp_path / "games.jsonl"
    row = {
        "responses_create_params": {"input": [{"role": "system", "content": "Guess the number."}]},
        "game": {"low": 1, "high": 8, "secret": SECRET, "max_guesses": 3},
    }
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for _ in range(4)))
    return path


def blend(tmp_path: Path, games: Path) -> Any:
    raw = {
        "environments": [
            {"name": "mcqa"},
            {"name": "guess_number", "agent": "guess_number_gymnasium_agent", "train": [str(games)]},
        ],
        "prompts_per_step": 4,
        "responses_per_prompt": 2,
        "seed": 5,
    }
    return parse_spec(raw, "test", tmp_path)


@pytest.fixture
def remote_stack(start_stack: Callable[..., Any]) -> Iterator[Callable[[str], Any]]:
    def start(upstream: str) -> Any:
        return start_stack(
            "--model-type",
            "vllm_model",
            "--resources-server",
            "mcqa",
            "--resources-server",
            "guess_number",
            f"policy_base_url={upstream}",
            "policy_api_key=",
            "policy_model_name=trainer-policy",
        )

    yield start


def text_of(ids: list[int]) -> str:
    return bytes(ids).decode()


def check_game(rollout: TokenRollout) -> None:
    """Two turns: guess 1 (too low), guess 2 (correct); only the guesses are trainable."""
    assert rollout.num_turns == 2 and rollout.reward == 1.0
    generated = bytes(t for t, m in zip(rollout.input_ids, rollout.loss_mask, strict=True) if m).decode()
    assert generated == f"<guess>1</guess> {END}<guess>2</guess> {END}"
    completion = text_of(rollout.completion_ids)
    assert re.fullmatch(
        rf"<guess>1</guess> {re.escape(END)}<\|user\|>1 is too low\..*{re.escape(END)}<\|assistant\|>"
        rf"<guess>2</guess> {re.escape(END)}",
        completion,
        re.DOTALL,
    ), completion
    assert text_of(rollout.input_ids[: rollout.prompt_length]).endswith("<|assistant|>")
    assert [lp for lp, m in zip(rollout.logprobs, rollout.loss_mask, strict=True) if m] == [-0.5] * sum(
        rollout.loss_mask
    )


def test_trainer_pulls_token_rollouts_from_a_running_stack(
    tmp_path: Path, game_rows: Path, remote_stack: Callable[[str], Any]
) -> None:
    with FakeVLLM() as upstream:
        stack = remote_stack(upstream.url)
        head_url = stack.record["head_url"]
        with TokenCollector(
            blend(tmp_path, game_rows), tmp_path / "remote.jsonl", head_url=head_url
        ) as collector:
            step = collector.step()
    # vllm_model asked the trainer's server for token ids and log-probs on every call
    assert upstream.requests and all(
        r.get("return_token_ids") and r.get("logprobs") for r in upstream.requests
    )
    assert all(r["model"] == "trainer-policy" for r in upstream.requests)
    assert step.step == 0 and len(step.rollouts) == 8
    games = [r for r in step.rollouts if r.env == "guess_number"]
    questions = [r for r in step.rollouts if r.env == "mcqa"]
    assert len(games) == len(questions) == 4
    for rollout in games:
        assert rollout.contiguous and not rollout.masked
        check_game(rollout)
    for rollout in questions:
        assert rollout.num_turns == 1 and rollout.contiguous and not rollout.masked
        assert text_of(rollout.completion_ids) == f"\\boxed{{A}}{END}"
        assert rollout.loss_mask[rollout.prompt_length :] == [1] * len(rollout.completion_ids)
    stats = step.stats
    assert stats["guess_number"].reward_mean == 1.0 and stats["guess_number"].turns_mean == 2
    assert stats["guess_number"].masked == 0 and stats[ALL_ENVS].completed == 8
    assert stats["mcqa"].realized_share == 0.5 and stats["mcqa"].groups == 2


def test_retokenization_drift_is_flagged_per_environment(
    tmp_path: Path, game_rows: Path, remote_stack: Callable[[str], Any]
) -> None:
    with FakeVLLM(drift=True) as upstream:
        stack = remote_stack(upstream.url)
        with TokenCollector(
            blend(tmp_path, game_rows), tmp_path / "drift.jsonl", head_url=stack.record["head_url"]
        ) as collector:
            step = collector.step()
    games = [r for r in step.rollouts if r.env == "guess_number"]
    assert games and all(not r.contiguous and r.masked for r in games)
    assert all(r.loss_mask == [0] * len(r.input_ids) for r in games)
    assert all((r.problem or "").startswith("turn 1:") for r in games)
    assert all(r.reward == 1.0 for r in games)  # the episode itself went fine
    # single-turn episodes cannot drift: mcqa is untouched
    assert all(r.contiguous and not r.masked for r in step.rollouts if r.env == "mcqa")
    assert step.stats["guess_number"].non_contiguous == step.stats["guess_number"].masked == 4
    assert step.stats["mcqa"].masked == 0 and step.stats[ALL_ENVS].masked == 4
    assert step.metrics()["polygym/guess_number/masked"] == 4.0


@pytest.mark.parametrize("claims_extension", [False, True])
def test_a_vllm_server_gets_prefix_ids_only_when_said_to_implement_them(
    tmp_path: Path, game_rows: Path, claims_extension: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """`gym train run --vllm-server` in front of stock vLLM (the drifting fake: no
    required_prefix_token_ids): by default later turns are rendered from text, counted, the drifted
    games masked and the alarm rung; told the server has the extension (it has not), every drifted
    turn is refused with a 502, which is what supplying the ids unconditionally did to every run."""
    from polygym.training.policy_serving import RETEMPLATED_MASKED_SHARE, masked_share_bound, serve_policy
    from polygym.training.run import POLICY_NAME, stack_config

    spec = blend(tmp_path, game_rows)
    with FakeVLLM(drift=True) as upstream:
        root = upstream.url.removesuffix("/v1")
        with serve_policy(
            None, None, POLICY_NAME, vllm_server=root, vllm_prefix_token_ids=claims_extension
        ) as served:
            assert served.url == upstream.url and served.prefix_token_ids is claims_extension
            config = stack_config(spec, served.url, (), (), served.prefix_token_ids)
            bound = masked_share_bound(None, served.prefix_token_ids)
            with (
                caplog.at_level(logging.WARNING, logger="polygym.training"),
                TokenCollector(
                    spec, tmp_path / "r.jsonl", stack_config=config, max_masked_share=bound
                ) as collector,
            ):
                step = collector.step()
    games = step.stats["guess_number"]
    later_turns = [r for r in upstream.requests if any(m["role"] == "assistant" for m in r["messages"])]
    assert later_turns
    if claims_extension:
        assert bound is None
        assert all(r["required_prefix_token_ids"] for r in later_turns)
        assert games.failures == 4 and games.completed == 0
        return
    assert bound == RETEMPLATED_MASKED_SHARE
    assert all("required_prefix_token_ids" not in r for r in later_turns)
    assert games.failures == 0 and games.completed == 4 and games.reward_mean == 1.0
    assert games.retemplated_turns == 4 and games.masked == 4 and games.masked_alarm == 1
    assert "guess_number has 4 of 4 rollouts masked" in caplog.text
    assert step.stats["mcqa"].masked == 0 and step.stats["mcqa"].masked_alarm == 0


def test_the_masked_share_alarm_defaults_on_only_for_re_rendered_turns() -> None:
    from polygym.training.policy_serving import RETEMPLATED_MASKED_SHARE, masked_share_bound

    assert masked_share_bound(None, prefix_token_ids=True) is None
    assert masked_share_bound(None, prefix_token_ids=False) == RETEMPLATED_MASKED_SHARE
    assert masked_share_bound(0.5, prefix_token_ids=False) == 0.5
    assert masked_share_bound(0.0, prefix_token_ids=True) == 0.0
