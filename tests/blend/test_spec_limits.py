"""Blend specs whose sizes no step can hold, or whose minimums no step can meet: refused on load."""

from __future__ import annotations

from pathlib import Path

import pytest

from polygym.blend.spec import (
    MAX_ENVIRONMENTS,
    MAX_PROMPTS_PER_STEP,
    MAX_RESPONSES_PER_PROMPT,
    MAX_ROLLOUTS_PER_STEP,
    load_spec,
    parse_spec,
)
from polygym.errors import BlendSpecError
from tests.stack.test_config_bombs import alias_bomb


def problems(raw: dict) -> str:
    with pytest.raises(BlendSpecError) as caught:
        parse_spec(raw, "spec.yaml", Path("."))
    return str(caught.value)


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        (
            {"prompts_per_step": MAX_PROMPTS_PER_STEP + 1},
            "prompts_per_step: Input should be less than or equal",
        ),
        (
            {"prompts_per_step": 4, "responses_per_prompt": MAX_RESPONSES_PER_PROMPT + 1},
            "responses_per_prompt: Input should be less than or equal",
        ),
        (
            {"prompts_per_step": MAX_PROMPTS_PER_STEP, "responses_per_prompt": 11},
            f"11,000,000 rollouts per step; at most {MAX_ROLLOUTS_PER_STEP:,}",
        ),
    ],
)
def test_a_step_too_large_to_hold_is_refused(sizes: dict, message: str) -> None:
    assert message in problems({"environments": [{"name": "a"}], **sizes})


def test_too_many_environments_are_refused() -> None:
    envs = [{"name": f"e{i}"} for i in range(MAX_ENVIRONMENTS + 1)]
    assert "environments: List should have at most" in problems({"environments": envs, "prompts_per_step": 1})


def test_a_minimum_above_prompts_per_step_is_refused_naming_the_environment() -> None:
    raw = {
        "environments": {"a": {"min_per_step": 9}, "b": {}, "c": {"min_per_step": 4}},
        "prompts_per_step": 4,
    }
    assert "min_per_step above prompts_per_step (4), which no step can meet: a: 9" in problems(raw)


def test_the_largest_allowed_sizes_load() -> None:
    raw = {"environments": [{"name": "a", "min_per_step": 100}], "prompts_per_step": 100}
    raw["responses_per_prompt"] = MAX_RESPONSES_PER_PROMPT
    assert parse_spec(raw, "spec.yaml", Path(".")).global_batch_size == MAX_ROLLOUTS_PER_STEP
    assert 100 * MAX_RESPONSES_PER_PROMPT == MAX_ROLLOUTS_PER_STEP


def test_an_alias_bomb_spec_is_refused(tmp_path: Path) -> None:
    spec = tmp_path / "blend.yaml"
    spec.write_text(alias_bomb(levels=6, width=10))
    with pytest.raises(BlendSpecError, match="expands to more than 100,000 values"):
        load_spec(spec)
