"""Which files make up a run, found from the one path a person types.

``gym view`` takes what people have at hand: the ``--output`` JSONL of ``gym eval run`` (or any of
its siblings), a step-wise run (the same files plus ``_steps.jsonl``), or a ``gym train run``
folder (or a watch's, which writes the same validation files: ``polygym.view.training``).
``discover`` turns that path into a ``RunSource``: the only files the viewer ever opens for that
run. Routes name runs by their number on the command line, so these files are the whole
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
CURVES = "validation.jsonl"
SUMMARY = "summary.json"
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
    folder: Path | None = None
    """A training (or watch) run's folder: the training page reads its validation files."""

    @property
    def ended(self) -> Path:
        """The file whose presence says the run has ended: the metrics file of an eval run, the
        ``summary.json`` of a training run."""
        return self.folder / SUMMARY if self.folder is not None else self.metrics


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
        folder=folder,
    )


def discover(path: Path) -> RunSource:
    """The run ``path`` names; raises RunNotFoundError saying what was expected."""
    if path.is_dir():
        if any((path / name).is_file() for name in (TRAIN_LOG, TRAIN_ROLLOUTS, CURVES)):
            return _train_run(path)
        raise RunNotFoundError(
            f"{path}: a folder is read as the output of `gym train run` or of a watch, but it has "
            f"no {TRAIN_LOG}, {TRAIN_ROLLOUTS} or {CURVES}; pass the run's .jsonl file instead"
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
