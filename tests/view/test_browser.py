"""``gym view`` in a real browser: headless Chromium (Debian's ``chromium`` + ``chromium-driver``,
installed by ``.ci/run``) driven by selenium over a run made by the scripted model.

Each test asserts what a person would see and saves a screenshot (to ``$POLYGYM_VIEW_SHOTS`` when
set, else the test's temporary folder). Without Chromium and its driver the tests are skipped
with that reason.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from polygym.net.thread_server import ThreadServer
from polygym.view.app import create_app
from polygym.view.export import write_export
from polygym.view.viewer import find_runs, open_runs
from tests.conftest import wait_until
from tests.view.demo_run import XSS, make_pair, make_steps_run
from tests.view.train_run import STEPS, grow
from tests.view.train_run import XSS as TRAIN_XSS

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (CHROMIUM and DRIVER),
        reason="needs chromium and chromedriver (apt-get install chromium chromium-driver)",
    ),
]


@pytest.fixture(scope="module")
def viewer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    base, new = make_pair(tmp_path_factory.mktemp("runs"))
    server = ThreadServer(create_app(open_runs([base, new], echo=lambda _: None)))
    asyncio.run(server.start(timeout_s=30))
    yield server.url
    asyncio.run(server.stop(timeout_s=10))


def serve(paths: list[Path]) -> ThreadServer:
    server = ThreadServer(create_app(open_runs(paths, echo=lambda _: None)))
    asyncio.run(server.start(timeout_s=30))
    return server


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1440,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=str(DRIVER)))
    yield driver
    driver.quit()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("POLYGYM_VIEW_SHOTS", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def follow(browser: object, element: object) -> None:
    """Click a link or submit button and wait until the next page has loaded.

    A click returns before the navigation it starts; reading the page right away can find the old
    page's elements (stale by the time they are read). The old ``<html>`` going stale and the new
    document being complete is the sign the next page is there.
    """
    old = browser.find_element(By.TAG_NAME, "html")  # type: ignore[attr-defined]
    element.click()  # type: ignore[attr-defined]

    def loaded() -> bool:
        try:
            _ = old.tag_name  # raises once the old page is gone
            return False
        except StaleElementReferenceException:
            pass
        except WebDriverException as exc:
            # Mid-navigation Chromium may answer "Node with given id does not belong to the
            # document" instead of a stale reference: the old page is gone all the same.
            if "does not belong to the document" not in str(exc):
                raise
        try:
            return browser.execute_script("return document.readyState") == "complete"  # type: ignore[attr-defined]
        except WebDriverException:
            return False  # the new document is not there yet to run scripts in

    assert wait_until(loaded, 10)


def drawn(browser: object, count: int) -> bool:
    return len(browser.find_elements(By.CSS_SELECTOR, "[data-drawn] .main-svg")) >= count  # type: ignore[attr-defined]


def no_console_errors(browser: object) -> None:
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]  # type: ignore[attr-defined]
    assert not errors, errors


def test_overview_shows_environment_rows_and_a_plot(browser: object, viewer: str, shots: Path) -> None:
    browser.get(f"{viewer}/run/0")  # type: ignore[attr-defined]
    rows = browser.find_elements(By.CSS_SELECTOR, "table.overview tbody tr")  # type: ignore[attr-defined]
    names = [r.find_element(By.CSS_SELECTOR, "td.name").text for r in rows]
    assert names == [
        "example_multi_step_simple_agent",
        "example_single_tool_call_simple_agent",
        "(all) reward, pass@k: mean of the 2 environments",
    ]
    single = rows[1].text
    assert "HTTP 400: 2" in single and "0.833" in single  # 2 failures; 5 of 6 tasks solved
    assert wait_until(lambda: drawn(browser, 1), 10)
    browser.save_screenshot(str(shots / "overview.png"))  # type: ignore[attr-defined]
    no_console_errors(browser)


def test_rollout_page_puts_tool_call_next_to_output(browser: object, viewer: str, shots: Path) -> None:
    browser.get(f"{viewer}/run/0/rollouts?env=example_multi_step_simple_agent")  # type: ignore[attr-defined]
    follow(browser, browser.find_element(By.CSS_SELECTOR, "table.rollouts tbody tr td a"))  # type: ignore[attr-defined]
    tools = browser.find_elements(By.CSS_SELECTOR, ".conversation .tool")  # type: ignore[attr-defined]
    assert len(tools) >= 2
    call, output = (
        tools[0].find_element(By.CSS_SELECTOR, ".call"),
        tools[0].find_element(By.CSS_SELECTOR, ".output"),
    )
    assert "get_synonym_value" in call.text and '"synonym"' in call.text
    assert "synonym_value" in output.text
    assert abs(call.location["y"] - output.location["y"]) < 5  # side by side, same row
    verdict = browser.find_element(By.CSS_SELECTOR, ".verdict").text  # type: ignore[attr-defined]
    assert "reward 1.000" in verdict and "ordered_match" in verdict
    assert len(browser.find_elements(By.CSS_SELECTOR, ".repeats a")) == 1  # type: ignore[attr-defined]
    browser.save_screenshot(str(shots / "rollout.png"))  # type: ignore[attr-defined]


def test_filters_narrow_the_list(browser: object, viewer: str, shots: Path) -> None:
    browser.get(f"{viewer}/run/0/rollouts")  # type: ignore[attr-defined]
    count = browser.find_element(By.ID, "count")  # type: ignore[attr-defined]
    assert count.text.startswith("24 of 24")
    browser.find_element(By.NAME, "status").send_keys("failed")  # type: ignore[attr-defined]
    follow(browser, browser.find_element(By.CSS_SELECTOR, "form.filters button"))  # type: ignore[attr-defined]
    assert browser.find_element(By.ID, "count").text.startswith("2 of 24")  # type: ignore[attr-defined]
    browser.get(f"{viewer}/run/0/rollouts?q=cape+town")  # type: ignore[attr-defined]
    # task 0 and the XSS task (a copy of task 0's row: its expected city is still Cape Town)
    assert browser.find_element(By.ID, "count").text.startswith("4 of 24")  # type: ignore[attr-defined]
    browser.get(f"{viewer}/run/0/rollouts?min=0.5&env=example_single_tool_call_simple_agent")  # type: ignore[attr-defined]
    assert browser.find_element(By.ID, "count").text.startswith(
        "10 of 24"
    )  # 5 tasks x 2 pass; not the XSS task (0) nor failures  # type: ignore[attr-defined]
    browser.save_screenshot(str(shots / "rollouts.png"))  # type: ignore[attr-defined]


def test_xss_row_shows_as_text(browser: object, viewer: str, shots: Path) -> None:
    browser.get(f"{viewer}/run/0/rollouts?q=onerror")  # type: ignore[attr-defined]
    assert browser.find_element(By.ID, "count").text.startswith("2 of 24")  # type: ignore[attr-defined]
    follow(browser, browser.find_element(By.CSS_SELECTOR, "table.rollouts tbody tr td a"))  # type: ignore[attr-defined]
    user = [m.text for m in browser.find_elements(By.CSS_SELECTOR, ".msg.role-user")]  # type: ignore[attr-defined]
    assert any(XSS in text for text in user)
    assert browser.find_elements(By.CSS_SELECTOR, "main img") == []  # type: ignore[attr-defined]
    assert browser.execute_script("return typeof window.alert === 'function' && document.scripts.length") == 2  # type: ignore[attr-defined]
    browser.save_screenshot(str(shots / "xss.png"))  # type: ignore[attr-defined]
    no_console_errors(browser)


def test_compare_shows_flips_and_both_rollouts(browser: object, viewer: str, shots: Path) -> None:
    browser.get(f"{viewer}/compare/0/1")  # type: ignore[attr-defined]
    flips = browser.find_elements(By.CSS_SELECTOR, "table.flips tbody tr")  # type: ignore[attr-defined]
    changes = sorted(f.find_elements(By.TAG_NAME, "td")[2].text for f in flips)
    assert changes == ["solved → unsolved", "solved → unsolved", "unsolved → solved"]
    deltas = browser.find_element(By.CSS_SELECTOR, "table.deltas").text  # type: ignore[attr-defined]
    assert "paired" in deltas.lower() or "6" in deltas
    browser.save_screenshot(str(shots / "compare.png"))  # type: ignore[attr-defined]
    follow(browser, flips[0].find_element(By.CSS_SELECTOR, "a.side"))
    left = browser.find_element(By.CSS_SELECTOR, ".side-left .verdict").text  # type: ignore[attr-defined]
    right = browser.find_element(By.CSS_SELECTOR, ".side-right .verdict").text  # type: ignore[attr-defined]
    assert "reward 1.000" in left and "reward 0.000" in right
    browser.save_screenshot(str(shots / "side_by_side.png"))  # type: ignore[attr-defined]


def test_export_draws_offline_under_its_own_csp(browser: object, shots: Path, tmp_path: Path) -> None:
    base, new = make_pair(tmp_path / "runs")
    report = tmp_path / "report.html"
    write_export(open_runs([base, new], echo=lambda _: None), report)
    browser.get(report.as_uri())  # type: ignore[attr-defined]
    assert (
        len(browser.find_elements(By.CSS_SELECTOR, ".figure-static svg polyline, .figure-static svg rect"))
        > 2
    )  # type: ignore[attr-defined]
    assert browser.execute_script("return document.scripts.length") == 0  # type: ignore[attr-defined]
    text = browser.find_element(By.TAG_NAME, "main").text  # type: ignore[attr-defined]
    assert "solved → unsolved" in text and "example_single_tool_call_simple_agent" in text
    browser.save_screenshot(str(shots / "export.png"))  # type: ignore[attr-defined]
    no_console_errors(browser)


def test_steps_page_draws_every_plot(browser: object, shots: Path, tmp_path: Path) -> None:
    server = serve([make_steps_run(tmp_path)])
    try:
        browser.get(f"{server.url}/run/0/steps")  # type: ignore[attr-defined]
        assert wait_until(lambda: drawn(browser, 4), 10)
        titles = browser.find_element(By.CSS_SELECTOR, ".figures").text  # type: ignore[attr-defined]
        for title in ("mean reward per environment per step", "realized (solid) vs target", "stragglers"):
            assert title in titles
        legend = browser.find_elements(By.CSS_SELECTOR, ".figures .legendtext")  # type: ignore[attr-defined]
        assert "example_multi_step target" in {t.text for t in legend}
        browser.save_screenshot(str(shots / "steps.png"))  # type: ignore[attr-defined]
        no_console_errors(browser)
    finally:
        asyncio.run(server.stop(timeout_s=10))


def test_live_run_refreshes_as_rows_arrive(browser: object, tmp_path: Path) -> None:
    base, _ = make_pair(tmp_path / "done")
    lines = base.read_bytes().splitlines(keepends=True)
    growing = tmp_path / "live" / "run.jsonl"
    growing.parent.mkdir()
    growing.write_bytes(b"".join(lines[:5]) + lines[5][:40])  # and a half-written line
    server = serve([growing])
    try:
        browser.get(f"{server.url}/run/0")  # type: ignore[attr-defined]
        assert "live · 5 rows" in browser.find_element(By.ID, "live").text  # type: ignore[attr-defined]
        with growing.open("ab") as handle:
            handle.write(lines[5][40:] + b"".join(lines[6:9]))

        def shows_nine() -> bool:
            try:
                return "9 rows" in browser.find_element(By.ID, "live").text  # type: ignore[attr-defined]
            except Exception:  # the page is reloading
                return False

        assert wait_until(shows_nine, 15)
    finally:
        browser.get("about:blank")  # type: ignore[attr-defined]  # stop its polling before its server
        asyncio.run(server.stop(timeout_s=10))


def test_a_slow_page_shows_progress_then_its_numbers(browser: object, tmp_path: Path, shots: Path) -> None:
    base, new = make_pair(tmp_path / "runs")
    server = ThreadServer(create_app(find_runs([base, new]), wait_s=0))  # never wait: progress first
    asyncio.run(server.start(timeout_s=30))
    try:
        browser.get(f"{server.url}/compare/0/1")  # type: ignore[attr-defined]
        assert browser.find_elements(By.ID, "progress")  # type: ignore[attr-defined]
        browser.save_screenshot(str(shots / "waiting.png"))  # type: ignore[attr-defined]

        def compared() -> bool:
            try:
                return bool(browser.find_elements(By.CSS_SELECTOR, "table.flips"))  # type: ignore[attr-defined]
            except WebDriverException:
                return False  # reloading

        assert wait_until(compared, 20)
        no_console_errors(browser)
    finally:
        browser.get("about:blank")  # type: ignore[attr-defined]
        asyncio.run(server.stop(timeout_s=10))


def test_training_view_live_with_every_point_and_its_rollouts(
    browser: object, tmp_path: Path, shots: Path
) -> None:
    folder = tmp_path / "train_grpo"
    done = grow(folder, 0, 12)
    server = ThreadServer(create_app(find_runs([folder]), wait_s=30))
    asyncio.run(server.start(timeout_s=30))
    browser.set_window_size(1440, 2300)  # type: ignore[attr-defined]
    try:
        browser.get(f"{server.url}/run/0/training")  # type: ignore[attr-defined]
        assert wait_until(lambda: drawn(browser, 3), 15)
        alarms = [a.text for a in browser.find_elements(By.CSS_SELECTOR, ".alarm")]  # type: ignore[attr-defined]
        assert alarms == ["step 5 · guess_number · masked share: 50% of the step's rollouts masked"]
        points = browser.find_elements(By.CSS_SELECTOR, "table.validation tbody tr")  # type: ignore[attr-defined]
        assert [p.get_attribute("data-step") for p in points] == ["0", "8"]
        browser.save_screenshot(str(shots / "training_running.png"))  # type: ignore[attr-defined]
        grow(folder, done, STEPS)  # the run goes on and ends: the open page reloads by itself

        def ended() -> bool:
            try:
                return "ended" in browser.find_element(By.TAG_NAME, "h1").text  # type: ignore[attr-defined]
            except WebDriverException:
                return False

        assert wait_until(ended, 20)
        assert wait_until(lambda: drawn(browser, 3), 15)
        alarms = [a.text for a in browser.find_elements(By.CSS_SELECTOR, ".alarm")]  # type: ignore[attr-defined]
        assert [a.split(":")[0] for a in alarms] == [
            "step 5 · guess_number · masked share",
            "step 16 · mcqa · validation regression",
            "step 24 · mcqa · validation regression",
        ]
        legend = {t.text for t in browser.find_elements(By.CSS_SELECTOR, ".figures .legendtext")}  # type: ignore[attr-defined]
        assert {
            "arithmetic",
            "guess_number",
            "mcqa (watched)",
            "regression alarm",
            "arithmetic planned",
        } <= legend
        browser.save_screenshot(str(shots / "training_ended.png"))  # type: ignore[attr-defined]
        no_console_errors(browser)
        row = browser.find_element(By.CSS_SELECTOR, 'table.validation tr[data-step="16"]')  # type: ignore[attr-defined]
        follow(browser, row.find_elements(By.CSS_SELECTOR, "td.num a")[2])  # mcqa's rollouts at step 16
        assert browser.find_element(By.ID, "count").text.startswith("32 of 96")  # type: ignore[attr-defined]
        browser.save_screenshot(str(shots / "training_point_rollouts.png"))  # type: ignore[attr-defined]
        browser.get(browser.current_url.split("?")[0] + "?q=onerror")  # type: ignore[attr-defined]
        follow(browser, browser.find_element(By.CSS_SELECTOR, "table.rollouts tbody tr td a"))  # type: ignore[attr-defined]
        answers = [m.text for m in browser.find_elements(By.CSS_SELECTOR, ".msg.role-assistant")]  # type: ignore[attr-defined]
        assert any(TRAIN_XSS in text for text in answers)
        assert browser.find_elements(By.CSS_SELECTOR, "main img") == []  # type: ignore[attr-defined]
        browser.save_screenshot(str(shots / "training_xss.png"))  # type: ignore[attr-defined]
        no_console_errors(browser)
    finally:
        browser.get("about:blank")  # type: ignore[attr-defined]
        browser.set_window_size(1440, 1000)  # type: ignore[attr-defined]
        asyncio.run(server.stop(timeout_s=10))
