"""reproduction/gpu_mlp_report.py on a hand-built paper2.json whose phases and trap onsets are known by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from reproduction import gpu_mlp_report as rep

EPOCHS = [0, 10, 20, 40, 80, 160, 320]
TRAIN = [0.1, 0.9, 1.0, 1.0, 1.0, 1.0, 1.0]
TEST = [0.1, 0.6, 0.82, 0.90, 0.78, 0.77, 0.76]


def _traps(epoch: int, layer1: int, alpha0: float) -> list[dict]:
    return [
        {"epoch": epoch, "matrix": "layers.0.W", "n_traps": 0, "alpha": alpha0},
        {"epoch": epoch, "matrix": "layers.1.W", "n_traps": layer1, "alpha": 3.0},
        {"epoch": epoch, "matrix": "layers.2.W", "n_traps": 0, "alpha": float("nan")},
    ]


def _paper2(tmp_path: Path, mlp: dict) -> Path:
    path = tmp_path / "paper2.json"
    path.write_text(json.dumps({"steps": 60, "members": [], "mlp": mlp}))  # part d's keys beside it
    return path


def test_a_member_is_read_by_item_8s_rules(tmp_path):
    metrics = [{"epoch": e, "step": 5 * e, "train_acc": a, "test_acc": t} for e, a, t in zip(EPOCHS, TRAIN, TEST)]
    traps = _traps(0, 0, 3.0) + _traps(40, 1, 3.0) + _traps(320, 2, 1.8)
    run = {"weight_decay": 0.0, "seed": 3, "metrics": metrics, "traps": traps}
    path = _paper2(tmp_path, {"steps_per_epoch": 5, "steps": 1600, "runs": [run]})
    (row,) = rep.report(path, tmp_path / "out")
    # by hand: train >= 0.99 first at epoch 20; test >= 0.80 first at epoch 20; peak 0.90 at epoch 40;
    # <= 0.90 - 0.10 at epochs 80, 160, 320 (three in a row, train 1.0): anti-grok at 80, and the fall
    # (<= 0.90 - 0.03 to the end) from 80; first trap at epoch 40, first alpha < 2 at 320
    assert (row["fit_step"], row["grok_step"], row["peak_step"]) == (100, 100, 200)
    assert (row["anti_grok_step"], row["fall_onset_step"], row["outcome"]) == (400, 400, "anti-grokked")
    assert (row["first_trap_step"], row["first_alpha_below_2_step"]) == (200, 1600)
    assert row["traps_final"] == {"layers.0.W": 0, "layers.1.W": 2, "layers.2.W": 0} and row["trap_checkpoints"] == 3
    assert row["trap_vs_fall"] == "before"
    saved = json.loads((tmp_path / "out" / "members.json").read_text())
    assert saved["members"] == [row] and "members.csv" in {p.name for p in (tmp_path / "out").iterdir()}


def test_a_paper2_json_without_part_f_is_one_line(tmp_path, capsys):
    path = tmp_path / "paper2.json"
    path.write_text(json.dumps({"steps": 60, "members": []}))
    assert rep.main([str(path), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no 'mlp' key: part f did not run" in err
    skipped = _paper2(tmp_path, {"skipped": "budget: 40 s left holds only 3 epochs"})
    assert rep.main([str(skipped), str(tmp_path / "out")]) == 2
    assert "part f trained nothing (budget: 40 s left" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing written on bad input
