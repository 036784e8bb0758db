"""HTSR α: the power-law tail exponent of a weight matrix's eigenvalue spectrum, as WeightWatcher 0.7.7 reports it.

WeightWatcher's ``analyze()`` (defaults: ``pl_package="ww"``, ``fit="power_law"``, no ``xmax``,
no ``fix_fingers``), whose rules this module reproduces, vectorised:

1. Eigenvalues λ = s² of W (squared singular values; no 1/N, no mean-1 rescaling), ascending.
   Matrices with M = min(N, M) < 8 are skipped (``min_evals``).
2. Only λ > 1e-5 (``EVALS_THRESH``, an absolute cut in these units) enter the fit: x₁ ≤ … ≤ x_n.
3. Every xᵢ but the largest is a candidate xmin (duplicates included). With tail size
   n_i = n − i and s_i = Σ_{j≥i} log(x_j / x_i):
   α_i = 1 + n_i / s_i (continuous MLE), and the KS distance
   D_i = max_{j≥i} |1 − (x_j/x_i)^(1−α_i) − (j−i)/n_i|, with D_i = 1 where α_i ≤ 1.
   xmin is the first candidate of least D.
4. Fewer than 20 eigenvalues in the fit (WW's "small N" branch): α_i = 1 + (n_i − 1)/s_i, and only
   tails of ≥ 8 points are candidates. (That branch also ranks candidates by D_i − 0.868/√n_i, but
   ``WWFit.__init__`` then overwrites its choice with the argmin of D_i, so D_i decides.)

Where WeightWatcher returns a number that means nothing, we return NaN and say why (``reason``):
M < 8; fewer than 2 eigenvalues above the cut; all eigenvalues equal to rounding (max/min − 1 <
1e-10; WW's α is then ~1e15 or ∞); fewer than 8 eigenvalues in the small-N branch; or a KS-best
tail of fewer than ``min_tail`` points (α's standard error (α − 1)/√n_tail is then ≥ (α − 1)/2).
A candidate whose tail is flat (s_i ≤ 1e-12, WW's small-N test, applied to both branches) is
never chosen. Everything else agrees with WeightWatcher (see
``tests/interp/spectral/test_htsr.py``). Unlike WW we do not skip N > 50,000 or M > 15,000.

The eigenvalues come from ``eigvalsh(WᵀW)`` in float64 (WW: ``scipy.linalg.svd``), the KS distances
for all candidates at once, in row blocks of a candidates × eigenvalues matrix; a CUDA matrix is
analysed on its GPU (``benchmarks/gpu`` part e times that against WeightWatcher's SVD).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from lenslab.interp.common import Table

EVALS_THRESH = 1e-5  # WW 0.7.7 constants.EVALS_THRESH (CPU): eigenvalues at or below it are not fitted
MIN_EVALS = 8  # WW's default min_evals: a matrix with M < 8 is skipped
SMALL_N = 20  # WW_powerlaw.SMALL_N_CUTOFF: fewer fitted eigenvalues use the small-N branch
SMALL_N_K_MIN = 8  # smallest tail the small-N branch considers
FLAT = 1e-10  # max/min − 1 below this: a flat spectrum (eigvalsh's rounding is ~M·1e-16 relative)
FLAT_TAIL = 1e-12  # Σ log(x_j/x_i) at or below this: a flat tail (WW's small-N branch skips these)
MIN_TAIL = 5  # our floor: a KS-best tail with fewer points gives NaN (WW reports its α anyway)
_BLOCK = 1 << 22  # entries per block of the candidates × eigenvalues matrix (32 MiB in float64)


@dataclass(frozen=True)
class AlphaFit:
    """One matrix's power-law fit of its ESD; ``reason`` is None on success, a sentence when α is NaN.

    ``xmin`` is in WᵀW units (WeightWatcher's). ``n_evals`` counts the eigenvalues the fit saw
    (those above ``EVALS_THRESH``), ``n_tail`` those at or above xmin.
    """

    alpha: float
    xmin: float
    ks_distance: float
    n_tail: int
    n_evals: int
    reason: str | None = None

    @property
    def stderr(self) -> float:
        """Standard error of the MLE α, (α − 1)/√n_tail (WeightWatcher's ``sigma``)."""
        return (self.alpha - 1) / math.sqrt(self.n_tail) if self.n_tail > 0 else math.nan

    def __repr__(self) -> str:
        if math.isnan(self.alpha):
            return f"AlphaFit(alpha=nan: {self.reason}; {self.n_evals} eigenvalues)"
        return (
            f"AlphaFit(alpha={self.alpha:.4g} ± {self.stderr:.2g}, xmin={self.xmin:.4g}, tail {self.n_tail} of "
            f"{self.n_evals} eigenvalues, KS {self.ks_distance:.3g})"
        )

    def _repr_html_(self) -> str:
        """One row: α ± its standard error, xmin, the tail and the KS distance; or why α is NaN."""
        import html

        if math.isnan(self.alpha):
            return f"<div><b>AlphaFit</b>: α = NaN, {html.escape(str(self.reason))} ({self.n_evals} eigenvalues)</div>"
        cells = (
            f"{self.alpha:.4g} ± {self.stderr:.2g}",
            f"{self.xmin:.4g}",
            f"{self.n_tail} of {self.n_evals}",
            f"{self.ks_distance:.3g}",
        )
        head = "".join(f"<th>{h}</th>" for h in ("α", "xmin (WᵀW units)", "tail eigenvalues", "KS distance"))
        return f"<table><tr>{head}</tr><tr>{''.join(f'<td>{c}</td>' for c in cells)}</tr></table>"

    def to_record(self) -> dict:
        return asdict(self)

    @classmethod
    def failed(cls, reason: str, n_evals: int = 0, xmin: float = math.nan, ks: float = math.nan, n_tail: int = 0) -> AlphaFit:
        """α = NaN, with the sentence that says why."""
        return cls(math.nan, xmin, ks, n_tail, n_evals, reason)


def _nan(n_evals: int, reason: str, xmin: float = math.nan, ks: float = math.nan, n_tail: int = 0) -> AlphaFit:
    return AlphaFit.failed(reason, n_evals, xmin, ks, n_tail)


def _fit_device(t: Tensor) -> str:
    """Where α's float64 work runs: on a CUDA tensor's GPU, else on the CPU (MPS has no float64)."""
    return "cuda" if t.device.type == "cuda" else "cpu"


def esd(w: Float[Tensor, "n m"]) -> Float[Tensor, " k"]:  # k = min(n, m)
    """Ascending eigenvalues of WᵀW (W oriented so that N ≥ M), float64: the squared singular values.

    On the matrix's device where that is CUDA (the Gram matrix and ``eigvalsh`` are the whole cost on
    a CPU), on the CPU otherwise (MPS has no float64)."""
    w = w.detach().to(_fit_device(w), torch.float64)
    a = w if w.shape[0] >= w.shape[1] else w.T
    return torch.linalg.eigvalsh(a.T @ a)


def _candidate_fits(x: Tensor, small: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``(alpha, D, objective)`` for every candidate xmin = x[i], i < n − 1 (x ascending, > 0); objective = inf where invalid."""
    n = x.numel()
    logx = x.log()
    k = n - 1
    dev = x.device
    alpha, dist, s_all = (torch.empty(k, dtype=torch.float64, device=dev) for _ in range(3))
    rows = max(1, _BLOCK // n)
    j = torch.arange(n, device=dev)
    for lo in range(0, k, rows):
        i = torch.arange(lo, min(lo + rows, k), device=dev)
        tail = j[None, :] >= i[:, None]  # [c, n]: the points of each candidate's tail
        d = torch.where(tail, logx[None, :] - logx[i][:, None], 0.0)  # log(x_j / x_i) ≥ 0
        n_i = (n - i).to(torch.float64)
        s = d.sum(1)  # summed directly, no cancellation from a cumulative sum
        a = 1 + (n_i - 1 if small else n_i) / s
        f_fit = 1 - torch.exp((1 - a)[:, None] * d)
        f_emp = (j[None, :] - i[:, None]).to(torch.float64) / n_i[:, None]
        gap = torch.where(tail, (f_fit - f_emp).abs(), 0.0)
        alpha[i], dist[i], s_all[i] = a, gap.amax(1), s
    n_i = (n - torch.arange(k, device=dev)).to(torch.float64)
    # s > 0 makes α > 1, so WW's "D = 1 where α ≤ 1" never applies; a flat tail (α ≥ 1e12) is never chosen
    valid = (s_all > FLAT_TAIL) & (n_i >= SMALL_N_K_MIN) if small else (s_all > FLAT_TAIL)
    objective = torch.where(valid, dist, math.inf)
    return alpha, dist, objective


def fit_power_law(evals, min_tail: int = MIN_TAIL) -> AlphaFit:
    """WeightWatcher 0.7.7's power-law fit of eigenvalues ``evals`` (any order; see the module docstring)."""
    x = torch.as_tensor(np.asarray(evals, dtype=np.float64) if not isinstance(evals, Tensor) else evals)
    x = x.detach().to(_fit_device(x), torch.float64).flatten()  # a CUDA ESD is fitted there
    if not torch.isfinite(x).all():
        return _nan(0, f"{int((~torch.isfinite(x)).sum())} eigenvalues are NaN/inf; check the matrix for NaN/inf entries")
    x = x[x > EVALS_THRESH].sort().values
    n = x.numel()
    if n < 2:
        return _nan(n, f"only {n} eigenvalue(s) above {EVALS_THRESH:g}: no tail to fit (the matrix is (nearly) zero or rank < 2)")
    spread = float(x[-1] / x[0]) - 1
    if spread < FLAT:
        return _nan(
            n, f"all {n} eigenvalues are equal to rounding (max/min - 1 = {spread:.2g}): a flat spectrum has no power-law tail"
        )
    small = n < SMALL_N
    alpha, dist, objective = _candidate_fits(x, small)
    if not bool(torch.isfinite(objective).any()):
        need = (
            f"≥ {SMALL_N_K_MIN} eigenvalues (fewer than {SMALL_N} are fitted by WW's small-N rule)"
            if small
            else "2 distinct eigenvalues"
        )
        return _nan(n, f"no xmin candidate has a tail of {need}; {n} eigenvalues lie above {EVALS_THRESH:g}")
    i = int(torch.argmin(objective))  # first minimum, as np.argmin in WW
    xmin, n_tail, ks = float(x[i]), n - i, float(dist[i])
    if n_tail < min_tail:
        return _nan(
            n,
            f"the KS-best tail holds {n_tail} eigenvalues (< {min_tail}): too few for α "
            f"(it would be {float(alpha[i]):.3g} ± {(float(alpha[i]) - 1) / math.sqrt(n_tail):.2g})",
            xmin,
            ks,
            n_tail,
        )
    return AlphaFit(float(alpha[i]), xmin, ks, n_tail, n)


def htsr_alpha(w: Any, name: str = "W", min_tail: int = MIN_TAIL) -> AlphaFit:
    """α of one 2-D matrix; bad input (wrong shape or dtype, NaN/inf, M < 8) gives NaN and a reason, not an exception."""
    if isinstance(w, np.ndarray):
        w = torch.from_numpy(w)
    if not isinstance(w, Tensor) or w.ndim != 2:
        got = f"shape {tuple(w.shape)}" if isinstance(w, Tensor) else type(w).__name__
        return _nan(0, f"{name}: expected a 2-D matrix, got {got}; reshape it to 2-D (see interp.spectral.adapter)")
    if not w.is_floating_point():
        return _nan(0, f"{name}: dtype {w.dtype} is not a real floating-point type")
    m = min(w.shape)
    if m < MIN_EVALS:
        return _nan(m, f"{name}: min(N, M) = {m} < {MIN_EVALS} eigenvalues, too few for a tail fit (WeightWatcher skips it too)")
    if not bool(torch.isfinite(w).all()):
        return _nan(m, f"{name}: {int((~torch.isfinite(w)).sum())} NaN/inf entries; fix or exclude this matrix")
    return fit_power_law(esd(w), min_tail=min_tail)


def alpha_table(
    source, per_head: bool = False, include_pos: bool = False, include_unembed: bool = True, min_tail: int = MIN_TAIL
) -> Table:
    """One row per analysed matrix of ``source`` (model, state dict, run dir, checkpoint; see ``adapter``):
    ``{matrix, N, M, alpha, xmin, ks, n_tail, n_evals, alpha_reason}``. What the adapter skips, and
    why, is in ``extract_matrices(source).skipped``."""
    from lenslab.interp.spectral.adapter import extract_matrices

    ms = extract_matrices(source, per_head=per_head, include_pos=include_pos, include_unembed=include_unembed)
    rows = Table()
    for name, w in ms.matrices.items():
        rows.append({"matrix": name, "N": max(w.shape), "M": min(w.shape), **alpha_record(htsr_alpha(w, name, min_tail))})
    return rows


def alpha_record(fit: AlphaFit) -> dict:
    """The fit as the flat columns ``lenslab traps`` and the tables use: alpha, xmin, ks, n_tail, n_evals, reason."""
    return {
        "alpha": fit.alpha,
        "xmin": fit.xmin,
        "ks": fit.ks_distance,
        "n_tail": fit.n_tail,
        "n_evals": fit.n_evals,
        "alpha_reason": fit.reason,
    }
