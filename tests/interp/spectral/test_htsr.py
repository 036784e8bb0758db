"""HTSR α (``interp.spectral.htsr``) against independent references: a matrix built with a known
power-law spectrum, a brute-force loop over xmin candidates, and WeightWatcher 0.7.7 where installed."""

from __future__ import annotations

import json
import logging
import math
import re

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from lenslab.interp.spectral import (
    AlphaFit,
    alpha_table,
    fit_power_law,
    format_traps_table,
    htsr_alpha,
    trap_count_figure,
    traps_command,
)
from lenslab.interp.spectral.htsr import EVALS_THRESH, MIN_TAIL, SMALL_N, SMALL_N_K_MIN
from lenslab.interp.spectral.run import trap_counts_over_run


def orthonormal(n: int, m: int, g: torch.Generator) -> torch.Tensor:
    """n × m with orthonormal columns (QR of a Gaussian matrix)."""
    q, r = torch.linalg.qr(torch.randn(n, m, generator=g, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def with_spectrum(evals: torch.Tensor, n: int, seed: int = 0) -> torch.Tensor:
    """W = U diag(√λ) Vᵀ with random orthonormal U (n × M) and V (M × M): WᵀW has eigenvalues ``evals``."""
    g = torch.Generator().manual_seed(seed)
    m = len(evals)
    return orthonormal(n, m, g) @ torch.diag(evals.sqrt()) @ orthonormal(m, m, g).T


def pareto(m: int, a: float, seed: int) -> torch.Tensor:
    """m draws of a Pareto law with density ∝ λ^(−a) on λ ≥ 1 (inverse CDF: λ = (1 − u)^(−1/(a − 1)))."""
    u = torch.rand(m, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (1 - u) ** (-1 / (a - 1))


# --- (1) a known power law --------------------------------------------------------------------


@pytest.mark.parametrize("a", [2.0, 3.0, 4.0])
def test_recovers_a_known_power_law_exponent(a):
    evals = pareto(1000, a, seed=int(10 * a))
    fit = htsr_alpha(with_spectrum(evals, 1500, seed=1))
    assert fit.reason is None and fit.n_evals == 1000 and fit.n_tail >= 50
    # The MLE at a fixed xmin has standard error (a − 1)/√n_tail; choosing xmin by KS adds a little
    # selection, so we allow 4 standard errors (a normal deviate beyond ±4 has probability 6e-5).
    # Across CPUs the eigenvalues move by ~1e-13 relative, far below this.
    assert abs(fit.alpha - a) < 4 * (a - 1) / math.sqrt(fit.n_tail)
    assert fit.stderr == pytest.approx((fit.alpha - 1) / math.sqrt(fit.n_tail))
    # the matrix path (eigvalsh of WᵀW) and the eigenvalues themselves give the same fit
    direct = fit_power_law(evals)
    assert fit.n_tail == direct.n_tail  # same xmin candidate
    assert fit.alpha == pytest.approx(direct.alpha, rel=1e-9)  # eigvalsh rounding (~1e-13 relative), any CPU


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_matrix_is_fitted_on_its_gpu_and_agrees_with_the_cpu():
    w = with_spectrum(pareto(500, 3.0, seed=3), 800, seed=2)
    cpu, gpu = htsr_alpha(w), htsr_alpha(w.cuda())
    # both are float64 eigvalsh of the same WᵀW (LAPACK vs cuSOLVER, ~1e-13 relative apart): same xmin, α to 1e-9
    assert gpu.n_tail == cpu.n_tail and gpu.alpha == pytest.approx(cpu.alpha, rel=1e-9)


# --- (2) the xmin / KS choice against a brute-force loop --------------------------------------


def brute_force(evals: list[float]) -> tuple[float, float, float, int]:
    """WeightWatcher 0.7.7's WWFit rules, one candidate at a time in plain Python: ``(alpha, xmin, D, n_tail)``."""
    x = sorted(v for v in evals if v > EVALS_THRESH)
    n = len(x)
    small = n < SMALL_N
    best = None
    for i in range(n - 1):
        tail = x[i:]
        k = len(tail)
        s = sum(math.log(v / x[i]) for v in tail)
        if (small and k < SMALL_N_K_MIN) or s <= 1e-12:
            continue
        alpha = 1 + (k - 1 if small else k) / s
        d = max(abs(1 - (v / x[i]) ** (1 - alpha) - j / k) for j, v in enumerate(tail))
        if best is None or d < best[2]:  # strict: the first of equal distances wins, as np.argmin
            best = (alpha, x[i], d, k)
    return best


@pytest.mark.parametrize(
    "evals",
    [
        [float(v) for v in np.random.default_rng(0).lognormal(0.0, 1.5, size=60)],  # standard branch
        [float(v) for v in np.random.default_rng(1).pareto(2.0, size=40) + 1.0],
        [1e-7, 0.5, 0.5, 0.5, 0.7, 0.9, 1.3, 1.3, 2.0, 3.5, 3.5, 4.0, 9.0, 20.0, 20.0, 41.0, 80.0]
        * 2,  # duplicates, one below the cut
        [float(v) for v in np.random.default_rng(2).lognormal(0.0, 1.0, size=15)],  # small-N branch (< 20 eigenvalues)
    ],
)
def test_xmin_and_ks_match_a_brute_force_loop(evals):
    alpha, xmin, d, n_tail = brute_force(evals)
    fit = fit_power_law(evals, min_tail=2)
    # vectorised (exp/log of differences, summed in blocks) vs scalar Python: rounding only, any CPU
    assert fit.xmin == xmin and fit.n_tail == n_tail
    assert fit.alpha == pytest.approx(alpha, rel=1e-12)
    assert fit.ks_distance == pytest.approx(d, rel=1e-9, abs=1e-12)


# --- (3) degenerate input: NaN and a reason, never an exception ---------------------------------


def _rank(r: int, n: int = 100, m: int = 10) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, r, generator=g, dtype=torch.float64) @ torch.randn(r, m, generator=g, dtype=torch.float64)


@pytest.mark.parametrize(
    "w,match",
    [
        (orthonormal(200, 50, torch.Generator().manual_seed(0)), "equal to rounding"),  # all eigenvalues 1
        (torch.zeros(64, 32), "only 0 eigenvalue"),
        (_rank(1), "only 1 eigenvalue"),
        (_rank(5), "tail of ≥ 8"),  # 5 eigenvalues above the cut: WW's small-N branch has no candidate
        (torch.randn(100, 5), "min\\(N, M\\) = 5 < 8"),
        (torch.full((30, 20), float("nan")), "NaN/inf"),
        (torch.randn(4, 8, 8), "2-D"),
        (torch.ones(20, 20, dtype=torch.int64), "dtype"),
        ("not a tensor", "2-D"),
    ],
)
def test_degenerate_input_gives_nan_and_a_reason(w, match):
    fit = htsr_alpha(w, "W")
    assert isinstance(fit, AlphaFit) and math.isnan(fit.alpha)
    assert fit.reason is not None
    assert re.search(match, fit.reason), fit.reason


def test_a_tail_too_short_is_nan_with_the_value_it_would_have_had():
    evals = pareto(1000, 3.0, seed=30)
    full = fit_power_law(evals)
    short = fit_power_law(evals, min_tail=full.n_tail + 1)
    assert math.isnan(short.alpha) and f"holds {full.n_tail} eigenvalues" in short.reason and f"{full.alpha:.3g}" in short.reason
    assert short.xmin == full.xmin and short.n_tail == full.n_tail  # what was chosen is still reported
    assert MIN_TAIL >= 2


# --- where α shows up: the tidy table, lenslab traps, the run rows, the figure ------------------


def test_alpha_table_and_traps_output(run_dir, modadd_kwargs):
    from lenslab.training.presets import build_model

    table = alpha_table(build_model(modadd_kwargs, seed=0))
    assert [r["matrix"] for r in table][:2] == ["embed.W_E", "blocks.0.attn.W_Q"]
    assert all(r["alpha"] > 1 and r["alpha_reason"] is None for r in table), table
    res = traps_command(run_dir, progress=False)
    rows = res["checkpoints"][-1]["matrices"]
    w_in = next(r for r in rows if r["name"] == "blocks.0.mlp.W_in")
    for key in ("alpha", "ks", "xmin", "n_tail", "n_evals", "alpha_reason"):
        assert key in w_in
    assert w_in["alpha"] > 1 and 0 < w_in["ks"] < 1
    text = format_traps_table(res)
    assert " alpha " in text and " ks" in text
    json.dumps(res)
    over = trap_counts_over_run(run_dir)
    assert all("alpha" in r and "ks" in r for r in over)
    fig = trap_count_figure(over.to_records())
    assert isinstance(fig, go.Figure) and any(t.name == "blocks.0.mlp.W_in α" for t in fig.data)
    assert any(s.get("y0") == 2 for s in fig.to_plotly_json()["layout"]["shapes"])  # the α = 2 line


# --- (4) against WeightWatcher 0.7.7 itself ----------------------------------------------------


def ww_alphas(mats: dict[str, torch.Tensor]):
    ww = pytest.importorskip("weightwatcher")
    logging.getLogger("weightwatcher").setLevel(logging.ERROR)
    layers = []
    for w in mats.values():
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        with torch.no_grad():
            lin.weight.copy_(w)
        layers.append(lin)
    return ww.WeightWatcher(model=torch.nn.Sequential(*layers)).analyze()


def test_matches_weightwatcher_077():
    pytest.importorskip("weightwatcher")
    g = torch.Generator().manual_seed(0)
    mats = {
        f"gauss{s}": torch.randn(*s, generator=g) / s[1] ** 0.5
        for s in [(768, 2304), (768, 768), (3072, 768), (512, 128), (114, 128)]
    }
    mats |= {f"small{s}": torch.randn(*s, generator=g) for s in [(200, 15), (64, 10)]}  # < 20 eigenvalues: WW's small-N branch
    mats |= {f"pareto{a}": with_spectrum(pareto(400, a, seed=int(a)), 600, seed=2).float() for a in (2.0, 3.0, 5.0)}
    mats |= {f"student{df}": torch.distributions.StudentT(df).sample((512, 256)).float() for df in (2.0, 3.0)}
    df = ww_alphas(mats)
    assert len(df) == len(mats)
    for (name, w), (_, ref) in zip(mats.items(), df.iterrows()):
        fit = htsr_alpha(w, name, min_tail=2)  # WW reports α for any tail; so do we with min_tail=2
        # WW: scipy SVD of the float64 matrix; we: eigvalsh(WᵀW). The eigenvalues differ by ~1e-13
        # relative (measured: |Δα| ≤ 5e-13 on these matrices); 1e-9 leaves room for other CPUs/BLAS.
        assert fit.alpha == pytest.approx(float(ref["alpha"]), rel=1e-9), name
        assert fit.xmin == pytest.approx(float(ref["xmin"]), rel=1e-9), name
        assert fit.ks_distance == pytest.approx(float(ref["D"]), abs=1e-9), name
        assert fit.n_tail == int(ref["num_pl_spikes"]), name
