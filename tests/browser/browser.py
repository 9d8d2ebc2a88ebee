"""Headless Chromium for the UI tests: the system browser and driver (Debian's ``chromium`` and
``chromium-driver``), driven by Selenium. Nothing downloads a browser build: Selenium is given both
paths, so its own driver manager never runs."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
REQUIRED_ENV = "ASYNCRL_BROWSER_TESTS"  # "required" (CI): a missing browser fails, not skips
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS_ENV = "ASYNCRL_TEST_ARTIFACTS"


def system_browser() -> tuple[str, str] | None:
    """``(browser, driver)`` executables found on PATH, or None."""
    browser = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def screenshot_dir() -> Path:
    """Where screenshots go: ``$ASYNCRL_TEST_ARTIFACTS/browser`` or ``test-artifacts/browser``."""
    folder = Path(os.environ.get(ARTIFACTS_ENV) or ROOT / "test-artifacts") / "browser"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def start_chromium(browser: str, driver: str) -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    # --no-sandbox: Chromium refuses to run as root with its sandbox (CI runs as root here).
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1600,1100", "--lang=en-US"):  # fmt: skip
        options.add_argument(arg)
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    chrome.implicitly_wait(0)  # every wait is explicit (wait_for), with its own deadline
    return chrome


def wait_for(
    what: str, probe: Callable[[], object], *, timeout_s: float = 30.0, interval_s: float = 0.3
) -> object:
    """Call ``probe`` until it returns something truthy (a found element, a text) and return
    that; fail naming ``what`` when ``timeout_s`` passes. A probe that raises counts as "not yet"
    (the single-page apps re-render elements under our feet)."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while True:
        try:
            if result := probe():
                return result
        except (WebDriverException, StaleElementReferenceException) as err:
            last_error = err
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}") from (
                last_error
            )
        time.sleep(interval_s)


def by_text(chrome: webdriver.Chrome, text: str, tag: str = "*") -> list[WebElement]:
    """Displayed elements whose whole visible text is ``text``, innermost last."""
    found = chrome.find_elements(By.XPATH, f"//{tag}[normalize-space(.)='{text}']")
    return [e for e in found if e.is_displayed()]


def click_text(chrome: webdriver.Chrome, text: str, tag: str = "*", timeout_s: float = 30) -> None:
    """Click the innermost displayed element showing ``text`` once it is there."""
    element = wait_for(f"{text!r} on {chrome.current_url}", lambda: by_text(chrome, text, tag),
                       timeout_s=timeout_s)  # fmt: skip
    element[-1].click()  # type: ignore[index]


def page_text(chrome: webdriver.Chrome) -> str:
    return chrome.find_element(By.TAG_NAME, "body").text
