"""The anti-grokking probe (issue 15, REPRODUCTION items 6-7): modular addition, fixed weight decay from step 0.

    # probe 1 (p = 31, 30 %): nothing grokked, not even the weight-decay-1 control
    .venv/bin/python reproduction/antigrok.py train ~/lenslab-runs/antigrok --epochs 10000
    .venv/bin/python reproduction/antigrok.py train ~/lenslab-runs/antigrok --epochs 30000 --dtypes float64   # extend one arm
    .venv/bin/python reproduction/antigrok.py report ~/lenslab-runs/antigrok reproduction/results/antigrok
    # probe 2 (p = 31, the train fraction at which the control groks: reproduction/antigrok_pilot.sh)
    .venv/bin/python reproduction/antigrok.py train ~/lenslab-runs/antigrok2 --train-frac 0.6 --epochs 100000 --n-evals 150 --dtypes float64 &
    .venv/bin/python reproduction/antigrok.py train ~/lenslab-runs/antigrok2 --train-frac 0.6 --epochs 100000 --n-evals 150 --dtypes float32 &
    .venv/bin/python reproduction/antigrok.py report ~/lenslab-runs/antigrok2 reproduction/results/antigrok2 --train-frac 0.6
    # probe 2 to 10^5 steps (2026-12-05): the float64 arms, each its own stack of 2 on one thread
    # (a stack of 6 ran at 5 steps/s, too slow for one session); three processes on the 2 cores
    OMP_NUM_THREADS=1 .venv/bin/python reproduction/antigrok.py train ~/lenslab-runs/antigrok2 --train-frac 0.6 --epochs 100000 --n-evals 150 --dtypes float64 --weight-decays 0 &
    OMP_NUM_THREADS=1 .venv/bin/python reproduction/antigrok.py train ~/lenslab-runs/antigrok2 --train-frac 0.6 --epochs 100000 --n-evals 150 --dtypes float64 --weight-decays 0.01 &
    OMP_NUM_THREADS=1 .venv/bin/python reproduction/antigrok.py train ~/lenslab-runs/antigrok2 --train-frac 0.6 --epochs 100000 --n-evals 150 --dtypes float64 --weight-decays 1 &

Set-up (chosen before any run, from the issue): p = 31, train fraction 0.3 (288 of 961 pairs; probe 2:
``--train-frac``, chosen by the pilot's rule before any weight-decay-0/0.01 run),
full batch, AdamW lr 1e-3, betas (0.9, 0.98), log-spaced evaluations and checkpoints.
Arms: float64 at weight decay 0, 0.01 and 1.0 (the grokking control), float32 at weight decay 0
and 0.01; seeds 0 and 1 each. Each dtype is one stacked ensemble (members differ in seed and
weight decay). ``train`` is resumable: run it again, or with a larger ``--epochs``, and every
member continues where it stopped (float32 first: it is four times cheaper per step here).

``report`` reads the runs and writes, per run, the accuracy / collapse-diagnostic trajectory and
the trap count and HTSR alpha of every matrix at every checkpoint (``lenslab traps``' robust
mode), plus one figure.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ARMS = {"float32": (0.0, 0.01), "float64": (0.0, 0.01, 1.0)}
SEEDS = (0, 1)
TASK = {"p": 31, "train_frac": 0.3}  # --p / --train-frac override


def configs(dtype: str, epochs: int, n_evals: int, wds: tuple[float, ...] | None = None) -> tuple[list[dict], list[str]]:
    from lenslab.training.config import modadd_run_config

    cfgs, names = [], []
    for wd in ARMS[dtype]:
        if wds is not None and wd not in wds:
            continue
        for s in SEEDS:
            cfgs.append(
                modadd_run_config(
                    **TASK, weight_decay=wd, seed=s, epochs=epochs, dtype=dtype, eval_schedule="log", n_evals=n_evals
                )
            )
            names.append(f"{dtype}-wd{wd:g}/seed_{s}")
    return cfgs, names


def train(
    root: Path, epochs: int, n_evals: int, dtypes: tuple[str, ...] = tuple(ARMS), wds: tuple[float, ...] | None = None
) -> None:
    from lenslab.training.ensemble import train_ensemble

    for dtype in dtypes:
        cfgs, names = configs(dtype, epochs, n_evals, wds)
        if not cfgs:
            print(f"{dtype}: no arm has weight decay in {wds} (arms: {ARMS[dtype]}); nothing to train", file=sys.stderr)
            continue
        print(f"{dtype}: {len(cfgs)} members to epoch {epochs}", file=sys.stderr, flush=True)
        train_ensemble(cfgs, [root / n for n in names], resume=True, progress=True)


def report(root: Path, out: Path) -> None:
    """Per run and checkpoint: accuracies, collapse numbers, traps per matrix and HTSR alpha -> trajectory.csv, summary.json, antigrok.html."""
    import csv

    from lenslab.interp.spectral import traps_command
    from lenslab.training.outcomes import modadd_outcome
    from lenslab.training.run import Run
    from reproduction.figures import write_figure

    out.mkdir(parents=True, exist_ok=True)
    table, summary = [], {}
    for d in sorted(root.glob("*/seed_*")):
        run = Run.open(d)
        name = f"{d.parent.name}/{d.name}"
        by_epoch = {r["epoch"]: r for r in run.metrics}
        scan = traps_command(str(d), mode="robust", seed=0, n_shuffles=1, jsd=False, workers=1, progress=False)
        for c in scan["checkpoints"]:
            m = by_epoch.get(c["epoch"], {})
            row = {
                "run": name,
                "epoch": c["epoch"],
                "train_acc": m.get("train_acc"),
                "test_acc": m.get("test_acc"),
                "max_abs_logit": m.get("train_max_abs_logit"),
                "zero_loss_frac": m.get("train_zero_loss_frac"),
                "weight_norm": m.get("weight_norm"),
                "grad_norm": m.get("grad_norm"),
                "traps_total": sum(x["n_traps"] or 0 for x in c["matrices"]),
                "alpha_min": min((x["alpha"] for x in c["matrices"] if x["alpha"] == x["alpha"]), default=None),
            }
            for x in c["matrices"]:
                row[f"traps:{x['name']}"] = x["n_traps"]
                row[f"alpha:{x['name']}"] = x["alpha"]
            table.append(row)
        rows = [r for r in table if r["run"] == name]
        first_trap = next((r["epoch"] for r in rows if r["traps_total"]), None)
        first_alpha2 = next((r["epoch"] for r in rows if r["alpha_min"] is not None and r["alpha_min"] < 2), None)
        summary[name] = {
            **modadd_outcome(run),
            "first_trap_epoch": first_trap,
            "first_alpha_below_2_epoch": first_alpha2,
            "traps_at_end": rows[-1]["traps_total"] if rows else None,
            "alpha_min_at_end": rows[-1]["alpha_min"] if rows else None,
        }
    keys = list(dict.fromkeys(k for r in table for k in r))
    with open(out / "trajectory.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, lineterminator="\n")
        w.writeheader()
        w.writerows(table)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    write_figure(figure(table), out / "antigrok.html")
    print(json.dumps(summary, indent=1))


def figure(table: list[dict]):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    panels = [
        ("test_acc", "test accuracy"),
        ("traps_total", "correlation traps (all matrices)"),
        ("alpha_min", "smallest HTSR alpha"),
        ("zero_loss_frac", "train examples at loss exactly 0"),
        ("max_abs_logit", "max |logit| (train)"),
        ("weight_norm", "weight norm"),
    ]
    fig = make_subplots(rows=3, cols=2, subplot_titles=[t for _, t in panels], vertical_spacing=0.09)
    runs = list(dict.fromkeys(r["run"] for r in table))
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
    for i, name in enumerate(runs):
        rows = [r for r in table if r["run"] == name and r["epoch"] > 0]
        for j, (key, _) in enumerate(panels):
            fig.add_trace(
                go.Scatter(
                    x=[r["epoch"] for r in rows],
                    y=[r[key] for r in rows],
                    mode="lines",
                    name=name,
                    legendgroup=name,
                    showlegend=(j == 0),
                    line={"color": palette[i % len(palette)], "dash": "dot" if "float32" in name else "solid"},
                ),
                row=j // 2 + 1,
                col=j % 2 + 1,
            )
    fig.update_xaxes(type="log", title_text="step (full batch: epoch = step)")
    fig.add_hline(y=2, line_dash="dash", line_color="grey", row=2, col=1)
    fig.update_layout(
        template="plotly_white",
        height=1000,
        title=f"Modular addition p = {TASK['p']}, {TASK['train_frac']:.0%} train, weight decay fixed from step 0 (float64 solid, float32 dotted)",
    )
    return fig


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["train", "report"])
    ap.add_argument("root")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--epochs", type=int, default=10_000)
    ap.add_argument("--n-evals", type=int, default=120)
    ap.add_argument("--dtypes", default="float32,float64", help="which arms to train (comma list)")
    ap.add_argument("--weight-decays", default=None, help="only these arms (comma list); each call stacks its own members")
    ap.add_argument("--p", type=int, default=TASK["p"])
    ap.add_argument("--train-frac", type=float, default=TASK["train_frac"])
    a = ap.parse_args()
    TASK.update(p=a.p, train_frac=a.train_frac)
    if a.what == "train":
        wds = tuple(float(x) for x in a.weight_decays.split(",")) if a.weight_decays else None
        train(Path(a.root), a.epochs, a.n_evals, tuple(a.dtypes.split(",")), wds)
    else:
        report(Path(a.root), Path(a.out))
