"""CLI: --seeds trains one ordinary run per seed; inspect refuses a checkpoint from another config."""

from __future__ import annotations

import json

from test_cli_train import TINY, run_cli

from lenslab.training.presets import build_model
from lenslab.training.run import Run
from lenslab.training.runio import save_checkpoint


def test_train_seeds_writes_one_run_per_seed(tmp_path, capsys):
    out = tmp_path / "seeds"
    rc, stdout, err = run_cli(
        capsys,
        "train",
        *TINY,
        "--epochs",
        "2",
        "--eval-every",
        "2",
        "--batch-size",
        "256",
        "--seeds",
        "3,5",
        "--ensemble-size",
        "1",
        "--out",
        str(out),
        "--json",
    )
    assert rc == 0, err
    result = json.loads(stdout)
    assert sorted(result["runs"]) == sorted(str(out / f"seed_{s}") for s in (3, 5))
    for s in (3, 5):
        run = Run.open(out / f"seed_{s}")
        assert run.config["train"]["seed"] == s
        assert [r["epoch"] for r in run.metrics] == [0, 2]
        assert run.summary["status"] == "complete"


def test_train_seeds_bad_input_is_one_line(tmp_path, capsys):
    for argv, needle in [
        (["--seeds", "0-2", "--seed", "1"], "either --seed or --seeds"),
        (["--seeds", "2-1"], "bad seed range"),
        (["--seeds", "1,1"], "twice"),
        (["--ensemble-size", "4"], "goes with --seeds"),
    ]:
        rc, _, err = run_cli(capsys, "train", *TINY, "--out", str(tmp_path / "x"), *argv)
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, (argv, err)
        assert not (tmp_path / "x").exists()


def test_inspect_refuses_a_checkpoint_from_another_config(tmp_path, capsys):
    out = tmp_path / "run"
    rc, _, err = run_cli(capsys, "train", *TINY, "--epochs", "0", "--out", str(out))
    assert rc == 0, err
    cfg = Run.open(out).config
    other = {**cfg["model"], "n_heads": 2, "d_head": cfg["model"]["d_model"] // 2}
    save_checkpoint(out, 7, build_model(other, seed=0), other)  # a foreign checkpoint planted in the run
    rc, _stdout, err = run_cli(capsys, "inspect", str(out / "checkpoints" / "7.safetensors"))
    last = err.strip().splitlines()[-1]
    assert rc == 2 and last.startswith("lenslab: error:") and "Traceback" not in err, err
    assert "different model config" in last, err
    assert not (out / "report.html").exists()
