"""WeightWatcher 0.7.7's Marchenko–Pastur fit of a (shuffled) ESD, re-implemented from its rules.

The rules (``RMT_Util.fit_density_with_range`` / ``resid_mp`` and ``WeightWatcher.mp_fit``):

1. Normalise the eigenvalues to mean 1 (``to_plot = λ · n / Σλ``).
2. For Q == 1 fit the singular values ``√λ`` to a quarter circle, otherwise fit ``λ`` to MP.
3. Kernel density: linear (triangular) kernel, bandwidth 0.1, on 1000 points in
   ``[0, max + 0.5]``; points with density ≤ 0.01 are dropped (and count 0 in the residual).
4. σ is found by ``scipy.optimize.brute`` (grid 0.05·s₀ … 2·s₀ step 0.01·s₀ with
   ``s₀ = √(max λ)/(1 + 1/√Q)``, then a Nelder–Mead polish) of Σ (ρ_MP(x; σ) − kde(x))²;
   an MP edge outside the KDE's support or on the wrong side of its peak costs 1000 per point.
5. λ₊ = (σ(1 + 1/√Q))², TW = Q^(−1/2) · λ₊^(2/3) · M^(−2/3), threshold λ₊ + √TW,
   spikes = #{to_plot > threshold}.

WeightWatcher recomputes the KDE for every σ it tries; we compute it once (same numbers).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import optimize

BANDWIDTH = 0.1
KDE_POINTS = 1000
KDE_FLOOR = 0.01


def linear_kde(samples: np.ndarray, grid: np.ndarray, bw: float = BANDWIDTH) -> np.ndarray:
    """sklearn's ``KernelDensity(kernel="linear")``: (1/(n·h)) Σ max(0, 1 − |x − xᵢ|/h)."""
    out = np.zeros_like(grid)
    xs = np.sort(samples)
    # only samples within h of a grid point contribute; chunk to bound memory
    for i in range(0, len(grid), 200):
        g = grid[i : i + 200, None]
        out[i : i + 200] = np.maximum(0.0, 1.0 - np.abs(g - xs[None, :]) / bw).sum(1)
    return out / (len(samples) * bw)


class _Residual:
    """Σ (model − kde)² on the retained KDE points, exactly as WeightWatcher's ``resid_mp``."""

    def __init__(self, to_fit: np.ndarray, q: float):
        self.q = q
        xde = np.linspace(0, np.max(to_fit) + 0.5, KDE_POINTS)
        yde = linear_kde(to_fit, xde)
        good = yde > KDE_FLOOR
        self.n_bad = int((yde < KDE_FLOOR).sum())
        self.x, self.y = xde[good], yde[good]
        self.x_peak = self.x[np.argmax(self.y)] if len(self.y) else 0.0
        self.x_max = self.x.max() if len(self.x) else 0.0

    def __call__(self, p) -> float:
        sigma = float(np.asarray(p).ravel()[0])
        x = self.x
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            # the density is 0 outside the support: clip instead of taking sqrt's nan (whose warning still
            # reached the test log from tests/interp/spectral/test_ray.py), which nan_to_num made the same 0
            if self.q == 1:
                ymp = np.nan_to_num((1 / (np.pi * sigma * sigma)) * np.sqrt(np.clip(4 - x**2, 0, None)))
            else:
                y = 1 / self.q
                b = (sigma * (1 + math.sqrt(y))) ** 2
                a = (sigma * (1 - math.sqrt(y))) ** 2
                if b < self.x_peak or b > self.x_max or a > self.x_peak:
                    return 1000.0**2 * len(x)
                ymp = np.nan_to_num((1 / (2 * np.pi * sigma * sigma * x * y)) * np.sqrt(np.clip((b - x) * (x - a), 0, None)))
        return float(np.sum((ymp - self.y) ** 2))


def ww_fit(evals: np.ndarray, q: float, m: int) -> dict:
    """WeightWatcher's fit of raw eigenvalues ``evals`` (any scale; pooled shuffles allowed).

    Returns ``sigma`` (normalised units), ``lambda_plus`` and ``threshold`` (normalised units),
    ``scale`` (multiply normalised values by it to get ``evals``' units) and ``n_spikes``.
    """
    evals = np.asarray(evals, dtype=float)
    scale = float(np.sum(evals)) / len(evals)
    to_plot = evals / scale
    s0 = math.sqrt(np.max(to_plot) / (1 + 1 / math.sqrt(q)) ** 2)
    to_fit = np.sqrt(to_plot) if q == 1 else to_plot
    resid = _Residual(to_fit, q)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        sigma = optimize.brute(resid, (slice(0.05 * s0, 2.0 * s0, 0.01 * s0),), full_output=True)[0][0]
    lam_plus = (sigma * (1 + 1 / math.sqrt(q))) ** 2
    tw = 1 / math.sqrt(q) * lam_plus ** (2 / 3) * m ** (-2 / 3)
    threshold = lam_plus + math.sqrt(tw)
    return {
        "sigma": float(sigma),
        "lambda_plus": float(lam_plus),
        "threshold": float(threshold),
        "scale": scale,
        "n_spikes": int((to_plot > threshold).sum()),
    }
