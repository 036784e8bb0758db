"""The README's analysis block runs as written, on a test run (only the run path is replaced)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_analysis_block_runs(fake_run, monkeypatch):
    import plotly.io as pio

    monkeypatch.delenv("PLOTLY_RENDERER", raising=False)
    monkeypatch.setattr(pio.renderers, "default", pio.renderers.default)  # restored after the block sets it
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    block = next(b for b in blocks if 'run = Run.open("runs/r09")  # its repr' in b)
    scope: dict = {}
    exec(compile(block.replace('"runs/r09"', repr(str(fake_run))), "README.md", "exec"), scope)  # noqa: S102
    assert len(scope["abl"]) == 2 and scope["strings"][-1] == "READ"
    assert len(scope["alphas"]) > 0 and len(scope["traps"]) > 0 and scope["fig"].data
    assert "<" in scope["view"]._repr_html_()
    assert pio.renderers.default == "plotly_mimetype+lenslab_notebook"
