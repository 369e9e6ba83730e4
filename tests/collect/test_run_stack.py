"""run_stack: a run records its stack's identity; --resume refuses another policy or environment set."""

from pathlib import Path
from typing import Any

import pytest

from polygym.collect.run_files import RunFiles, prepare, read_record
from polygym.collect.run_stack import StackChangedError, check_stack, identity_of


def config(
    model: str = "gpt-a", url: str = "https://user:sk-secret-password@api.example/v1"
) -> dict[str, Any]:
    return {
        "policy_api_key": "****",
        "policy_model": {
            "responses_api_models": {
                "openai_model": {"openai_model": model, "openai_base_url": url, "timeout_s": 600}
            }
        },
        "weather": {"resources_servers": {"weather": {"domain": "agent"}}},
        "weather_agent": {"responses_api_agents": {"simple_agent": {"max_steps": 6}}},
    }


def test_identity_is_the_policy_and_the_names_without_secrets() -> None:
    assert identity_of(config()) == {
        "policy": {
            "policy_model": {
                "implementation": "openai_model",
                "openai_model": "gpt-a",
                "openai_base_url": "https://user:****@api.example/v1",
                "settings": {},
            }
        },
        "environments": ["weather"],
        "agents": ["weather_agent"],
    }


def test_resume_refuses_a_changed_stack_unless_allowed(tmp_path: Path) -> None:
    files = RunFiles(tmp_path / "out.jsonl")
    prepare(files, resume=False, overwrite=False, fingerprint="plan")
    check_stack(files, identity_of(config()), allow_change=False)
    check_stack(files, identity_of({**config(), "policy_model": config()["policy_model"]}), False)  # same
    other = config(model="gpt-b")
    del other["weather"]
    with pytest.raises(StackChangedError) as info:
        check_stack(files, identity_of(other), allow_change=False)
    message = str(info.value)
    assert "environments no longer served: weather" in message
    assert "policy policy_model.openai_model: 'gpt-a' -> 'gpt-b'" in message
    assert "--allow-stack-change" in message
    assert "sk-secret" not in message
    check_stack(files, identity_of(other), allow_change=True)
    record = read_record(files)
    assert record is not None and record["stack"] == identity_of(other)
    [change] = record["stack_changes"]
    assert change["from"] == identity_of(config()) and len(change["changes"]) == 2


def scripted(rules: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    settings = {"rules": rules, "latency_ms": 0, "timeout_s": 5, "api_key": "****", **extra}
    return {"policy_model": {"responses_api_models": {"scripted_model": settings}}}


def test_resume_refuses_a_policy_whose_settings_changed_under_the_same_name(tmp_path: Path) -> None:
    """Same implementation, same (absent) model name: the scripted rules differ, so the policy does."""
    files = RunFiles(tmp_path / "out.jsonl")
    prepare(files, resume=False, overwrite=False, fingerprint="plan")
    check_stack(files, identity_of(scripted([{"reply": "a"}])), allow_change=False)
    served_otherwise = scripted([{"reply": "a"}], latency_ms=50, timeout_s=60)
    check_stack(files, identity_of(served_otherwise), allow_change=False)  # how it is served: fine
    with pytest.raises(StackChangedError) as info:
        check_stack(files, identity_of(scripted([{"reply": "b"}], seed=3)), allow_change=False)
    lines = str(info.value).splitlines()
    assert any(line.strip().startswith("policy policy_model.rules: changed (fingerprint ") for line in lines)
    assert "  policy policy_model.seed: newly set" in lines


def test_a_record_from_before_fingerprints_is_compared_by_what_it_has(tmp_path: Path) -> None:
    files = RunFiles(tmp_path / "out.jsonl")
    prepare(files, resume=False, overwrite=False, fingerprint="plan")
    old = identity_of(scripted([{"reply": "a"}]))
    del old["policy"]["policy_model"]["settings"]
    check_stack(files, old, allow_change=False)
    check_stack(files, identity_of(scripted([{"reply": "b"}])), allow_change=False)
