"""Controls for trap counts: are they a proxy for the weight norm? (paper 2's perturbation control)

    rows = rescale_control(model, scales=(0.5, 1.0, 2.0))        # one row per matrix × scale, plus a Gaussian
    rho = norm_trap_correlation(table_rows, norm_key="weight_norm", trap_key="traps_total")

``rescale_control`` multiplies each matrix by c and counts its traps and HTSR α again, and adds, per
matrix, a Gaussian matrix of the same shape and the same Frobenius norm (``scale = "gaussian"``).
Both detectors are scale-invariant by construction: ``robust`` fits σ² on the shuffled ESD, which
scales with c², and ``weightwatcher`` normalises the eigenvalues to mean 1; α is a power-law
exponent, unchanged when every eigenvalue is multiplied by c². So a count that *changes* under
rescaling would be a bug, and the informative rows are the Gaussian ones (same norm, no structure:
expected 0 traps) and the correlation of ‖W‖ with trap counts across checkpoints of a run, where
the norm does change.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import stats

from lenslab.interp.common import Table, check_scales
from lenslab.interp.spectral.adapter import extract_matrices
from lenslab.interp.spectral.errors import SpectralError
from lenslab.interp.spectral.htsr import htsr_alpha
from lenslab.interp.spectral.shuffle import make_generator
from lenslab.interp.spectral.traps import detect_traps


def norm_matched_gaussian(w: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """A matrix of ``w``'s shape and dtype with i.i.d. N(0, 1) entries (drawn from ``make_generator(seed)``),
    rescaled to ``w``'s Frobenius norm exactly."""
    g = torch.randn(w.shape, generator=make_generator(seed), dtype=torch.float64)
    return (g * (w.double().norm() / g.norm())).to(w.dtype)


def rescale_control(
    source,
    scales=(0.5, 1.0, 2.0),
    mode: str = "robust",
    seed: int = 0,
    n_shuffles: int = 1,
    gaussian: bool = True,
    matrices: list[str] | None = None,
) -> Table:
    """Rows ``{matrix, scale, frobenius_norm, n_traps, n_traps_mean, n_traps_std, alpha, lambda_max, threshold}``.

    ``source``: anything ``extract_matrices`` reads (a model, a state dict, a run directory, a checkpoint).
    ``scale`` is a number for the rescaled matrix, or ``"gaussian"`` for the norm-matched Gaussian
    (seed ``seed``; its ``n_traps`` is 0 unless noise crosses the TW threshold, about 2·10⁻⁴ per matrix).
    ``matrices`` limits the rows to those names (all by default).
    """
    scales = check_scales(scales, SpectralError)
    found = extract_matrices(source).matrices
    if matrices is not None:
        missing = [m for m in matrices if m not in found]
        if missing:
            raise SpectralError(f"matrices {missing} are not in the model; it has {list(found)}")
        found = {k: found[k] for k in matrices}
    rows = Table()
    for name, w in found.items():
        variants = [(c, w * c) for c in scales]
        if gaussian:
            variants.append(("gaussian", norm_matched_gaussian(w, seed)))
        for label, m in variants:
            r = detect_traps(m, name, mode=mode, seed=seed, n_shuffles=n_shuffles, details=False)
            if r.error:
                raise SpectralError(r.error)
            rows.append(
                {
                    "matrix": name,
                    "scale": label,
                    "frobenius_norm": float(m.double().norm()),
                    "n_traps": r.n_traps,
                    "n_traps_mean": r.n_traps_mean,
                    "n_traps_std": r.n_traps_std,
                    "alpha": htsr_alpha(m, name).alpha,
                    "lambda_max": r.lambda_max,
                    "threshold": r.threshold,
                }
            )
    return rows


def norm_trap_correlation(rows, norm_key: str = "weight_norm", trap_key: str = "traps_total") -> dict:
    """Spearman's ρ between ``rows[norm_key]`` and ``rows[trap_key]`` (rows with both finite), with its p-value.

    ``{"rho", "p", "n"}``; ρ is NaN (with ``"reason"``) when fewer than 3 rows or either column is constant.
    """
    pairs = [
        (float(r[norm_key]), float(r[trap_key]))
        for r in rows
        if r.get(norm_key) is not None
        and r.get(trap_key) is not None
        and math.isfinite(float(r[norm_key]))
        and math.isfinite(float(r[trap_key]))
    ]
    n = len(pairs)
    if n < 3:
        return {"rho": math.nan, "p": math.nan, "n": n, "reason": f"{n} rows with both {norm_key} and {trap_key}; need 3"}
    a, b = np.array(pairs).T
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        const = norm_key if np.ptp(a) == 0 else trap_key
        return {"rho": math.nan, "p": math.nan, "n": n, "reason": f"{const} is constant over the rows"}
    res = stats.spearmanr(a, b)
    return {"rho": float(res.statistic), "p": float(res.pvalue), "n": n}
