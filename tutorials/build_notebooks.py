"""Build the tutorial notebooks (``NN_name.ipynb``) from their jupytext percent sources (``NN_name.py``).

    python tutorials/build_notebooks.py --execute  # rebuild and run each in quick mode: what is committed
    python tutorials/build_notebooks.py --check    # exit 1 if a notebook's cells differ from its .py, or it is not executed
    python tutorials/build_notebooks.py            # rebuild without outputs (quick, while editing)

The ``.py`` files are the sources (readable diffs; jupytext opens them as notebooks too); the
``.ipynb`` files are what users open, and they are committed **executed** in quick mode, so that a
reader on a code host sees every table and figure before running anything. ``--execute`` runs each
notebook in a fresh kernel of this interpreter, in a temporary directory (the runs it trains do not
land in the repository), with ``PLOTLY_RENDERER=plotly_mimetype+png``: every plotly figure keeps
its interactive JSON and gains a static PNG in the same output, which static renderers (GitHub,
``nbconvert --to html``) show. The PNGs need kaleido (in the notebook extra) and a Chromium
(Debian: ``apt-get install chromium``).
Only the subset of the percent format used here is understood: ``# %%`` starts a code cell,
``# %% [markdown]`` a markdown cell whose lines are ``# ``-prefixed comments.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
CELL_TIMEOUT = 900  # seconds per cell: generous, CI machines are shared; the notebooks take minutes in all
STATIC_RENDERER = "plotly_mimetype+png"


def _cells(text: str) -> list[tuple[str, list[str]]]:
    cells: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("# %%"):
            cells.append(("markdown" if "[markdown]" in line else "code", []))
        elif cells:
            cells[-1][1].append(line)
    return cells


def _strip(lines: list[str]) -> str:
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return "\n".join(lines)


def notebook_from_percent(text: str) -> nbformat.NotebookNode:
    """A v4 notebook without outputs from percent-format source text."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    for kind, lines in _cells(text):
        if kind == "markdown":
            body = [ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in lines]
            nb.cells.append(nbformat.v4.new_markdown_cell(_strip(body)))
        else:
            nb.cells.append(nbformat.v4.new_code_cell(_strip(lines)))
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:02d}"  # stable ids: rebuilding gives the same file
    return nb


def render(py: Path) -> str:
    return nbformat.writes(notebook_from_percent(py.read_text(encoding="utf-8"))) + "\n"


def sources() -> list[Path]:
    return sorted(p for p in HERE.glob("[0-9][0-9]_*.py"))


def cell_sources(nb: nbformat.NotebookNode) -> list[tuple[str, str]]:
    """(cell type, source) of every cell: what must match the .py, outputs aside."""
    return [(c.cell_type, c.source) for c in nb.cells]


def execute(nb: nbformat.NotebookNode, workdir: str | Path, env: dict[str, str] | None = None) -> nbformat.NotebookNode:
    """Run ``nb`` in place, top to bottom, in a kernel of this interpreter started in ``workdir``.

    ``env`` is set in the kernel's environment (on top of this process's). Raises nbclient's
    ``CellExecutionError`` at the first failing cell.
    """
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    with tempfile.TemporaryDirectory() as kernels:
        spec = Path(kernels) / "lenslab-venv"
        spec.mkdir()
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "lenslab venv", "language": "python"}))
        km = KernelManager(
            kernel_name="lenslab-venv", kernel_spec_manager=KernelSpecManager(kernel_dirs=[kernels], ensure_native_kernel=False)
        )
        saved = {k: os.environ.get(k) for k in env or {}}
        os.environ.update(env or {})
        try:
            client = NotebookClient(
                nb,
                km=km,
                timeout=CELL_TIMEOUT,
                allow_errors=False,
                record_timing=False,
                resources={"metadata": {"path": str(workdir)}},
            )
            client.execute()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    nb.metadata["kernelspec"] = dict(KERNELSPEC)  # not the temporary spec's name
    return nb


def static_export_problem() -> str | None:
    """Why plotly cannot export a PNG here (kaleido missing, or no Chromium for it), or None when it can."""
    try:
        import plotly.graph_objects as go

        go.Figure().to_image(format="png", width=10, height=10)
    except Exception as e:  # noqa: BLE001 -- whatever fails (kaleido, its Chromium), there is no PNG export
        return f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return None


def _check_static_export() -> None:
    problem = static_export_problem()
    if problem:
        raise SystemExit(
            f"build_notebooks --execute: plotly cannot export PNG here ({problem}); "
            "install kaleido (pip install -e '.[notebook]') and Chromium (apt-get install chromium)"
        )


def main(argv: list[str]) -> int:
    unknown = [a for a in argv if a not in ("--check", "--execute")]
    if unknown or len(argv) > 1:
        print(f"build_notebooks: unknown or conflicting options {argv}; use one of --execute, --check", file=sys.stderr)
        return 2
    stale = []
    if "--execute" in argv:
        _check_static_export()
    for py in sources():
        nb_path = py.with_suffix(".ipynb")
        fresh = notebook_from_percent(py.read_text(encoding="utf-8"))
        if "--check" in argv:
            committed = nbformat.read(nb_path, as_version=4) if nb_path.is_file() else None
            if committed is None or cell_sources(committed) != cell_sources(fresh):
                stale.append(f"{nb_path.name} (cells differ from {py.name})")
            elif any(c.cell_type == "code" and c.execution_count is None for c in committed.cells):
                stale.append(f"{nb_path.name} (not executed)")
        elif "--execute" in argv:
            print(f"executing {py.stem} in quick mode ...", file=sys.stderr, flush=True)
            with tempfile.TemporaryDirectory() as work:
                execute(fresh, work, env={"LENSLAB_TUTORIAL_MODE": "quick", "PLOTLY_RENDERER": STATIC_RENDERER})
            nb_path.write_text(nbformat.writes(fresh) + "\n", encoding="utf-8")
            print(f"wrote {nb_path.relative_to(HERE.parent)} ({nb_path.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
        else:
            nb_path.write_text(nbformat.writes(fresh) + "\n", encoding="utf-8")
    if stale:
        print(f"out of date: {'; '.join(stale)}; run python tutorials/build_notebooks.py --execute", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
