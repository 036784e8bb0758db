"""Cross-check ``mode="weightwatcher"`` against WeightWatcher 0.7.7 itself on the same permutations.

WeightWatcher shuffles with ``np.random.shuffle`` (global, unseeded). We hand it our permutations
by patching that function for the duration of ``analyze``: its first calls (the 1 or 5 shuffles
of ``random_eigenvalues`` whose ESD it fits) apply our permutations; later calls (its
``rand_distance`` column) fall back to numpy's shuffle.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from spectral_helpers import planted

from lenslab.interp.spectral import detect_traps, make_generator, random_permutation

ww = pytest.importorskip("weightwatcher")


def ww_row(w: torch.Tensor, perms: list[torch.Tensor], monkeypatch):
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    with torch.no_grad():
        lin.weight.copy_(w)
    pending = iter(perms)
    real = np.random.shuffle

    def ours(x):
        p = next(pending, None)
        if p is None:
            return real(x)
        x[:] = x[p.numpy()]

    logging.getLogger("weightwatcher").setLevel(logging.ERROR)
    monkeypatch.setattr(np.random, "shuffle", ours)
    df = ww.WeightWatcher(model=torch.nn.Sequential(lin)).analyze(randomize=True, plot=False)
    monkeypatch.setattr(np.random, "shuffle", real)
    assert len(df) == 1
    return df.iloc[0]


@pytest.mark.parametrize(
    "shape,spikes",
    [
        ((512, 128), [40.0, 30.0, 25.0]),  # M >= 100: one shuffle
        ((128, 512), [30.0]),  # wide matrix
        ((200, 60), [20.0, 15.0]),  # M < 100: WeightWatcher pools 5 shuffles
        ((128, 14), [12.0]),  # the modadd W_E shape
        ((64, 64), [15.0]),  # Q = 1: quarter-circle fit
        ((300, 120), []),  # no traps
    ],
)
def test_matches_weightwatcher_077(shape, spikes, monkeypatch):
    w = planted(*shape, spikes, seed=3).float()
    per = 5 if min(shape) < 100 else 1
    gen = make_generator(7)
    perms = [random_permutation(w.numel(), gen) for _ in range(per)]
    ref = ww_row(w, perms, monkeypatch)
    row = detect_traps(w, mode="weightwatcher", perms=perms)
    assert row.n_traps == int(ref["rand_num_spikes"])
    # different routines (WeightWatcher's numpy/scipy SVD vs our eigvalsh) sum in other orders; rel 1e-6 sits far
    # above float64 rounding on any CPU and absorbs a float32 step anywhere in WeightWatcher's path
    assert row.sigma_normalized == pytest.approx(float(ref["rand_sigma_mp"]), rel=1e-6)
    # WeightWatcher's eigenvalues are those of WᵀW (no 1/N): λ₊ in its units is ours times N
    assert row.lambda_plus * row.N == pytest.approx(float(ref["rand_bulk_max"]), rel=1e-6)
