"""Shared by the blend tests: the shipped example datasets, and writing spec and data files."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ROOT

ENVS = ("example_single_tool_call", "example_multi_step")


def example(env: str) -> Path:
    return ROOT / "resources_servers" / env / "data" / "example.jsonl"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
