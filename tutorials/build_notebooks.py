"""Build the tutorial notebooks (``NN_name.ipynb``) from their jupytext percent sources (``NN_name.py``).

    python tutorials/build_notebooks.py          # rewrite every .ipynb next to its .py
    python tutorials/build_notebooks.py --check  # exit 1 if any .ipynb is out of date

The ``.py`` files are the sources (readable diffs; jupytext opens them as notebooks too); the
``.ipynb`` files are what users open. Both are committed; the notebooks carry no outputs.
Only the subset of the percent format used here is understood: ``# %%`` starts a code cell,
``# %% [markdown]`` a markdown cell whose lines are ``# ``-prefixed comments.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


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


def main(argv: list[str]) -> int:
    stale = []
    for py in sources():
        nb_path = py.with_suffix(".ipynb")
        text = render(py)
        if "--check" in argv:
            if not nb_path.is_file() or nb_path.read_text(encoding="utf-8") != text:
                stale.append(nb_path.name)
        else:
            nb_path.write_text(text, encoding="utf-8")
    if stale:
        print(f"out of date: {', '.join(stale)}; run python tutorials/build_notebooks.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
