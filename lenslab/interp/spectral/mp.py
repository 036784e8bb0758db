"""Marchenko–Pastur law and Tracy–Widom edge scale for X = WᵀW/N (W is N×M, N ≥ M, Q = N/M).

For i.i.d. entries of variance σ², the eigenvalues of X follow, as N, M → ∞ at fixed Q ≥ 1,

    ρ(λ) = Q / (2π σ² λ) · √((λ₊ − λ)(λ − λ₋)),   λ± = σ² (1 ± 1/√Q)²,

which integrates to 1 on [λ₋, λ₊]. The largest eigenvalue fluctuates on the Tracy–Widom scale
(Johnstone 2001, with A = W/σ and l₁ the top eigenvalue of AᵀA):

    (l₁ − μ) / s → TW₁,   μ = (√(N−1) + √M)²,   s = (√(N−1) + √M) · (1/√(N−1) + 1/√M)^(1/3).
"""

from __future__ import annotations

import math

import numpy as np


def mp_edges(q: float, sigma2: float) -> tuple[float, float]:
    """``(λ₋, λ₊)`` for aspect ratio ``q = N/M ≥ 1`` and entry variance ``sigma2``."""
    r = 1.0 / math.sqrt(q)
    return sigma2 * (1.0 - r) ** 2, sigma2 * (1.0 + r) ** 2


def mp_density(x: np.ndarray | float, q: float, sigma2: float = 1.0) -> np.ndarray:
    """The MP density ρ(x) above (0 outside [λ₋, λ₊]); ``q = N/M ≥ 1``."""
    x = np.asarray(x, dtype=float)
    lo, hi = mp_edges(q, sigma2)
    inside = (x > lo) & (x < hi) & (x > 0)
    out = np.zeros_like(x)
    xi = x[inside]
    out[inside] = q / (2 * math.pi * sigma2 * xi) * np.sqrt((hi - xi) * (xi - lo))
    return out


def tw_center_scale(n: int, m: int, sigma2: float) -> tuple[float, float]:
    """Johnstone's centre and scale of the top eigenvalue of X = WᵀW/N, in X's units."""
    a, b = math.sqrt(max(n - 1, 1)), math.sqrt(m)
    mu = (a + b) ** 2
    s = (a + b) * (1.0 / a + 1.0 / b) ** (1.0 / 3.0)
    return sigma2 * mu / n, sigma2 * s / n
