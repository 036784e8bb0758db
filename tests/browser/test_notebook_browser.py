"""Issue 27, items 2 and 5, in a real browser (headless Chromium, network off; see ``browser_page``).

- A notebook's attention views are self-contained: each output carries the packed circuitsvis
  bundle, so a view draws when every other output on the page is gone (the first view's cell
  cleared), and two views on a page unpack it once.
- lenslab's progress bars are ipywidgets in a notebook kernel (``tqdm.auto``).
- ``use_notebook_renderer()`` makes a notebook's nbconvert HTML draw every plotly figure offline:
  the notebook is executed in a real kernel, one view's output is cleared, nbconvert exports it,
  and Chromium must find an SVG in every figure and a drawing in every remaining view. nbconvert's
  own template asks for require.js and MathJax from CDNs; the outputs must ask for nothing more
  than an empty notebook's export does.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import nbformat
import torch
from browser_page import assert_views_drawn, open_page, page_state

from lenslab.interp.visual import AttentionView

ROOT = Path(__file__).resolve().parents[2]
HEADS = ["L0H0", "L0H1"]


def _view(seed: int) -> AttentionView:
    g = torch.Generator().manual_seed(seed)
    pattern = torch.softmax(torch.randn(2, 5, 5, generator=g), dim=-1)
    return AttentionView(pattern, ["3", "1", "4", "1", "READ"], HEADS, title=f"view {seed}")


def _page(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>{body}</body></html>", encoding="utf-8")
    return path


def test_a_view_draws_with_no_other_output_on_the_page(browser, tmp_path):
    first, second = _view(0), _view(1)
    first._repr_html_()  # shown, then its output cleared: nothing of it reaches the page
    seen = open_page(browser, _page(tmp_path, "second_only.html", second._repr_html_()))
    state = page_state(browser)
    assert seen == {"requests": [], "errors": []}, seen
    assert state["views"] == 1
    assert_views_drawn(state, HEADS)


def test_two_views_unpack_the_bundle_once(browser, tmp_path):
    seen = open_page(browser, _page(tmp_path, "two.html", _view(0)._repr_html_() + _view(1)._repr_html_()))
    state = page_state(browser)
    assert seen == {"requests": [], "errors": []}, seen
    assert state["views"] == 2 and state["headScripts"] == 1, state  # one unpacked bundle in <head>
    assert_views_drawn(state, HEADS)


NOTEBOOK = """\
# %%
import torch

from lenslab.interp.visual import AttentionView, heatmap, use_notebook_renderer

use_notebook_renderer()
heatmap([[1, 2], [3, 4]], ["a", "b"], ["c", "d"], "first figure", "x", "y")

# %%
AttentionView(torch.softmax(torch.randn(2, 5, 5), -1), ["3", "1", "4", "1", "READ"], ["L0H0", "L0H1"], "cleared")

# %%
AttentionView(torch.softmax(torch.randn(2, 5, 5), -1), ["3", "1", "4", "1", "READ"], ["L0H0", "L0H1"], "kept")

# %%
heatmap([[4, 3], [2, 1]], ["a", "b"], ["c", "d"], "second figure", "x", "y")

# %%
from lenslab.interp.spectral import scan
from lenslab.training import ensemble, sweep, trainer

for module in (trainer, ensemble, sweep, scan):
    sum(module.tqdm(range(3)))
"""


def _builder():
    spec = importlib.util.spec_from_file_location("build_notebooks", ROOT / "tutorials" / "build_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_nbconvert_html_draws_every_figure_and_view_offline(browser, tmp_path, monkeypatch):
    from nbconvert import HTMLExporter

    monkeypatch.delenv("PLOTLY_RENDERER", raising=False)  # the kernel starts with plotly's own default
    builder = _builder()
    nb = builder.notebook_from_percent(NOTEBOOK)
    builder.execute(nb, tmp_path)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "cleared" in code[1].source
    code[1].outputs = []  # the first view's output cleared before the export
    bars = [o for o in code[4].outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert len(bars) == 4, code[4].outputs  # each module's progress bar is a widget in a kernel, not stderr text
    code[4].outputs = []  # a widget's export loads the widget manager from unpkg: not what this page tests
    nb.metadata.pop("widgets", None)

    exporter = HTMLExporter()
    page = _page(tmp_path, "unused.html", "")
    page.write_text(exporter.from_notebook_node(nb)[0], encoding="utf-8")
    empty = tmp_path / "empty.html"
    empty.write_text(exporter.from_notebook_node(nbformat.v4.new_notebook())[0], encoding="utf-8")

    template = open_page(browser, empty)
    seen = open_page(browser, page)
    state = page_state(browser)
    assert set(seen["requests"]) <= set(template["requests"]), seen["requests"]
    own_errors = [e for e in seen["errors"] if not any(url in e for url in template["requests"])]
    assert own_errors == [], own_errors
    assert state["figs"] == 2 and state["figsWithSvg"] == 2, state
    assert state["views"] == 1, state
    assert_views_drawn(state, HEADS)
