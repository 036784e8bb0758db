"""Paper 2's controls on the MNIST MLP: the ×c perturbation control and the norm-matched Gaussian,
Spearman ρ of ‖W‖ against trap counts, trap vectors as 28×28 pixel maps, and the ‖x‖² test.

References are independent of the code under test: planted entries (their count and their
pixels), brute-force ranks for Spearman, positive homogeneity of a bias-free ReLU net, and a plain
``nn.Sequential`` with the same weights for the predictions."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lenslab.interp.common import InterpError
from lenslab.interp.norm_response import mixed_images, norm_response, standard_probes
from lenslab.interp.spectral.controls import norm_matched_gaussian, norm_trap_correlation, rescale_control
from lenslab.interp.spectral.errors import SpectralError
from lenslab.interp.spectral.localization import trap_image_figure, trap_pixel_maps
from lenslab.training.mlp import HookedMLP, build_mlp

CFG = {"arch": "mlp", "d_in": 784, "d_hidden": 200, "n_layers": 3, "d_out": 10, "act_fn": "relu", "init_scale": 8.0}
PLANTED = {(3, 7): 40.0, (50, 120): 30.0, (170, 10): 25.0}  # layers.1.W entry -> multiple of its entries' std
PATCH = [r * 28 + c for r in range(13, 16) for c in range(13, 16)]  # a 3x3 patch of pixels at the centre


def mlp(seed: int = 0) -> HookedMLP:
    return build_mlp(CFG, seed=seed, dtype=torch.float64).eval()


def planted_mlp() -> HookedMLP:
    model = mlp()
    with torch.no_grad():
        w = model.layers[1].W
        sigma = float(w.std())
        for (i, j), k in PLANTED.items():
            w[i, j] = k * sigma
    return model


# --- the perturbation control ------------------------------------------------------------------


def test_rescaling_leaves_the_planted_trap_count_and_alpha_unchanged_and_the_gaussian_has_none():
    rows = rescale_control(planted_mlp(), scales=(0.5, 1.0, 2.0), matrices=["layers.1.W", "layers.2.W"])
    by = {(r["matrix"], r["scale"]): r for r in rows}
    assert set(by) == {(m, s) for m in ("layers.1.W", "layers.2.W") for s in (0.5, 1.0, 2.0, "gaussian")}
    for c in (0.5, 1.0, 2.0):
        assert by[("layers.1.W", c)]["n_traps"] == len(PLANTED)  # the three planted entries, at every scale
        assert by[("layers.2.W", c)]["n_traps"] == 0
        assert by[("layers.1.W", c)]["frobenius_norm"] == pytest.approx(c * by[("layers.1.W", 1.0)]["frobenius_norm"], rel=1e-12)
        assert by[("layers.1.W", c)]["alpha"] == pytest.approx(by[("layers.1.W", 1.0)]["alpha"], rel=1e-9)
        # λ_max moves with c² (the count does not): the detector sees the scale and discounts it
        assert by[("layers.1.W", c)]["lambda_max"] == pytest.approx(c * c * by[("layers.1.W", 1.0)]["lambda_max"], rel=1e-9)
    for m in ("layers.1.W", "layers.2.W"):
        g = by[(m, "gaussian")]
        assert g["n_traps"] == 0
        assert g["frobenius_norm"] == pytest.approx(by[(m, 1.0)]["frobenius_norm"], rel=1e-12)


def test_norm_matched_gaussian_is_seeded_and_has_the_norm():
    w = torch.randn(30, 20, dtype=torch.float64) * 7
    a, b, c = norm_matched_gaussian(w, 0), norm_matched_gaussian(w, 0), norm_matched_gaussian(w, 1)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert float(a.norm()) == pytest.approx(float(w.norm()), rel=1e-12)


@pytest.mark.parametrize("scales", [(), (0.0,), (-1.0,), (float("inf"),), ("2",), (True,)])
def test_rescale_control_refuses_bad_scales(scales):
    with pytest.raises(SpectralError, match="scales="):
        rescale_control(mlp(), scales=scales)


def test_rescale_control_names_the_matrices_it_has():
    with pytest.raises(SpectralError, match=r"layers\.9\.W.*layers\.0\.W"):
        rescale_control(mlp(), matrices=["layers.9.W"])


def test_spearman_equals_pearson_of_brute_force_ranks():
    g = np.random.default_rng(0)
    norm = g.normal(size=40)
    traps = norm * 0.5 + g.normal(size=40)  # continuous values: no ties, so ranks are argsort positions
    rows = [{"weight_norm": a, "traps_total": b} for a, b in zip(norm, traps)] + [{"weight_norm": None, "traps_total": 1}]
    ranks = [np.argsort(np.argsort(v)) for v in (norm, traps)]
    ref = np.corrcoef(*ranks)[0, 1]
    out = norm_trap_correlation(rows)
    assert out["n"] == 40
    assert out["rho"] == pytest.approx(ref, abs=1e-12)
    assert 0 < out["p"] < 1


def test_spearman_is_nan_with_a_reason_when_it_cannot_be_computed():
    assert math.isnan(norm_trap_correlation([{"weight_norm": 1, "traps_total": 2}])["rho"])
    flat = norm_trap_correlation([{"weight_norm": i, "traps_total": 0} for i in range(5)])
    assert math.isnan(flat["rho"]) and "traps_total is constant" in flat["reason"]


# --- localization: traps as pixel maps ------------------------------------------------------------


def planted_first_layer() -> dict:
    model = mlp()
    w = model.layers[0].W.detach().clone()
    sigma = float(w.std())
    for k, pix in enumerate(PATCH[:4]):
        w[pix, 10 * k] = (40.0 - 3 * k) * sigma
    return {"layers.0.W": w, "layers.0.b": model.layers[0].b.detach()}, PATCH[:4]


def test_each_planted_entry_is_a_trap_whose_pixel_map_peaks_on_its_pixel():
    state, pixels = planted_first_layer()
    maps = trap_pixel_maps(state, "layers.0.W")
    assert len(maps.rows) == len(pixels)
    assert maps.images.shape == (len(pixels), 28, 28)
    assert np.allclose(maps.images.reshape(len(pixels), -1).sum(1), 1.0)
    assert sorted(r["peak_pixel"] for r in maps.rows) == sorted(pixels)
    for r, img in zip(maps.rows, maps.images):
        assert img.reshape(-1).argmax() == r["peak_pixel"]
        assert r["top5_pixel_mass"] > 0.3  # a flat map would hold 0.05
        assert img.max() > 100 / 784  # its peak pixel holds > 100 times a flat share
        assert r["effective_pixels"] < 0.1 * 784
    assert maps.row_mass.shape == (28, 28) and maps.row_mass.sum() == pytest.approx(1.0)
    fig = trap_image_figure(maps)
    assert [t.type for t in fig.data] == ["heatmap"] * (len(pixels) + 1)


def test_an_unplanted_matrix_has_no_pixel_maps():
    maps = trap_pixel_maps(mlp(), "layers.0.W")
    assert len(maps.rows) == 0 and maps.images.shape == (0, 28, 28)
    assert len(trap_image_figure(maps).data) == 1


def test_pixel_maps_refuse_a_matrix_that_is_not_an_image_layer():
    with pytest.raises(SpectralError, match="200 input rows, not 784"):
        trap_pixel_maps(mlp(), "layers.1.W")
    with pytest.raises(SpectralError, match="not in the model"):
        trap_pixel_maps(mlp(), "W_in")


# --- the ‖x‖² test ---------------------------------------------------------------------------


def sequential_of(model: HookedMLP) -> torch.nn.Sequential:
    mods = []
    for i, layer in enumerate(model.layers):
        lin = torch.nn.Linear(*layer.W.shape, dtype=torch.float64)
        with torch.no_grad():
            lin.weight.copy_(layer.W.T)
            lin.bias.copy_(layer.b)
        mods += [lin] + ([torch.nn.ReLU()] if i < len(model.layers) - 1 else [])
    return torch.nn.Sequential(*mods)


def test_a_bias_free_relu_net_is_norm_blind():
    model = mlp()
    with torch.no_grad():
        for layer in model.layers:
            layer.b.zero_()
    x = torch.randn(64, 784, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    rows = norm_response(model, {"gaussian": x}, scales=(0.25, 1.0, 4.0))
    unit = rows.where(scale=1.0)[0]
    for r in rows:
        assert r["agree_with_unit"] == 1.0
        assert r["top_class"] == unit["top_class"] and r["top_class_share"] == unit["top_class_share"]
        assert r["mean_max_logit"] == pytest.approx(
            r["scale"] * unit["mean_max_logit"], rel=1e-10
        )  # ReLU(cz) = c ReLU(z): f(cx) = c f(x)


def test_norm_response_matches_a_plain_sequential_forward():
    model = mlp()
    seq = sequential_of(model)
    x = torch.rand(200, 784, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    for r in norm_response(model, {"img": x}, scales=(0.01, 1.0, 50.0)):
        with torch.no_grad():
            pred = seq(x * r["scale"]).argmax(-1)
            unit = seq(x).argmax(-1)
        counts = torch.bincount(pred, minlength=10)
        assert r["agree_with_unit"] == pytest.approx(float((pred == unit).double().mean()))
        assert r["top_class_share"] == pytest.approx(float(counts.max()) / 200)
        assert r["input_norm"] == pytest.approx(r["scale"] * float(x.norm(dim=1).mean()))


def test_mixed_images_average_two_images_of_different_classes():
    x = torch.eye(40, dtype=torch.float64)  # image i is the i-th basis vector: a mix shows which two it holds
    y = torch.arange(40) % 4
    mixed, pairs = mixed_images(x, y, n=50, seed=3)
    assert mixed.shape == (50, 40) and pairs.shape == (50, 2)
    for row, (ya, yb) in zip(mixed, pairs):
        idx = torch.nonzero(row).flatten()
        assert ya != yb
        if len(idx) == 2:  # two different images at 0.5 each
            assert torch.allclose(row[idx], torch.tensor([0.5, 0.5], dtype=torch.float64))
            assert sorted(y[idx].tolist()) == sorted([int(ya), int(yb)])
        else:  # pragma: no cover - a = b is impossible when the classes differ
            pytest.fail(f"mix of {idx.tolist()}")
    assert torch.equal(mixed_images(x, y, 50, 3)[0], mixed)


def test_standard_probes_and_bad_input():
    model = mlp()
    x = torch.rand(30, 784, dtype=torch.float64)
    probes = standard_probes(model, x, torch.arange(30) % 10, n=16)
    assert {k: tuple(v.shape) for k, v in probes.items()} == {"gaussian": (16, 784), "mixed": (16, 784)}
    with pytest.raises(InterpError, match="at least 2 classes"):
        mixed_images(x, torch.zeros(30, dtype=torch.long))
    with pytest.raises(InterpError, match="scales="):
        norm_response(model, probes, scales=(0,))
    with pytest.raises(InterpError, match="non-empty"):
        norm_response(model, {})
