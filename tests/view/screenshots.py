"""The README's screenshots of `gym view`, from a real run made by the scripted model.

    python tests/view/screenshots.py docs/img

In a scratch folder it runs ``python tests/view/demo_run.py runs`` (``gym eval run`` with the
scripted model), starts ``gym view runs/demo.jsonl runs/demo_new.jsonl`` as a person would, reads
the URL it prints and saves the overview, a multi-step rollout, the comparison, a step-wise
run's steps page and a training run's page (``tests/view/train_run.py``) with headless
Chromium. The process it started is stopped by its PID.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.common.by import By

ROOT = Path(__file__).resolve().parents[2]
SHOTS = {
    "view_overview.png": "/run/0",
    "view_rollout.png": "/run/0/rollouts?env=example_multi_step_simple_agent",
    "view_compare.png": "/compare/0/1",
}


def wait_for_url(proc: subprocess.Popen[str], deadline_s: float = 60.0) -> str:
    assert proc.stdout is not None
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        line = proc.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:\d+", line)
        if found:
            return found.group(0)
        if proc.poll() is not None:
            raise RuntimeError("gym view exited before printing its URL")
    raise TimeoutError("gym view printed no URL")


DRAWN = (
    "return document.querySelectorAll('[data-figure]').length"
    " == document.querySelectorAll('[data-drawn]').length"
)


def wait_drawn(driver: webdriver.Chrome, deadline_s: float = 30.0) -> None:
    """Poll until the page has its numbers (not the computing page) and every figure is drawn."""
    end = time.monotonic() + deadline_s
    while driver.find_elements(By.ID, "progress") or not driver.execute_script(DRAWN):
        if time.monotonic() > end:
            raise TimeoutError("figures not drawn")
        time.sleep(0.05)


def main(out: Path) -> None:
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="polygym-view-demo-"))
    subprocess.run([sys.executable, str(ROOT / "tests/view/demo_run.py"), "runs"], cwd=scratch, check=True)
    subprocess.run(
        [sys.executable, str(ROOT / "tests/view/train_run.py"), "runs/train"], cwd=scratch, check=True
    )
    command = [
        sys.executable,
        "-m",
        "polygym",
        "view",
        "runs/demo.jsonl",
        "runs/demo_new.jsonl",
        "runs/blend.jsonl",
        "runs/train",
    ]
    proc = subprocess.Popen(
        command, cwd=scratch, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService("/usr/bin/chromedriver"))
    try:
        url = wait_for_url(proc)
        for name, path in SHOTS.items():
            driver.get(url + path)
            if name == "view_rollout.png":
                driver.find_element(By.CSS_SELECTOR, "table.rollouts tbody tr td a").click()
            wait_drawn(driver)
            driver.save_screenshot(str(out / name))
        driver.get(url + "/run/2/steps")
        wait_drawn(driver)
        driver.save_screenshot(str(out / "view_steps.png"))
        driver.set_window_size(1400, 1300)
        driver.get(url + "/run/3/training")
        wait_drawn(driver)
        driver.save_screenshot(str(out / "view_training.png"))
    finally:
        driver.quit()
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img"))
