"""Plotly figures for interp results, and circuitsvis attention views rendered offline.

Plotly figures show inline in Jupyter through plotly's own ``_repr_html_``. circuitsvis
normally probes the internet on every display and loads its JavaScript from unpkg;
``AttentionView`` instead carries the bundled ``circuitsvis/dist/cdn/iife.js``: packed in every
notebook output (``_repr_html_``), once per page in a report (``circuitsvis_bundle_html``).
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from uuid import uuid4

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens import utilities as utils  # "utils" is deprecated (removed in TL 4)

from lenslab.interp.common import InterpError, check_index, check_tokens, head_label, task_numbers
from lenslab.interp.patching import PatchGrid

# -- plotly ------------------------------------------------------------------------------


def heatmap(
    values, x_labels, y_labels, title: str, x_title: str, y_title: str, zmid: float | None = 0.0, colorbar: str = ""
) -> go.Figure:
    """A plotly heatmap of ``values`` (a 2-D tensor or nested list) with labelled axes, centred at ``zmid`` (None: not centred)."""
    z = values.tolist() if isinstance(values, Tensor) else values
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[str(x) for x in x_labels],
            y=[str(y) for y in y_labels],
            zmid=zmid,
            colorscale="RdBu",
            colorbar={"title": colorbar},
        )
    )
    fig.update_layout(
        title=title,
        xaxis_title=x_title,
        yaxis_title=y_title,
        yaxis_autorange="reversed",
        height=max(260, 60 + 32 * len(y_labels)),
    )
    return fig


def patching_figure(grid: PatchGrid) -> go.Figure:
    """Heatmap of one grid: layer × position, (layer, head) × position, or layer × head."""
    title = f"patching {grid.kind} ({grid.direction}, {grid.n_pairs} pairs): normalized logit diff"
    v = grid.values
    if grid.kind == "z_by_pos":
        L, P, H = v.shape
        rows = v.permute(0, 2, 1).reshape(L * H, P)
        return heatmap(
            rows,
            list(range(P)),
            [head_label(l, h) for l in range(L) for h in range(H)],
            title,
            "position",
            "head",
            colorbar="norm. LD",
        )
    if grid.kind == "z_all_pos":
        return heatmap(
            v,
            [f"H{h}" for h in range(v.shape[1])],
            [f"L{l}" for l in range(v.shape[0])],
            title,
            "head",
            "layer",
            colorbar="norm. LD",
        )
    return heatmap(
        v, list(range(v.shape[1])), [f"L{l}" for l in range(v.shape[0])], title, "position", "layer", colorbar="norm. LD"
    )


def ablation_figure(table: Sequence[dict], value: str = "delta_acc") -> go.Figure:
    """Targets × splits heatmap of ``<value>_<split>`` (e.g. accuracy change when ablated)."""
    rows = [r for r in table if r["target"] != "none"]
    splits = sorted(k[len(value) + 1 :] for k in table[0] if k.startswith(value + "_"))
    z = [[r[f"{value}_{s}"] for s in splits] for r in rows]
    return heatmap(
        z, splits, [r["target"] for r in rows], f"ablation: {value} per split", "split", "ablated target", colorbar=value
    )


def lines(
    rows: list[dict], x: str, ys: list[str], title: str, y_title: str, vlines: dict[str, float | None] | None = None
) -> go.Figure:
    """One line per key of ``ys`` against ``x`` over ``rows`` (rows missing a key are skipped), with dotted vertical lines at ``vlines``."""
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
    """Accuracy per split against epoch from a run's ``metrics`` (``run.metrics``), with the phase epochs marked when given."""
    ys = ["train_acc", "validation_acc", "adv_acc", "train_consistent_acc", "train_anti_acc"]
    v = {"phase 1": phase.get("phase1_epoch"), "phase 2": phase.get("phase2_epoch")} if phase else None
    return lines(metrics, "epoch", ys, "accuracy per split", "accuracy", v)


def gradient_figure(metrics: list[dict]) -> go.Figure:
    """Gradient conflict (cosine) and amplification (anti / consistent) against epoch, from a run's ``metrics``."""
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("gradient conflict (cosine)", "gradient amplification (anti / consistent)")
    )
    for col, key in ((1, "grad_conflict"), (2, "grad_amplification")):
        pts = [(m["epoch"], m[key]) for m in metrics if m.get(key) is not None]
        fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=key), row=1, col=col)
        fig.update_xaxes(title_text="epoch", row=1, col=col)
    fig.update_layout(title="gradient dynamics", showlegend=False)
    return fig


HEAD_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def fingerprint_evolution_figure(head_rows: list[dict], source: str = "w") -> go.Figure:
    """One panel per fingerprint; one line per head, over checkpoints."""
    names = ("qk_rho", "pos0_mass", "ov_parity_rho")
    fig = make_subplots(rows=1, cols=3, subplot_titles=[f"{n} ({'weights' if source == 'w' else 'activations'})" for n in names])
    heads = sorted({r["head_name"] for r in head_rows})
    colours = {h: HEAD_COLOURS[i % len(HEAD_COLOURS)] for i, h in enumerate(heads)}  # one colour per head in every panel
    for col, n in enumerate(names, start=1):
        for h in heads:
            pts = [(r["epoch"], r[f"{n}_{source}"]) for r in head_rows if r["head_name"] == h]
            fig.add_trace(
                go.Scatter(
                    x=[p[0] for p in pts],
                    y=[p[1] for p in pts],
                    mode="lines",
                    name=h,
                    legendgroup=h,
                    showlegend=col == 1,
                    line={"color": colours[h]},
                ),
                row=1,
                col=col,
            )
        fig.update_xaxes(title_text="epoch", row=1, col=col)
    fig.update_layout(title="fingerprint evolution per head")
    return fig


def head_evolution_heatmap(head_rows: list[dict], key: str, title: str) -> go.Figure:
    """Heads × epochs heatmap of one fingerprint column ``key`` from ``circuit_evolution``'s head rows."""
    epochs = sorted({r["epoch"] for r in head_rows})
    heads = sorted({r["head_name"] for r in head_rows})
    z = [[next((r[key] for r in head_rows if r["epoch"] == e and r["head_name"] == h), None) for e in epochs] for h in heads]
    return heatmap(z, epochs, heads, title, "epoch", "head", colorbar=key)


# -- the notebook renderer ----------------------------------------------------------------
NOTEBOOK_RENDERER = "plotly_mimetype+lenslab_notebook"
_MATHJAX_CDN = re.compile(r'<script src="https://[^"]*mathjax[^"]*"></script>', re.IGNORECASE)


def _offline_notebook_renderer():
    from plotly.io.base_renderers import NotebookRenderer

    class OfflineNotebookRenderer(NotebookRenderer):
        """plotly's ``notebook`` renderer (plotly.js inlined in the first figure's cell) without the
        MathJax ``<script src>`` from a CDN that plotly adds to every figure."""

        def to_mimebundle(self, fig_dict):
            bundle = super().to_mimebundle(fig_dict)
            bundle["text/html"] = _MATHJAX_CDN.sub("", bundle["text/html"])
            return bundle

    return OfflineNotebookRenderer()


def use_notebook_renderer() -> str:
    """Show plotly figures in JupyterLab, Notebook 7, VS Code *and* nbconvert's HTML, offline; returns
    the renderer now in use.

    plotly's default in a Jupyter kernel (``plotly_mimetype``) draws in JupyterLab and VS Code but
    leaves nbconvert's HTML blank. This sets ``plotly.io.renderers.default`` to
    ``plotly_mimetype+lenslab_notebook``: each figure keeps its plotly JSON (what JupyterLab and VS
    Code draw) and gains an HTML copy (what nbconvert and classic front ends draw), with plotly.js
    inlined once in the first figure's cell, about 4.7 MB, and no CDN load. A renderer named in
    ``PLOTLY_RENDERER`` wins and is left alone. Call it once, at the top of a notebook.
    """
    import plotly.io as pio

    if os.environ.get("PLOTLY_RENDERER"):
        return pio.renderers.default
    if "lenslab_notebook" not in pio.renderers:
        pio.renderers["lenslab_notebook"] = _offline_notebook_renderer()
    pio.renderers.default = NOTEBOOK_RENDERER
    return NOTEBOOK_RENDERER


# -- circuitsvis, offline -------------------------------------------------------------------
_BUNDLE: str | None = None
_PACKED: str | None = None


def _bundle_source() -> str:
    """``circuitsvis/dist/cdn/iife.js`` as shipped in the wheel, its source-map comment removed."""
    import circuitsvis

    path = Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js"
    return path.read_text(encoding="utf-8").replace("//# sourceMappingURL=iife.js.map", "")


def circuitsvis_js() -> str:
    """The circuitsvis browser bundle, safe inside an inline ``<script>`` (``</script>`` escaped)."""
    global _BUNDLE
    if _BUNDLE is None:
        _BUNDLE = _bundle_source().replace("</script>", "<\\/script>")
    return _BUNDLE


def circuitsvis_bundle_html() -> str:
    """A classic ``<script>`` defining ``window.CircuitsVis``; put it once on a page."""
    return f"<script>{circuitsvis_js()}</script>"


def circuitsvis_packed() -> str:
    """The bundle gzipped (level 9, no timestamp) and base64-encoded, for a notebook output to carry:
    about a third of the bundle's size (see ``AttentionView``)."""
    global _PACKED
    if _PACKED is None:
        _PACKED = base64.b64encode(gzip.compress(_bundle_source().encode("utf-8"), compresslevel=9, mtime=0)).decode("ascii")
    return _PACKED


# Runs in the page: defines window.CircuitsVis from a packed bundle, once per page (a promise that
# later views share), with the browser's own gzip (DecompressionStream) and a classic <script>.
_UNPACK_JS = """\
function lenslabCircuitsVis(packed) {
  if (window.CircuitsVis) return Promise.resolve();
  if (!window.__lenslabCircuitsVis) {
    var bytes = Uint8Array.from(atob(packed), function (c) { return c.charCodeAt(0); });
    var text = new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"))).text();
    window.__lenslabCircuitsVis = text.then(function (js) {
      var s = document.createElement("script");
      s.textContent = js;
      document.head.appendChild(s);
    });
  }
  return window.__lenslabCircuitsVis;
}"""


class AttentionView:
    """A circuitsvis ``AttentionHeads`` view whose HTML never touches the network.

    In a notebook every view's output is self-contained: it carries the circuitsvis bundle
    gzipped and base64-encoded (about 0.48 MB instead of the bundle's 1.3 MB; the browser
    unpacks it with its own ``DecompressionStream``), and unpacks it only when no earlier output
    on the page already did. So a view renders after any other output was cleared, in a notebook
    reopened later, and in nbconvert's HTML. Every view also carries a one-line note that its
    script replaces once it has drawn, so a static viewer (a code host, nbconvert without
    JavaScript) shows the note instead of blank space. In a report, ``html()`` puts the plain
    bundle once per page instead (``circuitsvis_bundle_html``).
    """

    def __init__(self, attention: Tensor, tokens: list[str], head_names: list[str], title: str = ""):
        from circuitsvis.utils.convert_props import convert_props

        self.title = title
        self.n_heads, self.n_tokens = len(head_names), len(tokens)
        self.props = convert_props({"attention": attention, "tokens": tokens, "attentionHeadNames": head_names})

    def __repr__(self) -> str:
        title = f"{self.title!r}, " if self.title else ""
        return f"AttentionView({title}{self.n_heads} heads x {self.n_tokens} tokens)"

    def html(self, packed: bool = False) -> str:
        """The view. ``packed=False``: needs ``circuitsvis_bundle_html()`` earlier on the page (a report);
        ``packed=True``: carries the bundle itself (a notebook output, ``_repr_html_``)."""
        uid = "circuits-vis-" + uuid4().hex[:13]
        head = f"<h4>{self.title}</h4>" if self.title else ""
        draw = f'CircuitsVis.render("{uid}", CircuitsVis.AttentionHeads, {self.props}); note.remove();'
        if packed:
            body = (
                f"{_UNPACK_JS}\n"
                f'if (!window.CircuitsVis && !window.DecompressionStream) {{ note.textContent = "{OLD_BROWSER_NOTE}"; return; }}\n'
                f'lenslabCircuitsVis("{circuitsvis_packed()}").then(function () {{ {draw} }},\n'
                f'  function (e) {{ note.textContent = "{UNPACK_FAILED_NOTE}" + e; }});'
            )
        else:
            body = f'if (!window.CircuitsVis) {{ note.textContent = "{MISSING_NOTE}"; return; }}\n{draw}'
        return (
            f'{head}<p id="{uid}-note" style="color: #666; font-style: italic;">{STATIC_NOTE}</p>\n'
            f'<div id="{uid}" style="margin: 15px 0;"></div>\n'
            f'<script>(function () {{ var note = document.getElementById("{uid}-note");\n{body} }})();</script>'
        )

    def _repr_html_(self) -> str:
        return self.html(packed=True)


STATIC_NOTE = (
    "Interactive attention view (circuitsvis): it draws when the notebook runs in Jupyter or VS Code; "
    "this viewer runs no JavaScript."
)
MISSING_NOTE = "The circuitsvis bundle is not on this page: put lenslab.interp.visual.circuitsvis_bundle_html() before the view."
OLD_BROWSER_NOTE = "This browser has no DecompressionStream (Chrome 80, Firefox 113, Safari 16.4 and later do), so the attention view cannot unpack circuitsvis."
UNPACK_FAILED_NOTE = "The attention view could not unpack circuitsvis: "


def token_strings(tokens, n_values: int) -> list[str]:
    """An MPSP example's tokens as strings: values as their numbers, the readout token as ``READ``.
    ``tokens``: a list of ints or a 1-D integer tensor."""
    if isinstance(tokens, Tensor):
        if tokens.ndim != 1:
            raise InterpError(f"token_strings takes one example [pos]; got shape {tuple(tokens.shape)}")
        tokens = tokens.tolist()
    return [str(int(t)) if t < n_values else "READ" for t in tokens]


def attention_view(
    model: HookedTransformer, tokens: Tensor, n_values: int | None = None, layer: int | None = None, title: str = ""
) -> AttentionView:
    """Attention patterns of every head (or of one layer) on one example ``tokens`` [pos]; ``n_values`` defaults to
    the task of the run the model came from."""
    if n_values is None:
        n_values, _ = task_numbers(model, None, None)
    tokens = check_tokens(model, tokens.reshape(1, -1))
    layers = range(model.cfg.n_layers) if layer is None else [check_index("layer", layer, model.cfg.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    pats = torch.cat([cache[utils.get_act_name("pattern", l)][0] for l in layers])  # [heads, dest, src]
    names = [head_label(l, h) for l in layers for h in range(model.cfg.n_heads)]
    return AttentionView(pats, token_strings(tokens[0].tolist(), n_values), names, title)


def figure_json(fig: go.Figure) -> dict:
    """A figure as its plotly JSON dict (for ``--json`` output and reports)."""
    return json.loads(fig.to_json())


# -- softmax-collapse diagnostics (metrics.jsonl, written by training.trainer) ----------------
COLLAPSE_KEYS = ("train_max_abs_logit", "train_zero_loss_frac", "weight_norm", "grad_norm")


def collapse_figure(metrics: Sequence[dict]) -> go.Figure:
    """Four small panels over the evaluations: max |logit| (train), the share of train losses that are
    exactly 0, the weight norms (total and per matrix), the last step's gradient norm. Log y where
    the quantity spans decades; log x when the evaluations do (a log ``eval_schedule``)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows = [r for r in metrics if any(r.get(k) is not None for k in COLLAPSE_KEYS)]
    epochs = [r["epoch"] for r in rows]
    positive = [e for e in epochs if e > 0]
    log_x = bool(positive) and max(positive) / min(positive) >= 1000
    fig = make_subplots(
        rows=2,
        cols=2,
        subplot_titles=(
            "max |logit| on the train split",
            "train examples with loss exactly 0",
            "weight norm (bold: all parameters)",
            "gradient norm of the last step",
        ),
    )

    def series(key: str, r: int, c: int, name: str | None = None, width: float = 2.0, values=None) -> None:
        ys = values if values is not None else [row.get(key) for row in rows]
        pts = [(e, y) for e, y in zip(epochs, ys) if y is not None and not (log_x and e == 0)]
        if pts:
            fig.add_trace(
                go.Scatter(
                    x=[p[0] for p in pts],
                    y=[p[1] for p in pts],
                    mode="lines+markers",
                    name=name or key,
                    line={"width": width},
                    marker={"size": 3},
                    showlegend=name is not None,
                ),
                row=r,
                col=c,
            )

    series("train_max_abs_logit", 1, 1)
    series("train_zero_loss_frac", 1, 2)
    series("weight_norm", 2, 1, name="all parameters", width=3.0)
    names = sorted({n for row in rows for n in (row.get("weight_norms") or {})})
    for n in names:
        if n.endswith(
            (".W_Q", ".W_K", ".W_V", ".W_O", ".W_in", ".W_out", "W_E", "W_pos", "W_U")
        ):  # the matrices; biases would crowd it
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
