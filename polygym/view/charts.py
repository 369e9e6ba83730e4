"""The plots of the viewer, as plotly figures (plain JSON: ``{"data": [...], "layout": {...}}``).

Figures are built as data, not drawn here: the page embeds them as JSON and plotly.js draws them
in the browser. plotly.js itself comes from the installed ``plotly`` package (``PLOTLY_JS``),
served by the viewer and inlined into an exported report, never fetched from a CDN, so both work
offline. Every label is data passed to plotly as text (it does not interpret it as HTML beyond
its own small tag set, and names here are environment names from the run, escaped by it).
"""

from __future__ import annotations

from collections.abc import Collection
from importlib.resources import files
from pathlib import Path
from typing import Any

from polygym.row import ALL_ENVS, env_label
from polygym.view.stats import EnvSummary
from polygym.view.steps import Series
from polygym.view.training import Point


def plotly_js() -> Path:
    """The minified plotly.js bundled with the ``plotly`` package (the ``[view]`` extra)."""
    return Path(str(files("plotly") / "package_data" / "plotly.min.js"))


def _layout(title: str, y_title: str, **extra: Any) -> dict[str, Any]:
    return {
        "title": {"text": title, "font": {"size": 14}, "x": 0.01, "xanchor": "left"},
        "margin": {"l": 50, "r": 10, "t": 40, "b": 40},
        "height": 340,
        "xaxis": {"title": {"text": "step"}},
        "yaxis": {"title": {"text": y_title}, "rangemode": "tozero"},
        "legend": {"orientation": "h", "y": -0.3, "yanchor": "top"},
        **extra,
    }


def _above(s: EnvSummary) -> float:
    r = s.reward
    return 0.0 if r.high is None or r.mean is None else r.high - r.mean


def _below(s: EnvSummary) -> float:
    r = s.reward
    return 0.0 if r.low is None or r.mean is None else r.mean - r.low


def reward_bars(summaries: list[EnvSummary]) -> dict[str, Any]:
    """Mean reward per environment with its 95% interval over tasks."""
    envs = [s for s in summaries if s.reward.mean is not None]
    return {
        "data": [
            {
                "type": "bar",
                "x": [env_label(s.env) for s in envs],
                "y": [s.reward.mean for s in envs],
                "error_y": {
                    "type": "data",
                    "symmetric": False,
                    "array": [_above(s) for s in envs],
                    "arrayminus": [_below(s) for s in envs],
                    "visible": True,
                },
                "hovertemplate": "%{x}: %{y:.3f}<extra></extra>",
            }
        ],
        "layout": _layout(
            "mean reward per environment (95% CI over tasks)", "reward", xaxis={"automargin": True}
        ),
    }


PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
"""One colour per environment in every step plot, so its target line matches its realized one."""


def _colours(series: dict[str, Series]) -> dict[str, str]:
    envs = sorted(e for e in series if e != ALL_ENVS)
    return {e: PALETTE[i % len(PALETTE)] for i, e in enumerate(envs)} | {ALL_ENVS: "#333333"}


def _lines(series: dict[str, Series], name: str, **trace: Any) -> list[dict[str, Any]]:
    colour = _colours(series)
    return [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": env_label(env),
            "x": s.steps,
            "y": s.values[name],
            "marker": {"color": colour[env]},
            "line": {"color": colour[env]},
            **trace,
        }
        for env, s in series.items()
    ]


def step_figures(series: dict[str, Series], validation: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """Reward, realized vs target share, stragglers, token share per step; validation when given."""
    envs = {env: s for env, s in series.items() if env != ALL_ENVS}
    figures = [
        {
            "data": _lines(series, "reward_mean"),
            "layout": _layout("mean reward per environment per step", "reward"),
        }
    ]
    shares = _lines(envs, "realized_share") + [
        {
            **trace,
            "name": f"{trace['name']} target",
            "line": {**trace["line"], "dash": "dot"},
            "mode": "lines",
        }
        for trace in _lines(envs, "target_share")
    ]
    figures.append({"data": shares, "layout": _layout("realized (solid) vs target (dotted) share", "share")})
    stragglers = [{**t, "type": "bar"} for t in _lines(envs, "stragglers")]
    for trace in stragglers:
        trace.pop("mode")
    figures.append(
        {"data": stragglers, "layout": _layout("stragglers per step", "rollouts", barmode="stack")}
    )
    figures.append(
        {"data": _token_share(envs), "layout": _layout("share of tokens per step", "share of tokens")}
    )
    if validation:
        figures.append(validation_figure(validation))
    return figures


def _token_share(envs: dict[str, Series]) -> list[dict[str, Any]]:
    colour = _colours(envs)
    totals: dict[int, float] = {}
    for s in envs.values():
        for step, tokens in zip(s.steps, s.values["tokens"], strict=True):
            totals[step] = totals.get(step, 0.0) + (tokens or 0.0)
    return [
        {
            "type": "scatter",
            "mode": "lines",
            "stackgroup": "tokens",
            "line": {"color": colour[env]},
            "name": env_label(env),
            "x": s.steps,
            "y": [
                (t or 0.0) / totals[step] if totals[step] else 0.0
                for step, t in zip(s.steps, s.values["tokens"], strict=True)
            ],
        }
        for env, s in envs.items()
    ]


def validation_figure(validation: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Each environment's validation reward at each validation point (before/after training)."""
    phases = list(validation)
    agents = sorted({a for rewards in validation.values() for a in rewards})
    data = [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": agent,
            "x": [p.replace("validation_", "") for p in phases],
            "y": [validation[p].get(agent) for p in phases],
        }
        for agent in agents
    ]
    return {
        "data": data,
        "layout": _layout("validation reward per environment", "reward", xaxis={"title": {"text": ""}}),
    }


def validation_curves(points: list[Point], alarmed: Collection[tuple[int, str]] = ()) -> dict[str, Any]:
    """Every validation point of every environment; watched (``eval_only``) ones dashed, points
    with a regression alarm (``alarmed``: (step, environment)) marked by a red cross."""
    envs = sorted({p.env for p in points})
    colour = {e: PALETTE[i % len(PALETTE)] for i, e in enumerate(envs)}
    data = []
    for env in envs:
        mine = [p for p in points if p.env == env]
        watched = any(p.eval_only for p in mine)
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": f"{env} (watched)" if watched else env,
                "x": [p.step for p in mine],
                "y": [p.reward_mean for p in mine],
                "customdata": [p.n for p in mine],
                "hovertemplate": "step %{x}: %{y:.3f} over %{customdata} rollouts"
                "<extra>%{fullData.name}</extra>",
                "line": {"color": colour[env], **({"dash": "dash"} if watched else {})},
                "marker": {"color": colour[env], "size": 8},
            }
        )
    marked = [p for p in points if (p.step, p.env) in alarmed]
    if marked:
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": "regression alarm",
                "x": [p.step for p in marked],
                "y": [p.reward_mean for p in marked],
                "text": [p.env for p in marked],
                "hovertemplate": "%{text}: regression alarm at step %{x}<extra></extra>",
                "marker": {"color": "#c62828", "symbol": "x", "size": 14, "line": {"width": 2}},
            }
        )
    return {
        "data": data,
        "layout": _layout("validation reward per environment, every validation point", "reward"),
    }


def planned_vs_realized(series: dict[str, Series]) -> dict[str, Any]:
    """Each environment's realized share of a step's rollouts (solid) against its plan (dotted):
    ``planned_share`` where the step log has it (``gym train run``), else ``target_share``."""
    envs = {env: s for env, s in series.items() if env != ALL_ENVS}
    planned = (
        "planned_share"
        if any(v is not None for s in envs.values() for v in s.values["planned_share"])
        else "target_share"
    )
    data = _lines(envs, "realized_share") + [
        {
            **trace,
            "name": f"{trace['name']} planned",
            "line": {**trace["line"], "dash": "dot"},
            "mode": "lines",
        }
        for trace in _lines(envs, planned)
    ]
    return {"data": data, "layout": _layout("realized (solid) vs planned (dotted) share per step", "share")}
