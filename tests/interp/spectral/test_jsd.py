"""JSD: definition against scipy, identity replacement, and the trap-replacement ablation."""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.spatial.distance import jensenshannon
from spectral_helpers import P

from lenslab.interp.spectral import js_divergence, trap_jsd
from lenslab.training.presets import build_model


def test_js_divergence_matches_scipy_symmetric_bounded():
    g = torch.Generator().manual_seed(0)
    a, b = 3 * torch.randn(50, 7, generator=g), 3 * torch.randn(50, 7, generator=g)
    ours = js_divergence(a, b)
    p, q = torch.softmax(a.double(), -1).numpy(), torch.softmax(b.double(), -1).numpy()
    ref = np.array([jensenshannon(p[i], q[i]) ** 2 for i in range(50)])  # natural log by default
    # float64 softmax and logs vs scipy's, summed in another order: ~1e-16 per term, 1e-10 for any libm/ISA
    np.testing.assert_allclose(ours.numpy(), ref, atol=1e-10)
    torch.testing.assert_close(ours, js_divergence(b, a))
    assert torch.all(js_divergence(a, a).abs() < 1e-12)
    far = torch.tensor([[50.0, -50.0]]), torch.tensor([[-50.0, 50.0]])
    assert float(js_divergence(*far)) <= math.log(2) + 1e-12
    assert abs(float(js_divergence(*far)) - math.log(2)) < 1e-6


def test_trap_replacement_ablation(modadd_kwargs):
    model = build_model(modadd_kwargs, seed=0)
    with torch.no_grad():  # a huge localized entry in W_U that drives the outputs: residual dim 5 -> class 2
        model.embed.W_E[:, 5] = 3.0
        model.unembed.W_U[5, 2] = 8.0
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tokens = torch.randint(0, P + 1, (64, 3), generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, P, (64,), generator=torch.Generator().manual_seed(2))
    rows = trap_jsd(model, n_probes=128, n_null=10, split=(tokens, labels), matrices=["unembed.W_U"])
    assert len(rows) == 1
    r = rows[0]
    assert 0 <= r.null_mean <= r.null_p95 <= math.log(2)
    assert r.jsd > r.null_p95 and r.harmful
    assert r.accuracy is not None and -1 <= r.accuracy_change <= 1
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # the original is untouched


def test_identity_replacement_gives_zero(modadd_kwargs, monkeypatch):
    """With the replacement W' = W (patched in), every J_k is exactly 0."""
    import lenslab.interp.spectral.jsd as jsd_mod

    model = build_model(modadd_kwargs, seed=0)
    with torch.no_grad():
        model.unembed.W_U[5, 2] = 8.0
    monkeypatch.setattr(jsd_mod, "replacement", lambda w, comp, gen: w.clone())
    rows = trap_jsd(model, n_probes=32, n_null=3, matrices=["unembed.W_U"])
    assert rows and all(r.jsd == 0.0 and r.null_p95 == 0.0 for r in rows)
