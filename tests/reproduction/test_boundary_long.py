"""reproduction/boundary_long.py's cell tables, on hand-built runs whose counts are worked out by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from reproduction import boundary_long as bl


def _script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "reproduction/boundary_long.py"), *args], check=False, capture_output=True, text=True
    )


def _run(cell, seed, outcome, *, ever, at200, fit=50, lag=None, trend=0.0, values=16):
    return {
        "n_values": values,
        "cell": cell,
        "ratio": 0.9 if "r0.9" in cell else 0.5,
        "seed": seed,
        "horizon": 400,
        "generalized": ever,
        "fit_epoch": fit,
        "fit_to_generalized": lag,
        "adv_trend": trend,
        "outcome": outcome,
        "outcome_at_200": at200,
    }


A, B = "L2H2-r0.5-wd0.1-len6", "L2H2-r0.9-wd0.1-len6"
RUNS = [
    _run(A, 0, "generalized", ever=True, at200="generalized", lag=0),  # learned the rule as it fit: no escape
    _run(A, 1, "memorized", ever=False, at200="memorized", fit=None),
    _run(B, 0, "generalized", ever=True, at200="memorized", lag=300),  # escaped and held
    _run(B, 1, "transient", ever=True, at200="memorized", lag=250, trend=0.4),  # escaped, lost, climbing back
    _run(B, 2, "shortcut", ever=False, at200="memorized", trend=-0.5),
]


def test_cells_count_ever_and_end_state_generalization_apart():
    cells = {c["cell"]: c for c in bl.cell_rows(RUNS)}
    a, b = cells[A], cells[B]
    assert (a["runs"], a["generalized"], a["generalized_at_horizon"]) == (2, 1, 1)
    assert (b["runs"], b["generalized"], b["generalized_at_horizon"]) == (3, 2, 1)
    assert (a["escaped_memorization"], b["escaped_memorization"]) == (0, 2)
    assert (a["still_moving"], b["still_moving"]) == (0, 1)
    assert b["fit_to_generalized"] == [300, 250] and a["median_fit_epoch"] == 50.0
    assert b["failed_shortcut"] == 1 and a["failed_memorized"] == 1
    # Wilson 95 % for 1/3 by hand: centre (1/3 + z^2/6) / (1 + z^2/3), half-width z sqrt(2/27 + z^2/36) / (1 + z^2/3)
    z = 1.959963984540054
    d = 1 + z * z / 3
    centre, half = (1 / 3 + z * z / 6) / d, z * (2 / 27 + z * z / 36) ** 0.5 / d
    assert b["rule_wilson_low"] == pytest.approx(centre - half) and b["rule_wilson_high"] == pytest.approx(centre + half)


def test_cells_rebuild_from_a_written_runs_csv(tmp_path):
    (tmp_path / "runs.csv").write_text(bl._csv(RUNS))
    (tmp_path / "cells.json").write_text(json.dumps({"horizons": {"16 values": 400}, "cells": []}))
    back = bl.runs_from_csv((tmp_path / "runs.csv").read_text())
    assert bl.cell_rows(back) == bl.cell_rows(RUNS)
    done = _script("--cells-from-runs", str(tmp_path))
    assert done.returncode == 0, done.stderr
    cells = json.loads((tmp_path / "cells.json").read_text())
    assert cells["horizons"] == {"16 values": 400}
    assert [c["generalized_at_horizon"] for c in cells["cells"]] == [1, 1]


def test_an_older_runs_csv_takes_the_value_count_from_the_cell_name():
    rows = [{k: v for k, v in r.items() if k != "n_values"} | {"cell": r["cell"] + "-v12"} for r in RUNS]
    assert {r["n_values"] for r in bl.runs_from_csv(bl._csv(rows))} == {12}


@pytest.mark.parametrize("argv", [["--cells-from-runs"], ["--bogus", "x"]])
def test_bad_arguments_give_one_line_and_exit_2(argv):
    done = _script(*argv)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "usage" in done.stderr


def test_a_folder_without_runs_csv_is_refused_and_left_alone(tmp_path):
    done = _script("--cells-from-runs", str(tmp_path))
    assert done.returncode == 2 and "runs.csv is missing" in done.stderr and "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_every_panel_of_the_curves_figure_has_a_log_epoch_axis():
    metrics = [{"epoch": e, "adv_acc": 0.5, "train_acc": 0.9} for e in (0, 10, 100, 1000)]
    groups = {
        f"{v} values": [{"run": SimpleNamespace(metrics=metrics), "ratio": q, "seed": 0} for q in (0.5, 0.9)] for v in (12, 16)
    }
    fig = bl.curves_figure(groups, {name: 1000 for name in groups})
    axes = [k for k in fig.layout.to_plotly_json() if k.startswith("xaxis")]
    assert len(axes) == 4 and all(fig.layout[k].type == "log" for k in axes)
    assert all(tr.x == (10, 100, 1000) for tr in fig.data)  # epoch 0 has no place on a log axis
