"""The tutorials run top to bottom in quick mode under a real Jupyter kernel, and ship without outputs.

Each notebook is executed by nbclient with a kernel whose spec points at this interpreter
(``sys.executable``, i.e. the venv's python), in a temporary working directory, so the runs it
trains land there and not in the repository. Any cell error fails the test: the notebooks'
own assertions check the results each cell shows.
"""

from __future__ import annotations

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


def _load_builder():
    spec = importlib.util.spec_from_file_location("build_notebooks", TUTORIALS / "build_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_both_tutorials_exist():
    assert sorted(p.stem for p in TUTORIALS.glob("[0-9][0-9]_*.ipynb")) == NAMES
    assert sorted(p.stem for p in TUTORIALS.glob("[0-9][0-9]_*.py")) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_has_no_outputs(name):
    nb = nbformat.read(TUTORIALS / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "no code cells"
    for i, cell in enumerate(code):
        assert cell.outputs == [], f"code cell {i} has outputs: strip them (python tutorials/build_notebooks.py)"
        assert cell.execution_count is None, f"code cell {i} has an execution count"
    assert "widgets" not in nb.metadata


@pytest.mark.parametrize("name", NAMES)
def test_notebook_matches_its_percent_source(name):
    builder = _load_builder()
    expected = builder.render(TUTORIALS / f"{name}.py")
    assert (TUTORIALS / f"{name}.ipynb").read_text(encoding="utf-8") == expected, (
        f"{name}.ipynb is out of date with {name}.py: run python tutorials/build_notebooks.py"
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


def _outputs(nb, key: str) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if key in o.get("data", {})]


@pytest.mark.parametrize("name", NAMES)
def test_tutorial_runs_in_quick_mode(name, tmp_path, monkeypatch, kernel_dir):
    monkeypatch.setenv("LENSLAB_TUTORIAL_MODE", "quick")
    nb = nbformat.read(TUTORIALS / f"{name}.ipynb", as_version=4)
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
