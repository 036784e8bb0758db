"""Circuit evolution over a run's checkpoints, aligned with its metrics, and phase-2 detection.

For each evaluated checkpoint: weight and activation fingerprints, per-head mean ablation
(means over the train split) on validation and adv, and per-head cross-split patching
(``z_all_pos``, validation -> counterfactual). Rows are tidy: one per checkpoint (wide, head
columns named ``L{l}H{h}.<quantity>``) plus one per (checkpoint, head) (long).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from lenslab.interp.ablation import all_head_ablations, evaluate_ablations
from lenslab.interp.common import InterpError, Table, subsample
from lenslab.interp.fingerprints import FINGERPRINTS, activation_fingerprints, weight_fingerprints
from lenslab.interp.patching import DIRECTIONS, cross_split_patching

METRIC_KEYS = (
    "train_acc",
    "validation_acc",
    "adv_acc",
    "train_consistent_acc",
    "train_anti_acc",
    "grad_conflict",
    "grad_amplification",
    "train_loss",
    "validation_loss",
    "adv_loss",
)


def select_checkpoints(epochs: list[int], max_n: int | None = 40) -> list[int]:
    """At most ``max_n`` epochs spread evenly over ``epochs`` (first and last always kept)."""
    if max_n is None or len(epochs) <= max_n:
        return list(epochs)
    if max_n < 2:
        raise InterpError(f"max_checkpoints={max_n} must be >= 2 (first and last)")
    idx = sorted({round(i) for i in np.linspace(0, len(epochs) - 1, max_n)})
    return [epochs[i] for i in idx]


def metrics_at(metrics: list[dict], epoch: int) -> dict | None:
    """The evaluation at ``epoch``, else the latest one before it (None if there is none)."""
    best = None
    for m in metrics:
        e = m.get("epoch")
        if isinstance(e, (int, float)) and e <= epoch and (best is None or e >= best["epoch"]):
            best = m
    return best


def detect_phase2(metrics: list[dict], val_threshold: float = 0.99, margin: float = 0.1, plateau_evals: int = 3) -> dict:
    """The two-phase signature in ``metrics`` (one dict per evaluation, in epoch order).

    - phase 1 starts at the first evaluation with ``validation_acc >= val_threshold`` (the
      shortcut has been learned);
    - the plateau is the median ``adv_acc`` over that evaluation and the next
      ``plateau_evals - 1`` ones;
    - phase 2 starts at the first later evaluation where ``adv_acc > plateau + margin`` while
      ``validation_acc >= val_threshold``.

    Returns ``{"phase1_epoch", "plateau_adv_acc", "phase2_epoch", "margin", "val_threshold",
    "generalized_epoch"}`` (epochs None when not found; ``generalized_epoch`` = first adv_acc == 1).
    """
    ms = [m for m in metrics if _finite(m.get("validation_acc")) and _finite(m.get("adv_acc"))]
    ms.sort(key=lambda m: m["epoch"])
    out = {"phase1_epoch": None, "plateau_adv_acc": None, "phase2_epoch": None, "margin": margin, "val_threshold": val_threshold}
    out["generalized_epoch"] = next((m["epoch"] for m in ms if m["adv_acc"] >= 1.0), None)
    start = next((i for i, m in enumerate(ms) if m["validation_acc"] >= val_threshold), None)
    if start is None:
        return out
    out["phase1_epoch"] = ms[start]["epoch"]
    plateau = float(np.median([m["adv_acc"] for m in ms[start : start + plateau_evals]]))
    out["plateau_adv_acc"] = plateau
    for m in ms[start + 1 :]:
        if m["adv_acc"] > plateau + margin and m["validation_acc"] >= val_threshold:
            out["phase2_epoch"] = m["epoch"]
            break
    return out


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _split(splits: dict, name: str, idx: torch.Tensor) -> tuple:
    return splits[f"{name}_tokens"][idx], splits[f"{name}_labels"][idx], splits[f"{name}_shortcut"][idx]


def checkpoint_analysis(
    model, splits: dict, n_values: int, k: int, max_examples: int = 512, max_pairs: int = 64, seed: int = 0
) -> list[dict]:
    """Per-head numbers for one model: fingerprints (w/a), ablation deltas, patching effect."""
    val_idx = subsample(len(splits["validation_tokens"]), max_examples, seed)
    adv_idx = subsample(len(splits["adv_tokens"]), max_examples, seed + 1)
    train_idx = subsample(len(splits["train_tokens"]), max_examples, seed + 2)
    w = weight_fingerprints(model, n_values, k, seed=seed)
    a = activation_fingerprints(model, splits["validation_tokens"][val_idx], k)
    abl = evaluate_ablations(
        model,
        all_head_ablations(model, "mean"),
        {"validation": _split(splits, "validation", val_idx), "adv": _split(splits, "adv", adv_idx)},
        reference_tokens=splits["train_tokens"][train_idx],
        seed=seed,
    )
    heads = []
    if "counterfactual_tokens" in splits:
        grids = cross_split_patching(
            model,
            splits["validation_tokens"],
            splits["counterfactual_tokens"],
            splits["counterfactual_labels"],
            splits["counterfactual_shortcut"],
            kinds=("z_all_pos",),
            directions=(DIRECTIONS[0],),
            max_pairs=max_pairs,
            seed=seed,
        )
        patch = grids[DIRECTIONS[0]]["z_all_pos"].values
    else:
        patch = None
    for rw, ra, rb in zip(w, a, abl[1:]):
        row = {"layer": rw["layer"], "head": rw["head"], "head_name": rw["head_name"]}
        for f in FINGERPRINTS:
            row[f"{f}_w"] = rw[f]
            row[f"{f}_a"] = ra[f]
        row["ablate_delta_acc_validation"] = rb["delta_acc_validation"]
        row["ablate_delta_acc_adv"] = rb["delta_acc_adv"]
        row["patch_z"] = None if patch is None else float(patch[rw["layer"], rw["head"]])
        heads.append(row)
    return heads


def circuit_evolution(run, max_checkpoints: int | None = 40, max_pairs: int = 64, max_examples: int = 512, seed: int = 0) -> dict:
    """Evolution of every head over (at most ``max_checkpoints`` of) the run's checkpoints.

    Returns ``{"rows": Table (one per checkpoint), "head_rows": Table (one per checkpoint and
    head), "phase": detect_phase2(run.metrics), "epochs_used", "n_checkpoints", "note"}``.
    """
    if not run.is_mpsp:
        raise InterpError(f"{run.path}: circuit evolution needs an MPSP run (this one is {run.config['task'].get('name')!r})")
    task, splits, metrics = run.task, run.splits, run.metrics
    all_epochs = run.epochs()
    if not all_epochs:
        raise InterpError(f"{run.path}: the run has no checkpoints; train it first")
    chosen = select_checkpoints(all_epochs, max_checkpoints)
    rows, head_rows = Table(), Table()
    for epoch, model in run.iter_models(epochs=chosen):  # the others are not even read
        m = metrics_at(metrics, epoch) or {}
        row = {"epoch": epoch, "metrics_epoch": m.get("epoch")}
        row.update({key: m.get(key) for key in METRIC_KEYS})
        for h in checkpoint_analysis(model, splits, task.n_values, task.k, max_examples, max_pairs, seed):
            head_rows.append({"epoch": epoch, **h})
            row.update({f"{h['head_name']}.{key}": v for key, v in h.items() if key not in ("layer", "head", "head_name")})
        rows.append(row)
    note = (
        f"evaluated {len(rows)} of {len(all_epochs)} checkpoints"
        + (" (evenly spread)" if len(rows) < len(all_epochs) else "")
        + f"; ≤{max_examples} examples per split, ≤{max_pairs} patching pairs per checkpoint"
    )
    return {
        "rows": rows,
        "head_rows": head_rows,
        "phase": detect_phase2(metrics),
        "epochs_used": [r["epoch"] for r in rows],
        "n_checkpoints": len(all_epochs),
        "note": note,
    }
