"""NaN/inf stops training with the epoch named and the last good state kept; traps report NaN matrices per matrix."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "training"))
from helpers import tiny_modadd

from lenslab.cli import main
from lenslab.training import trainer
from lenslab.training.errors import TrainingDiverged
from lenslab.training.run import Run
from lenslab.training.runio import atomic_save_safetensors, read_safetensors


def poison_after_step(monkeypatch, step: int, value: float) -> None:
    """AdamW whose ``step``-th update (1-based) writes ``value`` into one weight: the loss before it was finite."""
    real = trainer._optimizer

    def make(model, t):
        opt = real(model, t)
        count = {"n": 0}
        step_fn = opt.step

        def poisoned_step(*a, **k):
            out = step_fn(*a, **k)
            count["n"] += 1
            if count["n"] == step:
                with torch.no_grad():
                    model.blocks[0].attn.W_Q.view(-1)[0] = value
            return out

        opt.step = poisoned_step
        return opt

    monkeypatch.setattr(trainer, "_optimizer", make)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_weights_poisoned_after_a_finite_loss_stop_training(tmp_path, monkeypatch, value):
    poison_after_step(monkeypatch, 3, value)  # full batch: step 3 ends epoch 3
    with pytest.raises(TrainingDiverged, match=r"diverged at epoch 3 .*last good state is epoch 2"):
        trainer.train(tiny_modadd(epochs=6, eval_every=1), tmp_path, progress=False)
    run = Run.open(tmp_path)
    assert run.epochs() == [0, 1, 2] and [r["epoch"] for r in run.metrics] == [0, 1, 2]
    for _, model in run.iter_models():  # every checkpoint kept is finite (loading checks it)
        assert all(torch.isfinite(p).all() for p in model.parameters())
    state, meta = read_safetensors(tmp_path / "checkpoints" / "resume.safetensors")
    params = [f"model.{n}" for n, _ in run.new_model().named_parameters()]
    kept = params + [k for k in state if k.startswith("optim.")]  # buffers hold -inf masks by design
    assert meta["epoch"] == "2" and all(torch.isfinite(state[k]).all() for k in kept)
    assert run.summary["status"] == "diverged" and run.summary["epochs_completed"] == 2


def test_divergence_at_the_cli_is_one_line(tmp_path, monkeypatch, capsys):
    poison_after_step(monkeypatch, 2, math.nan)
    rc = main(
        [
            "train",
            "--task",
            "modadd",
            "--p",
            "11",
            "--train-frac",
            "0.5",
            "--epochs",
            "4",
            "--eval-every",
            "1",
            "--no-progress",
            "--out",
            str(tmp_path / "r"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith("lenslab: error: training diverged at epoch 2 ")
    assert not any("Traceback" in line for line in err)


def test_traps_reports_nan_matrices_per_matrix(tmp_path, capsys):
    trainer.train(tiny_modadd(epochs=1, eval_every=1), tmp_path, progress=False)
    state, meta = read_safetensors(tmp_path / "checkpoints" / "1.safetensors")
    state["blocks.0.attn.W_Q"][0, 0, 0] = math.nan
    state["blocks.0.mlp.W_in"][0, 0] = math.inf
    atomic_save_safetensors(tmp_path / "checkpoints" / "1.safetensors", state, meta)
    for target in (tmp_path, tmp_path / "checkpoints" / "1.safetensors"):
        rc = main(["traps", str(target), "--json", "--no-progress", "--workers", "1"])
        out = capsys.readouterr().out
        assert rc == 0
        doc = json.loads(out)
        rows = {r["name"]: r for r in doc["checkpoints"][-1]["matrices"]}
        assert "NaN" in rows["blocks.0.attn.W_Q"]["error"] or "nan" in rows["blocks.0.attn.W_Q"]["error"].lower()
        assert rows["blocks.0.mlp.W_in"]["error"]
        assert rows["blocks.0.attn.W_K"]["error"] is None and rows["blocks.0.attn.W_K"]["n_traps"] >= 0
    rc = main(["traps", str(tmp_path), "--no-progress", "--workers", "1"])  # the table, too
    assert rc == 0 and "error:" in capsys.readouterr().out
