"""What each page shows, as plain data for the templates (one function per page).

These are the view models: they pick rows, read the few that a page shows back from disk, and
shape numbers for display. They never format HTML; the templates do, with autoescaping, so a
rollout's text reaches the browser only as escaped text.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson

from polygym.collect.compare import CompareError, compare
from polygym.row import ALL_ENVS, ENV_FIELD, INDEX_FIELDS, STEP_FIELD, env_label
from polygym.view import charts
from polygym.view.conversation import MAX_TEXT, Block, conversation
from polygym.view.index import RunIndex
from polygym.view.query import Page, RowFilter, page_of, parse_filter, parse_page, select
from polygym.view.stats import EnvSummary, compare_envs, env_rows, flips, summarize
from polygym.view.steps import read_steps, read_validation

PREVIEW_CHARS = 140
DASH = "\u2013"
"""What a table shows for a number it does not have."""
MAX_FLIPS = 500
HIDDEN_FIELDS = {"response", "responses_create_params", "agent_ref", *INDEX_FIELDS, ENV_FIELD, STEP_FIELD}


_memo: dict[tuple[str, tuple[int, ...]], tuple[tuple[tuple[int, int], ...], Any]] = {}


def _remembered(name: str, indexes: tuple[RunIndex, ...], compute: Callable[[], Any]) -> Any:
    """The last result of ``compute`` for these indexes while none of them changed: the overview and
    the comparison scan every row, and a person reloads them far more often than a run grows."""
    key = (name, tuple(id(x) for x in indexes))
    state = tuple((x.generation, len(x)) for x in indexes)
    hit = _memo.get(key)
    if hit is not None and hit[0] == state:
        return hit[1]
    value = compute()
    _memo[key] = (state, value)
    return value


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
    return dict(_remembered("overview", (index,), lambda: _overview(index)))


def _overview(index: RunIndex) -> dict[str, Any]:
    latency = latency_by_agent(index.source.metrics)
    rows = env_rows(index)
    summaries = [
        summarize(index, env, members, latency.get(env))
        for env, members in sorted(rows.items(), key=lambda kv: (kv[0] == ALL_ENVS, kv[0]))
        if env != ALL_ENVS or len(rows) > 2
    ]
    if len(rows) == 2:  # one environment: the roll-up is the same numbers again
        summaries.append(summarize(index, ALL_ENVS, rows[ALL_ENVS], None))
    ks = sorted({k for s in summaries for k in s.pass_at}, key=_k_order)
    return {
        "summaries": summaries,
        "pass_keys": ks,
        "figure": charts.reward_bars([s for s in summaries if s.env != ALL_ENVS]),
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
        failed=index.failed[i],
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
    repeats = [j for j in select(index, RowFilter(task=index.task_key[i]))]
    return {
        "row": list_row(index, i),
        "blocks": blocks,
        "fields": fields,
        "repeats": [(j, index.reward[j], index.failed[j]) for j in repeats],
        "error": str(data.get("error", "")) if failed else "",
    }


def fmt(value: float | None, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return DASH
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def comparison(base: RunIndex, new: RunIndex) -> dict[str, Any]:
    return dict(_remembered("comparison", (base, new), lambda: _comparison(base, new)))


def _comparison(base: RunIndex, new: RunIndex) -> dict[str, Any]:
    metric_rows: list[dict[str, Any]] = []
    if base.source.metrics.is_file() and new.source.metrics.is_file():
        try:
            result = compare(base.source.metrics, new.source.metrics)
            metric_rows = [
                {"env": env_label(e.env), "status": e.status, **m.__dict__}
                for e in result.candidates[0].environments
                for m in e.metrics
            ]
        except CompareError:
            metric_rows = []
    found = flips(base, new)
    return {
        "deltas": compare_envs(base, new),
        "flips": found[:MAX_FLIPS],
        "flips_total": len(found),
        "losses": sum(not f.now_solved for f in found),
        "gains": sum(f.now_solved for f in found),
        "metric_rows": metric_rows,
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
        "left_repeats": [(j, base.reward[j], base.failed[j]) for j in a],
        "right_repeats": [(j, new.reward[j], new.failed[j]) for j in b],
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
