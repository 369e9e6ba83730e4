"""Which files make up a run, found from the one path a person types.

``gym view`` takes what people have at hand: the ``--output`` JSONL of ``gym eval run`` (or any of
its siblings), a step-wise run (the same files plus ``_steps.jsonl``), or a ``gym train run``
folder. ``discover`` turns that path into a ``RunSource``: the only files the viewer ever opens
for that run. Routes name runs by their number on the command line, so these files are the whole
of what can be served.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from polygym.collect.run_files import RunFiles

SIBLING_SUFFIXES = (
    "_materialized_inputs.jsonl",
    "_failures.jsonl",
    "_aggregate_metrics.json",
    "_steps.jsonl",
)
TRAIN_LOG = "train_log.jsonl"
TRAIN_ROLLOUTS = "rollouts/train.jsonl"
VALIDATION = ("validation_before", "validation_after")


class RunNotFoundError(Exception):
    """The path is not a run the viewer can read; the message says what it expected."""


@dataclass(frozen=True)
class RunSource:
    name: str
    kind: str
    """``eval`` (``gym eval run``), ``steps`` (step-wise) or ``train`` (a ``gym train run`` folder)."""
    rollouts: Path
    failures: Path
    metrics: Path
    """Written when the run ends: it may not exist yet while a run is live."""
    steps: Path | None
    validation: dict[str, Path]
    """Phase (``validation_before``...) -> its ``_aggregate_metrics.json`` (train runs)."""


def _output_of(path: Path) -> Path:
    for suffix in SIBLING_SUFFIXES:
        if path.name.endswith(suffix):
            return path.with_name(path.name[: -len(suffix)] + ".jsonl")
    return path


def _train_run(folder: Path) -> RunSource:
    files = RunFiles(folder / TRAIN_ROLLOUTS)
    validation = {
        phase: folder / f"{phase}_aggregate_metrics.json"
        for phase in VALIDATION
        if (folder / f"{phase}_aggregate_metrics.json").is_file()
    }
    return RunSource(
        name=folder.name or str(folder),
        kind="train",
        rollouts=files.output,
        failures=files.failures,
        metrics=files.metrics,
        steps=folder / TRAIN_LOG,
        validation=validation,
    )


def discover(path: Path) -> RunSource:
    """The run ``path`` names; raises RunNotFoundError saying what was expected."""
    if path.is_dir():
        if (path / TRAIN_LOG).is_file() or (path / TRAIN_ROLLOUTS).is_file():
            return _train_run(path)
        raise RunNotFoundError(
            f"{path}: a folder is read as a `gym train run` output, but it has no {TRAIN_LOG} "
            f"or {TRAIN_ROLLOUTS}; pass the run's .jsonl file instead"
        )
    output = _output_of(path)
    files = RunFiles(output)
    if not output.is_file():
        raise RunNotFoundError(
            f"{path}: no such run (expected the --output .jsonl of `gym eval run`, a sibling of it, "
            "or a `gym train run` folder)"
        )
    steps = output.with_name(output.name[: -len(".jsonl")] + "_steps.jsonl")
    return RunSource(
        name=output.name[: -len(".jsonl")] if output.name.endswith(".jsonl") else output.name,
        kind="steps" if steps.is_file() else "eval",
        rollouts=output,
        failures=files.failures,
        metrics=files.metrics,
        steps=steps if steps.is_file() else None,
        validation={},
    )
