"""Checkpoints of ``gym train run`` and its exact resume (``--checkpoint-every N``, ``--resume``).

A checkpoint is what TRL/transformers save themselves in ``OUTPUT/trainer/checkpoint-N`` (weights,
optimizer, scheduler, the RNG states of Python, NumPy and torch, and the trainer state with its
global step and log history), plus polygym's marker ``polygym_checkpoint.json`` (``{"step": N}``),
written only once the trainer's files are complete: a checkpoint without it was cut mid-save and is
never resumed from. Two are kept, so a kill during a save still leaves the one before.

What needs no saving, by design:

- **the sampler**: step N's prompts are a function of the blend's seed and N alone
  (``blend.sampler``), and so are dynamic sampling's extra draws (``blend.dynamic_sampling``); the
  resumed trainer skips the N generation batches it already trained and the rollout hook checks
  that the prompts TRL hands it are step N's;
- **the files**: every record names its step, so a resume cuts each file back to the steps before
  N (the rollout files through the step collector's own continuation, ``train_log.jsonl`` and
  ``validation.jsonl`` here) and the resumed run writes steps N.. exactly once: no record is
  duplicated or lost, whatever step the kill interrupted.

A resume must use the run's settings: ``run.json`` (the run record, written at the start) is
compared with the new ones, and any difference other than ``--resume`` and ``--report-to`` is
refused, naming the settings, because it would make the continued run a different run.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from polygym.jsonl import iter_jsonl, write_jsonl

MARKER = "polygym_checkpoint.json"
RUN_RECORD = "run.json"
TRAINER_DIR = "trainer"
"""The trainer's folder in a run's output: its checkpoints live there."""
KEPT_CHECKPOINTS = 2
_FREE_ON_RESUME = frozenset({"resume", "report_to"})
_CHECKPOINT_DIR = re.compile(r"checkpoint-(\d+)")


class ResumeError(ValueError):
    """The run cannot be resumed as asked; the message says why and what to do."""


def checkpoint_config(every: int | None) -> dict[str, Any]:
    """``GRPOConfig`` settings that save a checkpoint every ``every`` optimizer steps (None: never)."""
    if every is None:
        return {"save_strategy": "no"}
    return {
        "save_strategy": "steps",
        "save_steps": every,
        "save_total_limit": KEPT_CHECKPOINTS,
        "save_only_model": False,
    }


def marker_callback() -> Any:
    """A ``TrainerCallback`` that marks each checkpoint complete once the trainer has saved it."""
    from transformers import TrainerCallback

    class CheckpointMarker(TrainerCallback):
        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if folder.is_dir():
                (folder / MARKER).write_text(json.dumps({"step": state.global_step}))

    return CheckpointMarker()


def latest_checkpoint(trainer_dir: Path) -> tuple[Path, int] | None:
    """The newest complete checkpoint under ``trainer_dir`` and its step (None: there is none)."""
    found = []
    for folder in trainer_dir.glob("checkpoint-*") if trainer_dir.is_dir() else ():
        match = _CHECKPOINT_DIR.fullmatch(folder.name)
        if match and (folder / MARKER).is_file():
            found.append((int(match.group(1)), folder))
    if not found:
        return None
    step, folder = max(found)
    return folder, step


def write_run_record(output: Path, settings: dict[str, Any]) -> None:
    """``run.json``: the run's settings, written before its first validation, so what reads the
    folder while the run goes (the viewer: its ``--max-regression`` limits) knows them."""
    (output / RUN_RECORD).write_text(json.dumps({"settings": settings}, indent=2, default=str))


def start_fresh(output: Path, trainer_dir: Path, settings: dict[str, Any]) -> None:
    """Record a new run's settings and remove the checkpoints of any earlier run in ``output``:
    a resume must never continue from a checkpoint of another run (the trainer would also count
    them among the ones it keeps)."""
    write_run_record(output, settings)
    for folder in trainer_dir.glob("checkpoint-*") if trainer_dir.is_dir() else ():
        if _CHECKPOINT_DIR.fullmatch(folder.name) and folder.is_dir():
            shutil.rmtree(folder)


def check_resumable(output: Path, settings: dict[str, Any]) -> tuple[Path, int]:
    """The checkpoint to resume ``output``'s run from; ResumeError when there is none or the
    settings differ from the run record's."""
    record_path = output / RUN_RECORD
    if not record_path.is_file():
        raise ResumeError(f"--resume: no run to resume in {output} (no {RUN_RECORD}); run without --resume")
    recorded = json.loads(record_path.read_text()).get("settings", {})
    settings = json.loads(json.dumps(settings))  # as recorded: tuples become lists
    changed = sorted(
        key
        for key in set(recorded) | set(settings)
        if key not in _FREE_ON_RESUME and recorded.get(key) != settings.get(key)
    )
    if changed:
        details = "; ".join(f"{k}: {recorded.get(k)!r} -> {settings.get(k)!r}" for k in changed)
        raise ResumeError(f"--resume: settings differ from the run in {output} ({details}); use the run's")
    found = latest_checkpoint(output / TRAINER_DIR)
    if found is None:
        raise ResumeError(
            f"--resume: no complete checkpoint in {output / TRAINER_DIR} (was --checkpoint-every given?); "
            "run again without --resume"
        )
    return found


def keep_steps_before(path: Path, step: int) -> list[dict[str, Any]]:
    """Cut a JSONL file of ``{"step": ...}`` records back to the steps before ``step``; the kept records."""
    kept = [line for line in iter_jsonl(path) if isinstance(line.get("step"), int) and line["step"] < step]
    write_jsonl(kept, path)
    return kept
