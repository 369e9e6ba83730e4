"""The viewer's HTTP surface and the exported report: read-only, escaped, nothing outside the runs."""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from polygym.view.app import create_app, embed_json
from polygym.view.export import export_html
from polygym.view.viewer import open_runs
from tests.view.demo_run import XSS, make_pair


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_pair(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def client(runs: tuple[Path, Path]) -> TestClient:
    return TestClient(create_app(open_runs(list(runs), echo=lambda _: None)))


def test_pages_answer_with_security_headers(client: TestClient) -> None:
    for path in ("/run/0", "/run/0/rollouts", "/run/0/rollouts/3", "/compare/0/1", "/run/1/count.json"):
        reply = client.get(path)
        assert reply.status_code == 200, path
        assert "default-src 'self'" in reply.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in reply.headers["content-security-policy"]
        assert reply.headers["x-content-type-options"] == "nosniff"
    count = client.get("/run/1/count.json").json()
    assert count["rows"] == 22 and count["live"] is True and count["version"].startswith("22:")


def test_failure_row_shows_its_error(client: TestClient) -> None:
    rows = client.get("/run/0/rollouts?status=failed").text
    number = re.search(r'data-row="(\d+)"', rows)
    assert number is not None
    page = client.get(f"/run/0/rollouts/{number.group(1)}").text
    assert "failed: HTTP 400" in page and "scripted error" in page and "Oslo" in page


def test_read_only_bounded_and_no_paths(client: TestClient) -> None:
    assert client.post("/run/0").status_code == 405
    assert client.get("/run/0/rollouts?q=" + "x" * 5000).status_code == 414
    assert client.get("/run/0/rollouts?min=abc").status_code == 400
    assert client.get("/run/7").status_code == 404
    assert client.get("/run/0/rollouts/999").status_code == 404
    for path in ("/static/../app.py", "/static/%2e%2e%2fapp.py", "/static/templates", "/etc/passwd"):
        assert client.get(path).status_code == 404, path
    assert client.get("/static/plotly.min.js").status_code == 200


def test_model_output_is_escaped(client: TestClient) -> None:
    rows = client.get("/run/0/rollouts?q=onerror").text
    number = re.search(r'data-row="(\d+)"', rows)
    assert number is not None
    page = client.get(f"/run/0/rollouts/{number.group(1)}").text
    assert XSS not in page and "&lt;script&gt;alert(" in page and "<img src=x" not in page
    assert (
        embed_json({"t": "</script><b>\u2028&"})
        == '{"t":"\\u003c/script\\u003e\\u003cb\\u003e\\u2028\\u0026"}'
    )


def test_export_is_self_contained_script_free_and_sized_to_its_content(runs: tuple[Path, Path]) -> None:
    html = export_html(open_runs(list(runs), echo=lambda _: None))
    assert "<script" not in html and not re.search(r"<link[^>]+href=\"http|<img[^>]+src=\"http", html)
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html)
    assert csp is not None
    policy = unescape(csp.group(1))
    assert "default-src 'none'" in policy and "script-src" not in policy
    assert html.count("<svg") >= 2  # each run's reward figure, drawn as SVG
    assert XSS not in html and "&lt;script&gt;alert(" in html
    assert "solved → unsolved" in html and "example_multi_step_simple_agent" in html
    # two runs of 22 rows with their conversations: tens of KB, not the 4.6 MB of plotly.js
    assert len(html.encode()) < 400_000
