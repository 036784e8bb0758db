"""Items 1 and 3 of REPRODUCTION.md from a finished (or partial) behavioral sweep.

    .venv/bin/python reproduction/behavioral.py runs/repro/behavioral reproduction/results/behavioral

Reads ``OUT/sweep.json`` and every member's ``metrics.jsonl``/``summary.json``; writes
``table.csv``/``table.json`` (item 1: generalization rate per cell with Wilson 95 % intervals),
``gradients.json`` (item 3: per-example gradient amplification anti/consistent at r = 0.9 and
the conflict cosine, per cell, median and range over seeds and evaluations after epoch 0) and
``gradients.html`` (conflict over training: the first generalizing 2L seed vs a 1L seed at r = 0.9).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lenslab.sweep_figures import sweep_figure
from lenslab.training.run import Run
from lenslab.training.sweep import summarize_sweep
from reproduction.figures import write_figure


def main(sweep_dir: str, out_dir: str) -> None:
    root, out = Path(sweep_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = summarize_sweep(root)
    (out / "table.json").write_text(json.dumps(rows, indent=2))
    (out / "table.csv").write_text((root / "results.csv").read_text())
    write_figure(sweep_figure(rows), out / "rate_vs_r.html")
    plan = json.loads((root / "sweep.json").read_text())
    grads = {}
    curves = {}
    for m in plan["members"]:
        run_dir = root / m["out"]
        if not (run_dir / "metrics.jsonl").exists():
            continue
        run = Run.open(run_dir)
        cell = m["out"].split("/")[0]
        vals = [r for r in run.metrics if r["epoch"] > 0 and r.get("grad_amplification") is not None]
        g = grads.setdefault(cell, {"amplification": [], "conflict": [], "seeds": 0})
        g["seeds"] += 1
        g["amplification"] += [r["grad_amplification"] for r in vals]
        g["conflict"] += [r["grad_conflict"] for r in vals]
        curves.setdefault(cell, []).append(
            (m["seed"], run.summary.get("generalized"), [(r["epoch"], r["grad_conflict"], r["adv_acc"]) for r in run.metrics])
        )
    table = {}
    for cell, g in grads.items():
        a, c = g["amplification"], g["conflict"]
        table[cell] = {
            "seeds": g["seeds"],
            "evaluations": len(a),
            "amplification_median": statistics.median(a) if a else None,
            "amplification_min": min(a, default=None),
            "amplification_max": max(a, default=None),
            "conflict_median": statistics.median(c) if c else None,
            "conflict_min": min(c, default=None),
            "conflict_max": max(c, default=None),
        }
    (out / "gradients.json").write_text(json.dumps(table, indent=2))
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=2, cols=1, shared_xaxes=True, subplot_titles=("gradient conflict cos(g_consistent, g_anti)", "adversarial accuracy")
    )
    picks = []
    for cell, runs in sorted(curves.items()):
        if "r0.9" not in cell:
            continue
        gen = [x for x in runs if x[1]]
        picks.append((cell, (gen or runs)[0]))
    for cell, (seed, generalized, pts) in picks:
        name = f"{cell} seed {seed} ({'generalized' if generalized else 'did not generalize'})"
        fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], name=name, legendgroup=name), row=1, col=1)
        fig.add_trace(
            go.Scatter(x=[p[0] for p in pts], y=[p[2] for p in pts], name=name, legendgroup=name, showlegend=False), row=2, col=1
        )
    fig.update_layout(template="plotly_white", height=600, title="r = 0.9: gradient conflict vs adversarial accuracy")
    fig.update_xaxes(title_text="epoch", row=2, col=1)
    write_figure(fig, out / "gradients.html")
    print(json.dumps({"cells": rows, "gradients": table}, indent=2))


if __name__ == "__main__":
    main(*sys.argv[1:3])
