"""The flame-graph SVG in a real browser: Debian's chromium, driven through its
chromedriver by selenium (which then downloads nothing), clicks and searches
as a user would and reads what the page shows.

Needs the `chromium` and `chromium-driver` packages (scripts/provision.sh
installs them on Debian); skipped with the reason when they are missing.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import SMALL, read_svg

from kvprof.export import write
from kvprof.model.profile import Profile

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1200,360",
]


def _missing() -> str | None:
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not Path(path).is_file():
            return f"needs {path} (Debian package {package}; scripts/provision.sh installs it)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "needs selenium (pip install -e '.[dev]')"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless chromium for the module; it and chromedriver are gone at teardown."""
    why = _missing()
    if why:
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    service = Service(executable_path=CHROMEDRIVER)
    driver = webdriver.Chrome(service=service, options=options)
    try:
        yield driver
    finally:
        driver.quit()  # closes chromium, then stops chromedriver
        proc: subprocess.Popen[bytes] | None = getattr(service, "process", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _frame(driver: Any, name: str) -> Any:
    """The <g> of the frame called `name` (the first line of its <title>)."""
    from selenium.webdriver.common.by import By

    for g in driver.find_elements(By.CSS_SELECTOR, "#frames > g"):
        title = g.find_element(By.TAG_NAME, "title").get_attribute("textContent")
        if title.split("\n")[0] == name:
            return g
    raise AssertionError(f"no frame {name!r}")


def _box(driver: Any, name: str) -> tuple[float, float]:
    from selenium.webdriver.common.by import By

    rect = _frame(driver, name).find_element(By.TAG_NAME, "rect")
    return float(rect.get_attribute("x")), float(rect.get_attribute("width"))


@pytest.fixture
def flame(browser: Any, tmp_path: Path) -> Any:
    out = tmp_path / "cpu.svg"
    write(Profile.load(SMALL), "cpu", out)
    browser.get(out.as_uri())
    return browser


def test_click_zooms_into_a_frame_and_reset_undoes_it(flame: Any, tmp_path: Path) -> None:
    """Clicking process_commands (9 of 14 samples) makes it full width, its callees scale
    with it, its callers stay (faded), the rest hides; Reset zoom restores the layout."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    before = {f.name: (f.x, f.width) for f in read_svg(tmp_path / "cpu.svg").frames}
    reset = flame.find_element(By.ID, "reset")
    assert not reset.is_displayed()

    target = _frame(flame, "process_commands")
    ActionChains(flame).move_to_element(target.find_element(By.TAG_NAME, "rect")).click().perform()

    assert _box(flame, "process_commands") == (10.0, 1180.0)
    x, w = _box(flame, "collect_timings")  # 4 of the 9 samples, first in name order
    assert abs(x - 10) <= 1 and abs(w - 4 / 9 * 1180) <= 1
    x, w = _box(flame, "update_topkeys")
    assert abs(x - (10 + 4 / 9 * 1180)) <= 1 and abs(w - 5 / 9 * 1180) <= 1
    for caller in ("worker_main", "start_thread", "all"):
        assert _box(flame, caller) == (10.0, 1180.0)
        assert "anc" in _frame(flame, caller).get_attribute("class")
    for other in ("epoll_wait", "a:b", "[unknown]"):
        assert not _frame(flame, other).is_displayed()
    assert flame.find_element(By.ID, "details").text.startswith("process_commands")  # the hovered frame
    assert reset.is_displayed()
    flame.save_screenshot(str(tmp_path / "zoomed.png"))

    reset.click()
    after = {name: _box(flame, name) for name in before}
    for name, (x0, w0) in before.items():
        assert abs(after[name][0] - x0) <= 0.01 and abs(after[name][1] - w0) <= 0.01, name
    assert not reset.is_displayed()


def test_search_highlights_matches_and_reports_their_share(flame: Any, tmp_path: Path) -> None:
    """Search takes a regex in a prompt, colours the matching frames and shows the share
    of samples under them; a match inside a match counts once."""
    from selenium.webdriver.common.by import By

    def search(term: str) -> str:
        button = flame.find_element(By.ID, "search")
        if button.text == "Reset search":
            button.click()
        button.click()
        prompt = flame.switch_to.alert
        prompt.send_keys(term)
        prompt.accept()
        return str(flame.find_element(By.ID, "matched").text)

    # update_topkeys 5 + collect_timings 4 of 14 samples
    assert search("update_topkeys|collect") == "Matched: 64.29% (2 frames, /update_topkeys|collect/)"
    hit = _frame(flame, "update_topkeys").find_element(By.TAG_NAME, "rect")
    assert hit.value_of_css_property("fill") == "rgb(230, 0, 230)"
    miss = _frame(flame, "epoll_wait").find_element(By.TAG_NAME, "rect")
    assert miss.value_of_css_property("fill") != "rgb(230, 0, 230)"
    # worker_main holds 13 of the 14 samples; process_commands (9) is inside it
    assert search("^(worker_main|process_commands)$").startswith("Matched: 92.86% (2 frames")

    shot = tmp_path / "search.png"
    assert flame.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000
    print(f"screenshot: {shot}")

    flame.find_element(By.ID, "search").click()  # "Reset search"
    assert flame.find_element(By.ID, "matched").text == ""
    assert hit.value_of_css_property("fill") != "rgb(230, 0, 230)"
