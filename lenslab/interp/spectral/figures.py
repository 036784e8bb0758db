"""Plotly figures: trap counts and HTSR α under the accuracy curves, and one matrix's shuffled ESD with its MP fit."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from lenslab.interp.spectral.mp import mp_density, mp_edges
from lenslab.interp.spectral.shuffle import make_generator, random_permutation, shuffle
from lenslab.interp.spectral.traps import check_matrix, detect_traps, shuffled_eigenvalues


def trap_count_figure(
    rows: list[dict], metrics: list[dict] | None = None, title: str = "Correlation traps over training"
) -> go.Figure:
    """Accuracy curves (top), trap count per matrix and, when ``rows`` carry it, HTSR α per matrix
    (bottom, log axis, dashed line at α = 2), against epoch with a shared x axis.

    ``rows`` are ``trap_counts_over_run`` rows; ``metrics`` (e.g. ``run.metrics``) draws the
    accuracy at every logged epoch, otherwise the accuracies carried in ``rows`` are used.
    """
    with_alpha = any(_finite(r.get("alpha")) for r in rows)
    titles = ("accuracy", "traps per matrix") + (("HTSR α per matrix (α < 2: heavy tail)",) if with_alpha else ())
    fig = make_subplots(rows=len(titles), cols=1, shared_xaxes=True, vertical_spacing=0.06, subplot_titles=titles)
    source = metrics if metrics else list({r["epoch"]: r for r in rows}.values())
    acc_keys = sorted({k for m in source for k in m if k.endswith("_acc")})
    for k in acc_keys:
        pts = sorted((m["epoch"], m[k]) for m in source if m.get(k) is not None and m.get("epoch") is not None)
        fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines", name=k), row=1, col=1)
    palette = qualitative.Plotly
    for i, name in enumerate(dict.fromkeys(r["matrix"] for r in rows)):
        color = palette[i % len(palette)]
        pts = sorted((r["epoch"], r["n_traps"]) for r in rows if r["matrix"] == name and r.get("error") is None)
        fig.add_trace(
            go.Scatter(
                x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=name, legendgroup=name, line_color=color
            ),
            row=2,
            col=1,
        )
        if with_alpha:
            pts = sorted((r["epoch"], r["alpha"]) for r in rows if r["matrix"] == name and _finite(r.get("alpha")))
            fig.add_trace(
                go.Scatter(
                    x=[p[0] for p in pts],
                    y=[p[1] for p in pts],
                    mode="lines+markers",
                    name=f"{name} α",
                    legendgroup=name,
                    showlegend=False,
                    line_color=color,
                ),
                row=3,
                col=1,
            )
    fig.update_yaxes(title_text="accuracy", range=[0, 1.02], row=1, col=1)
    top = max([r["n_traps"] for r in rows if r.get("error") is None] + [1])
    fig.update_yaxes(title_text="n traps", range=[-0.5, top + 0.5], row=2, col=1)  # zero counts sit above the axis
    if with_alpha:
        fig.add_hline(y=2, line_dash="dash", line_color="red", row=3, col=1)
        fig.update_yaxes(title_text="α", type="log", row=3, col=1)
    fig.update_xaxes(title_text="epoch", row=len(titles), col=1)
    fig.update_layout(title=title, height=800 if with_alpha else 600)
    return fig


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def esd_figure(w, name: str = "W", mode: str = "robust", seed: int = 0, bins: int | None = None) -> go.Figure:
    """Histogram of the shuffled ESD (X = W_randᵀW_rand/N) with the fitted MP density, λ₊ and the threshold.

    ``bins`` defaults to M/2 clipped to [10, 80] (M eigenvalues: more bins than that leave gaps).
    """
    w = check_matrix(w, name)
    row = detect_traps(w, name, mode=mode, seed=seed, details=False)
    evals = shuffled_eigenvalues(shuffle(w, random_permutation(w.numel(), make_generator(seed))))
    bins = bins or int(np.clip(row.M // 2, 10, 80))
    q = row.N / row.M
    sigma2 = row.sigma**2
    lo, hi = mp_edges(q, sigma2)
    x = np.linspace(max(lo, 1e-12), hi, 400)
    fig = go.Figure()
    fig.add_trace(go.Histogram(x=evals, histnorm="probability density", nbinsx=bins, name="shuffled ESD", opacity=0.6))
    fig.add_trace(go.Scatter(x=x, y=mp_density(x, q, sigma2), mode="lines", name=f"MP fit (σ={row.sigma:.3g})"))
    fig.add_vline(x=row.lambda_plus, line_dash="dot", annotation_text="λ₊")
    fig.add_vline(x=row.threshold, line_dash="dash", line_color="red", annotation_text=f"threshold ({row.n_traps} traps)")
    fig.update_layout(
        title=f"{name}: N={row.N}, M={row.M}, {mode} mode", xaxis_title="eigenvalue of WᵀW/N", yaxis_title="density"
    )
    return fig
