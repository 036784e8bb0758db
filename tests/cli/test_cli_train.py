"""The CLI: one-line errors with non-zero exit, --json purity, nothing on disk damaged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lenslab.cli import main

TINY = [
    "--seq-len",
    "4",
    "--n-values",
    "8",
    "--n-train",
    "1536",
    "--n-val",
    "256",
    "--n-adv",
    "256",
    "--layers",
    "1",
    "--heads",
    "1",
    "--no-progress",
]


def run_cli(capsys, *argv):
    try:
        rc = main(list(argv))
    except SystemExit as e:  # argparse usage errors
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--ratio", "1.5"], "ratio=1.5"),
        (["--layers", "0"], "layers=0"),
        (["--task", "nope"], "invalid choice: 'nope'"),
        (["--seq-len", "3", "--n-values", "4"], "allow only"),
        (["--heads", "3"], "not divisible"),
        (["--lr", "-1"], "lr=-1"),
        (["--epochs", "-2"], "epochs=-2"),
        (["--label", "sum7"], "unknown label"),
        (["--p", "7"], "modadd flag"),
        (["--dtype", "float16"], "invalid choice: 'float16'"),
        (["--dtype", "float16"], "float64"),  # the line names the choices
        (["--eval-schedule", "log", "--n-evals", "0"], "n_evals=0"),
    ],
)
def test_bad_train_input_is_one_line(capsys, tmp_path, argv, needle):
    out_dir = tmp_path / "run"
    rc, out, err = run_cli(capsys, "train", *argv, "--out", str(out_dir), "--no-progress")
    assert rc == 2
    lines = [line for line in err.strip().splitlines() if line and not line.startswith("training into")]
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err and out == ""
    assert not out_dir.exists() or not any(out_dir.iterdir())


def test_train_json_resume_and_refusals(capsys, tmp_path):
    run = tmp_path / "run"
    rc, out, err = run_cli(capsys, "train", *TINY, "--epochs", "2", "--eval-every", "1", "--out", str(run), "--json")
    assert rc == 0
    summary = json.loads(out)  # exactly one JSON document on stdout
    assert summary["epochs_completed"] == 2
    before = (run / "metrics.jsonl").read_bytes()

    rc, out, err = run_cli(capsys, "train", *TINY, "--epochs", "2", "--out", str(run))
    assert rc == 2 and "already holds a run" in err and "Traceback" not in err
    rc, out, err = run_cli(capsys, "train", "--out", str(run), "--resume", "--ratio", "0.5")
    assert rc == 2 and "--ratio 0.5 differs" in err
    assert (run / "metrics.jsonl").read_bytes() == before

    rc, out, err = run_cli(capsys, "train", "--out", str(run), "--resume", "--epochs", "3", "--json", "--no-progress")
    assert rc == 0 and json.loads(out)["epochs_completed"] == 3


def test_corrupted_checkpoint_on_resume(capsys, tmp_path):
    run = tmp_path / "run"
    assert run_cli(capsys, "train", *TINY, "--epochs", "1", "--out", str(run))[0] == 0
    (run / "checkpoints" / "resume.safetensors").write_bytes(b"\x00" * 40)
    rc, _out, err = run_cli(capsys, "train", "--out", str(run), "--resume", "--epochs", "2", "--no-progress")
    assert rc == 2 and "not a readable safetensors file" in err
    assert len([line for line in err.strip().splitlines() if not line.startswith("training into")]) == 1


def test_a_model_config_whose_n_ctx_does_not_fit_the_sequence(capsys, tmp_path):
    run = tmp_path / "run"
    assert run_cli(capsys, "train", *TINY, "--epochs", "1", "--out", str(run))[0] == 0
    cfg = json.loads((run / "config.json").read_text())
    cfg["model"]["n_ctx"] = 3  # seq_len 4 + readout needs 5
    (run / "config.json").write_text(json.dumps(cfg))
    rc, _out, err = run_cli(capsys, "train", "--out", str(run), "--resume", "--epochs", "2", "--no-progress")
    assert rc == 2 and "needs n_ctx >= 5" in err


def test_real_process_has_no_traceback(tmp_path):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    p = subprocess.run(  # noqa: PLW1510 -- the exit code is the assertion
        [sys.executable, "-m", "lenslab.cli", "train", "--ratio", "-0.2", "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).parents[2],
    )
    assert p.returncode == 2
    assert (
        p.stderr.strip()
        == "lenslab: error: ratio=-0.2 is outside [0, 1]: it is the fraction of shortcut-consistent train examples"
    )
    assert p.stdout == ""


def test_traps_and_inspect_commands(capsys, tmp_path):
    run = tmp_path / "run"
    assert run_cli(capsys, "train", *TINY, "--epochs", "2", "--eval-every", "1", "--out", str(run))[0] == 0
    rc, out, err = run_cli(capsys, "traps", str(run / "checkpoints" / "2.safetensors"), "--json", "--no-progress")
    assert rc == 0
    doc = json.loads(out)
    names = [m["name"] for m in doc["checkpoints"][0]["matrices"]]
    assert "blocks.0.attn.W_Q" in names and all("n_traps" in m for m in doc["checkpoints"][0]["matrices"])
    rc, out, err = run_cli(capsys, "traps", str(tmp_path / "missing"))
    assert rc == 2 and len(err.strip().splitlines()) == 1
    rc, out, err = run_cli(capsys, "inspect", str(tmp_path))
    assert rc == 2 and "not a lenslab run directory" in err and "Traceback" not in err


def test_train_float64_log_schedule_and_resume_refusals(capsys, tmp_path):
    from lenslab.training.config import log_schedule
    from lenslab.training.run import Run

    run = tmp_path / "run"
    rc, _, err = run_cli(
        capsys,
        "train",
        *TINY,
        "--epochs",
        "12",
        "--dtype",
        "float64",
        "--eval-schedule",
        "log",
        "--n-evals",
        "4",
        "--out",
        str(run),
        "--json",
    )
    assert rc == 0, err
    r = Run.open(run)
    assert r.config["train"]["dtype"] == "float64" and r.config["train"]["eval_schedule"] == "log"
    assert r.epochs() == log_schedule(12, 4) and [m["epoch"] for m in r.metrics] == log_schedule(12, 4)
    assert {"train_max_abs_logit", "train_zero_loss_frac", "weight_norm", "weight_norms", "grad_norm"} <= set(r.metrics[-1])
    rc, _, err = run_cli(capsys, "train", "--out", str(run), "--resume", "--dtype", "float32", "--epochs", "20")
    assert rc == 2 and "--dtype float32 differs from the run's train.dtype='float64'" in err
    assert len(err.strip().splitlines()) == 1


def test_train_modadd_seeds_with_weight_decay(capsys, tmp_path):
    root = tmp_path / "seeds"
    rc, out, err = run_cli(
        capsys,
        "train",
        "--task",
        "modadd",
        "--p",
        "11",
        "--train-frac",
        "0.5",
        "--seeds",
        "0-1",
        "--weight-decay",
        "0",
        "--epochs",
        "2",
        "--eval-every",
        "1",
        "--dtype",
        "float64",
        "--out",
        str(root),
        "--json",
        "--no-progress",
    )
    assert rc == 0, err
    doc = json.loads(out)
    assert sorted(doc["runs"]) == [str(root / "seed_0"), str(root / "seed_1")]
    for s in (0, 1):
        cfg = json.loads((root / f"seed_{s}" / "config.json").read_text())
        assert cfg["train"]["seed"] == s and cfg["train"]["weight_decay"] == 0 and cfg["train"]["dtype"] == "float64"
