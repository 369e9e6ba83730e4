"""``gym view --export report.html``: one HTML file that shows a run with no server and no network.

The report holds the overview of every run, the step plots, the comparison of the first two runs
and the first rollouts of each run with their conversations, all rendered by the same templates
as the served pages (autoescaped). Its size is its content: the figures are static SVG
(``polygym.view.svg``, a few KB each) and the stylesheet (5 KB) is inlined; there is no script at
all (plotly.js, 4.6 MB, made a 5-rollout report 4.9 MB). Past that, the rollouts' conversations
dominate (at most ``ROLLOUTS_PER_RUN`` per run, each text cut at ``MAX_TEXT`` characters). The
file's Content-Security-Policy allows no script and no network, so the report opened from a mail
attachment cannot call out, and a ``<script>`` in a rollout stays text even where escaping would
have failed.
"""

from __future__ import annotations

from pathlib import Path

from markupsafe import Markup

from polygym.view import pages
from polygym.view.app import PACKAGE, templates
from polygym.view.index import RunIndex
from polygym.view.query import RowFilter, select

ROLLOUTS_PER_RUN = 100
"""Rollouts whose conversation the report carries per run (failures and lowest rewards first)."""


CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
"""No script, no fetch: a report is text, tables and SVG."""


def _inline(text: str, what: str) -> Markup:
    """Our own file, inlined as is (its hash is in the CSP); it must not be able to end its element."""
    if "</script" in text.lower() or "</style" in text.lower():
        raise ValueError(f"{what} contains a closing tag and cannot be inlined")
    return Markup(text)  # a file of the package, not run content


def _chosen_rows(index: RunIndex) -> list[int]:
    """Failures, then the lowest-reward rollouts: what someone reading a report looks for first."""
    rows = select(index, RowFilter())
    rows.sort(key=lambda i: (not index.failed[i], index.reward[i], i))
    return sorted(rows[:ROLLOUTS_PER_RUN])


def export_html(indexes: list[RunIndex]) -> str:
    runs = [(i, x.source) for i, x in enumerate(indexes)]
    sections = []
    for number, index in enumerate(indexes):
        sections.append(
            {
                "number": number,
                "source": index.source,
                "rows": len(index),
                "overview": pages.overview(index),
                "steps": pages.steps_page(index),
                "rollouts": [pages.rollout_detail(index, i) for i in _chosen_rows(index)],
            }
        )
    comparison = pages.comparison(indexes[0], indexes[1]) if len(indexes) > 1 else None
    return (
        templates()
        .get_template("export.html")
        .render(
            runs=runs,
            export=True,
            export_csp=CSP,
            inline_css=_inline((PACKAGE / "static" / "view.css").read_text(encoding="utf-8"), "view.css"),
            sections=sections,
            comparison=comparison,
            per_run=ROLLOUTS_PER_RUN,
        )
    )


def write_export(indexes: list[RunIndex], path: Path) -> int:
    """Write the report; returns its size in bytes."""
    html = export_html(indexes).encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(html)
    return len(html)
