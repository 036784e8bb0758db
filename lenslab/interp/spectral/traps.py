"""Correlation traps of one 2-D weight matrix: outliers of the ESD of its entry-shuffled copy.

Definitions (W is the matrix as given; it is transposed if needed so that N ≥ M, Q = N/M):

- ``W_rand``: one seeded permutation of all entries of W (``shuffle.shuffle``).
- eigenvalues λ₁ ≥ … ≥ λ_M of X = W_randᵀ W_rand / N (float64).
- a *trap* is an eigenvalue above ``threshold``. Two ways to set it:

  ``robust`` (default): σ² is fitted on the bulk only. Start from σ² = median(λ)/median_MP(Q)
  (insensitive to a few outliers); then repeat: threshold = Johnstone's TW centre + ``tw_c`` TW
  scales (see ``mp.tw_center_scale``), σ² = mean of the eigenvalues at or below it (the MP mean
  is σ²), until the set of outliers stops changing. ``tw_c = 4`` puts the threshold where the
  TW₁ tail probability is ≈ 2·10⁻⁴ (TW₁'s 99 % point is 2.02), so a pure-noise matrix is
  flagged rarely even with σ² estimated. Each shuffle is fitted on its own; a trap is counted
  once; with ``n_shuffles > 1`` the row reports the mean and spread of the counts.

  ``weightwatcher``: WeightWatcher 0.7.7's rules (``ww.ww_fit``), including its pooling of 5
  shuffles when M < 100 (so one real trap there counts ≈ 5 times, as in WeightWatcher).

Per trap (eigenvector v of X, singular value s = √(λN), u = W_rand v / s), its localization:
``ipr`` = Σ vᵢ⁴; ``q_loc`` = (M·IPR − 1)/(M − 1) (0 for a flat vector, 1 for a basis vector);
``top5_mass`` = share of ‖s u vᵀ‖²_F on the positions of the top 5 % of |W_rand| (≈ 0.05 if
unrelated); ``top_sv_overlap`` = ‖U_kᵀ C V_k‖_F / ‖C‖_F, with C the component mapped back through
the inverse permutation and U_k, V_k the top k = min(5, M) singular vectors of the original W.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from lenslab.interp.spectral.errors import SpectralError
from lenslab.interp.spectral.mp import mp_density, mp_edges, tw_center_scale
from lenslab.interp.spectral.shuffle import make_generator, random_permutation, shuffle, unshuffle
from lenslab.interp.spectral.ww import ww_fit

MODES = ("robust", "weightwatcher")
MIN_DIM = 2  # a 1×M matrix has a single eigenvalue, which is its own bulk: nothing to fit
WW_POOL_BELOW = 100  # WeightWatcher pools 5 shuffles when M < 100
WW_POOL = 5


@dataclass
class TrapRow:
    """One matrix's result (one row of the tidy table); ``error`` is set instead of a crash."""

    name: str
    N: int
    M: int
    Q: float
    mode: str
    seed: int
    n_shuffles: int
    sigma: float = math.nan  # fitted entry std, in X = WᵀW/N units (λ± = σ²(1 ± 1/√Q)²)
    sigma_normalized: float = math.nan  # σ for eigenvalues rescaled to mean 1 (WeightWatcher's sigma)
    lambda_plus: float = math.nan
    threshold: float = math.nan
    tw_allowance: float = math.nan  # threshold − λ₊
    lambda_max: float = math.nan
    n_traps: int = 0  # of the first shuffle (pooled replicas in weightwatcher mode for M < 100)
    n_traps_mean: float = 0.0
    n_traps_std: float = 0.0
    n_traps_per_shuffle: list[int] = field(default_factory=list)
    trap_eigenvalues: list[float] = field(default_factory=list)
    largest_over_lambda_plus: float = math.nan
    traps: list[dict] = field(default_factory=list)
    error: str | None = None

    def to_record(self) -> dict:
        return asdict(self)


@dataclass
class TrapComponent:
    """The rank-1 component s·u vᵀ of one trap in W_rand, with the permutation that made W_rand."""

    s: float
    u: Tensor  # [rows of W_rand]  (in W's orientation, not the transposed one)
    v: Tensor  # [cols of W_rand]
    perm: Tensor
    shape: tuple[int, int]

    def in_shuffled(self) -> Float[Tensor, "n m"]:
        return self.s * torch.outer(self.u, self.v)

    def in_original(self) -> Float[Tensor, "n m"]:
        """The component mapped back through the inverse permutation (W's coordinates)."""
        return unshuffle(self.in_shuffled(), self.perm)


def to_records(rows) -> list[dict]:
    """Rows (``TrapRow`` or dicts) as plain dicts."""
    return [r.to_record() if isinstance(r, TrapRow) else dict(r) for r in rows]


def _mp_median(q: float) -> float:
    """Median of the MP law with σ² = 1 (numerical, on a cosine grid that resolves the edges)."""
    lo, hi = mp_edges(q, 1.0)
    theta = np.linspace(0, np.pi, 4001)
    x = lo + (hi - lo) * (1 - np.cos(theta)) / 2
    cdf = np.concatenate([[0.0], np.cumsum(np.diff(x) * (mp_density(x[1:], q) + mp_density(x[:-1], q)) / 2)])
    return float(np.interp(0.5, cdf / cdf[-1], x))


def robust_fit(evals: np.ndarray, n: int, m: int, tw_c: float = 4.0, max_iter: int = 50) -> dict:
    """Bulk-only MP fit of eigenvalues of X = WᵀW/N (see the module docstring)."""
    q = n / m
    sigma2 = float(np.median(evals)) / _mp_median(q)
    if not sigma2 > 0:
        sigma2 = float(np.mean(evals))
    prev = None
    for _ in range(max_iter):
        centre, scale = tw_center_scale(n, m, sigma2)
        threshold = centre + tw_c * scale
        bulk = evals <= threshold
        if prev is not None and np.array_equal(bulk, prev):
            break
        prev = bulk
        if bulk.any() and np.mean(evals[bulk]) > 0:
            sigma2 = float(np.mean(evals[bulk]))
    centre, scale = tw_center_scale(n, m, sigma2)
    return {"sigma2": sigma2, "lambda_plus": mp_edges(q, sigma2)[1], "threshold": centre + tw_c * scale}


def _oriented(w_rand: Tensor) -> tuple[Tensor, bool]:
    return (w_rand, False) if w_rand.shape[0] >= w_rand.shape[1] else (w_rand.T, True)


def shuffled_eigenvalues(w_rand: Float[Tensor, "n m"]) -> np.ndarray:
    """Ascending eigenvalues of X = AᵀA/N, A = W_rand oriented so that N ≥ M."""
    a, _ = _oriented(w_rand)
    return torch.linalg.eigvalsh(a.T @ a / a.shape[0]).numpy()


def _components(w_rand: Tensor, perm: Tensor, threshold: float) -> list[TrapComponent]:
    a, transposed = _oriented(w_rand)
    n = a.shape[0]
    lam, vecs = torch.linalg.eigh(a.T @ a / n)
    out = []
    for i in torch.nonzero(lam > threshold).flatten().flip(0).tolist():
        s = math.sqrt(float(lam[i]) * n)
        v = vecs[:, i]
        u = a @ v / s
        if transposed:
            u, v = v, u
        out.append(TrapComponent(s=s, u=u, v=v, perm=perm, shape=tuple(w_rand.shape)))
    return out


def _localization(w: Tensor, w_rand: Tensor, comps: list[TrapComponent], lam_plus: float) -> list[dict]:
    if not comps:
        return []
    k5 = max(1, math.ceil(0.05 * w_rand.numel()))
    top5 = torch.zeros(w_rand.numel(), dtype=torch.bool)
    top5[torch.topk(w_rand.abs().reshape(-1), k5).indices] = True
    top5 = top5.reshape(w_rand.shape)
    a, transposed = _oriented(w)
    lam, vecs = torch.linalg.eigh(a.T @ a)
    k = min(5, a.shape[1])
    v_top = vecs[:, -k:]
    u_top = a @ v_top / lam[-k:].clamp_min(1e-300).sqrt()
    if transposed:
        u_top, v_top = v_top, u_top
    m = min(w.shape)
    rows = []
    for c in comps:
        small = c.v if w_rand.shape[0] >= w_rand.shape[1] else c.u  # the length-M vector
        ipr = float((small**4).sum() / (small**2).sum() ** 2)
        cs = c.in_shuffled()
        co = c.in_original()
        lam_c = c.s**2 / max(w.shape)
        rows.append(
            {
                "eigenvalue": lam_c,
                "over_lambda_plus": lam_c / lam_plus,
                "ipr": ipr,
                "q_loc": (m * ipr - 1) / (m - 1),
                "top5_mass": float((cs[top5] ** 2).sum() / (cs**2).sum()),
                "top_sv_overlap": float(torch.linalg.norm(u_top.T @ co @ v_top) / torch.linalg.norm(co)),
            }
        )
    return rows


def _trial(w: Tensor, perms: list[Tensor], mode: str, tw_c: float, details: bool):
    """One fit: one shuffle (robust) or WeightWatcher's 1 or 5 pooled shuffles."""
    n, m = max(w.shape), min(w.shape)
    shuffled = [shuffle(w, p) for p in perms]
    evals = np.concatenate([shuffled_eigenvalues(wr) for wr in shuffled])
    if mode == "robust":
        fit = robust_fit(evals, n, m, tw_c)
        sigma2, lam_plus, thr = fit["sigma2"], fit["lambda_plus"], fit["threshold"]
        sigma_norm = math.sqrt(sigma2 / np.mean(evals))
    else:
        fit = ww_fit(evals, n / m, m)
        sc = fit["scale"]
        sigma2, lam_plus, thr, sigma_norm = fit["sigma"] ** 2 * sc, fit["lambda_plus"] * sc, fit["threshold"] * sc, fit["sigma"]
    trap_evals = sorted((float(x) for x in evals[evals > thr]), reverse=True)
    comps, loc = [], []
    if details and trap_evals:
        for wr, p in zip(shuffled, perms):
            comps += _components(wr, p, thr)
        comps.sort(key=lambda c: -c.s)
        loc = _localization(w, shuffled[0], comps, lam_plus) if len(perms) == 1 else _pooled_loc(w, shuffled, comps, lam_plus)
    return {
        "sigma2": sigma2,
        "sigma_norm": sigma_norm,
        "lambda_plus": lam_plus,
        "threshold": thr,
        "lambda_max": float(evals.max()),
        "trap_evals": trap_evals,
        "comps": comps,
        "loc": loc,
    }


def _pooled_loc(w, shuffled, comps, lam_plus):
    out = []
    for c in comps:
        wr = shuffle(w, c.perm)
        out += _localization(w, wr, [c], lam_plus)
    return out


def check_matrix(w, name: str = "W") -> Tensor:
    """``w`` as a float64 2-D tensor, or a ``SpectralError`` naming what is wrong with it."""
    if isinstance(w, np.ndarray):
        w = torch.from_numpy(w)
    if not isinstance(w, Tensor):
        raise SpectralError(f"{name}: expected a 2-D tensor, got {type(w).__name__}")
    if w.ndim != 2:
        raise SpectralError(
            f"{name}: expected a 2-D matrix, got shape {tuple(w.shape)}; pass 2-D matrices (see interp.spectral.adapter)"
        )
    if min(w.shape) < MIN_DIM:
        raise SpectralError(
            f"{name}: shape {tuple(w.shape)} is too small (min(N, M) < {MIN_DIM}): a 1×M matrix has no bulk to fit"
        )
    if not (w.is_floating_point() or w.is_complex()) or w.is_complex():
        raise SpectralError(f"{name}: dtype {w.dtype} is not a real floating-point type")
    w = w.detach().to("cpu", torch.float64)
    if not torch.isfinite(w).all():
        bad = int((~torch.isfinite(w)).sum())
        raise SpectralError(f"{name}: {bad} NaN/inf entries; fix or exclude this matrix")
    return w


def detect_traps(
    w: Any,  # a 2-D float matrix; anything else gives an error row, not an exception
    name: str = "W",
    mode: str = "robust",
    seed: int = 0,
    n_shuffles: int = 1,
    tw_c: float = 4.0,
    perms: list[Int[Tensor, " nm"]] | None = None,
    details: bool = True,
    return_components: bool = False,
):
    """Trap row for one matrix (an error row, not an exception, for NaN/inf or too-small input).

    ``perms`` overrides the seeded permutations (one per shuffle; in ``weightwatcher`` mode with
    M < 100, 5 per shuffle). With ``return_components`` also returns the first shuffle's
    ``TrapComponent``s (for the JSD ablation).
    """
    if mode not in MODES:
        raise SpectralError(f"mode={mode!r} is not one of {MODES}")
    if isinstance(n_shuffles, bool) or not isinstance(n_shuffles, int) or n_shuffles < 1:
        raise SpectralError(f"n_shuffles={n_shuffles!r} must be an integer >= 1")
    shape = tuple(getattr(w, "shape", ()))
    n, m = (max(shape), min(shape)) if len(shape) == 2 else (0, 0)
    row = TrapRow(name=name, N=n, M=m, Q=n / m if m else math.nan, mode=mode, seed=seed, n_shuffles=n_shuffles)
    try:
        w = check_matrix(w, name)
    except SpectralError as e:
        row.error = str(e)
        return (row, []) if return_components else row
    per = WW_POOL if mode == "weightwatcher" and m < WW_POOL_BELOW else 1
    gen = make_generator(seed)
    counts, first = [], None
    for t in range(n_shuffles):
        if perms is not None:
            ps = list(perms[t * per : (t + 1) * per])
            if len(ps) != per:
                raise SpectralError(f"{name}: perms holds {len(perms)} permutations; {per * n_shuffles} needed")
        else:
            ps = [random_permutation(w.numel(), gen) for _ in range(per)]
        res = _trial(w, ps, mode, tw_c, details=details and t == 0)
        counts.append(len(res["trap_evals"]))
        first = first or res
    row.sigma = math.sqrt(first["sigma2"])
    row.sigma_normalized = first["sigma_norm"]
    row.lambda_plus = first["lambda_plus"]
    row.threshold = first["threshold"]
    row.tw_allowance = first["threshold"] - first["lambda_plus"]
    row.lambda_max = first["lambda_max"]
    row.n_traps = counts[0]
    row.n_traps_per_shuffle = counts
    row.n_traps_mean = float(np.mean(counts))
    row.n_traps_std = float(np.std(counts))
    row.trap_eigenvalues = first["trap_evals"]
    row.largest_over_lambda_plus = first["trap_evals"][0] / first["lambda_plus"] if counts[0] else math.nan
    row.traps = first["loc"]
    return (row, first["comps"]) if return_components else row
