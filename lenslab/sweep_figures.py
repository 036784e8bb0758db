"""The figure of a sweep's table (``results.html``): generalization rate vs r per architecture, or grokked
fraction per modular-addition cell. Report layer, above ``training.sweep`` (which returns the rows);
plotly only, so the GPU path draws it without the circuitsvis bundle ``lenslab.report`` inlines.

    write_sweep_figure("runs/sweep", rows)   # rows: training.sweep.summarize_sweep / run_sweep
"""

from __future__ import annotations

from pathlib import Path


def sweep_figure(rows: list[dict]):
    """Generalization rate vs r, one line per architecture (and weight decay), Wilson 95 % error bars."""
    import plotly.graph_objects as go

    fig = go.Figure()

    def line(r: dict) -> str:  # a cell's name without its ratio: one line per everything-but-r
        return "-".join(part for part in r["cell"].split("-") if not part.startswith("r"))

    for key in sorted({line(r) for r in rows}):
        pts = sorted((r for r in rows if line(r) == key and r["rate"] is not None), key=lambda r: r["ratio"])
        fig.add_trace(
            go.Scatter(
                x=[r["ratio"] for r in pts],
                y=[r["rate"] for r in pts],
                mode="lines+markers",
                name=key,
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": [r["wilson_high"] - r["rate"] for r in pts],
                    "arrayminus": [r["rate"] - r["wilson_low"] for r in pts],
                },
                text=[f"{r['generalized']}/{r['runs']} seeds" for r in pts],
                hovertemplate="r=%{x}: %{y:.2f} (%{text})",
            )
        )
    fig.update_layout(
        title="Generalization rate vs spurious ratio r (Wilson 95% interval)",
        xaxis_title="r",
        yaxis_title="fraction of seeds reaching 100% adversarial accuracy",
        yaxis_range=[-0.05, 1.05],
        template="plotly_white",
    )
    return fig


def modadd_sweep_figure(rows: list[dict]):
    """Best and final test accuracy per modular-addition cell (median over seeds)."""
    import plotly.graph_objects as go

    names = [r["cell"] for r in rows]
    fig = go.Figure(
        [
            go.Bar(x=names, y=[r["median_test_acc_best"] for r in rows], name="best test accuracy (median over seeds)"),
            go.Bar(
                x=names,
                y=[r["median_test_acc_final"] for r in rows],
                name="final test accuracy (median over seeds)",
                text=[f"{r['grokked']}/{r['runs']} grokked, {r['anti_grokked']} anti" for r in rows],
            ),
        ]
    )
    fig.update_layout(
        barmode="group",
        template="plotly_white",
        yaxis_range=[0, 1.05],
        yaxis_title="test accuracy",
        title="Modular addition: grokked = test accuracy >= 0.95 at some evaluation; anti-grokked = then >= 0.1 below its best",
    )
    return fig


def write_sweep_figure(root: str | Path, rows: list[dict]) -> Path:
    """``ROOT/results.html``: the figure of ``training.sweep.summarize_sweep``'s (or ``run_sweep``'s) ``rows``,
    a full page with plotly.js inlined (modular-addition cells: accuracies per cell; MPSP cells: rate vs r)."""
    from lenslab.training.runio import atomic_write_bytes

    modadd = any("grokked" in r for r in rows)
    fig = modadd_sweep_figure(rows) if modadd else sweep_figure(rows)
    path = Path(root) / "results.html"
    atomic_write_bytes(path, fig.to_html(include_plotlyjs=True, full_html=True, div_id="lenslab-sweep-results").encode())
    return path
