"""Rows checked against the verifiers of the environments they target."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from polygym.blend.mix import load_blend
from polygym.blend.spec import parse_spec
from polygym.blend.validate import validate_files
from polygym.collect.dataset import DatasetError
from tests.blend.helpers import ENVS, example, write


def test_rows_missing_verifier_fields_stop_the_load(tmp_path: Path) -> None:
    rows = [orjson.loads(line) for line in example(ENVS[1]).read_bytes().splitlines()]
    del rows[2]["expected_synonym_values"]
    data = write(tmp_path / "w.jsonl", "".join(orjson.dumps(r).decode() + "\n" for r in rows))
    spec = parse_spec(
        {"environments": [{"name": ENVS[1], "train": str(data)}], "prompts_per_step": 2}, "inline", tmp_path
    )
    with pytest.raises(DatasetError) as info:
        load_blend(spec)
    assert info.value.problems == [
        f"{data}:3: expected_synonym_values: missing (required by the example_multi_step verifier)"
    ]


def test_validate_files_counts_per_environment() -> None:
    report = validate_files([example(ENVS[0]), example(ENVS[1])])
    assert report.problems == [] and report.rows == 10
    stats = {s.env: s.to_dict() for s in report.stats}
    assert stats[ENVS[0]]["rows"] == 5 and stats[ENVS[0]]["tools"] == ["get_weather"]
    assert stats[ENVS[1]]["tools"] == ["extract_synonym_values", "get_synonym_value"]
    assert stats[ENVS[0]]["turns"] == {"min": 2, "mean": 2.0, "max": 2}
    assert stats[ENVS[0]]["est_tokens"]["min"] > 0
