"""How a run ended: each outcome from hand-made metric rows, the trend against numpy's own fit, and the constant check on a real model."""

import numpy as np
import pytest
import torch

from lenslab.training.outcomes import classify, constant_share, tail_trend


def _rows(adv, train=None, val=None, anti=None, step=10):
    n = len(adv)
    train = train if train is not None else [0.9] * n
    val = val if val is not None else [0.9] * n
    anti = anti if anti is not None else [0.5] * n
    return [
        {"epoch": i * step, "adv_acc": a, "train_acc": t, "validation_acc": v, "train_anti_acc": x}
        for i, (a, t, v, x) in enumerate(zip(adv, train, val, anti))
    ]


def test_generalized_and_transient_follow_the_papers_rule():
    assert classify(_rows([0.1, 1.0, 1.0]), 2, None) == "generalized"
    assert classify(_rows([0.1, 1.0, 0.7]), 2, None) == "transient"
    assert classify(_rows([0.1, 0.999, 0.999]), 2, 0.5) != "generalized"  # 100 %, not almost


def test_each_failure_mode():
    flat = [0.05] * 10
    assert classify(_rows(flat), 2, 0.995) == "constant"
    assert classify(_rows([0.5] * 10, train=[0.52] * 10, val=[0.5] * 10), 2, 0.6) == "chance"
    assert classify(_rows([0.3] * 10, train=[0.36] * 10, val=[0.5] * 10), 3, 0.5) == "chance"  # 1/3 + 0.03
    assert classify(_rows([0.1] * 8 + [0.2, 0.3]), 2, 0.5) == "climbing"
    assert classify(_rows([0.5] * 10, train=[0.97] * 10, val=[0.5] * 10, anti=[0.95] * 10), 2, 0.5) == "memorized"
    assert classify(_rows(flat, train=[0.9] * 10, val=[0.97] * 10, anti=[0.05] * 10), 2, 0.5) == "shortcut"
    assert classify(_rows([0.6] * 10, train=[0.8] * 10, val=[0.7] * 10, anti=[0.6] * 10), 2, 0.5) == "partial"


def test_climbing_is_checked_before_the_static_labels():
    # on the shortcut (val 0.97, adv low) but rising over the last 20 % of evaluations: run it longer
    rows = _rows([0.02] * 16 + [0.05, 0.09, 0.14, 0.2], val=[0.97] * 20, anti=[0.1] * 20)
    assert classify(rows, 2, 0.5) == "climbing"


def test_tail_trend_is_the_least_squares_rise_over_the_last_fifth():
    rng = np.random.default_rng(0)
    epochs = list(range(0, 500, 5))
    values = list(rng.random(100))
    x, y = np.array(epochs[-20:], float), np.array(values[-20:])
    slope = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()  # closed form, not polyfit
    assert tail_trend(epochs, values) == pytest.approx(slope * (x[-1] - x[0]), rel=1e-9)
    assert tail_trend([0, 5], [0.1, 0.2]) is None


def test_constant_share_counts_the_argmax_of_a_real_model():
    from lenslab.training.config import mpsp_run_config
    from lenslab.training.gradients import readout_logits
    from lenslab.training.presets import build_model

    cfg = mpsp_run_config(seq_len=4, n_values=8, layers=1, heads=1)
    model = build_model(cfg["model"], seed=0)
    tokens = torch.randint(0, 8, (300, 5), generator=torch.Generator().manual_seed(0))
    tokens[:, -1] = 8
    pred = [int(readout_logits(model, tokens[i : i + 1]).argmax()) for i in range(300)]  # one example at a time
    assert constant_share(model, tokens) == max(pred.count(c) for c in set(pred)) / 300
    with torch.no_grad():  # a model whose unembedding bias dominates predicts one class everywhere
        model.b_U[1] = 1e4
    assert constant_share(model, tokens) == 1.0


def test_fit_epoch_is_the_first_evaluation_at_the_threshold():
    from lenslab.training.outcomes import fit_epoch

    rows = _rows([0.1] * 5, train=[0.5, 0.969, 0.97, 0.6, 1.0])
    assert fit_epoch(rows) == 20  # 0.97 counts, 0.969 does not; a later dip does not move it
    assert fit_epoch(rows, threshold=0.99) == 40
    assert fit_epoch(_rows([0.1] * 3, train=[0.5] * 3)) is None


class _FakeRun:
    """What run_outcome reads from a Run: metrics, checkpoint epochs, a model per epoch, splits, task."""

    def __init__(self, rows, ckpts):
        self.metrics, self._ckpts, self.asked = rows, ckpts, []
        self.splits = {"train_tokens": torch.zeros(4, 3, dtype=torch.long)}
        self.task = type("T", (), {"k": 2})()

    def epochs(self):
        return self._ckpts

    def model(self, epoch=None):
        self.asked.append(epoch)
        return epoch


def test_run_outcome_until_reads_the_run_as_it_stood_then(monkeypatch):
    from lenslab.training import outcomes

    # memorized by epoch 30 (train 0.98, anti 0.95, adv 0.5), the rule at epoch 70
    adv = [0.5, 0.5, 0.5, 0.5, 0.5, 0.6, 0.8, 1.0]
    train = [0.6, 0.9, 0.96, 0.98, 0.99, 0.99, 1.0, 1.0]
    run = _FakeRun(_rows(adv, train=train, val=[0.5] * 8, anti=[0.95] * 8), ckpts=[0, 20, 40, 70])
    monkeypatch.setattr(outcomes, "constant_share", lambda model, tokens: 0.5)
    whole = outcomes.run_outcome(run)
    assert (whole["outcome"], whole["fit_epoch"], whole["first_generalized_epoch"], whole["fit_to_generalized"]) == (
        "generalized",
        30,
        70,
        40,
    )
    assert run.asked == []  # a generalized run needs no constant check
    early = outcomes.run_outcome(run, until=45)
    assert (early["epochs"], early["outcome"], early["fit_to_generalized"]) == (40, "memorized", None)
    assert run.asked == [40]  # the last checkpoint at or before the horizon, not the run's last
    assert outcomes.run_outcome(run, until=-1) == {"outcome": None}
    # generalized at the same evaluation as the fit: lag 0; before the fit: no lag
    same = _FakeRun(_rows([0.2, 1.0], train=[0.5, 0.99]), ckpts=[10])
    assert outcomes.run_outcome(same)["fit_to_generalized"] == 0
    before = _FakeRun(_rows([1.0, 1.0], train=[0.9, 0.99]), ckpts=[10])
    assert outcomes.run_outcome(before)["fit_to_generalized"] is None
