import json

import pytest

from lenslab.interp.evolution import circuit_evolution, detect_phase2, select_checkpoints
from lenslab.training.errors import RunError
from lenslab.training.run import Run
from lenslab.training.runio import read_jsonl


def test_one_row_per_checkpoint(fake_run):
    run = Run.open(fake_run)
    evo = circuit_evolution(run, max_pairs=32, max_examples=128)
    epochs = run.epochs()
    assert len(epochs) >= 3
    assert [r["epoch"] for r in evo["rows"]] == epochs
    assert len(evo["head_rows"]) == len(epochs) * 4  # 2 layers x 2 heads
    metrics = {m["epoch"]: m for m in read_jsonl(fake_run / "metrics.jsonl")}
    for r in evo["rows"]:
        assert r["validation_acc"] == metrics[r["epoch"]]["validation_acc"]
        assert r["grad_conflict"] == metrics[r["epoch"]]["grad_conflict"]
        assert -1 <= r["L1H0.qk_rho_w"] <= 1 and r["L0H1.patch_z"] is not None
    json.dumps(evo["rows"].to_records())  # JSON-serialisable


def test_checkpoint_cap(fake_run):
    evo = circuit_evolution(Run.open(fake_run), max_checkpoints=2, max_pairs=16, max_examples=64)
    assert evo["epochs_used"] == [Run.open(fake_run).epochs()[0], Run.open(fake_run).epochs()[-1]]
    assert "2 of" in evo["note"]


def test_select_checkpoints():
    assert select_checkpoints(list(range(0, 1000, 10)), 40)[0] == 0
    assert select_checkpoints(list(range(0, 1000, 10)), 40)[-1] == 990
    assert len(select_checkpoints(list(range(0, 1000, 10)), 40)) == 40
    assert select_checkpoints([1, 2, 3], 40) == [1, 2, 3]


def test_detect_phase2_on_a_known_curve():
    val = [0.5, 0.995, 1.0, 1.0, 1.0, 1.0, 0.98, 1.0, 1.0]
    adv = [0.5, 0.02, 0.01, 0.03, 0.08, 0.20, 0.60, 0.70, 1.0]
    metrics = [{"epoch": 10 * i, "validation_acc": v, "adv_acc": a} for i, (v, a) in enumerate(zip(val, adv))]
    ph = detect_phase2(metrics, margin=0.1)
    assert ph["phase1_epoch"] == 10
    assert ph["plateau_adv_acc"] == pytest.approx(0.02)
    assert ph["phase2_epoch"] == 50  # epoch 60 has adv 0.6 but validation 0.98 < 0.99; 50 is first
    assert ph["generalized_epoch"] == 80
    assert detect_phase2([{"epoch": 0, "validation_acc": 0.5, "adv_acc": 0.5}])["phase1_epoch"] is None


def test_not_a_run(tmp_path):
    with pytest.raises(RunError):
        Run.open(tmp_path)
