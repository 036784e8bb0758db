"""What an MPSP run did: generalized, or which way it failed, read from its metrics (and last checkpoint).

    row = run_outcome(Run.open("runs/sweep/L2H2-r0.5-wd0.1-len6/seed_0"))
    row["outcome"]   # "generalized" | "transient" | "constant" | "chance" | "climbing" | "memorized" | "shortcut" | "partial"

A run *generalized* when it reached 100 % adversarial accuracy at any evaluation (paper 1's rule);
*transient* when it did but lost it by the end. A run that never did is put in the first of
these that fits (the thresholds were fixed before the regime-map sweep was looked at):

- ``constant``: at the last checkpoint the model predicts one class for >= 99 % of the train split;
- ``chance``: its best train accuracy never rose more than 0.05 above chance (1/k);
- ``climbing``: adversarial accuracy rose by >= 0.05 over the last 20 % of evaluations (least-squares
  trend), so the run was cut off while still moving: run it longer before judging it;
- ``memorized``: it fits the train split's anti-shortcut examples (>= 0.9) but not the held-out
  adversarial split (>= 0.3 lower): it learned the examples, not the rule;
- ``shortcut``: validation (r = 1) accuracy >= 0.9 with adversarial <= 0.2: it follows the shortcut;
- ``partial``: anything else (learned something, none of the above).
"""

from __future__ import annotations

import numpy as np
import torch

CONSTANT_SHARE = 0.99
CHANCE_MARGIN = 0.05
CLIMB = 0.05
TAIL = 0.2
MEMORIZED_FIT, MEMORIZED_GAP = 0.9, 0.3
SHORTCUT_VAL, SHORTCUT_ADV = 0.9, 0.2
FIT = 0.97  # train accuracy that counts as fitting the split (issue 25's memorization onset)
OUTCOMES = ("generalized", "transient", "constant", "chance", "climbing", "memorized", "shortcut", "partial")
FAILURES = OUTCOMES[2:]


def tail_trend(epochs: list[int], values: list[float], tail: float = TAIL) -> float | None:
    """Least-squares change of ``values`` across the last ``tail`` of the evaluations (None with < 3 points)."""
    n = max(3, int(np.ceil(tail * len(values))))
    if len(values) < 3:
        return None
    x, y = np.asarray(epochs[-n:], dtype=float), np.asarray(values[-n:], dtype=float)
    if x[-1] == x[0]:
        return None
    slope = np.polyfit(x, y, 1)[0]
    return float(slope * (x[-1] - x[0]))


def constant_share(model, tokens: torch.Tensor) -> float:
    """The largest share of ``tokens`` (the train split) that the model puts in one class."""
    from lenslab.training.gradients import readout_logits

    with torch.no_grad():
        pred = torch.cat([readout_logits(model, tokens[s : s + 8192]).argmax(-1) for s in range(0, len(tokens), 8192)])
    return float(torch.bincount(pred).max()) / len(pred)


def classify(rows: list[dict], k: int, share: float | None) -> str:
    """The outcome (module docstring) of one run's metrics rows; ``share`` from ``constant_share`` or None."""
    if any(r.get("adv_acc") == 1.0 for r in rows):
        return "generalized" if rows[-1].get("adv_acc") == 1.0 else "transient"
    last = rows[-1]
    if share is not None and share >= CONSTANT_SHARE:
        return "constant"
    if max(r["train_acc"] for r in rows) <= 1 / k + CHANCE_MARGIN:
        return "chance"
    trend = tail_trend([r["epoch"] for r in rows], [r["adv_acc"] for r in rows])
    if trend is not None and trend >= CLIMB:
        return "climbing"
    anti = last.get("train_anti_acc")
    if anti is not None and anti >= MEMORIZED_FIT and anti - last["adv_acc"] >= MEMORIZED_GAP:
        return "memorized"
    if last["validation_acc"] >= SHORTCUT_VAL and last["adv_acc"] <= SHORTCUT_ADV:
        return "shortcut"
    return "partial"


def fit_epoch(rows: list[dict], threshold: float = FIT) -> int | None:
    """The first evaluated epoch whose train accuracy is >= ``threshold`` (None if none): the
    memorization onset of a run that fits its split before (or without) learning the rule."""
    return next((r["epoch"] for r in rows if r["train_acc"] >= threshold), None)


def run_outcome(run, check_constant: bool = True, until: int | None = None) -> dict:
    """One tidy row for a run (a ``training.run.Run``): the numbers behind its outcome, and the outcome.

    ``until``: judge the run as it stood at that epoch: only evaluations at epochs <= ``until``, and
    the constant check on the last checkpoint at or before it (for runs that went further, so that
    every run of a comparison is read at the same horizon).

    Besides the outcome: ``fit_epoch``, the first evaluation with train accuracy >= 0.97
    (``FIT``; the memorization onset of runs that fit first), and ``fit_to_generalized``, the epochs
    from there to the first 100 % adversarial evaluation when that comes later (a memorized run's
    escape lag; 0 when both come at the same evaluation, None when the run never generalized).
    """
    rows = run.metrics
    if until is not None:
        rows = [r for r in rows if r["epoch"] <= until]
    if not rows:
        return {"outcome": None}
    share = None
    if check_constant and not any(r.get("adv_acc") == 1.0 for r in rows):
        epochs = [e for e in run.epochs() if until is None or e <= until]
        share = constant_share(run.model(epochs[-1] if epochs else None), run.splits["train_tokens"])
    last = rows[-1]
    gen = [r["epoch"] for r in rows if r.get("adv_acc") == 1.0]
    fit = fit_epoch(rows)
    return {
        "epochs": last["epoch"],
        "generalized": bool(gen),
        "first_generalized_epoch": gen[0] if gen else None,
        "fit_epoch": fit,
        "fit_to_generalized": gen[0] - fit if gen and fit is not None and gen[0] >= fit else None,
        "train_acc_final": last["train_acc"],
        "train_acc_max": max(r["train_acc"] for r in rows),
        "train_consistent_acc": last.get("train_consistent_acc"),
        "train_anti_acc": last.get("train_anti_acc"),
        "validation_acc": last["validation_acc"],
        "adv_acc_last": last["adv_acc"],
        "adv_acc_max": max(r["adv_acc"] for r in rows),
        "adv_trend": tail_trend([r["epoch"] for r in rows], [r["adv_acc"] for r in rows]),
        "top_class_share": share,
        "outcome": classify(rows, run.task.k, share),
    }


GROKKED = 0.95  # test accuracy that counts as grokked (paper 2's grokked phase: 0.97)
ANTI_DROP = 0.1  # a fall of test accuracy this far below its best after grokking counts as anti-grokking (paper 2: 0.97 -> 0.68)


def modadd_outcome(run) -> dict:
    """One tidy row for a modular-addition run: grokked? anti-grokked after? and the softmax-collapse numbers at the end."""
    rows = run.metrics
    if not rows:
        return {"outcome": None}
    last = rows[-1]
    best = max(rows, key=lambda r: r["test_acc"])
    grok = next((r["epoch"] for r in rows if r["test_acc"] >= GROKKED), None)
    after = [r for r in rows if grok is not None and r["epoch"] >= grok]
    low = min(after, key=lambda r: r["test_acc"]) if after else None
    anti = low is not None and low["test_acc"] <= best["test_acc"] - ANTI_DROP
    outcome = (
        "anti-grokked" if anti else "grokked" if grok is not None else ("memorized" if last["train_acc"] == 1.0 else "training")
    )
    return {
        "epochs": last["epoch"],
        "train_acc_final": last["train_acc"],
        "test_acc_final": last["test_acc"],
        "test_acc_best": best["test_acc"],
        "best_epoch": best["epoch"],
        "first_grokked_epoch": grok,
        "anti_grokked_epoch": low["epoch"] if anti else None,
        "test_acc_after_grok_min": low["test_acc"] if low else None,
        "max_abs_logit_final": last.get("train_max_abs_logit"),
        "zero_loss_frac_final": last.get("train_zero_loss_frac"),
        "weight_norm_final": last.get("weight_norm"),
        "outcome": outcome,
    }


# -- MNIST MLP (paper 2): the rules fixed in reproduction/mnist_antigrok.py before its runs were looked at --
MNIST_FIT = 0.99  # train accuracy that counts as fitted (memorized)
MNIST_GROK = 0.80  # test accuracy that counts as grokked (the 1k-image MLP's plateau is ~0.85-0.9)
MNIST_ANTI_DROP, MNIST_ANTI_RUN = 0.10, 3  # anti-grokked: <= peak - 0.10 at 3 consecutive evaluations, train still fitted
MNIST_FALL_DROP = 0.03  # fall onset: from here test accuracy stays <= peak - 0.03 to the end


def mnist_phases(rows: list[dict]) -> dict:
    """The phases of an MNIST-MLP run from its metrics rows (the pre-registered rules above).

    Returns the steps (``step`` of the rows; ``epoch`` where a row has none) of the fit, the
    peak, the grok, the anti-grok and the fall onset (None where a rule is not met), the peak and
    final test accuracy, ``outcome`` ("fitting" | "pre-grok" | "grokked" | "anti-grokked": the
    phase at the last evaluation) and ``phase``: one phase per row, in order.
    """
    if not rows:
        return {"outcome": None, "phase": []}
    at = [r.get("step", r["epoch"]) for r in rows]
    test = [r["test_acc"] for r in rows]
    fitted = [r["train_acc"] >= MNIST_FIT for r in rows]
    fit = next((i for i, f in enumerate(fitted) if f), None)
    peak = max(range(len(rows)), key=lambda i: (test[i], -i))
    grok = next((i for i, a in enumerate(test) if a >= MNIST_GROK), None) if test[peak] >= MNIST_GROK else None
    anti = None
    for i in range(peak + 1, len(rows) - MNIST_ANTI_RUN + 1):
        window = range(i, i + MNIST_ANTI_RUN)
        if all(test[j] <= test[peak] - MNIST_ANTI_DROP and fitted[j] for j in window):
            anti = i
            break
    fall = None
    for i in range(len(rows) - 1, peak, -1):  # the earliest i after the peak with every later row low
        if test[i] > test[peak] - MNIST_FALL_DROP:
            break
        fall = i
    phase = []
    for i in range(len(rows)):
        if fit is None or i < fit:
            phase.append("fitting")
        elif anti is not None and i >= anti:
            phase.append("anti-grokked")
        elif grok is not None and i >= grok:
            phase.append("grokked")
        else:
            phase.append("pre-grok")
    step = lambda i: None if i is None else at[i]
    return {
        "steps": at[-1],
        "fit_step": step(fit),
        "peak_step": at[peak],
        "peak_test_acc": test[peak],
        "grok_step": step(grok),
        "anti_grok_step": step(anti),
        "fall_onset_step": step(fall),
        "test_acc_final": test[-1],
        "train_acc_final": rows[-1]["train_acc"],
        "weight_norm_final": rows[-1].get("weight_norm"),
        "outcome": phase[-1],
        "phase": phase,
    }
