"""Plotly figures for interp results, and circuitsvis attention views rendered offline.

Plotly figures show inline in Jupyter through plotly's own ``_repr_html_``. circuitsvis
normally probes the internet on every display and loads its JavaScript from unpkg;
``AttentionView`` instead inlines the bundled ``circuitsvis/dist/cdn/iife.js`` — once per
kernel in a notebook (``_repr_html_``), once per page in a report (``circuitsvis_bundle_html``).
"""

from __future__ import annotations

import json
from pathlib import Path
from uuid import uuid4

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor
from transformer_lens import HookedTransformer, utils

from interp.common import Table, check_index, check_tokens
from interp.patching import PatchGrid

# -- plotly ------------------------------------------------------------------------------


def heatmap(values, x_labels, y_labels, title: str, x_title: str, y_title: str, zmid: float | None = 0.0, colorbar: str = "") -> go.Figure:
    z = values.tolist() if isinstance(values, Tensor) else values
    fig = go.Figure(go.Heatmap(z=z, x=[str(x) for x in x_labels], y=[str(y) for y in y_labels], zmid=zmid, colorscale="RdBu", colorbar={"title": colorbar}))
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, yaxis_autorange="reversed", height=max(260, 60 + 32 * len(y_labels)))
    return fig


def patching_figure(grid: PatchGrid) -> go.Figure:
    """Heatmap of one grid: layer × position, (layer, head) × position, or layer × head."""
    title = f"patching {grid.kind} ({grid.direction}, {grid.n_pairs} pairs): normalized logit diff"
    v = grid.values
    if grid.kind == "z_by_pos":
        L, P, H = v.shape
        rows = v.permute(0, 2, 1).reshape(L * H, P)
        return heatmap(rows, list(range(P)), [f"L{l}H{h}" for l in range(L) for h in range(H)], title, "position", "head", colorbar="norm. LD")
    if grid.kind == "z_all_pos":
        return heatmap(v, [f"H{h}" for h in range(v.shape[1])], [f"L{l}" for l in range(v.shape[0])], title, "head", "layer", colorbar="norm. LD")
    return heatmap(v, list(range(v.shape[1])), [f"L{l}" for l in range(v.shape[0])], title, "position", "layer", colorbar="norm. LD")


def ablation_figure(table: Table, value: str = "delta_acc") -> go.Figure:
    """Targets × splits heatmap of ``<value>_<split>`` (e.g. accuracy change when ablated)."""
    rows = [r for r in table if r["target"] != "none"]
    splits = sorted(k[len(value) + 1 :] for k in table[0] if k.startswith(value + "_"))
    z = [[r[f"{value}_{s}"] for s in splits] for r in rows]
    return heatmap(z, splits, [r["target"] for r in rows], f"ablation: {value} per split", "split", "ablated target", colorbar=value)


def lines(rows: list[dict], x: str, ys: list[str], title: str, y_title: str, vlines: dict[str, float | None] | None = None) -> go.Figure:
    fig = go.Figure()
    for y in ys:
        pts = [(r[x], r.get(y)) for r in rows if r.get(y) is not None]
        if pts:
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=y))
    for name, at in (vlines or {}).items():
        if at is not None:
            fig.add_vline(x=at, line_dash="dash", annotation_text=name)
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y_title)
    return fig


def accuracy_figure(metrics: list[dict], phase: dict | None = None) -> go.Figure:
    ys = ["train_acc", "validation_acc", "adv_acc", "train_consistent_acc", "train_anti_acc"]
    v = {"phase 1": phase.get("phase1_epoch"), "phase 2": phase.get("phase2_epoch")} if phase else None
    return lines(metrics, "epoch", ys, "accuracy per split", "accuracy", v)


def gradient_figure(metrics: list[dict]) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("gradient conflict (cosine)", "gradient amplification (anti / consistent)"))
    for col, key in ((1, "grad_conflict"), (2, "grad_amplification")):
        pts = [(m["epoch"], m[key]) for m in metrics if m.get(key) is not None]
        fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=key), row=1, col=col)
        fig.update_xaxes(title_text="epoch", row=1, col=col)
    fig.update_layout(title="gradient dynamics", showlegend=False)
    return fig


def fingerprint_evolution_figure(head_rows: list[dict], source: str = "w") -> go.Figure:
    """One panel per fingerprint; one line per head, over checkpoints."""
    names = ("qk_rho", "pos0_mass", "ov_parity_rho")
    fig = make_subplots(rows=1, cols=3, subplot_titles=[f"{n} ({'weights' if source == 'w' else 'activations'})" for n in names])
    heads = sorted({r["head_name"] for r in head_rows})
    for col, n in enumerate(names, start=1):
        for h in heads:
            pts = [(r["epoch"], r[f"{n}_{source}"]) for r in head_rows if r["head_name"] == h]
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines", name=h, legendgroup=h, showlegend=col == 1), row=1, col=col)
        fig.update_xaxes(title_text="epoch", row=1, col=col)
    fig.update_layout(title="fingerprint evolution per head")
    return fig


def head_evolution_heatmap(head_rows: list[dict], key: str, title: str) -> go.Figure:
    epochs = sorted({r["epoch"] for r in head_rows})
    heads = sorted({r["head_name"] for r in head_rows})
    z = [[next((r[key] for r in head_rows if r["epoch"] == e and r["head_name"] == h), None) for e in epochs] for h in heads]
    return heatmap(z, epochs, heads, title, "epoch", "head", colorbar=key)


# -- circuitsvis, offline -------------------------------------------------------------------
_BUNDLE: str | None = None
_BUNDLE_SHOWN = False  # per kernel: has a notebook output already carried the bundle?


def circuitsvis_js() -> str:
    """The circuitsvis browser bundle shipped in the wheel (source-map comment removed)."""
    global _BUNDLE
    if _BUNDLE is None:
        import circuitsvis

        path = Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js"
        js = path.read_text(encoding="utf-8").replace("</script>", "<\\/script>")
        _BUNDLE = js.replace("//# sourceMappingURL=iife.js.map", "")
    return _BUNDLE


def circuitsvis_bundle_html() -> str:
    """A classic ``<script>`` defining ``window.CircuitsVis``; put it once on a page."""
    return f"<script>{circuitsvis_js()}</script>"


class AttentionView:
    """A circuitsvis ``AttentionHeads`` view whose HTML never touches the network."""

    def __init__(self, attention: Tensor, tokens: list[str], head_names: list[str], title: str = ""):
        from circuitsvis.utils.convert_props import convert_props

        self.title = title
        self.props = convert_props({"attention": attention, "tokens": tokens, "attentionHeadNames": head_names})

    def html(self) -> str:
        """The view alone (needs ``circuitsvis_bundle_html()`` earlier on the page)."""
        uid = "circuits-vis-" + uuid4().hex[:13]
        head = f"<h4>{self.title}</h4>" if self.title else ""
        return (
            f'{head}<div id="{uid}" style="margin: 15px 0;"></div>\n'
            f'<script>CircuitsVis.render("{uid}", CircuitsVis.AttentionHeads, {self.props});</script>'
        )

    def _repr_html_(self) -> str:
        global _BUNDLE_SHOWN
        bundle = "" if _BUNDLE_SHOWN else circuitsvis_bundle_html()
        _BUNDLE_SHOWN = True
        return bundle + self.html()


def token_strings(tokens: list[int], n_values: int) -> list[str]:
    return [str(t) if t < n_values else "READ" for t in tokens]


def attention_view(model: HookedTransformer, tokens: Tensor, n_values: int, layer: int | None = None, title: str = "") -> AttentionView:
    """Attention patterns of every head (or of one layer) on one example ``tokens`` [pos]."""
    tokens = check_tokens(model, tokens.reshape(1, -1))
    layers = range(model.cfg.n_layers) if layer is None else [check_index("layer", layer, model.cfg.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    pats = torch.cat([cache[utils.get_act_name("pattern", l)][0] for l in layers])  # [heads, dest, src]
    names = [f"L{l}H{h}" for l in layers for h in range(model.cfg.n_heads)]
    return AttentionView(pats, token_strings(tokens[0].tolist(), n_values), names, title)


def figure_json(fig: go.Figure) -> dict:
    return json.loads(fig.to_json())
