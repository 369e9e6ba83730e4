"""The viewer's figures as static SVG, for the exported report.

A served page draws its figures with plotly.js (zoom, hover); an export inlined plotly.js too,
4.6 MB of script in every report, so a 5-rollout run gave a 4.9 MB file. The export draws the
same figure data (``polygym.view.charts``' plotly-shaped dicts) as SVG here instead: lines,
markers, dotted targets, bars with their intervals, a legend; a few KB per figure and no script
at all. Every text (titles, environment names, tick labels) goes through ``markupsafe.escape``.
"""

from __future__ import annotations

import math
from typing import Any

from markupsafe import Markup, escape

WIDTH, HEIGHT = 640, 300
LEFT, RIGHT, TOP, BOTTOM = 50, 150, 30, 40
DEFAULT_COLOUR = "#1f77b4"


def _numbers(values: list[Any]) -> list[float | None]:
    return [float(v) if isinstance(v, int | float) and math.isfinite(v) else None for v in values]


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    if high <= low:
        return [low]
    step = (high - low) / (count - 1)
    return [low + i * step for i in range(count)]


class _Frame:
    """Data coordinates -> SVG coordinates for one plot area."""

    def __init__(self, xs: list[float], ys: list[float]) -> None:
        self.x0, self.x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
        self.y0, self.y1 = min([0.0, *ys]), max([*ys, 1e-9]) if ys else 1.0
        if self.x1 == self.x0:
            self.x0, self.x1 = self.x0 - 0.5, self.x1 + 0.5

    def x(self, value: float) -> float:
        return LEFT + (value - self.x0) / (self.x1 - self.x0) * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        return HEIGHT - BOTTOM - (value - self.y0) / (self.y1 - self.y0) * (HEIGHT - TOP - BOTTOM)


def _text(x: float, y: float, text: str, anchor: str = "start") -> str:
    """A label; ``text`` may come from a run (an environment's name) and is escaped here."""
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="10">{escape(text)}</text>'


def _rect(x: float, y: float, width: float, height: float, colour: str) -> str:
    return f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{height:.1f}" fill="{colour}"/>'


def _axes(frame: _Frame, labels: list[str] | None) -> list[str]:
    bottom = HEIGHT - BOTTOM
    out = [
        f'<line x1="{LEFT}" y1="{bottom}" x2="{WIDTH - RIGHT}" y2="{bottom}" stroke="#999"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{bottom}" stroke="#999"/>',
    ]
    out += [_text(LEFT - 4, frame.y(v) + 4, f"{v:.2g}", "end") for v in _ticks(frame.y0, frame.y1)]
    if labels is None:
        out += [_text(frame.x(v), bottom + 14, f"{v:.3g}", "middle") for v in _ticks(frame.x0, frame.x1)]
    else:
        out += [_text(frame.x(i), bottom + 14, label[:24], "middle") for i, label in enumerate(labels)]
    return out


def _colour(trace: dict[str, Any]) -> str:
    colour = (trace.get("line") or {}).get("color") or (trace.get("marker") or {}).get("color")
    text = str(colour or DEFAULT_COLOUR)
    return text if text.startswith("#") and len(text) <= 9 and text[1:].isalnum() else DEFAULT_COLOUR


def figure_svg(figure: dict[str, Any]) -> Markup:
    """One figure (``{"data": [...], "layout": {...}}``) as an ``<svg>`` element."""
    traces = [t for t in figure.get("data", []) if isinstance(t, dict)]
    title = str(((figure.get("layout") or {}).get("title") or {}).get("text", ""))
    categorical = any(not all(isinstance(x, int | float) for x in t.get("x", [])) for t in traces)
    labels = sorted({str(x) for t in traces for x in t.get("x", [])}) if categorical else None
    xs: list[float] = [-0.5, len(labels) - 0.5] if labels else []  # a category sits mid-slot
    ys: list[float] = []
    for t in traces:
        xs += [] if labels else [x for x in _numbers(t.get("x", [])) if x is not None]
        ys += [y for y in _numbers(t.get("y", [])) if y is not None]
    frame = _Frame(xs, ys)
    parts = [f'<text x="{LEFT}" y="16" font-size="13">{escape(title)}</text>', *_axes(frame, labels)]
    for n, trace in enumerate(traces):
        parts += _trace(trace, frame, labels, n, len(traces))
        legend_y = TOP + 14 * n
        if trace.get("name"):
            parts.append(_rect(WIDTH - RIGHT + 10, legend_y - 8, 10, 10, _colour(trace)))
            parts.append(_text(WIDTH - RIGHT + 24, legend_y + 1, str(trace["name"])[:28]))
    body = "".join(parts)
    return Markup(
        f'<svg class="figure-svg" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="100%" role="img">{body}</svg>'
    )


def _trace(trace: dict[str, Any], frame: _Frame, labels: list[str] | None, n: int, count: int) -> list[str]:
    colour = _colour(trace)
    raw_x = trace.get("x", [])
    xs = [float(labels.index(str(x))) for x in raw_x] if labels else _numbers(raw_x)
    points = [
        (x, y)
        for x, y in zip(xs, _numbers(trace.get("y", [])), strict=False)
        if x is not None and y is not None
    ]
    if trace.get("type") == "bar":
        slots = len(labels) if labels else max(1, len(points))
        width = (WIDTH - LEFT - RIGHT) / slots / max(1, count) * 0.8
        out = []
        for x, y in points:
            left = frame.x(x) - width * count / 2 + n * width
            top, base = frame.y(max(y, 0.0)), frame.y(min(y, 0.0))
            out.append(_rect(left, top, width, base - top, colour))
        return out
    dash = ' stroke-dasharray="4 3"' if (trace.get("line") or {}).get("dash") else ""
    path = " ".join(f"{frame.x(x):.1f},{frame.y(y):.1f}" for x, y in points)
    out = [f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"{dash}/>']
    if "markers" in str(trace.get("mode", "")):
        out += [
            f'<circle cx="{frame.x(x):.1f}" cy="{frame.y(y):.1f}" r="2.5" fill="{colour}"/>'
            for x, y in points
        ]
    return out
