"""Write a plotly figure for REPRODUCTION.md without embedding plotly.js each time.

Every figure under ``reproduction/results/<item>/`` loads ``reproduction/results/plotly.min.js``
(written once, from the installed plotly, so it works offline) instead of carrying its own 4.7 MB copy.
"""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def write_figure(fig, path: str | Path) -> Path:
    from plotly.offline import get_plotlyjs

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    js = path.parent.parent / "plotly.min.js"
    if not js.exists():
        js.write_text(get_plotlyjs())
    path.write_text(fig.to_html(include_plotlyjs="../plotly.min.js", full_html=True, div_id=path.stem))
    return path
