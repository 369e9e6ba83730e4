"""What each page shows, as plain data for the templates (one function per page).

These are the view models: they pick rows, read the few that a page shows back from disk, and
shape numbers for display. They never format HTML; the templates do, with autoescaping, so a
rollout's text reaches the browser only as escaped text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson

from polygym.row import ENV_FIELD, INDEX_FIELDS, STEP_FIELD
from polygym.view import charts
from polygym.view.conversation import MAX_TEXT, Block, conversation
from polygym.view.index import RunIndex
from polygym.view.query import Page, RowFilter, page_of, parse_filter, parse_page, select
from polygym.view.stats import (
    REWARD,
    EnvSummary,
    compare_indexes,
    env_tasks,
    flips,
    rollup,
    rows_by_env,
    summarize,
)
from polygym.view.steps import read_steps, read_validation
from polygym.view.training import REGRESSION, Training, read_training

PREVIEW_CHARS = 140
DASH = "\u2013"
"""What a table shows for a number it does not have."""
MAX_FLIPS = 500
HIDDEN_FIELDS = {"response", "responses_create_params", "agent_ref", *INDEX_FIELDS, ENV_FIELD, STEP_FIELD}


def latency_by_agent(metrics: Path) -> dict[str, dict[str, float]]:
    """``latency/pNN_s`` of each agent in a run's metrics file (written when the run ends)."""
    try:
        entries = orjson.loads(metrics.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    out: dict[str, dict[str, float]] = {}
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        name = (entry.get("agent_ref") or {}).get("name")
        values = entry.get("agent_metrics") or {}
        found = {p: values.get(f"latency/{p}_s") for p in ("p50", "p90", "p99")}
        if isinstance(name, str) and all(isinstance(v, int | float) for v in found.values()):
            out[name] = {p: float(v) for p, v in found.items() if v is not None}
    return out


def overview(index: RunIndex) -> dict[str, Any]:
    """Per-environment numbers (``polygym.view.stats``), the (all) row when there are several."""
    latency = latency_by_agent(index.source.metrics)
    rows, tasks = rows_by_env(index), env_tasks(index)
    summaries = [
        summarize(index, env, rows[env], tasks.get(env, {}), latency.get(env)) for env in sorted(rows)
    ]
    envs = list(summaries)
    if len(summaries) > 1:
        summaries.append(rollup(index, summaries))
    ks = sorted({k for s in summaries for k in s.pass_at}, key=_k_order)
    return {
        "summaries": summaries,
        "pass_keys": ks,
        "figure": charts.reward_bars(envs),
        "skipped": index.skipped,
    }


def _k_order(key: str) -> tuple[int, str]:
    head = key.split("@", 1)[1]
    return (int(head) if head.isdigit() else 10**9, key)


def steps_page(index: RunIndex) -> dict[str, Any]:
    series = read_steps(index.source.steps)
    validation = read_validation(index.source.validation)
    return {"figures": charts.step_figures(series, validation) if series else [], "has_steps": bool(series)}


def _preview(row: Mapping[str, Any]) -> str:
    if "error_class" in row and "response" not in row:
        return str(row.get("error", ""))[:PREVIEW_CHARS]
    texts = [b.text for b in conversation(row) if b.kind == "message" and b.role == "assistant" and b.text]
    text = texts[-1] if texts else ""
    return text[:PREVIEW_CHARS] + ("…" if len(text) > PREVIEW_CHARS else "")


@dataclass
class ListRow:
    number: int
    env: str
    task: int
    repeat: int
    step: int
    reward: float
    failed: bool
    failure_class: str
    turns: int
    tokens: int
    preview: str


def list_row(index: RunIndex, i: int) -> ListRow:
    code = index.failure_class[i]
    return ListRow(
        number=i,
        env=index.envs[index.env[i]],
        task=index.task[i],
        repeat=index.repeat[i],
        step=index.step[i],
        reward=index.reward[i],
        failed=bool(index.failed[i]),
        failure_class=index.classes[code] if code >= 0 else "",
        turns=index.turns[i],
        tokens=index.tokens[i],
        preview=_preview(index.row(i)),
    )


def rollout_list(index: RunIndex, params: Mapping[str, str]) -> dict[str, Any]:
    """Raises ``QueryError`` on a bad filter value."""
    flt = parse_filter(params)
    number, per_page = parse_page(params)
    page: Page = page_of(select(index, flt), number, per_page)
    query = flt.params()
    return {
        "filter": flt,
        "page": page,
        "rows": [list_row(index, i) for i in page.rows],
        "envs": sorted(index.envs),
        "classes": sorted(index.classes),
        "has_steps": any(s >= 0 for s in index.step[:1000]),
        "prev_query": urlencode({**query, "page": page.number - 1}) if page.number > 1 else None,
        "next_query": urlencode({**query, "page": page.number + 1}) if page.number < page.pages else None,
    }


def _field_text(value: Any) -> str:
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + f" … ({len(text) - MAX_TEXT} characters cut)"


def rollout_detail(index: RunIndex, i: int) -> dict[str, Any]:
    data = index.row(i)
    failed = index.failed[i]
    inner = data.get("row")
    row: dict[str, Any] = inner if failed and isinstance(inner, dict) else data
    blocks: list[Block] = conversation(row)
    fields = {k: _field_text(v) for k, v in data.items() if k not in HIDDEN_FIELDS and k != "row"}
    repeats = select(index, RowFilter(task=index.task_key_of(i)))
    return {
        "row": list_row(index, i),
        "blocks": blocks,
        "fields": fields,
        "repeats": [(j, index.reward[j], bool(index.failed[j])) for j in repeats],
        "error": str(data.get("error", "")) if failed else "",
    }


def fmt(value: float | None, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return DASH
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def comparison(base: RunIndex, new: RunIndex) -> dict[str, Any]:
    """``gym eval compare`` of the two runs (``polygym.view.stats.compare_indexes``): the reward
    table, every metric with its interval, and the flipped tasks."""
    result = compare_indexes(base, new)
    candidate = result.candidates[0]
    deltas = []
    for env in candidate.environments:
        reward = next((m for m in env.metrics if m.metric == REWARD), None)
        if reward is not None:
            deltas.append({"env": env.env, "status": env.status, "paired": env.paired_tasks, "m": reward})
    found = flips(base, new, result)
    return {
        "deltas": deltas,
        "metric_rows": [
            {"env": env.env, "status": env.status, "m": m}
            for env in candidate.environments
            for m in env.metrics
        ],
        "regressions": candidate.regressions,
        "flips": found[:MAX_FLIPS],
        "flips_total": len(found),
        "losses": sum(not f.now_solved for f in found),
        "gains": sum(f.now_solved for f in found),
        "confidence": result.confidence,
        "resamples": result.resamples,
    }


def side_by_side(
    base: RunIndex, new: RunIndex, key: str, left: int | None, right: int | None
) -> dict[str, Any]:
    """The rollouts of task ``key`` in both runs; ``left``/``right`` pick the repeat shown."""
    a = select(base, RowFilter(task=key))
    b = select(new, RowFilter(task=key))
    left = left if left in a else (a[0] if a else None)
    right = right if right in b else (b[0] if b else None)
    return {
        "key": key,
        "left": rollout_detail(base, left) if left is not None else None,
        "right": rollout_detail(new, right) if right is not None else None,
        "left_repeats": [(j, base.reward[j], bool(base.failed[j])) for j in a],
        "right_repeats": [(j, new.reward[j], bool(new.failed[j])) for j in b],
        "left_number": left,
        "right_number": right,
    }


def summary_cells(s: EnvSummary) -> dict[str, str]:
    """Formatted numbers of one overview row (templates stay free of arithmetic)."""
    r = s.reward
    return {
        "reward": fmt(r.mean),
        "ci": f"[{r.low:.3f}, {r.high:.3f}]" if r.low is not None and r.high is not None else "",
        "tokens": f"{s.tokens_mean:.0f}" if s.tokens_mean is not None else DASH,
        "turns": f"{s.turns_mean:.1f}" if s.turns_mean is not None else DASH,
        **{
            p: (f"{s.latency[p]:.3f}" if s.latency.get(p) is not None else DASH)
            for p in ("p50", "p90", "p99")
        },
    }


@dataclass
class ValidationRow:
    step: int
    run: int | None
    """The viewer's run number of the rollouts behind this point (None: no such file, yet)."""
    cells: dict[str, Any]
    """Environment -> ``{"mean", "n", "env"}`` (``env``: its name in that run's rows, to filter by)."""
    alarms: list[str]


def training_page(index: RunIndex, points: Mapping[int, tuple[int, RunIndex]]) -> dict[str, Any]:
    """The training view: validation curves with every point, the rollouts behind each point,
    planned vs realized shares per step, the step rewards and the alarms so far."""
    source = index.source
    assert source.folder is not None
    training: Training = read_training(source.folder, source.steps)
    series = read_steps(source.steps)
    alarmed = {(a.step, a.env) for a in training.alarms if a.kind == REGRESSION}
    figures = [charts.validation_curves(training.points, alarmed)] if training.points else []
    if series:
        figures.append(charts.planned_vs_realized(series))
        figures.append(charts.step_figures(series, {})[0])
    envs = sorted({p.env for p in training.points})
    rows = []
    for step in sorted({p.step for p in training.points}):
        number, found = points.get(step, (None, None))
        names = set(found.envs) if found is not None else set()
        cells = {
            p.env: {
                "mean": p.reward_mean,
                "n": p.n,
                "env": p.env if p.env in names else training.agents.get(p.env, p.env),
            }
            for p in training.points
            if p.step == step
        }
        alarms = [f"{a.env}: {a.kind}" for a in training.alarms if a.step == step]
        rows.append(ValidationRow(step, number, cells, alarms))
    return {
        "training": training,
        "envs": envs,
        "validation_rows": rows,
        "figures": figures,
        "steps_logged": len({step for s in series.values() for step in s.steps}),
    }
