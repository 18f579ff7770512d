"""report.html in a real browser: headless Chromium (the system's package, driven by selenium through its
chromedriver) opens the report of the default run offline and checks that the images load, the charts are drawn and
the filters work; the screenshot goes to docs/images/report.png (the README shows it).

Opt-in (`make test-browser`, which installs chromium and chromium-driver): `pytest -m browser tests/browser`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "report.png"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1280,900")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """The default run (`vlm-grpo train`, 3 steps) and `vlm-grpo report` on it."""
    run = tmp_path_factory.mktemp("browser") / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cli = [sys.executable, "-m", "vlm_grpo.cli"]
    train = subprocess.run([*cli, "train", "--output-dir", str(run), "--max-steps", "3", "--logging.progress", "false",
                            "--logging.report", "false"], env=env, capture_output=True, text=True, timeout=600)
    assert train.returncode == 0, train.stderr[-3000:]
    assert not (run / "report.html").exists()  # logging.report false: the command below writes it
    made = subprocess.run([*cli, "report", str(run)], env=env, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-3000:]
    return run / "report.html"


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    for tool in (CHROMIUM, CHROMEDRIVER):
        if not Path(tool).exists():
            pytest.fail(f"{tool} missing: `make test-browser` installs chromium and chromium-driver")
    os.environ["SE_OFFLINE"] = "true"  # selenium never looks for a driver online
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _visible_rows(driver) -> list[tuple[str, float]]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('tr.completion')).filter(r => r.offsetParent !== null)"
        ".map(r => [r.dataset.step, parseFloat(r.dataset.reward)]);")


def _set(driver, element_id: str, value) -> None:
    prop = "checked" if isinstance(value, bool) else "value"
    driver.execute_script(f"const e = document.getElementById(arguments[0]); e.{prop} = arguments[1];"
                          "e.dispatchEvent(new Event('input')); e.dispatchEvent(new Event('change'));", element_id, value)


def test_report_opens_offline_with_images_charts_and_working_filters(report, browser):
    browser.get(report.as_uri())
    assert browser.title.startswith("vlm-grpo report")

    # images: decoded and drawn
    images = browser.execute_script(
        "return Array.from(document.querySelectorAll('img.prompt-image')).map(i => [i.complete, i.naturalWidth, "
        "i.getBoundingClientRect().width]);")
    assert len(images) >= 6 and all(done and natural > 0 and shown > 0 for done, natural, shown in images)

    # charts: inline SVGs laid out at size, with their lines drawn
    charts = browser.execute_script(
        "return Array.from(document.querySelectorAll('svg.chart-svg')).map(s => { const b = s.getBoundingClientRect();"
        " const lines = Array.from(s.querySelectorAll('path.series')).map(p => p.getTotalLength());"
        " return [s.dataset.chart, b.width, b.height, lines]; });")
    drawn = {name: lines for name, w, h, lines in charts if w > 200 and h > 100 and lines}
    assert {"reward", "reward_components", "accuracy", "kl", "completion_length"} <= set(drawn)
    assert len(drawn) == len(charts) and drawn["reward"][0] > 100  # the reward curve runs across its chart
    assert len(drawn["reward_components"]) == 3

    # nothing was fetched from anywhere
    fetched = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name);")
    assert [u for u in fetched if not u.startswith("data:")] == []

    # the step filter: only the chosen step's completions stay
    every = _visible_rows(browser)
    steps = sorted({s for s, _ in every})
    assert len(steps) >= 2
    _set(browser, "step-filter", steps[-1])
    chosen = _visible_rows(browser)
    assert chosen and {s for s, _ in chosen} == {steps[-1]} and len(chosen) < len(every)
    count = browser.find_element("id", "shown-count").text
    assert count.startswith(f"{len(chosen)} of {len(every)}")

    # the reward filter: only completions at or above the threshold
    rewards = sorted(r for _, r in chosen)
    threshold = rewards[len(rewards) // 2]
    _set(browser, "reward-filter", f"{threshold:.2f}")
    kept = _visible_rows(browser)
    assert kept and all(r >= round(threshold, 2) - 1e-9 for _, r in kept) and len(kept) <= len(chosen)

    # a screenshot for the README: the filter bar over the last step's best groups, with their images
    _set(browser, "reward-filter", browser.find_element("id", "reward-filter").get_attribute("min"))
    browser.set_window_size(1280, 1100)  # the last curves, then the best groups with their images
    browser.execute_script("document.getElementById('best-worst').scrollIntoView(); window.scrollBy(0, -330);")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(SCREENSHOT))
    from PIL import Image

    with Image.open(SCREENSHOT) as shot:
        assert shot.size[0] >= 1000 and len(shot.convert("RGB").getcolors(1 << 20) or []) > 50  # not blank

    _set(browser, "step-filter", "all")
    assert len(_visible_rows(browser)) == len(every)
