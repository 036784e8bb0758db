"""One self-contained HTML report: plotly.js and the circuitsvis bundle inlined once, no URLs loaded.

    write_report("RUN/report.html", "run demo", [("Accuracy", [fig, "<p>note</p>", "plain text"]), ...])

A section is ``(heading, items)``; an item is a plotly ``Figure``, an object with ``html()``
(an ``interp.visual.AttentionView``), an HTML string (starting with ``<``), or plain text.
"""

from __future__ import annotations

import html as html_lib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { border-bottom: 2px solid #888; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
pre, code { background: #f4f4f4; } pre { padding: .6em; overflow-x: auto; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 2px 6px; }
"""


def _item_html(item: Any) -> tuple[str, bool]:
    """HTML of one item and whether it needs the circuitsvis bundle."""
    if hasattr(item, "to_html") and hasattr(item, "to_plotly_json"):
        return item.to_html(full_html=False, include_plotlyjs=False), False
    if hasattr(item, "html") and callable(item.html):
        return item.html(), True
    text = str(item)
    if text.lstrip().startswith("<"):
        return text, False
    return f"<p>{html_lib.escape(text)}</p>", False


def render_report(title: str, sections: Sequence[tuple[str, Sequence[Any]]]) -> str:
    from plotly.offline import get_plotlyjs

    body, needs_cv = [], False
    for heading, items in sections:
        body.append(f"<h2>{html_lib.escape(str(heading))}</h2>")
        for item in items if isinstance(items, (list, tuple)) else [items]:
            h, cv = _item_html(item)
            needs_cv |= cv
            body.append(h)
    scripts = [f'<script type="text/javascript">{get_plotlyjs()}</script>']
    if needs_cv:
        from lenslab.interp.visual import circuitsvis_bundle_html

        scripts.append(circuitsvis_bundle_html())
    return (
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
        f"<title>{html_lib.escape(title)}</title><style>{STYLE}</style>\n"
        + "\n".join(scripts)
        + f"\n</head><body><h1>{html_lib.escape(title)}</h1>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def write_report(path: str | Path, title: str, sections: Sequence[tuple[str, Sequence[Any]]]) -> Path:
    """Write the report atomically (temp file + rename) and return its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = render_report(title, sections)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
