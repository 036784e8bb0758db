"""The regime map (REPRODUCTION item 1): where in the knobs paper 1 leaves open does its effect live?

    .venv/bin/python reproduction/regime_map.py ~/lenslab-runs/regime reproduction/results/regime_map

Reads a sweep folder (``reproduction/regime_map.sh`` writes one) and writes ``cells.csv`` /
``cells.json`` (per cell: generalization rate, Wilson 95 % interval, median first-generalization
epoch, how the failed runs failed), ``runs.csv`` (per run: the numbers behind its outcome) and
``regime_map.html``: per architecture, a heatmap of regime (the cell's other knobs) x r, each
cell reading "k/n [low, high] | median first epoch", and beside it the breakdown of the runs
that did not generalize (memorized / shortcut / chance / constant / climbing / partial).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lenslab.training.outcomes import FAILURES
from lenslab.training.sweep import summarize_sweep
from reproduction.figures import write_figure

COLOURS = {
    "memorized": "#d62728",
    "shortcut": "#ff7f0e",
    "chance": "#7f7f7f",
    "constant": "#8c564b",
    "climbing": "#2ca02c",
    "partial": "#bcbd22",
}


def regime(row: dict) -> str:
    """The cell's knobs other than architecture and r, as a short label (seq_len always shown)."""
    parts = [f"len {row['seq_len']}"]
    if row["n_values"] != 16:
        parts.append(f"{row['n_values']} values")
    if row["weight_decay"] != 0.1:
        parts.append(f"wd {row['weight_decay']:g}")
    if row["batch_size"] != 512:
        parts.append("full batch" if row["batch_size"] == 0 else f"batch {row['batch_size']}")
    if row["lr"] != 1e-3:
        parts.append(f"lr {row['lr']:g}")
    return ", ".join(parts)


def regime_figure(rows: list[dict]):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    archs = sorted({(r["layers"], r["heads"]) for r in rows}, reverse=True)
    fig = make_subplots(
        rows=len(archs),
        cols=2,
        column_widths=[0.55, 0.45],
        horizontal_spacing=0.16,
        vertical_spacing=0.14,
        subplot_titles=[
            t for L, H in archs for t in (f"{L}L {H}H: generalization rate", f"{L}L {H}H: runs that did not generalize")
        ],
    )
    for i, (L, H) in enumerate(archs, 1):
        mine = [r for r in rows if (r["layers"], r["heads"]) == (L, H) and r["runs"]]
        regimes = sorted({regime(r) for r in mine})
        ratios = sorted({r["ratio"] for r in mine})
        z, text = [], []
        for g in regimes:
            zr, tr = [], []
            for q in ratios:
                r = next((r for r in mine if regime(r) == g and r["ratio"] == q), None)
                if r is None:
                    zr.append(None)
                    tr.append("")
                    continue
                first = "-" if r["median_first_generalized_epoch"] is None else f"{r['median_first_generalized_epoch']:g}"
                ep = r["epochs_max"] if r["epochs_min"] == r["epochs_max"] else f"{r['epochs_min']}-{r['epochs_max']}"
                zr.append(r["rate"])
                tr.append(
                    f"{r['generalized']}/{r['runs']} [{r['wilson_low']:.2f}, {r['wilson_high']:.2f}]<br>1st: {first} | {ep} ep"
                )
            z.append(zr)
            text.append(tr)
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=[f"r = {q:g}" for q in ratios],
                y=regimes,
                text=text,
                texttemplate="%{text}",
                zmin=0,
                zmax=1,
                colorscale="Blues",
                showscale=(i == 1),
                colorbar={"title": "rate", "len": 0.4, "y": 0.8},
            ),
            row=i,
            col=1,
        )
        labels = [f"{g} | r {q:g}" for g in regimes for q in ratios if any(regime(r) == g and r["ratio"] == q for r in mine)]
        for o in FAILURES:
            counts = [next(r[f"failed_{o}"] for r in mine if f"{regime(r)} | r {r['ratio']:g}" == lab) for lab in labels]
            fig.add_trace(
                go.Bar(y=labels, x=counts, name=o, orientation="h", marker_color=COLOURS[o], legendgroup=o, showlegend=(i == 1)),
                row=i,
                col=2,
            )
        fig.update_xaxes(title_text="runs", row=i, col=2)
    fig.update_layout(
        barmode="stack",
        template="plotly_white",
        height=380 * len(archs) + 120,
        width=1250,
        title="Regime map: generalization (100 % adversarial accuracy at any evaluation) by regime and r, with Wilson 95 % intervals",
    )
    return fig


def main(sweep_dir: str, out_dir: str) -> None:
    root, out = Path(sweep_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = summarize_sweep(root)
    shutil.copyfile(root / "results.csv", out / "cells.csv")
    shutil.copyfile(root / "results_runs.csv", out / "runs.csv")
    doc = json.loads((root / "results.json").read_text())
    (out / "cells.json").write_text(json.dumps({"grid": doc["grid"], "cells": rows}, indent=1))
    write_figure(regime_figure(rows), out / "regime_map.html")
    for r in sorted(rows, key=lambda r: (-r["layers"], regime(r), r["ratio"])):
        fails = ", ".join(f"{r[f'failed_{o}']} {o}" for o in FAILURES if r[f"failed_{o}"])
        print(f"{r['layers']}L{r['heads']}H {regime(r):<24} r={r['ratio']:<4g} {r['generalized']}/{r['runs']} gen  {fails}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
