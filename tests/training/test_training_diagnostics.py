"""Collapse diagnostics in metrics.jsonl and the log-spaced evaluation schedule.

Diagnostics are checked against a plain TransformerLens model loaded from each checkpoint
(logits, per-example losses, ``torch.linalg.vector_norm``, autograd); the schedule against its
defining recurrence evaluated in floating point and against exact decades.
"""

from __future__ import annotations

import math
import os
import signal

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_modadd
from safetensors.torch import load_file
from transformer_lens import HookedTransformer, HookedTransformerConfig

from lenslab.training.config import log_schedule
from lenslab.training.presets import build_model
from lenslab.training.runio import list_checkpoints, read_jsonl
from lenslab.training.trainer import Interrupted, evaluate, train


def _tl_at(run_dir, epoch, model_kwargs):
    model = HookedTransformer(HookedTransformerConfig(**model_kwargs))
    model.load_state_dict(load_file(str(run_dir / "checkpoints" / f"{epoch}.safetensors")))
    return model


def test_diagnostics_match_the_checkpoints(tmp_path):
    cfg = tiny_modadd(epochs=3, eval_every=1)  # full batch: the last step's gradient is the full train loss's
    train(cfg, tmp_path, progress=False)
    splits = load_file(str(tmp_path / "splits.safetensors"))
    tokens, labels = splits["train_tokens"], splits["train_labels"]
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["epoch"] for r in rows] == [0, 1, 2, 3]
    assert rows[0]["grad_norm"] is None  # no step before epoch 0
    for row in rows:
        model = _tl_at(tmp_path, row["epoch"], cfg["model"])
        with torch.no_grad():
            logits = model(tokens)[:, -1]
        # same weights, same forward; only BLAS blocking may differ between a 60-row and a chunked call
        assert row["train_max_abs_logit"] == pytest.approx(float(logits.abs().max()), rel=1e-6)
        assert row["train_zero_loss_frac"] == float((F.cross_entropy(logits, labels, reduction="none") == 0).double().mean())
        norms = {n: float(torch.linalg.vector_norm(p.detach().double())) for n, p in model.named_parameters()}
        assert set(row["weight_norms"]) == set(norms)
        for n, v in norms.items():  # float32 sums of squares vs float64: ~1e-7 relative
            assert row["weight_norms"][n] == pytest.approx(v, rel=1e-5), n
        assert row["weight_norm"] == pytest.approx(math.sqrt(sum(v * v for v in norms.values())), rel=1e-5)
        if row["epoch"] > 0:  # the gradient of the step that led here, taken at the previous checkpoint
            prev = _tl_at(tmp_path, row["epoch"] - 1, cfg["model"])
            loss = F.cross_entropy(prev(tokens)[:, -1], labels)
            g = torch.autograd.grad(loss, list(prev.parameters()))
            want = math.sqrt(sum(float(x.double().pow(2).sum()) for x in g))
            # the trainer takes the mean over a permuted batch (another float32 summation order): ~1e-6 relative
            assert row["grad_norm"] == pytest.approx(want, rel=1e-4)


def test_zero_loss_fraction_counts_exact_zeros_in_the_runs_dtype():
    """A saturated readout: many float32 losses are exactly 0, far fewer in float64 (softmax collapse is a float32 effect)."""
    cfg = tiny_modadd()
    from lenslab.training.trainer import make_splits

    splits = make_splits(cfg)
    fracs = {}
    for dtype in ("float32", "float64"):
        model = build_model(cfg["model"], seed=0, dtype=dtype)
        with torch.no_grad():
            model.unembed.W_U.mul_(3e3)
        got = evaluate(model, splits, torch.device("cpu"))
        with torch.no_grad():
            logits = model(splits["train_tokens"])[:, -1]
        brute = [float(-torch.log_softmax(logits[i], -1)[y]) == 0.0 for i, y in enumerate(splits["train_labels"].tolist())]
        assert got["train_zero_loss_frac"] == sum(brute) / len(brute)
        assert got["train_max_abs_logit"] == float(logits.abs().max())
        fracs[dtype] = got["train_zero_loss_frac"]
    assert fracs["float32"] > 0.1 and fracs["float64"] < fracs["float32"]  # measured: 0.167 vs 0.083 (at most train_acc, 0.183)


@pytest.mark.parametrize("epochs,n", [(1, 5), (7, 7), (7, 3), (40, 6), (1000, 50), (10**5, 200), (10**7, 200), (123457, 1)])
def test_log_schedule_is_its_recurrence(epochs, n):
    s = log_schedule(epochs, n)
    assert s[0] == 0 and s[-1] == epochs and s == sorted(set(s))
    assert len(s) == min(n, epochs) + 1
    if n >= 2 and epochs >= 2:
        assert s[1] == 1
    for i in range(1, len(s) - 1):  # each next epoch: ceil(cur * (epochs / cur) ** (1 / left)), or cur + 1
        cur, left = s[i], len(s) - 1 - i
        target = cur * (epochs / cur) ** (1 / left)
        assert s[i + 1] == cur + 1 or (s[i + 1] - 1 < target * (1 + 1e-12) and s[i + 1] >= target * (1 - 1e-12)), (i, cur, target)


def test_log_schedule_exact_cases():
    assert log_schedule(10**6, 7) == [0, 1, 10, 100, 1000, 10**4, 10**5, 10**6]
    assert log_schedule(5, 200) == [0, 1, 2, 3, 4, 5]
    assert log_schedule(0, 10) == [0]
    assert log_schedule(10**6, 7) == log_schedule(10**6, 7)  # deterministic


def test_log_schedule_training_resume_and_extension(tmp_path):
    cfg = tiny_modadd(epochs=40, eval_schedule="log", n_evals=6)
    want = log_schedule(40, 6)
    train(cfg, tmp_path / "straight", progress=False)
    assert [r["epoch"] for r in read_jsonl(tmp_path / "straight" / "metrics.jsonl")] == want
    assert [e for e, _ in list_checkpoints(tmp_path / "straight")] == want  # every evaluation is checkpointed

    def ctrl_c(row):
        if row["epoch"] == want[3]:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(Interrupted):
        train(cfg, tmp_path / "cut", progress=False, on_eval=ctrl_c)
    train(cfg, tmp_path / "cut", resume=True, progress=False)
    assert read_jsonl(tmp_path / "cut" / "metrics.jsonl") == read_jsonl(tmp_path / "straight" / "metrics.jsonl")
    for e in want:
        name = f"{e}.safetensors"
        assert (tmp_path / "cut" / "checkpoints" / name).read_bytes() == (
            tmp_path / "straight" / "checkpoints" / name
        ).read_bytes()

    # extending the target: what was evaluated stays, later evaluations follow the new target's schedule
    train(tiny_modadd(epochs=100, eval_schedule="log", n_evals=6), tmp_path / "straight", resume=True, progress=False)
    extended = want + [e for e in log_schedule(100, 6) if e > 40]
    assert [r["epoch"] for r in read_jsonl(tmp_path / "straight" / "metrics.jsonl")] == extended
    assert [e for e, _ in list_checkpoints(tmp_path / "straight")] == extended


def test_report_panel_draws_the_diagnostics(tmp_path):
    from lenslab.interp.visual import collapse_items
    from lenslab.report import render_report

    train(tiny_modadd(epochs=2, eval_every=1), tmp_path, progress=False)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    note, fig = collapse_items(rows)
    names = {t.name for t in fig.data}
    assert {"train_max_abs_logit", "train_zero_loss_frac", "all parameters", "grad_norm", "blocks.0.attn.W_Q"} <= names
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis2.range == (0, 1.02)
    assert "Softmax collapse" in render_report("t", [("collapse", [note, fig])])
    old = [{"epoch": r["epoch"], "train_acc": r["train_acc"]} for r in rows]  # a run from before the diagnostics
    assert "not recorded" in collapse_items(old)[1]
