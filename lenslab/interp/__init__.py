"""Interpretability on plain HookedTransformers: ablation, cross-split patching, fingerprints,
circuit evolution over checkpoints, offline visualisation. Load runs with ``training.run.Run``."""

from lenslab.interp.ablation import (
    Ablation,
    AttnTarget,
    HeadTarget,
    MLPTarget,
    ResidTarget,
    all_head_ablations,
    evaluate_ablations,
    run_ablated,
)
from lenslab.interp.common import InterpError, Table, label_vs_shortcut_diff
from lenslab.interp.evolution import circuit_evolution, detect_phase2, select_checkpoints
from lenslab.interp.fingerprints import activation_fingerprints, ov_unembed_circuit, qk_circuit, weight_fingerprints
from lenslab.interp.patching import GRID_KINDS, PatchGrid, cross_split_patching, normalized_logit_diff_metric, patch_grid
from lenslab.training.run import Run, open_run

__all__ = [
    "GRID_KINDS",
    "Ablation",
    "AttnTarget",
    "HeadTarget",
    "InterpError",
    "MLPTarget",
    "PatchGrid",
    "ResidTarget",
    "Run",
    "Table",
    "activation_fingerprints",
    "all_head_ablations",
    "circuit_evolution",
    "cross_split_patching",
    "detect_phase2",
    "evaluate_ablations",
    "label_vs_shortcut_diff",
    "normalized_logit_diff_metric",
    "open_run",
    "ov_unembed_circuit",
    "patch_grid",
    "qk_circuit",
    "run_ablated",
    "select_checkpoints",
    "weight_fingerprints",
]
