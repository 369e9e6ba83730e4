"""NeMo Gym's rollout-collection overrides (``+num_repeats=3``, ``++responses_create_params.x=...``).

NeMo Gym users pass collection settings as Hydra overrides on the same command line as config
overrides, and its rollout collection reads them from the merged config: ``num_repeats``,
``limit``, ``agent_name``, the input and output files, ``num_samples_in_parallel`` and
``responses_create_params.<field>`` (set on every row). polygym takes those as options of
``gym eval run``, so this module is the one place that tells such an override from a config
override and says which option it becomes. Keys NeMo Gym reads that polygym cannot honour are
refused by name, never dropped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

ROW_PARAMS = "responses_create_params"

OPTION_OF: dict[str, str] = {
    "num_repeats": "--num-repeats",
    "limit": "--limit",
    "agent_name": "--agent",
    "input_jsonl_fpath": "--input",
    "output_jsonl_fpath": "--output",
    "num_samples_in_parallel": "--concurrency",
    "interleave_repeats": "--interleave-repeats",
    "disable_aggregation": "--disable-aggregation",
}
"""NeMo Gym's collection key -> the ``gym eval run`` option that does the same."""

UNSUPPORTED: dict[str, str] = {
    "split": "polygym does not prepare datasets by split; pass the split's JSONL with --input",
    "prompt_config": "polygym does not render prompt templates; pass rows that hold their prompts",
    "resume_from_cache": "use --resume (it continues from the output file)",
}
"""Collection keys NeMo Gym reads that polygym cannot honour, and what to do instead."""


@dataclass
class RowOverrides:
    """The collection settings found among a command line's overrides."""

    options: dict[str, tuple[str, Any]] = field(default_factory=dict)
    """``gym eval run`` option -> (the override's text, its value)."""
    sampling: dict[str, Any] = field(default_factory=dict)
    """``responses_create_params`` fields to set on every row."""
    refused: list[str] = field(default_factory=list)
    """One message per override that cannot be honoured, naming it."""


def split_overrides(parsed: Iterable[tuple[str, str, Any]]) -> tuple[list[str], RowOverrides]:
    """Split ``(text, key, value)`` overrides into config overrides (their text) and row settings."""
    config: list[str] = []
    row = RowOverrides()
    for text, key, value in parsed:
        head, _, rest = key.partition(".")
        if head == ROW_PARAMS:
            _take_sampling(row, text, rest, value)
        elif key in OPTION_OF:
            row.options[OPTION_OF[key]] = (text, value)
        elif key in UNSUPPORTED:
            row.refused.append(f"override '{text}' cannot be honoured: {UNSUPPORTED[key]}")
        else:
            config.append(text)
    return config, row


def _take_sampling(row: RowOverrides, text: str, field_name: str, value: Any) -> None:
    if not field_name:
        if isinstance(value, dict):
            row.sampling.update(value)
        else:
            row.refused.append(f"override '{text}': {ROW_PARAMS} must be a mapping of fields")
    elif "." in field_name:
        row.refused.append(
            f"override '{text}': only top-level {ROW_PARAMS} fields can be set on every row "
            f"(write {ROW_PARAMS}.{field_name.split('.')[0]}={{...}})"
        )
    else:
        row.sampling[field_name] = value
