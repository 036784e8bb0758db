"""Everything about one run, as JSON-serialisable numbers (the report that shows it is ``lenslab.report``'s).

    result = inspect_run("runs/demo")                 # dict: numbers only
    sections = lenslab.report.inspection_sections("runs/demo", result)
    lenslab.report.write_report("runs/demo/report.html", "demo", sections)
    # or both at once: lenslab.report.write_inspection("runs/demo")

Kept fast on full runs: ≤ ``max_pairs`` (256) patching pairs on the final model, ≤ 40
checkpoints (evenly spread) and ≤ 64 pairs per checkpoint for the evolution, correlation traps
(robust mode, one shuffle) on ≤ ``trap_checkpoints`` (40) checkpoints; the limits used are
recorded in ``result["limits"]``.
"""

from __future__ import annotations

from lenslab.interp.ablation import Ablation, AttnTarget, MLPTarget, all_head_ablations, evaluate_ablations
from lenslab.interp.common import InterpError, subsample
from lenslab.interp.evolution import circuit_evolution, detect_phase2
from lenslab.interp.fingerprints import activation_fingerprints, weight_fingerprints
from lenslab.interp.patching import GRID_KINDS, cross_split_patching
from lenslab.training.run import Run


def _open(run_or_path) -> Run:
    return run_or_path if isinstance(run_or_path, Run) else Run.open(run_or_path)


def trap_summary(run: Run, epoch: int, max_checkpoints: int = 40, seed: int = 0) -> dict:
    """Robust-mode trap counts per matrix over ≤ ``max_checkpoints`` checkpoints of ``run``.

    ``esd_matrix`` is the matrix whose ESD the report draws: at the checkpoint nearest ``epoch``,
    the one with the most traps (ties: the largest, N·M).
    """
    from lenslab.interp.spectral import trap_counts_over_run

    rows = trap_counts_over_run(run.path, mode="robust", seed=seed, max_checkpoints=max_checkpoints)
    epochs = sorted({r["epoch"] for r in rows})
    ok = [r for r in rows if r["error"] is None]
    esd_epoch = min((r["epoch"] for r in ok), key=lambda e: abs(e - epoch), default=None)
    at = [r for r in ok if r["epoch"] == esd_epoch]
    best = max(at, key=lambda r: (r["n_traps"], r["N"] * r["M"]), default=None)
    return {
        "mode": "robust",
        "seed": seed,
        "epochs_used": epochs,
        "n_checkpoints": len(run.epochs()),
        "rows": rows.to_records(),
        "final": {r["matrix"]: r["n_traps"] for r in rows if r["epoch"] == (epochs[-1] if epochs else None)},
        "esd_epoch": esd_epoch,
        "esd_matrix": best["matrix"] if best else None,
    }


def inspect_run(
    run_dir,
    max_pairs: int = 256,
    max_checkpoints: int = 40,
    evolution_pairs: int = 64,
    max_examples: int = 1024,
    seed: int = 0,
    trap_checkpoints: int = 40,
) -> dict:
    """Ablation, patching, fingerprints on the final (or focused) checkpoint, plus evolution and traps."""
    run = _open(run_dir)
    if not run.is_mpsp:
        raise InterpError(f"{run.path}: inspect supports MPSP runs only (task {run.config['task'].get('name')!r})")
    task, splits = run.task, run.splits
    epoch = run.focus_epoch() if run.focus is not None else (run.epochs() or [None])[-1]
    if epoch is None:
        raise InterpError(f"{run.path}: the run has no checkpoints; train it first")
    model = run.model(epoch)
    pick = {s: subsample(len(splits[f"{s}_tokens"]), max_examples, seed) for s in ("train", "validation", "adv")}
    data = {s: (splits[f"{s}_tokens"][i], splits[f"{s}_labels"][i], splits[f"{s}_shortcut"][i]) for s, i in pick.items()}
    ablations = all_head_ablations(model, "mean") + [Ablation(AttnTarget(l), "mean") for l in range(model.cfg.n_layers)]
    if not model.cfg.attn_only:
        ablations += [Ablation(MLPTarget(l), "mean") for l in range(model.cfg.n_layers)]
    table = evaluate_ablations(
        model, ablations, {"validation": data["validation"], "adv": data["adv"]}, reference_tokens=data["train"][0], seed=seed
    )
    kinds = tuple(k for k in GRID_KINDS if not (k == "mlp_out" and model.cfg.attn_only))
    grids = cross_split_patching(
        model,
        splits["validation_tokens"],
        splits["counterfactual_tokens"],
        splits["counterfactual_labels"],
        splits["counterfactual_shortcut"],
        kinds=kinds,
        max_pairs=max_pairs,
        seed=seed,
    )
    evo = circuit_evolution(
        run, max_checkpoints=max_checkpoints, max_pairs=evolution_pairs, max_examples=min(512, max_examples), seed=seed
    )
    n_pairs = next(iter(next(iter(grids.values())).values())).n_pairs
    traps = trap_summary(run, epoch, max_checkpoints=trap_checkpoints, seed=seed)
    return {
        "run": str(run.path),
        "epoch": epoch,
        "task": task.to_dict(),
        "model": {k: run.config["model"][k] for k in ("n_layers", "n_heads", "d_model")},
        "phase": detect_phase2(run.metrics),
        "ablation": table.to_records(),
        "patching": {d: {k: g.to_dict() for k, g in gs.items()} for d, gs in grids.items()},
        "fingerprints": {
            "weights": weight_fingerprints(model, task.n_values, task.k, seed=seed).to_records(),
            "activations": activation_fingerprints(model, data["validation"][0], task.k).to_records(),
        },
        "evolution": {
            "rows": evo["rows"].to_records(),
            "head_rows": evo["head_rows"].to_records(),
            "epochs_used": evo["epochs_used"],
            "n_checkpoints": evo["n_checkpoints"],
        },
        "traps": traps,
        "limits": {
            "patching_pairs": n_pairs,
            "max_examples": max_examples,
            "evolution": evo["note"],
            "traps": f"robust mode, seed {seed}, 1 shuffle, {len(traps['epochs_used'])} of {traps['n_checkpoints']} checkpoints",
        },
    }
