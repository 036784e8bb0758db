"""Item 4 of REPRODUCTION.md: circuit reorganisation in one generalizing 2L seed, against one 1L seed.

    .venv/bin/python reproduction/circuits.py runs/repro/behavioral reproduction/results/circuits

From the behavioral sweep, picks the lowest-numbered 2L seed at r = 0.9 that generalized and the
lowest-numbered 1L seed at r = 0.9 that did not. For each it runs ``lenslab inspect`` (the
Python API, ``interp.inspect.write_inspection``) and writes:

- ``RUN/report.html`` (beside the run, not committed: 6 MB with its scripts): the full inspection
  report (fingerprint evolution, ablation, patching, phase 2);
- ``evolution.html``: per head over training, the QK fingerprint (activations), the OV parity
  fingerprint and the adversarial-accuracy change under mean ablation, for both runs;
- ``<name>_evolution.csv``: one row per checkpoint and head: epoch, adversarial / validation
  accuracy, the QK and OV fingerprints from weights (``_w``) and activations (``_a``), the accuracy
  change when the head is mean-ablated, and the cross-split patching effect of its ``z``;
- ``summary.json``: which seeds, the detected phases, and per head the fingerprints at the first
  checkpoint after the shortcut is learned vs at the end.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lenslab.report import write_inspection
from reproduction.figures import write_figure

KEYS = (
    "qk_rho_w",
    "ov_parity_rho_w",
    "pos0_mass_w",
    "qk_rho_a",
    "ov_parity_rho_a",
    "pos0_mass_a",
    "ablate_delta_acc_validation",
    "ablate_delta_acc_adv",
    "patch_z",
)


def pick(root: Path, plan: dict) -> dict[str, Path]:
    chosen = {}
    for m in sorted(plan["members"], key=lambda m: m["seed"]):
        cell, model = m["cell"], m["config"]["model"]
        if cell["ratio"] != 0.9:
            continue
        try:
            s = json.loads((root / m["out"] / "summary.json").read_text())
        except (OSError, ValueError):
            continue
        if s.get("status") != "complete":
            continue
        if model["n_layers"] == 2 and s.get("generalized") and "2L_generalizing" not in chosen:
            chosen["2L_generalizing"] = root / m["out"]
        if model["n_layers"] == 1 and not s.get("generalized") and "1L_shortcut" not in chosen:
            chosen["1L_shortcut"] = root / m["out"]
    return chosen


def main(sweep_dir: str, out_dir: str) -> None:
    root, out = Path(sweep_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plan = json.loads((root / "sweep.json").read_text())
    chosen = pick(root, plan)
    if not chosen:
        sys.exit(f"{root}: no finished r = 0.9 member to inspect yet")
    summary, series = {}, {}
    for name, run_dir in chosen.items():
        result, _ = write_inspection(run_dir)
        by_epoch = {r["epoch"]: r for r in result["evolution"]["rows"]}
        rows = []
        for h in result["evolution"]["head_rows"]:
            m = by_epoch[h["epoch"]]
            rows.append(
                {
                    "epoch": h["epoch"],
                    "head": h["head_name"],
                    "adv_acc": m.get("adv_acc"),
                    "validation_acc": m.get("validation_acc"),
                    **{k: h.get(k) for k in KEYS},
                }
            )
        with open(out / f"{name}_evolution.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        phase = result["phase"]
        start = phase.get("phase1_epoch")
        epochs = sorted({r["epoch"] for r in rows})
        first = next((e for e in epochs if start is not None and e >= start), epochs[0])
        heads = {}
        for r in rows:
            if r["epoch"] in (first, epochs[-1]):
                heads.setdefault(r["head"], {})["shortcut_learned" if r["epoch"] == first else "end"] = {
                    k: r[k] for k in ("adv_acc", *KEYS)
                }
        series[name] = rows
        summary[name] = {
            "run": str(run_dir),
            "phase": phase,
            "epochs": [first, epochs[-1]],
            "heads": heads,
            "final_ablation": result["ablation"],
            "limits": result["limits"],
        }
        print(f"{name}: {run_dir} phase {phase}", file=sys.stderr)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    write_figure(figure(series, summary), out / "evolution.html")


def figure(series: dict, summary: dict):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    names = list(series)
    panels = [
        ("adv_acc", "adversarial accuracy"),
        ("qk_rho_a", "QK fingerprint ρ (activations)"),
        ("ov_parity_rho_a", "OV parity fingerprint ρ (activations)"),
        ("ablate_delta_acc_adv", "Δ adv. accuracy, head mean-ablated"),
    ]
    fig = make_subplots(
        rows=len(panels),
        cols=len(names),
        shared_xaxes=True,
        subplot_titles=[
            f"{n}: {Path(summary[n]['run']).parent.name}/{Path(summary[n]['run']).name}" if i == 0 else ""
            for i in range(len(panels))
            for n in names
        ],
    )
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]
    for c, name in enumerate(names, start=1):
        rows = series[name]
        heads = sorted({r["head"] for r in rows})
        for r_i, (key, label) in enumerate(panels, start=1):
            for h_i, h in enumerate(heads if key != "adv_acc" else heads[:1]):
                pts = [r for r in rows if r["head"] == h]
                fig.add_trace(
                    go.Scatter(
                        x=[p["epoch"] for p in pts],
                        y=[p[key] for p in pts],
                        mode="lines+markers",
                        name=h if key != "adv_acc" else "adv_acc",
                        legendgroup=h,
                        showlegend=(c == 1 and r_i == 2) or (c == 2 and r_i == 2 and h.startswith("L1")),
                        line={"color": colors[h_i % 4] if key != "adv_acc" else "black"},
                    ),
                    row=r_i,
                    col=c,
                )
            fig.update_yaxes(title_text=label if c == 1 else None, row=r_i, col=c)
    fig.update_xaxes(title_text="epoch", row=len(panels))
    fig.update_layout(template="plotly_white", height=900, title="Item 4: circuit reorganisation (r = 0.9)")
    return fig


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.splitlines()[2].strip())
    main(sys.argv[1], sys.argv[2])
