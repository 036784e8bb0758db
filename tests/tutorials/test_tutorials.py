"""The tutorials run top to bottom in quick mode under a real Jupyter kernel, and ship executed.

Each notebook is executed by nbclient with a kernel whose spec points at this interpreter
(``sys.executable``, i.e. the venv's python), in a temporary working directory, so the runs it
trains land there and not in the repository. Any cell error fails the test, and so does any
check of ``checks.py``, which the test inserts after the cell it checks (the teaching cells
carry no asserts). The committed notebooks are executed (``build_notebooks.py --execute``):
their cells must match the .py sources, every figure must carry a static PNG, and a fresh run
must give the same outputs, numbers aside (they move with the CPU's kernels and the clock).
"""

from __future__ import annotations

import base64
import copy
import importlib.util
import json
import re
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = ROOT / "tutorials"
NAMES = ["01_shortcut_saturation", "02_correlation_traps"]
KERNEL = "lenslab-test-venv"
CELL_TIMEOUT = 900  # seconds per cell: generous, CI machines are shared; the notebooks take minutes in all
NETWORK = re.compile(r"""(src|href)\s*=\s*["']?(https?:)?//|cdn\.plot\.ly|unpkg\.com|cdn\.jsdelivr""", re.IGNORECASE)
PLOTLY_MIME = "application/vnd.plotly.v1+json"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


checks = _load("tutorial_checks", Path(__file__).with_name("checks.py"))


def _load_builder():
    spec = importlib.util.spec_from_file_location("build_notebooks", TUTORIALS / "build_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_both_tutorials_exist():
    assert sorted(p.stem for p in TUTORIALS.glob("[0-9][0-9]_*.ipynb")) == NAMES
    assert sorted(p.stem for p in TUTORIALS.glob("[0-9][0-9]_*.py")) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_is_executed_with_static_figures(name):
    """What a reader on a code host sees: every code cell ran, and every plotly figure carries a PNG."""
    nb = nbformat.read(TUTORIALS / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "no code cells"
    for i, cell in enumerate(code):
        assert cell.execution_count is not None, f"code cell {i} did not run: python tutorials/build_notebooks.py --execute"
        assert not [o for o in cell.outputs if o.output_type == "error"], f"code cell {i} has an error output"
    figures = _outputs(nb, PLOTLY_MIME)
    assert figures, "no plotly figure in the committed notebook"
    for o in figures:
        assert "image/png" in o["data"], "a plotly figure without its static PNG (PLOTLY_RENDERER=plotly_mimetype+png)"
        assert base64.b64decode(o["data"]["image/png"]).startswith(b"\x89PNG")
    size = (TUTORIALS / f"{name}.ipynb").stat().st_size
    assert size < 6e6, f"{name}.ipynb is {size / 1e6:.1f} MB: keep the committed outputs small"


@pytest.mark.parametrize("name", NAMES)
def test_static_html_shows_every_figure(name):
    """nbconvert --to html (no JavaScript needed): each figure output becomes an <img>."""
    from nbconvert import HTMLExporter

    nb = nbformat.read(TUTORIALS / f"{name}.ipynb", as_version=4)
    html, _ = HTMLExporter().from_notebook_node(nb)
    n_figures = len(_outputs(nb, PLOTLY_MIME))
    assert len(re.findall(r"<img\b[^>]*src=\"data:image/png;base64,", html)) >= n_figures
    if name.startswith("01"):  # the circuitsvis views say what they are where no script runs
        from lenslab.interp.visual import STATIC_NOTE

        assert html.count(STATIC_NOTE) >= 2


@pytest.mark.parametrize("name", NAMES)
def test_notebook_matches_its_percent_source(name):
    builder = _load_builder()
    expected = builder.notebook_from_percent((TUTORIALS / f"{name}.py").read_text(encoding="utf-8"))
    committed = nbformat.read(TUTORIALS / f"{name}.ipynb", as_version=4)
    assert builder.cell_sources(committed) == builder.cell_sources(expected), (
        f"{name}.ipynb is out of date with {name}.py: run python tutorials/build_notebooks.py --execute"
    )


def test_parameter_cell_switches_modes():
    for name in NAMES:
        nb = nbformat.read(TUTORIALS / f"{name}.ipynb", as_version=4)
        first_code = next(c for c in nb.cells if c.cell_type == "code").source
        assert 'MODE = os.environ.get("LENSLAB_TUTORIAL_MODE", "quick")' in first_code
        assert '"quick"' in first_code and '"full"' in first_code


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory) -> Path:
    """A kernelspec that starts ipykernel with exactly this interpreter (a fresh CI venv has no other)."""
    root = tmp_path_factory.mktemp("kernels")
    spec = root / KERNEL
    spec.mkdir()
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "lenslab test venv", "language": "python"}))
    return root


NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def output_shape(nb) -> dict[str, list]:
    """Per source cell (by its stable id ``cell-NN``; inserted check cells aside): what its outputs
    are, numbers aside. Each output gives its type, its mimetypes (the static PNG aside: only the
    committed build renders it) and, for a table (an HTML ``<table>``), its column headers with
    digits masked. A fresh run must give the same shapes as the committed notebook; the numbers
    themselves move with the CPU's kernels (AVX2 vs AVX-512) and the clock."""
    shapes = {}
    for c in nb.cells:
        if c.cell_type != "code" or not str(c.get("id", "")).startswith("cell-"):
            continue
        outs = []
        for o in c.outputs:
            if o.output_type == "stream":
                outs.append(("stream", o.get("name")))
                continue
            data = o.get("data", {})
            html = data.get("text/html", "")
            heads = (
                tuple(NUMBER.sub("#", h.strip()) for h in re.findall(r"<th[^>]*>(.*?)</th>", html, re.DOTALL))
                if "<table" in html
                else ()
            )
            outs.append((o.output_type, tuple(sorted(k for k in data if k != "image/png")), heads))
        # a repeated output (a loop) counts once; stdout and stderr interleave as they please
        shapes[c["id"]] = sorted(set(outs))
    return shapes


def _outputs(nb, key: str) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if key in o.get("data", {})]


@pytest.mark.parametrize("name", NAMES)
def test_tutorial_runs_in_quick_mode(name, tmp_path, monkeypatch, kernel_dir):
    monkeypatch.setenv("LENSLAB_TUTORIAL_MODE", "quick")
    # the committed build's renderer less its PNG (which needs Chromium and is masked below); the notebooks'
    # own default, use_notebook_renderer(), is drawn in a browser by tests/browser/test_notebook_browser.py
    monkeypatch.setenv("PLOTLY_RENDERER", "plotly_mimetype")
    committed = nbformat.read(TUTORIALS / f"{name}.ipynb", as_version=4)
    nb = copy.deepcopy(committed)
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
    assert checks.insert_checks(nb, name) == len(checks.CHECKS[name]) > 0
    nb.cells.append(nbformat.v4.new_code_cell("import sys, os\nprint(sys.executable)\nprint(os.getcwd())"))
    km = KernelManager(
        kernel_name=KERNEL, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernel_dir)], ensure_native_kernel=False)
    )
    client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT, allow_errors=False, resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on the first failing cell (its assertions included)

    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert all(c.execution_count is not None for c in nb.cells if c.cell_type == "code")
    executable, cwd = nb.cells[-1].outputs[0]["text"].split("\n")[:2]
    assert Path(executable).resolve() == Path(sys.executable).resolve()  # the kernel ran this venv's python
    assert Path(cwd).resolve() == tmp_path.resolve()

    tutorial = "tutorial" + name[:2]
    assert (tmp_path / "runs" / tutorial / "quick").is_dir(), "the notebook's runs should land in its working directory"

    assert _outputs(nb, PLOTLY_MIME), "no plotly figure was displayed inline"
    html = [o["data"]["text/html"] for o in _outputs(nb, "text/html")]
    for h in html:
        # offline: no resource is loaded from a URL (plotly.js and circuitsvis are inlined)
        for tag in re.findall(r"<(?:script|link|img|iframe)\b[^>]*>", h, re.IGNORECASE):
            assert not NETWORK.search(tag), f"a network resource in the output: {tag[:200]}"
    if name.startswith("01"):
        assert sum("CircuitsVis.render" in h for h in html) >= 2, "the two circuitsvis attention views did not render"
        assert sum("window.CircuitsVis" in h or "CircuitsVis=" in h for h in html) >= 1, "the circuitsvis bundle was not inlined"
    # the committed outputs come from the current sources: the same outputs per cell, numbers aside
    assert output_shape(nb) == output_shape(committed)


@pytest.mark.parametrize("name", NAMES)
def test_teaching_cells_have_no_asserts(name):
    source = (TUTORIALS / f"{name}.py").read_text()
    lines = [ln for ln in source.splitlines() if re.match(r"\s*assert\b", ln)]
    assert not lines, f"{name}.py: a teaching cell asserts (move it to tests/tutorials/checks.py): {lines[:3]}"


@pytest.mark.parametrize("name", NAMES)
def test_every_check_anchor_matches_one_cell(name):
    nb = nbformat.read(TUTORIALS / f"{name}.ipynb", as_version=4)
    before = len(nb.cells)
    assert checks.insert_checks(nb, name) == len(checks.CHECKS[name])
    assert len(nb.cells) == before + len(checks.CHECKS[name])
    inserted = [c for c in nb.cells if checks.CHECK_TAG in c.metadata.get("tags", [])]
    assert len(inserted) == len(checks.CHECKS[name])
    for c in inserted:
        compile(c.source, c["id"], "exec")  # each check is valid Python


def test_insert_checks_rejects_a_missing_anchor(monkeypatch):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    monkeypatch.setitem(checks.CHECKS, "toy", [("y = 2", "assert x == 1")])
    with pytest.raises(ValueError, match="in 0 code cells"):
        checks.insert_checks(nb, "toy")
