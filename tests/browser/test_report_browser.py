"""The inspection report in a real browser: headless Chromium, network off, driven by Selenium.

A tiny MPSP run is trained with ``training.trainer.train`` and inspected with
``report.write_inspection`` (the code path of ``lenslab inspect`` and ``lenslab demo``).
Chromium opens the file with no network: DNS maps every host to nothing, the proxy is a closed
port, and DevTools' network emulation is offline. The checks:

- every plotly figure in the HTML (``class="plotly-graph-div"``) has its ``svg.main-svg`` in the DOM;
- every circuitsvis container got rendered children (the AttentionHeads view);
- the browser log has no SEVERE entry (console.error, uncaught exceptions, failed loads);
- DevTools saw no request other than the report file itself (performance log,
  ``Network.requestWillBeSent``), so nothing was even attempted.

Two control pages (a remote script, a console.error) show the request and error checks can fail.
A full-page screenshot is saved under the test's tmp dir and copied to ``$LENSLAB_SCREENSHOT_DIR`` if set.
Skips when Chromium, chromedriver or selenium is missing; fails instead when
LENSLAB_REQUIRE_BROWSER=1 (``.ci/run`` installs Chromium and sets it).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import warnings
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def _missing(reason: str):
    """Skip locally; fail in CI (``.ci/run`` sets LENSLAB_REQUIRE_BROWSER=1), where it must run."""
    if os.environ.get("LENSLAB_REQUIRE_BROWSER") == "1":
        pytest.fail(f"LENSLAB_REQUIRE_BROWSER=1 but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


if CHROMIUM is None or CHROMEDRIVER is None:
    _missing("Chromium or chromedriver not installed (Debian: apt-get install -y chromium chromium-driver)")
try:
    from selenium import webdriver
except ImportError:
    _missing("selenium not installed (it is in the dev extra: pip install -e '.[dev]')")

warnings.filterwarnings("ignore", message=".*HookedTransformer is deprecated.*")

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


@pytest.fixture
def browser(tmp_path, monkeypatch):
    from selenium.webdriver.chrome.service import Service

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


def open_page(driver, path: Path) -> dict:
    """Load ``path``; return ``{"requests": [urls], "errors": [messages]}`` seen while it loaded."""
    driver.get_log("performance")  # drop what happened before (about:blank)
    driver.get_log("browser")
    driver.get(path.resolve().as_uri())
    # let plotly's and circuitsvis's (React) renders run to completion
    driver.execute_async_script("const done = arguments[0]; requestAnimationFrame(() => setTimeout(done, 500));")
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


def test_controls_fail(browser, tmp_path):
    """A remote script is seen as a request (and an error); console.error is seen as an error."""
    remote = tmp_path / "remote.html"
    remote.write_text('<!DOCTYPE html><html><body><script src="https://cdn.example.org/x.js"></script>hi</body></html>')
    seen = open_page(browser, remote)
    assert seen["requests"] == ["https://cdn.example.org/x.js"] and seen["errors"]
    noisy = tmp_path / "noisy.html"
    noisy.write_text("<!DOCTYPE html><html><body><script>console.error('boom')</script></body></html>")
    seen = open_page(browser, noisy)
    assert seen["requests"] == [] and any("boom" in e for e in seen["errors"])


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """report.html of a tiny trained MPSP run (1 layer, 2 heads, 4 epochs, 3 checkpoints)."""
    from lenslab.report import write_inspection
    from lenslab.training.config import mpsp_run_config
    from lenslab.training.trainer import train

    run = tmp_path_factory.mktemp("browser") / "run"
    cfg = mpsp_run_config(
        seq_len=4,
        n_values=8,
        n_train=1024,
        n_val=256,
        n_adv=256,
        layers=1,
        heads=2,
        epochs=4,
        eval_every=2,
        lr=3e-3,
        batch_size=256,
    )
    train(cfg, run, progress=False)
    _, path = write_inspection(run, max_pairs=32, max_examples=128, evolution_pairs=16)
    return path


def test_report_renders_offline(browser, report, tmp_path):
    html = report.read_text(encoding="utf-8")
    n_plotly = html.count('class="plotly-graph-div"')
    n_views = html.count('CircuitsVis.render("')
    assert n_plotly >= 10 and n_views >= 1 and "Correlation traps" in html

    seen = open_page(browser, report)
    state = browser.execute_script(
        """
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
          height: document.documentElement.scrollHeight,
        };
        """
    )
    assert seen["requests"] == [], f"network requests: {seen['requests']}"
    assert seen["errors"] == [], f"console errors: {seen['errors']}"
    assert state["figs"] == n_plotly and state["figsWithSvg"] == n_plotly, state
    assert state["views"] == n_views, state
    heads = ["L0H0", "L0H1"]
    for v in state["views_"]:
        assert all(h in v["text"] for h in heads) and v["height"] > 100, v
        assert v["canvases"] == len(heads) + 1, v  # a thumbnail per head and the zoomed pattern
        assert v["inked"] > 100, v  # the zoomed attention pattern was drawn (not a blank canvas)

    # Full page: make the viewport as tall as the page and reload, then capture the viewport.
    # (captureBeyondViewport resizes the page mid-capture, and circuitsvis's responsive
    # chart.js canvases collapse to a few pixels in the picture.)
    shot = tmp_path / "report_screenshot.png"
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride", {"width": 1200, "height": state["height"], "deviceScaleFactor": 1, "mobile": False}
    )
    assert open_page(browser, report) == {"requests": [], "errors": []}
    png = browser.execute_cdp_cmd("Page.captureScreenshot", {"format": "png"})
    shot.write_bytes(base64.b64decode(png["data"]))
    assert shot.stat().st_size > 10_000
    if os.environ.get("LENSLAB_SCREENSHOT_DIR"):
        out = Path(os.environ["LENSLAB_SCREENSHOT_DIR"])
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, out / shot.name)
