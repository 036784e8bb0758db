"""Issue 27's trial, executed: ``first_look.py`` as a notebook on a test run, then nbconvert's static HTML.

The notebook is built with the tutorials' builder and run in a real kernel of this interpreter.
Figures use ``PLOTLY_RENDERER=plotly_mimetype+png`` (plotly's own export: kaleido with Chromium),
so the HTML shows each figure as an ``<img>`` with no JavaScript; the attention view's HTML output
carries its circuitsvis div. Skips without Chromium, and fails instead under
LENSLAB_REQUIRE_BROWSER=1 (``.ci/run``).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PLOTLY_MIME = "application/vnd.plotly.v1+json"


def _builder():
    spec = importlib.util.spec_from_file_location("build_notebooks", ROOT / "tutorials" / "build_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _user_lines(nb) -> int:
    """Lines of user code: code cells' non-blank lines, imports and comments aside."""
    n = 0
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        tree = ast.parse(c.source)
        imports = {
            ln
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for ln in range(node.lineno, node.end_lineno + 1)
        }
        n += sum(
            1
            for i, ln in enumerate(c.source.splitlines(), 1)
            if ln.strip() and not ln.strip().startswith("#") and i not in imports
        )
    return n


def test_first_look_is_short_and_builds_no_dict():
    nb = _builder().notebook_from_percent((HERE / "first_look.py").read_text())
    assert _user_lines(nb) <= 25
    source = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert not [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Dict | ast.DictComp)], "a hand-built dict"


@pytest.fixture(scope="module")
def executed(fake_run, tmp_path_factory):
    problem = _builder().static_export_problem()
    if problem:
        if os.environ.get("LENSLAB_REQUIRE_BROWSER") == "1":
            pytest.fail(f"LENSLAB_REQUIRE_BROWSER=1 but plotly cannot export PNG: {problem}", pytrace=False)
        pytest.skip(f"plotly cannot export PNG here (kaleido + Chromium): {problem}")
    builder = _builder()
    nb = builder.notebook_from_percent((HERE / "first_look.py").read_text())
    work = tmp_path_factory.mktemp("first_look")
    builder.execute(nb, work, env={"LENSLAB_RUN": str(fake_run), "PLOTLY_RENDERER": builder.STATIC_RENDERER})
    return nb


def test_every_cell_shows_a_result(executed):
    code = [c for c in executed.cells if c.cell_type == "code"]
    for i, c in enumerate(code):
        assert not [o for o in c.outputs if o.output_type == "error"], f"cell {i} failed"
        assert [o for o in c.outputs if o.output_type in ("execute_result", "display_data")], (
            f"cell {i} shows nothing:\n{c.source}"
        )
    html = {i: o["data"].get("text/html", "") for i, c in enumerate(code) for o in c.outputs if "data" in o}
    assert "<table" in html[0] and "epochs" in html[0]  # the run's table: name, task, model, epochs
    for i in (2, 4, 6, 7):  # ablation, fingerprints, traps, alpha: tables
        assert "<table" in html[i], (i, code[i].source)


def test_nbconvert_html_shows_every_figure(executed):
    from nbconvert import HTMLExporter

    figures = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs if PLOTLY_MIME in o.get("data", {})]
    assert len(figures) == 2  # accuracy and patching
    assert all("image/png" in o["data"] for o in figures)
    html, _ = HTMLExporter().from_notebook_node(executed)
    assert len(re.findall(r'<img\b[^>]*src="data:image/png;base64,', html)) >= len(figures)
    assert re.search(r'<div id="circuits-vis-[0-9a-f]+"', html)  # the attention view's container
