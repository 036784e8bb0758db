"""Everything about one run, as JSON-serialisable numbers, and the report sections that show it.

    result = inspect_run("runs/demo")                 # dict: numbers only
    sections = inspection_sections("runs/demo", result)
    lenslab.report.write_report("runs/demo/report.html", "demo", sections)

Kept fast on full runs: ≤ ``max_pairs`` (256) patching pairs on the final model, ≤ 40
checkpoints (evenly spread) and ≤ 64 pairs per checkpoint for the evolution, correlation traps
(robust mode, one shuffle) on ≤ ``trap_checkpoints`` (40) checkpoints; the limits used are
recorded in ``result["limits"]``.
"""

from __future__ import annotations

import html
from pathlib import Path

import torch

from lenslab.interp.ablation import Ablation, AttnTarget, MLPTarget, all_head_ablations, evaluate_ablations
from lenslab.interp.common import InterpError, subsample
from lenslab.interp.evolution import circuit_evolution, detect_phase2
from lenslab.interp.fingerprints import activation_fingerprints, weight_fingerprints
from lenslab.interp.patching import GRID_KINDS, PatchGrid, cross_split_patching
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
    run_dir, max_pairs: int = 256, max_checkpoints: int = 40, evolution_pairs: int = 64, max_examples: int = 1024, seed: int = 0, trap_checkpoints: int = 40
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
    table = evaluate_ablations(model, ablations, {"validation": data["validation"], "adv": data["adv"]}, reference_tokens=data["train"][0], seed=seed)
    kinds = tuple(k for k in GRID_KINDS if not (k == "mlp_out" and model.cfg.attn_only))
    grids = cross_split_patching(
        model, splits["validation_tokens"], splits["counterfactual_tokens"], splits["counterfactual_labels"], splits["counterfactual_shortcut"], kinds=kinds, max_pairs=max_pairs, seed=seed
    )
    evo = circuit_evolution(run, max_checkpoints=max_checkpoints, max_pairs=evolution_pairs, max_examples=min(512, max_examples), seed=seed)
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
        "evolution": {"rows": evo["rows"].to_records(), "head_rows": evo["head_rows"].to_records(), "epochs_used": evo["epochs_used"], "n_checkpoints": evo["n_checkpoints"]},
        "traps": traps,
        "limits": {
            "patching_pairs": n_pairs,
            "max_examples": max_examples,
            "evolution": evo["note"],
            "traps": f"robust mode, seed {seed}, 1 shuffle, {len(traps['epochs_used'])} of {traps['n_checkpoints']} checkpoints",
        },
    }


def _limits_sentence(limits: dict) -> str:
    """The analysis limits as one sentence for the report (``result["limits"]`` keeps them as data)."""
    return (f"Limits: cross-split patching on {limits['patching_pairs']} pairs, at most {limits['max_examples']} examples per split; "
            f"evolution: {limits['evolution']}; traps: {limits['traps']}.")


def _table_html(rows: list[dict], keys: list[str]) -> str:
    def cell(v):
        return f"{v:.3f}" if isinstance(v, float) else html.escape(str(v))

    head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    body = "".join("<tr>" + "".join(f"<td>{cell(r.get(k))}</td>" for k in keys) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def inspection_sections(run_dir, result: dict, n_examples: int = 2) -> list[tuple[str, list]]:
    """Report sections for ``result`` (from ``inspect_run``): curves, gradients, circuits, views."""
    from lenslab.interp import visual

    run = _open(run_dir)
    metrics = run.metrics
    phase = result["phase"]
    ph = (
        f"phase 1 (validation ≥ {phase['val_threshold']:.0%}) from epoch {phase['phase1_epoch']}; "
        f"adv plateau {phase['plateau_adv_acc']}; phase 2 (adv > plateau + {phase['margin']}) from epoch {phase['phase2_epoch']}; "
        f"first 100 % adv at epoch {phase['generalized_epoch']}"
    )
    sections: list[tuple[str, list]] = [
        ("Run", [f"{result['run']} — analysed checkpoint: epoch {result['epoch']}", _limits_sentence(result["limits"])]),
        ("Accuracy", [visual.accuracy_figure(metrics, phase), ph]),
        ("Gradient dynamics", [visual.gradient_figure(metrics)]),
        ("Softmax collapse and weight norms", visual.collapse_items(metrics)),
    ]
    head_rows = result["evolution"]["head_rows"]
    evo_items = [result["limits"]["evolution"]]
    if head_rows:
        evo_items += [
            visual.fingerprint_evolution_figure(head_rows, "w"),
            visual.fingerprint_evolution_figure(head_rows, "a"),
            visual.head_evolution_heatmap(head_rows, "ablate_delta_acc_adv", "mean-ablation Δ adv accuracy per head"),
            visual.head_evolution_heatmap(head_rows, "patch_z", "patching head output (validation→counterfactual), normalized LD"),
        ]
    sections.append(("Circuit evolution", evo_items))
    fp = result["fingerprints"]
    keys = ["head_name", "source", "qk_rho", "pos0_mass", "ov_parity_rho"]
    sections.append(("Fingerprints (analysed checkpoint)", [_table_html(fp["weights"] + fp["activations"], keys)]))
    sections.append(("Ablation (mean over train)", [visual.ablation_figure(result["ablation"], "delta_acc"), visual.ablation_figure(result["ablation"], "logit_diff")]))
    patch_items = [f"{result['limits']['patching_pairs']} pairs; 0 = unpatched, 1 = receiver behaves like the source (normalized logit diff)"]
    for d, grids in result["patching"].items():
        for k, g in grids.items():
            grid = PatchGrid(kind=k, direction=d, values=torch.tensor(g["values"]), n_pairs=g["n_pairs"], ld_source=g["ld_source"], ld_receiver=g["ld_receiver"])
            patch_items.append(visual.patching_figure(grid))
    sections.append(("Cross-split patching", patch_items))
    sections.append(("Correlation traps", _trap_items(run, result["traps"])))
    model = run.model(result["epoch"])
    views = []
    for split in ("validation", "counterfactual"):
        for i in range(min(n_examples, len(run.splits[f"{split}_tokens"]))):
            tok = run.splits[f"{split}_tokens"][i]
            views.append(visual.attention_view(model, tok, run.task.n_values, title=f"{split} #{i}: label {int(run.splits[f'{split}_labels'][i])}, shortcut {int(run.splits[f'{split}_shortcut'][i])}"))
    sections.append(("Attention (readout is the last row)", views))
    return sections


def _trap_items(run: Run, traps: dict) -> list:
    from lenslab.interp.spectral import esd_figure, extract_matrices, trap_count_figure

    note = (
        f"Correlation traps (Prakash & Martin): eigenvalues of the entry-shuffled weight matrix's correlation matrix above the "
        f"Marchenko–Pastur bulk edge plus a Tracy–Widom allowance; {traps['mode']} mode (σ fitted on the bulk), seed {traps['seed']}, "
        f"{len(traps['epochs_used'])} of {traps['n_checkpoints']} checkpoints."
    )
    items = [note]
    rows = traps["rows"]
    if not rows:
        return items + ["no matrix could be analysed"]
    items.append(trap_count_figure(rows, run.metrics))
    errors = sorted({f"{r['matrix']}: {r['error']}" for r in rows if r["error"]})
    items += [f"not analysed: {e}" for e in errors]
    if traps["esd_matrix"] is not None:
        w = extract_matrices(run.model(traps["esd_epoch"])).matrices[traps["esd_matrix"]]
        items.append(esd_figure(w, f"{traps['esd_matrix']} (epoch {traps['esd_epoch']})", mode=traps["mode"], seed=traps["seed"]))
    last = traps["epochs_used"][-1]
    items.append(_table_html([r for r in rows if r["epoch"] == last], ["matrix", "n_traps", "lambda_plus", "threshold"]))
    return items


def write_inspection(run_dir, path: str | Path | None = None, **kwargs) -> tuple[dict, Path]:
    """``inspect_run`` + ``inspection_sections`` + ``write_report`` to ``RUN/report.html``."""
    from lenslab.report import write_report

    run = _open(run_dir)
    result = inspect_run(run, **kwargs)
    out = write_report(path or run.path / "report.html", f"lenslab inspect: {run.path.name}", inspection_sections(run, result))
    return result, out
