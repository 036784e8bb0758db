"""``training.writer.RunWriter``, driven directly (no trainer): the run directory it writes."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_config, tiny_modadd
from safetensors.torch import load_file

from lenslab.training.errors import RunError
from lenslab.training.gradients import readout_logits
from lenslab.training.presets import build_model
from lenslab.training.runio import RESUME_FORMAT, RunLock, list_checkpoints, read_jsonl, read_safetensors
from lenslab.training.trainer import make_splits
from lenslab.training.writer import RunWriter, resume_state, sigint_flag

CPU = torch.device("cpu")


def parts(config, seed=None):
    t = config["train"]
    model = build_model(config["model"], seed=t["seed"] if seed is None else seed, device="cpu", dtype=t["dtype"])
    opt = torch.optim.AdamW(model.parameters(), lr=t["lr"], betas=tuple(t["betas"]), weight_decay=t["weight_decay"])
    return model, opt


def state_of(model, opt):
    return resume_state(model.state_dict(), opt.state_dict()["state"])


def steps(model, opt, splits, n):
    for _ in range(n):
        loss = F.cross_entropy(readout_logits(model, splits["train_tokens"]), splits["train_labels"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def new_run(out, config, env=None):
    """A fresh run opened under its lock (the caller exits the writer)."""
    w = RunWriter(out, config)
    splits = make_splits(config)
    w.__enter__()
    model, opt = parts(config)
    w.open(model, opt, splits, CPU, env)
    return w, model, opt, splits


def row(epoch, **numbers):
    """A metrics row; a modadd summary needs ``test_acc``, so that is the default number."""
    return {"epoch": epoch, **(numbers or {"test_acc": 0.0})}


# -- opening -------------------------------------------------------------------------------
def test_open_writes_the_run_and_refuses_another_config(tmp_path):
    cfg = tiny_modadd(epochs=4, eval_every=2)
    w, model, opt, _ = new_run(tmp_path, cfg)
    w.log_eval(row(0, test_acc=0.1))
    w.checkpoint(0, model, state_of(model, opt))
    w.__exit__(None, None, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoints",
        "config.json",
        "metrics.jsonl",
        "splits.safetensors",
        "summary.json",
    ]
    assert json.loads((tmp_path / "config.json").read_text()) == json.loads(json.dumps(cfg))

    with pytest.raises(RunError, match="already holds a run: pass --resume"):
        RunWriter(tmp_path, cfg)
    other = tiny_modadd(epochs=4, eval_every=2, lr=cfg["train"]["lr"] * 2)
    with pytest.raises(RunError, match=r"holds a different run \(differs in train\.lr\)"):
        RunWriter(tmp_path, other, resume=True)
    longer = RunWriter(tmp_path, tiny_modadd(epochs=9, eval_every=2), resume=True)  # the epoch target may grow
    assert longer.resuming
    assert not RunWriter(tmp_path / "new", cfg, resume=True).resuming  # --resume on a new directory starts it


def test_foreign_or_file_out_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RunError, match="not a lenslab run"):
        RunWriter(tmp_path, tiny_modadd())
    with pytest.raises(RunError, match="is a file, not a directory"):
        RunWriter(tmp_path / "notes.txt", tiny_modadd())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_the_writer_holds_the_lock_and_clears_stale_temps(tmp_path):
    cfg = tiny_modadd()
    (tmp_path / "checkpoints").mkdir()
    stale = tmp_path / "checkpoints" / ".3.safetensors.abc.tmp"
    stale.write_bytes(b"half")
    with RunWriter(tmp_path, cfg):
        assert not stale.exists()
        with pytest.raises(RunError, match="another lenslab process"):
            RunLock(tmp_path).acquire()
    assert not (tmp_path / ".lock").exists()


# -- metrics, checkpoints, resume ---------------------------------------------------------------
def test_log_eval_appends_one_line_per_row(tmp_path):
    w, *_ = new_run(tmp_path, tiny_modadd())
    rows = [row(0, test_acc=0.25, weight_norms={"W_E": 1.5}), row(2, test_acc=0.5, grad_norm=None)]
    for r in rows:
        w.log_eval(r)
    w.__exit__(None, None, None)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == rows and w.rows == rows


def test_checkpoints_thin_out_dense_early_sparse_late(tmp_path):
    cfg = tiny_modadd(epochs=20, eval_every=1, ckpt_density=2)
    w, model, opt, _ = new_run(tmp_path, cfg)
    for epoch in range(21):
        w.log_eval(row(epoch, test_acc=0.0))
        w.checkpoint(epoch, model, state_of(model, opt))
    w.__exit__(None, None, None)
    # by hand: evaluations 0..2 (density 2), then stride 1 up to 4, 2 up to 8, 4 up to 16, 8 after; plus the last
    assert [e for e, _ in list_checkpoints(tmp_path)] == [0, 1, 2, 3, 4, 6, 8, 12, 16, 20]
    _, meta = read_safetensors(tmp_path / "checkpoints" / "resume.safetensors")
    assert meta == {"format": RESUME_FORMAT, "epoch": "20"}


def test_log_schedule_checkpoints_every_evaluation(tmp_path):
    cfg = tiny_modadd(epochs=30, eval_schedule="log", n_evals=6)
    w = RunWriter(tmp_path, cfg)
    evals = [e for e in range(31) if w.schedule.evaluates(e)]
    assert evals[0] == 0 and evals[-1] == 30 and len(evals) <= 7
    assert all(w.schedule.checkpoints(e) for e in evals) and not any(
        w.schedule.checkpoints(e) for e in range(31) if e not in evals
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_resume_round_trip_is_bitwise(tmp_path, dtype):
    cfg = tiny_modadd(epochs=6, eval_every=1, dtype=dtype)
    w, model, opt, splits = new_run(tmp_path, cfg)
    w.log_eval(row(0))
    w.checkpoint(0, model, state_of(model, opt))
    steps(model, opt, splits, 3)
    w.log_eval(row(3))
    w.checkpoint(3, model, state_of(model, opt))
    saved_model = {k: v.clone() for k, v in model.state_dict().items()}
    w.log_eval(row(4))  # a row written after the last resume state (a kill came before its checkpoint)
    w.__exit__(None, None, None)

    w2 = RunWriter(tmp_path, cfg, resume=True)
    model2, opt2 = parts(cfg, seed=cfg["train"]["seed"] + 1)  # another init: everything must come from the file
    with w2:
        splits2 = w2.open(model2, opt2, None, CPU)
    assert w2.start == 3 and [r["epoch"] for r in w2.rows] == [0, 3]
    assert [r["epoch"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [0, 3]
    assert all(torch.equal(splits[k], splits2[k]) for k in splits)
    for k, v in model2.state_dict().items():
        assert v.dtype == saved_model[k].dtype == getattr(torch, dtype) or not v.dtype.is_floating_point
        assert torch.equal(v, saved_model[k]), k
    a, b = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert a.keys() == b.keys() and all(torch.equal(a[i][key], b[i][key]) for i in a for key in a[i])
    steps(model, opt, splits, 2)  # both continue identically
    steps(model2, opt2, splits2, 2)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), model2.parameters()))


def test_resume_in_another_dtype_is_refused(tmp_path):
    w, model, opt, _ = new_run(tmp_path, tiny_modadd(dtype="float32"))
    w.log_eval(row(0))
    w.checkpoint(0, model, state_of(model, opt))
    w.__exit__(None, None, None)
    cfg64 = tiny_modadd(dtype="float64")
    with pytest.raises(RunError, match=r"differs in train\.dtype"):
        RunWriter(tmp_path, cfg64, resume=True)
    stored = json.loads((tmp_path / "config.json").read_text())  # a config edited by hand: the resume state still says float32
    (tmp_path / "config.json").write_text(json.dumps({**stored, "train": {**stored["train"], "dtype": "float64"}}))
    with RunWriter(tmp_path, cfg64, resume=True) as w64, pytest.raises(RunError, match="refusing to resume in another precision"):
        w64.open(*parts(cfg64), None, CPU)


def test_a_resume_past_the_target_is_refused(tmp_path):
    w, model, opt, _ = new_run(tmp_path, tiny_modadd(epochs=6, eval_every=2))
    w.log_eval(row(4))
    w.checkpoint(4, model, state_of(model, opt))
    w.__exit__(None, None, None)
    cfg = tiny_modadd(epochs=3, eval_every=2)
    with RunWriter(tmp_path, cfg, resume=True) as w2, pytest.raises(RunError, match="already trained 4 epochs"):
        w2.open(*parts(cfg), None, CPU)


# -- the summary ---------------------------------------------------------------------------
def test_finish_writes_the_modadd_summary(tmp_path):
    env = {"device": "cpu", "test": True}
    w, *_ = new_run(tmp_path, tiny_modadd(epochs=6), env=env)
    rows = [row(0, test_acc=0.1), row(2, test_acc=0.7), row(4, test_acc=0.7), row(6, test_acc=0.4)]
    for r in rows:
        w.log_eval(r)
    summary = w.finish()
    w.__exit__(None, None, None)
    want = {
        "status": "complete",
        "epochs_completed": 6,
        "epochs_target": 6,
        "best_test_acc": 0.7,
        "best_test_epoch": 2,
        "final": rows[-1],
        "environment": env,
    }
    assert summary == want and list(summary) == list(want)  # the key order is part of the file's bytes
    assert (tmp_path / "summary.json").read_text() == json.dumps(want, indent=2) + "\n"


def test_finish_writes_the_mpsp_summary(tmp_path):
    env = {"device": "cpu"}
    w, *_ = new_run(tmp_path, tiny_config(epochs=6), env=env)
    rows = [row(0, adv_acc=0.2), row(2, adv_acc=1.0), row(4, adv_acc=0.9), row(6, adv_acc=0.95)]
    for r in rows:
        w.log_eval(r)
    summary = w.finish()
    w.__exit__(None, None, None)
    want = {
        "status": "complete", "epochs_completed": 6, "epochs_target": 6, "generalized": True, "first_generalized_epoch": 2,
        "max_adv_acc": 1.0, "still_generalized_at_end": False, "final": rows[-1], "environment": env,
    }  # fmt: skip
    assert summary == want and list(summary) == list(want)
    assert json.loads((tmp_path / "summary.json").read_text()) == want


def test_checkpoint_writes_a_running_summary(tmp_path):
    w, model, opt, _ = new_run(tmp_path, tiny_modadd(epochs=6, eval_every=2))
    w.log_eval(row(2, test_acc=0.5))
    w.checkpoint(2, model, state_of(model, opt))
    w.__exit__(None, None, None)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert (s["status"], s["epochs_completed"], s["epochs_target"], s["final"]["epoch"]) == ("running", 2, 6, 2)


def test_interrupted_saves_the_resume_state_unless_the_evaluation_did(tmp_path):
    cfg = tiny_modadd(epochs=8, eval_every=2)
    w, model, opt, splits = new_run(tmp_path, cfg)
    w.log_eval(row(2, test_acc=0.5))
    w.checkpoint(2, model, state_of(model, opt))
    at_eval = (tmp_path / "checkpoints" / "resume.safetensors").read_bytes()
    steps(model, opt, splits, 1)
    w.interrupted(2, state_of(model, opt))  # epoch 2 was just evaluated: its resume state stands
    assert (tmp_path / "checkpoints" / "resume.safetensors").read_bytes() == at_eval
    w.interrupted(3, state_of(model, opt))
    w.__exit__(None, None, None)
    saved = load_file(str(tmp_path / "checkpoints" / "resume.safetensors"))
    _, meta = read_safetensors(tmp_path / "checkpoints" / "resume.safetensors")
    assert meta["epoch"] == "3"
    assert all(torch.equal(saved[f"model.{k}"], v) for k, v in model.state_dict().items())
    assert torch.equal(saved["optim.0.exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    s = json.loads((tmp_path / "summary.json").read_text())
    assert (s["status"], s["epochs_completed"], s["final"]["epoch"]) == ("interrupted", 3, 2)
    assert [e for e, _ in list_checkpoints(tmp_path)] == [2]  # an interrupt writes no model checkpoint


def test_diverged_records_the_last_good_epoch(tmp_path):
    w, *_ = new_run(tmp_path, tiny_modadd(epochs=8, eval_every=2))
    assert w.diverged() == 0  # no evaluation yet
    w.log_eval(row(0, test_acc=0.1))
    w.log_eval(row(2, test_acc=0.3))
    assert w.diverged() == 2
    w.__exit__(None, None, None)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert (s["status"], s["epochs_completed"], s["best_test_epoch"]) == ("diverged", 2, 2) and s == w.summary


def test_sigint_flag_catches_one_ctrl_c_and_restores_the_handler():
    before = signal.getsignal(signal.SIGINT)
    with sigint_flag() as flag:
        assert not flag["hit"]
        os.kill(os.getpid(), signal.SIGINT)
        assert flag["hit"]
    assert signal.getsignal(signal.SIGINT) is before


def test_resume_elsewhere_keeps_the_earlier_environment(tmp_path, capsys):
    cfg = tiny_modadd(epochs=4, eval_every=2)
    w, model, opt, _ = new_run(tmp_path, cfg, env={"device": "cuda:0"})
    w.log_eval(row(2))
    w.checkpoint(2, model, state_of(model, opt))
    w.__exit__(None, None, None)
    with RunWriter(tmp_path, cfg, resume=True) as w2:
        w2.open(*parts(cfg), None, CPU, env={"device": "cpu"})
    assert w2.env == {"device": "cpu", "earlier": [{"device": "cuda:0", "until_epoch": 2}]}
    assert "trained its first 2 epochs elsewhere (device 'cuda:0' -> 'cpu')" in capsys.readouterr().err
