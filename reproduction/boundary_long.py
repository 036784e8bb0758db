"""Issue 25 (REPRODUCTION item 1c): the 2L boundary cells past the memorization wall.

    .venv/bin/python reproduction/boundary_long.py ~/lenslab-runs/boundary reproduction/results/boundary_long

(2026-12-07: the 12-value runs are gone with the machine they ran on, and their tables stay in
``results/boundary_long``; the 16-value cells, rerun from nothing on another machine, are read into
``results/boundary_long_v16`` from a root holding only ``v16/``.)

Reads the sweep folders that ``reproduction/boundary_long.sh`` writes (``v12/``, ``v16/``) and
judges every run at its cell pair's **horizon**: the last round (a multiple of 200 epochs) that
every member of both r reached, so that r = 0.5 and r = 0.9 are read at the same epoch even when
the sweep was stopped mid-round (``run_outcome(run, until=horizon)``). Writes:

- ``runs.csv``: per run, the outcome at the horizon, ``fit_epoch`` (train accuracy first >= 0.97:
  the memorization onset), ``fit_to_generalized`` (the lag to 100 % adversarial accuracy), and the
  outcome at every earlier round (``outcome_at_<E>``), which is where an escape from memorization
  shows;
- ``cells.csv`` / ``cells.json``: per cell, ``generalized`` k/n (runs that ever reached 100 %
  adversarial accuracy, transient ones included) with a Wilson 95 % interval; ``generalized_at_horizon``
  (the end state: outcome "generalized", i.e. still exactly 1.0 at the horizon's last evaluation;
  paper 1's rate is the first count) with its own interval (``rule_wilson_low`` / ``rule_wilson_high``,
  named before REPRODUCTION 1c's correction); the failure
  breakdown, escapes (runs memorized at an earlier round and generalized by the horizon) and the
  runs still moving (outcome "climbing", or adversarial accuracy rising >= 0.05 over the last 20 %
  of evaluations);
- ``curves.html``: adversarial and train accuracy against epoch (log axis) for every run, by r.

The cell tables can be rebuilt from a committed ``runs.csv`` alone, without the run folders:

    .venv/bin/python reproduction/boundary_long.py --cells-from-runs reproduction/results/boundary_long
"""

from __future__ import annotations

import csv
import io
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lenslab.training.outcomes import CLIMB, FAILURES, run_outcome
from lenslab.training.run import Run
from lenslab.training.sweep import wilson
from reproduction.figures import write_figure

ROUND = 200
RATIO_COLOUR = {0.5: "#1f77b4", 0.9: "#d62728"}


def members(sweep: Path) -> list[dict]:
    plan = json.loads((sweep / "sweep.json").read_text())
    out = []
    for m in plan["members"]:
        run = Run.open(sweep / m["out"])
        if run.metrics:
            task = run.config["task"]
            out.append(
                {
                    "run": run,
                    "seed": m["seed"],
                    "ratio": task["ratio"],
                    "n_values": task["n_values"],
                    "cell": Path(m["out"]).parent.name,
                }
            )
    return out


def horizon(ms: list[dict]) -> int:
    """The last multiple of ROUND that every member's evaluations reached."""
    return min(m["run"].metrics[-1]["epoch"] for m in ms) // ROUND * ROUND


def judge(ms: list[dict], until: int) -> list[dict]:
    rows = []
    for m in ms:
        row = {"n_values": m["n_values"], "cell": m["cell"], "ratio": m["ratio"], "seed": m["seed"], "horizon": until}
        row |= run_outcome(m["run"], until=until)
        row["epochs_reached"] = m["run"].metrics[-1]["epoch"]
        for e in range(ROUND, until, ROUND):
            row[f"outcome_at_{e}"] = run_outcome(m["run"], until=e)["outcome"]
        rows.append(row)
    return rows


def cell_rows(runs: list[dict]) -> list[dict]:
    cells = []
    for values, cell in sorted({(r["n_values"], r["cell"]) for r in runs}):  # a cell name omits n_values
        rs = [r for r in runs if r["cell"] == cell and r["n_values"] == values]
        gen = [r for r in rs if r["generalized"]]
        lo, hi = wilson(len(gen), len(rs))
        held = sum(r["outcome"] == "generalized" for r in rs)
        rule_lo, rule_hi = wilson(held, len(rs))
        earlier = [k for k in rs[0] if k.startswith("outcome_at_")]
        escaped = [r for r in gen if any(r[k] == "memorized" for k in earlier)]
        moving = [r for r in rs if r["outcome"] == "climbing" or (r["adv_trend"] is not None and r["adv_trend"] >= CLIMB)]
        lags = [r["fit_to_generalized"] for r in gen if r["fit_to_generalized"] is not None]
        cells.append(
            {
                "n_values": values,
                "cell": cell,
                "ratio": rs[0]["ratio"],
                "horizon": rs[0]["horizon"],
                "runs": len(rs),
                "generalized": len(gen),
                "wilson_low": lo,
                "wilson_high": hi,
                "generalized_at_horizon": held,
                "rule_wilson_low": rule_lo,
                "rule_wilson_high": rule_hi,
                **{f"failed_{o}": sum(r["outcome"] == o for r in rs) for o in FAILURES},
                "escaped_memorization": len(escaped),
                "still_moving": len(moving),
                "median_fit_epoch": _median([r["fit_epoch"] for r in rs if r["fit_epoch"] is not None]),
                "fit_to_generalized": lags,
            }
        )
    return cells


def _median(xs: list[float]) -> float | None:
    xs = sorted(xs)
    if not xs:
        return None
    n = len(xs)
    return float(xs[n // 2]) if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def _csv(rows: list[dict]) -> str:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in r.items()})
    return buf.getvalue()


def curves_figure(groups: dict[str, list[dict]], horizons: dict[str, int]):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    names = list(groups)
    fig = make_subplots(
        rows=2,
        cols=len(names),
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=[f"{n}: adversarial accuracy (r = 0 split)" for n in names] + [f"{n}: train accuracy" for n in names],
    )
    shown = set()
    for j, name in enumerate(names, 1):
        for m in groups[name]:
            rows = [r for r in m["run"].metrics if r["epoch"] > 0]
            x = [r["epoch"] for r in rows]
            q = m["ratio"]
            for i, key in ((1, "adv_acc"), (2, "train_acc")):
                fig.add_trace(
                    go.Scatter(
                        x=x,
                        y=[r[key] for r in rows],
                        mode="lines",
                        line={"color": RATIO_COLOUR.get(q, "#555"), "width": 1.5},
                        name=f"r = {q:g}",
                        legendgroup=f"r{q}",
                        showlegend=(i == 1 and q not in shown),
                        hovertemplate=f"r {q:g}, seed {m['seed']}<br>epoch %{{x}}<br>{key} %{{y:.3f}}<extra></extra>",
                    ),
                    row=i,
                    col=j,
                )
                shown.add(q)
            fig.add_vline(x=horizons[name], line_dash="dot", line_color="#999", row="all", col=j)
    fig.update_xaxes(type="log")  # every panel: a shared axis does not pass its type on
    fig.update_xaxes(title_text="epoch (log)", row=2)
    fig.update_yaxes(range=[0, 1.02])
    fig.update_layout(
        template="plotly_white",
        height=760,
        width=560 * len(names) + 100,
        title="2L 2H, seq_len 6, weight decay 0.1:<br>every run of the boundary cells (dotted: the horizon judged)",
    )
    return fig


def _parse(value: str, kind):
    return None if value == "" else kind(value)


def runs_from_csv(text: str) -> list[dict]:
    """``runs.csv`` rows back as ``judge`` returned them, in the types ``cell_rows`` reads."""
    rows = []
    for r in csv.DictReader(io.StringIO(text)):
        r = dict(r)
        if r["generalized"] not in ("True", "False"):
            raise ValueError(f"runs.csv: generalized is {r['generalized']!r}; expected True or False")
        r["generalized"] = r["generalized"] == "True"
        named = re.search(r"-v(\d+)$", r["cell"])  # older tables: the value count is only in the cell name
        r["n_values"] = _parse(r.get("n_values", named.group(1) if named else ""), int)
        r["ratio"], r["horizon"] = float(r["ratio"]), int(r["horizon"])
        r["adv_trend"] = _parse(r["adv_trend"], float)
        r["fit_epoch"] = _parse(r["fit_epoch"], int)
        r["fit_to_generalized"] = _parse(r["fit_to_generalized"], int)
        rows.append(r)
    return rows


def write_cells(runs: list[dict], horizons: dict[str, int], out: Path) -> list[dict]:
    cells = cell_rows(runs)
    (out / "cells.csv").write_text(_csv(cells))
    (out / "cells.json").write_text(json.dumps({"horizons": horizons, "cells": cells}, indent=1))
    return cells


def print_cells(cells: list[dict]) -> None:
    for c in cells:
        fails = ", ".join(f"{c[f'failed_{o}']} {o}" for o in FAILURES if c[f"failed_{o}"])
        values = "" if c["n_values"] is None else f"{c['n_values']:>2} values "
        print(
            f"{values}{c['cell']:<24} @{c['horizon']:>5}  ever {c['generalized']}/{c['runs']} [{c['wilson_low']:.2f}, {c['wilson_high']:.2f}]"
            f"  at horizon {c['generalized_at_horizon']}/{c['runs']} [{c['rule_wilson_low']:.2f}, {c['rule_wilson_high']:.2f}]"
            f"  escaped {c['escaped_memorization']}  moving {c['still_moving']}  lags {c['fit_to_generalized']}  {fails}"
        )


def _die(message: str) -> None:
    print(message, file=sys.stderr)
    sys.exit(2)


def cells_from_runs(out_dir: str) -> None:
    out = Path(out_dir)
    for name in ("runs.csv", "cells.json"):
        if not (out / name).is_file():
            _die(f"boundary_long.py: {out / name} is missing; --cells-from-runs rebuilds the cells of a folder this script wrote")
    runs = runs_from_csv((out / "runs.csv").read_text())
    horizons = json.loads((out / "cells.json").read_text())["horizons"]
    print_cells(write_cells(runs, horizons, out))


def main(root_dir: str, out_dir: str) -> None:
    root, out = Path(root_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    groups, horizons, runs = {}, {}, []
    for sweep in sorted(p for p in root.iterdir() if (p / "sweep.json").exists()):
        ms = members(sweep)
        if not ms:
            continue
        values = ms[0]["run"].config["task"]["n_values"]
        name = f"{values} values"
        groups[name], horizons[name] = ms, horizon(ms)
        runs += judge(ms, horizons[name])
    (out / "runs.csv").write_text(_csv(runs))
    cells = write_cells(runs, horizons, out)
    write_figure(curves_figure(groups, horizons), out / "curves.html")
    print_cells(cells)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--cells-from-runs"] and len(sys.argv) == 3:
        cells_from_runs(sys.argv[2])
    elif len(sys.argv) == 3 and not sys.argv[1].startswith("-"):
        main(*sys.argv[1:3])
    else:
        _die("usage: boundary_long.py RUNS_ROOT OUT_DIR | boundary_long.py --cells-from-runs OUT_DIR")
