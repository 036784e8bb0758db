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
The browser fixture and ``open_page`` are in ``conftest.py``.
"""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path

import pytest
from browser_page import assert_views_drawn, open_page, page_state


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
    state = page_state(browser)
    assert seen["requests"] == [], f"network requests: {seen['requests']}"
    assert seen["errors"] == [], f"console errors: {seen['errors']}"
    assert state["figs"] == n_plotly and state["figsWithSvg"] == n_plotly, state
    assert state["views"] == n_views, state
    assert_views_drawn(state, ["L0H0", "L0H1"])

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
