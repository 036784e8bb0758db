"""The single-seed trainer and the run directory it writes."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_config, tiny_modadd
from safetensors.torch import load_file
from transformer_lens import HookedTransformer, HookedTransformerConfig

from lenslab.training.errors import RunError
from lenslab.training.presets import build_model
from lenslab.training.runio import RunLock, list_checkpoints, read_jsonl
from lenslab.training.trainer import Interrupted, is_checkpoint_epoch, train


def weights(run_dir, epoch):
    return load_file(str(run_dir / "checkpoints" / f"{epoch}.safetensors"))


def test_run_directory_contract(tmp_path):
    cfg = tiny_config()
    summary = train(cfg, tmp_path / "run", progress=False)
    run = tmp_path / "run"
    stored = json.loads((run / "config.json").read_text())
    assert stored["task"]["name"] == "mpsp" and stored["task"]["ratio"] == 0.9
    HookedTransformer(HookedTransformerConfig(**stored["model"]))  # config.json alone rebuilds the model
    splits = load_file(str(run / "splits.safetensors"))
    for split in ("train", "validation", "adv"):
        assert splits[f"{split}_tokens"].dtype == torch.int64 and splits[f"{split}_tokens"].shape[1] == 5
        assert splits[f"{split}_labels"].shape[0] == splits[f"{split}_tokens"].shape[0]
        assert f"{split}_shortcut" in splits
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["epoch"] for r in rows] == [0, 2, 4]
    assert [e for e, _ in list_checkpoints(run)] == [0, 2, 4]
    assert summary["status"] == "complete" and summary["final"]["epoch"] == 4
    assert json.loads((run / "summary.json").read_text()) == json.loads(json.dumps(summary))


def test_summary_records_where_the_run_trained(tmp_path):
    """summary.json names the versions, CPU, thread count and device of the process that trained."""
    import platform
    from importlib.metadata import version

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        summary = train(tiny_config(), tmp_path, progress=False, device="cpu")
    finally:
        torch.set_num_threads(before)
    env = json.loads((tmp_path / "summary.json").read_text())["environment"]
    assert env == summary["environment"]
    assert env["torch"] == torch.__version__ and env["transformer_lens"] == version("transformer_lens")
    assert env["python"] == platform.python_version() and env["device"] == "cpu" and env["torch_threads"] == 1
    assert isinstance(env["cpu"], str) and env["cpu"]


def test_resume_elsewhere_keeps_the_earlier_environment_and_says_so(tmp_path, capsys):
    """A run resumed in another environment keeps the old one under ``earlier`` and prints one note."""
    cfg = tiny_config(epochs=4)
    train(cfg, tmp_path, progress=False, device="cpu")
    summary = json.loads((tmp_path / "summary.json").read_text())
    here = summary["environment"]
    summary["environment"] = {**here, "cpu": "Some Other CPU", "torch_threads": 7}  # as if trained elsewhere
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    capsys.readouterr()
    cfg6 = tiny_config(epochs=6)
    train(cfg6, tmp_path, resume=True, progress=False, device="cpu")
    err = capsys.readouterr().err
    assert "trained its first 4 epochs elsewhere" in err and "cpu 'Some Other CPU' -> " in err and "torch_threads 7 -> " in err
    env = json.loads((tmp_path / "summary.json").read_text())["environment"]
    assert env["cpu"] == here["cpu"] and env["torch_threads"] == here["torch_threads"]
    assert env["earlier"] == [{**here, "cpu": "Some Other CPU", "torch_threads": 7, "until_epoch": 4}]
    # resuming again where it last ran: the history stays, and nothing is printed
    train(tiny_config(epochs=8), tmp_path, resume=True, progress=False, device="cpu")
    assert "elsewhere" not in capsys.readouterr().err
    assert json.loads((tmp_path / "summary.json").read_text())["environment"]["earlier"] == env["earlier"]


def test_resume_in_the_same_environment_adds_nothing(tmp_path, capsys):
    train(tiny_config(epochs=2), tmp_path, progress=False, device="cpu")
    first = json.loads((tmp_path / "summary.json").read_text())["environment"]
    capsys.readouterr()
    train(tiny_config(epochs=4), tmp_path, resume=True, progress=False, device="cpu")
    assert "elsewhere" not in capsys.readouterr().err
    assert json.loads((tmp_path / "summary.json").read_text())["environment"] == first


def test_checkpoint_reproduces_recorded_metrics(tmp_path):
    cfg = tiny_config()
    train(cfg, tmp_path, progress=False)
    rows = {r["epoch"]: r for r in read_jsonl(tmp_path / "metrics.jsonl")}
    splits = load_file(str(tmp_path / "splits.safetensors"))
    for epoch, path in list_checkpoints(tmp_path):
        model = HookedTransformer(HookedTransformerConfig(**cfg["model"]))
        model.load_state_dict(load_file(str(path)))
        model.eval()
        for split in ("train", "validation", "adv"):
            with torch.no_grad():
                pred = model(splits[f"{split}_tokens"])[:, -1].argmax(-1)
            acc = (pred == splits[f"{split}_labels"]).float().mean().item()
            assert acc == rows[epoch][f"{split}_acc"], (epoch, split)


def test_interrupted_and_resumed_equals_uninterrupted(tmp_path):
    cfg = tiny_config(epochs=6, eval_every=2)
    train(cfg, tmp_path / "straight", progress=False)

    def ctrl_c(row):
        if row["epoch"] == 2:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, delivered to our handler

    with pytest.raises(Interrupted):
        train(cfg, tmp_path / "cut", progress=False, on_eval=ctrl_c)
    assert json.loads((tmp_path / "cut" / "summary.json").read_text())["status"] == "interrupted"
    train(cfg, tmp_path / "cut", resume=True, progress=False)
    a, b = weights(tmp_path / "straight", 6), weights(tmp_path / "cut", 6)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert read_jsonl(tmp_path / "straight" / "metrics.jsonl") == read_jsonl(tmp_path / "cut" / "metrics.jsonl")


def test_epochs_is_the_total_on_resume(tmp_path):
    train(tiny_config(epochs=2, eval_every=1), tmp_path / "short", progress=False)
    train(tiny_config(epochs=4, eval_every=1), tmp_path / "short", resume=True, progress=False)
    train(tiny_config(epochs=4, eval_every=1), tmp_path / "long", progress=False)
    a, b = weights(tmp_path / "short", 4), weights(tmp_path / "long", 4)
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(RunError, match="must be >= 4"):
        train(tiny_config(epochs=3, eval_every=1), tmp_path / "short", resume=True, progress=False)


_RNG_PROBE = """
import random, sys
import numpy as np, torch
sys.path.insert(0, sys.argv[2])
from helpers import tiny_config
from lenslab.training.trainer import train

def draw():
    return (random.random(), np.random.rand(), torch.rand(1).item())

def reseed():
    random.seed(123); np.random.seed(123); torch.manual_seed(123)

reseed(); expect = draw(); reseed()
train(tiny_config(epochs=2), sys.argv[1], progress=False)
print(draw() == expect)
"""


def test_same_seed_same_run_and_global_rng_untouched(tmp_path):
    # In a fresh process without the test-time type checker: beartype (tests/conftest.py) samples
    # container items with Python's global `random`, which would hide what lenslab itself does.
    import subprocess
    import sys
    from pathlib import Path

    out = subprocess.run(
        [sys.executable, "-c", _RNG_PROBE, str(tmp_path / "a"), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.stdout.strip().splitlines()[-1] == "True", out.stdout + out.stderr
    train(tiny_config(epochs=2), tmp_path / "b", progress=False)
    train(tiny_config(epochs=2, seed=1), tmp_path / "c", progress=False)
    a, b, c = (weights(tmp_path / d, 2) for d in "abc")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["embed.W_E"], c["embed.W_E"])


def test_end_to_end_learns_the_shortcut(tmp_path):
    train(tiny_config(epochs=20, eval_every=5, batch_size=512), tmp_path, progress=False)
    final = read_jsonl(tmp_path / "metrics.jsonl")[-1]
    assert final["validation_acc"] == 1.0  # shortcut learned
    assert final["adv_acc"] < 0.5  # ... and the true rule not (yet)
    assert final["grad_amplification"] > 2.0  # anti-shortcut examples carry more gradient


def test_modadd_runs_and_records_test_accuracy(tmp_path):
    summary = train(tiny_modadd(), tmp_path, progress=False)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert {"train_acc", "test_acc", "train_loss", "test_loss"} <= set(rows[-1])
    assert "grad_conflict" not in rows[-1]
    assert summary["best_test_epoch"] in [r["epoch"] for r in rows]


def test_existing_run_is_not_overwritten(tmp_path):
    train(tiny_config(epochs=2), tmp_path, progress=False)
    before = (tmp_path / "checkpoints" / "2.safetensors").read_bytes()
    with pytest.raises(RunError, match="already holds a run"):
        train(tiny_config(epochs=2), tmp_path, progress=False)
    with pytest.raises(RunError, match="different run"):
        train(tiny_config(epochs=2, lr=1e-2), tmp_path, resume=True, progress=False)
    assert (tmp_path / "checkpoints" / "2.safetensors").read_bytes() == before


def test_foreign_directory_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RunError, match="not a lenslab run"):
        train(tiny_config(epochs=1), tmp_path, progress=False)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_corrupted_resume_state_is_a_clear_error(tmp_path):
    train(tiny_config(epochs=2), tmp_path, progress=False)
    state = tmp_path / "checkpoints" / "resume.safetensors"
    state.write_bytes(state.read_bytes()[:100])
    with pytest.raises(RunError, match="not a readable safetensors"):
        train(tiny_config(epochs=4), tmp_path, resume=True, progress=False)
    assert state.stat().st_size == 100  # nothing rewritten


def test_lock_refuses_a_second_writer_and_recovers_a_stale_one(tmp_path):
    with RunLock(tmp_path), pytest.raises(RunError, match="another lenslab process"):
        train(tiny_config(epochs=1), tmp_path, progress=False)
    import socket

    (tmp_path / ".lock").write_text(f"{socket.gethostname()} 999999999\n")  # a pid that cannot exist
    train(tiny_config(epochs=1), tmp_path, progress=False)
    assert not (tmp_path / ".lock").exists()


def test_diverging_loss_stops_with_epoch_named(tmp_path, monkeypatch):
    from lenslab.training import objective
    from lenslab.training.errors import TrainingDiverged

    real = objective.readout_logits
    calls = {"n": 0}

    def poisoned(model, tokens):  # the 13th training step (epoch 3 at 6 steps/epoch) produces NaN
        out = real(model, tokens)
        if torch.is_grad_enabled():
            calls["n"] += 1
            if calls["n"] >= 13:
                out = out * float("nan")
        return out

    monkeypatch.setattr(objective, "readout_logits", poisoned)
    with pytest.raises(TrainingDiverged, match="diverged at epoch 3"):
        train(tiny_config(epochs=6, eval_every=1), tmp_path, progress=False)
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "diverged"
    for _, path in list_checkpoints(tmp_path):
        assert all(torch.isfinite(v).all() for k, v in load_file(str(path)).items() if k.endswith(("W_E", "W_U")))


def test_checkpoint_schedule_is_dense_early_sparse_late():
    epochs = [e for e in range(0, 20001, 5) if is_checkpoint_epoch(e, 5, 16)]
    assert epochs[:17] == list(range(0, 81, 5))
    gaps = np.diff(epochs)
    assert (np.diff(gaps) >= 0).all() and gaps[-1] > 50 * gaps[0]
    assert len(epochs) < 200


def test_build_model_seed_is_reproducible_without_global_reseed():
    cfg = tiny_config()["model"]
    torch.manual_seed(7)
    x = torch.rand(1)
    torch.manual_seed(7)
    a, b = build_model(cfg, seed=3), build_model(cfg, seed=3)
    assert torch.rand(1).item() == x.item()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_readout_uses_last_position(tmp_path):
    cfg = tiny_config()
    model = build_model(cfg["model"], seed=0)
    tokens = torch.tensor([[1, 2, 3, 4, 8]])
    full = model(tokens)
    from lenslab.training.gradients import readout_logits

    assert torch.equal(readout_logits(model, tokens), full[:, -1])
    assert F.softmax(full[:, -1], -1).shape == (1, 2)


def test_labels_outside_the_models_classes_are_a_clear_error(tmp_path):
    """A splits file whose labels do not fit d_vocab_out is refused on open and on resume, before any step."""
    from lenslab.training.run import Run
    from lenslab.training.runio import save_splits

    cfg = tiny_config()
    out = tmp_path / "run"
    train({**cfg, "train": {**cfg["train"], "epochs": 1}}, out, progress=False)
    splits = load_file(str(out / "splits.safetensors"))
    splits["train_labels"][0] = cfg["model"]["d_vocab_out"]  # one label past the last class
    save_splits(out, splits)
    before = (out / "metrics.jsonl").read_bytes()
    with pytest.raises(RunError, match=rf"train_labels holds values outside \[0, {cfg['model']['d_vocab_out']}\)"):
        _ = Run.open(out).splits
    with pytest.raises(RunError, match="train_labels holds values outside"):
        train(cfg, out, resume=True, progress=False)
    assert (out / "metrics.jsonl").read_bytes() == before
