"""Trap counts and HTSR α per matrix over the checkpoints of a run, aligned with the run's accuracies."""

from __future__ import annotations

from lenslab.interp.common import Table
from lenslab.interp.spectral.paths import scan_path

# the columns of a scanned matrix record that each row carries (the record's ``name`` becomes ``matrix``)
ROW_KEYS = (
    "N",
    "M",
    "n_traps",
    "n_traps_mean",
    "n_traps_std",
    "lambda_plus",
    "threshold",
    "alpha",
    "ks",
    "xmin",
    "n_tail",
    "alpha_reason",
    "error",
)


def trap_counts_over_run(
    path,  # a run directory, or a Run
    mode: str = "robust",
    seed: int = 0,
    n_shuffles: int = 1,
    workers: int = 2,
    progress: bool = False,
    max_checkpoints: int | None = None,
) -> Table:
    """Tidy rows ``{epoch, matrix, N, M, n_traps, n_traps_mean, n_traps_std, lambda_plus, threshold, alpha, ks, xmin,
    n_tail, alpha_reason, error, <acc keys>}`` (α: ``htsr``, NaN with ``alpha_reason`` when it cannot be fitted).

    Every checkpoint, or at most ``max_checkpoints`` spread evenly (first and last kept).
    Accuracy keys are every ``*_acc`` field of the metrics.jsonl row with the same epoch (None if absent).
    """
    from lenslab.interp.evolution import select_checkpoints
    from lenslab.training.run import Run

    run = path if isinstance(path, Run) else Run.open(path)
    path = run.path
    epochs = None if max_checkpoints is None else select_checkpoints(run.epochs(), max_checkpoints)
    scan = scan_path(path, mode=mode, seed=seed, n_shuffles=n_shuffles, workers=workers, progress=progress, epochs=epochs)
    by_epoch = {m.get("epoch"): m for m in run.metrics}
    acc_keys = sorted({k for m in run.metrics for k in m if k.endswith("_acc")})
    rows = Table()
    for ck in scan.checkpoints:
        metrics = by_epoch.get(ck.epoch, {})
        accs = {k: metrics.get(k) for k in acc_keys}
        for r in ck.matrices:
            rows.append({"epoch": ck.epoch, "matrix": r["name"], **{k: r[k] for k in ROW_KEYS}, **accs})
    return rows
