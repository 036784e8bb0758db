"""Headless Chromium for the browser tests (the ``browser`` fixture is in ``conftest.py``), network off, driven by Selenium.

Chromium opens local files with no network: DNS maps every host to nothing, the proxy is a closed
port, and DevTools' network emulation is offline. ``open_page`` returns the requests it saw and the
SEVERE log entries. Tests that take the ``browser`` fixture skip when Chromium, chromedriver or
selenium is missing, and fail instead when LENSLAB_REQUIRE_BROWSER=1 (``.ci/run`` installs
Chromium and sets it).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def _missing(reason: str):
    """Skip locally; fail in CI (``.ci/run`` sets LENSLAB_REQUIRE_BROWSER=1), where it must run."""
    if os.environ.get("LENSLAB_REQUIRE_BROWSER") == "1":
        pytest.fail(f"LENSLAB_REQUIRE_BROWSER=1 but {reason}", pytrace=False)
    pytest.skip(reason)


FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--proxy-server=127.0.0.1:9",
    "--proxy-bypass-list=<-loopback>",
    "--window-size=1200,900",
    "--hide-scrollbars",
]
# not loads from anywhere: inline data, and Chromium's own pages (its new-tab page loads chrome://
# resources at start-up). Everything else counts, http(s)/ws(s) and any file:// other than the report.
LOCAL_SCHEMES = ("data:", "blob:", "about:", "chrome:", "chrome-untrusted:", "devtools:")


def open_page(driver, path: Path) -> dict:
    """Load ``path``; return ``{"requests": [urls], "errors": [messages]}`` seen while it loaded."""
    driver.get_log("performance")  # drop what happened before (about:blank)
    driver.get_log("browser")
    driver.get(path.resolve().as_uri())
    # let plotly's and circuitsvis's (React) renders run to completion; a view unpacking its bundle
    # (a notebook output) draws later, and removes its note when it has: wait for that, up to 15 s
    driver.execute_async_script(
        """const done = arguments[0], t0 = Date.now();
        const pending = () => document.querySelector('p[id^="circuits-vis-"][id$="-note"]');
        const poll = () => (!pending() || Date.now() - t0 > 15000 ? setTimeout(done, 500) : setTimeout(poll, 100));
        requestAnimationFrame(poll);"""
    )
    own = path.resolve().as_uri()
    requests = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg["method"] == "Network.requestWillBeSent":
            url = msg["params"]["request"]["url"]
            if url != own and not url.startswith(LOCAL_SCHEMES):
                requests.append(url)
    errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    return {"requests": requests, "errors": errors}


PAGE_STATE_JS = """
const figs = [...document.querySelectorAll('.plotly-graph-div')];
const views = [...document.querySelectorAll('div[id^="circuits-vis-"]')];
return {
  figs: figs.length,
  figsWithSvg: figs.filter(d => d.querySelector('svg.main-svg')).length,
  views: views.length,
  // per view: head labels, canvases (one per head + the zoomed head), inked pixels on the zoomed one
  views_: views.map(d => {
    const canv = [...d.querySelectorAll('canvas')];
    const big = canv.reduce((a, c) => (!a || c.width * c.height > a.width * a.height ? c : a), null);
    let inked = 0;
    if (big && big.width) {
      const px = big.getContext('2d').getImageData(0, 0, big.width, big.height).data;
      for (let i = 0; i < px.length; i += 4) if (px[i + 3] > 0 && (px[i] < 240 || px[i + 1] < 240 || px[i + 2] < 240)) inked++;
    }
    return {text: d.innerText, canvases: canv.length, inked: inked, height: d.getBoundingClientRect().height};
  }),
  notes: [...document.querySelectorAll('p[id^="circuits-vis-"][id$="-note"]')].map(p => p.textContent),
  headScripts: document.head.querySelectorAll('script').length,
  height: document.documentElement.scrollHeight,
};
"""


def page_state(driver) -> dict:
    """What the page drew: plotly figures with their SVG, and per circuitsvis view its text, canvases and
    inked pixels; the notes still showing (a view that drew removed its own)."""
    return driver.execute_script(PAGE_STATE_JS)


def assert_views_drawn(state: dict, heads: list[str]) -> None:
    """Every circuitsvis view drew its heads: a thumbnail per head plus the zoomed pattern, not blank."""
    assert state["notes"] == [], state["notes"]
    for v in state["views_"]:
        assert all(h in v["text"] for h in heads) and v["height"] > 100, v
        assert v["canvases"] == len(heads) + 1, v
        assert v["inked"] > 100, v
