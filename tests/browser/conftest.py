"""The ``browser`` fixture: headless Chromium with the network off (see ``browser_page``)."""

from __future__ import annotations

import pytest
from browser_page import CHROMEDRIVER, CHROMIUM, FLAGS, _missing


@pytest.fixture
def browser(tmp_path, monkeypatch):
    if CHROMIUM is None or CHROMEDRIVER is None:
        _missing("Chromium or chromedriver not installed (Debian: apt-get install -y chromium chromium-driver)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _missing("selenium not installed (it is in the dev extra: pip install -e '.[dev]')")

    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager must never fetch a driver
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for f in FLAGS + [f"--user-data-dir={tmp_path / 'profile'}"]:
        opts.add_argument(f)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(120)
    driver.set_script_timeout(60)
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd(
        "Network.emulateNetworkConditions", {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1}
    )
    yield driver
    driver.quit()
