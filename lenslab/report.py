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
        from interp.visual import circuitsvis_bundle_html

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


# -- softmax-collapse diagnostics (metrics.jsonl, written by training.trainer) ----------------
COLLAPSE_KEYS = ("train_max_abs_logit", "train_zero_loss_frac", "weight_norm", "grad_norm")


def collapse_figure(metrics: Sequence[dict]) -> Any:
    """Four small panels over the evaluations: max |logit| (train), the share of train losses that are
    exactly 0, the weight norms (total and per matrix), the last step's gradient norm. Log y where
    the quantity spans decades; log x when the evaluations do (a log ``eval_schedule``)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows = [r for r in metrics if any(r.get(k) is not None for k in COLLAPSE_KEYS)]
    epochs = [r["epoch"] for r in rows]
    positive = [e for e in epochs if e > 0]
    log_x = bool(positive) and max(positive) / min(positive) >= 1000
    fig = make_subplots(rows=2, cols=2, subplot_titles=(
        "max |logit| on the train split", "train examples with loss exactly 0",
        "weight norm (bold: all parameters)", "gradient norm of the last step"))

    def series(key: str, r: int, c: int, name: str | None = None, width: float = 2.0, values=None) -> None:
        ys = values if values is not None else [row.get(key) for row in rows]
        pts = [(e, y) for e, y in zip(epochs, ys) if y is not None and not (log_x and e == 0)]
        if pts:
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=name or key,
                                     line={"width": width}, marker={"size": 3}, showlegend=name is not None), row=r, col=c)

    series("train_max_abs_logit", 1, 1)
    series("train_zero_loss_frac", 1, 2)
    series("weight_norm", 2, 1, name="all parameters", width=3.0)
    names = sorted({n for row in rows for n in (row.get("weight_norms") or {})})
    for n in names:
        if n.endswith((".W_Q", ".W_K", ".W_V", ".W_O", ".W_in", ".W_out", "W_E", "W_pos", "W_U")):  # the matrices; biases would crowd it
            series(n, 2, 1, name=n, width=1.0, values=[(row.get("weight_norms") or {}).get(n) for row in rows])
    series("grad_norm", 2, 2)
    for r, c in ((1, 1), (2, 1), (2, 2)):
        fig.update_yaxes(type="log", row=r, col=c)
    fig.update_yaxes(range=[0, 1.02], row=1, col=2)
    for r in (1, 2):
        for c in (1, 2):
            fig.update_xaxes(type="log" if log_x else "linear", title_text="epoch", row=r, col=c)
    fig.update_layout(height=620, margin={"t": 40, "b": 40}, legend={"font": {"size": 9}})
    return fig


def collapse_items(metrics: Sequence[dict]) -> list:
    """The report's softmax-collapse panel: a note, the figure (or why there is none)."""
    note = (
        "Softmax collapse (Prieto et al. 2025): when the logits grow until softmax saturates, a train example's loss "
        "is exactly 0 in the run's dtype and it sends no gradient. Gradient norm: the last training step's "
        "(with full batch, the whole train loss's)."
    )
    if not any(r.get(k) is not None for r in metrics for k in COLLAPSE_KEYS):
        return [note, "not recorded: this run was trained before lenslab recorded collapse diagnostics"]
    return [note, collapse_figure(metrics)]
