"""The spectral tools on paper 2's MNIST MLP (``HookedMLP``): adapter, traps, α, the JSD ablation on
Gaussian probes and test images, ``scan_path`` / ``lenslab traps`` on a real run, and WeightWatcher 0.7.7
(where installed) on an ``nn.Sequential`` holding the same weights."""

from __future__ import annotations

import copy
import json
import logging
import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon

import lenslab.interp.spectral.jsd as jsd_mod
from lenslab.cli import main
from lenslab.interp.spectral import (
    alpha_table,
    detect_traps,
    extract_matrices,
    fit_power_law,
    format_traps_table,
    htsr_alpha,
    make_generator,
    plan_matrices,
    random_permutation,
    scan_path,
    shuffle,
    trap_jsd,
)
from lenslab.tasks.mnist import pixels_to_inputs
from lenslab.training.config import mnist_run_config
from lenslab.training.mlp import HookedMLP, build_mlp
from lenslab.training.run import Run
from lenslab.training.runio import list_checkpoints, save_checkpoint
from lenslab.training.trainer import train

CFG = {"arch": "mlp", "d_in": 784, "d_hidden": 200, "n_layers": 3, "d_out": 10, "act_fn": "relu", "init_scale": 8.0}
NAMES = ["layers.0.W", "layers.1.W", "layers.2.W"]
PLANTED = {(3, 7): 40.0, (50, 120): 30.0, (170, 10): 25.0}  # layers.1.W entry -> multiple of the entries' std


def mlp(seed: int = 0) -> HookedMLP:
    return build_mlp(CFG, seed=seed, dtype=torch.float64).eval()


def plant(model: HookedMLP) -> float:
    """Set three entries of ``layers.1.W`` (200 x 200) to 40, 30, 25 times its entry std; returns that std."""
    with torch.no_grad():
        w = model.layers[1].W
        sigma = float(w.std())
        for (i, j), k in PLANTED.items():
            w[i, j] = k * sigma
    return sigma


def bbp(spike: float, n: int, m: int) -> float:
    """The outlier of X = WᵀW/N for one entry ``spike`` (in units of σ) in an N x M noise matrix, in σ² units:
    (1 + a²)(c + a²)/a² with a² = spike²/N, c = M/N (Benaych-Georges & Nadakuditi 2012)."""
    a2 = spike * spike / n
    return (1 + a2) * (m / n + a2) / a2


# --- adapter and traps --------------------------------------------------------------------------


def test_adapter_gives_the_three_weight_matrices_and_exactly_the_planted_traps(tmp_path):
    model = mlp()
    sigma = plant(model)
    ms = extract_matrices(model)
    assert list(ms.matrices) == NAMES
    assert {k: tuple(v.shape) for k, v in ms.matrices.items()} == {n: tuple(model.matrices()[n].shape) for n in NAMES}
    assert tuple(ms.matrices["layers.0.W"].shape) == (784, 200)  # [d_in, d_out], as the model multiplies x @ W
    for i, name in enumerate(NAMES):
        assert torch.equal(ms.matrices[name], model.layers[i].W.detach())
    assert {s.name: s.shape for s in ms.skipped} == {"layers.0.b": (200,), "layers.1.b": (200,), "layers.2.b": (10,)}
    assert all("1-D" in s.reason for s in ms.skipped)
    # the same matrices from the state dict and from a checkpoint file
    ckpt = save_checkpoint(tmp_path, 0, model, CFG)
    for source in (model.state_dict(), ckpt):
        other = extract_matrices(source)
        assert list(other.matrices) == NAMES and all(torch.equal(other.matrices[n], ms.matrices[n]) for n in NAMES)

    rows = {n: detect_traps(w, n, return_components=True) for n, w in ms.matrices.items()}
    assert {n: r.n_traps for n, (r, _) in rows.items()} == {"layers.0.W": 0, "layers.1.W": 3, "layers.2.W": 0}
    row, comps = rows["layers.1.W"]
    # each trap, mapped back through the inverse permutation, sits on one planted entry (largest spike first)
    hits = [np.unravel_index(int(c.in_original().abs().argmax()), (200, 200)) for c in comps]
    assert [tuple(int(x) for x in h) for h in hits] == list(PLANTED)
    # and its eigenvalue is the BBP outlier of that entry (finite size at N = M = 200: a few percent)
    expected = [sigma**2 * bbp(k, 200, 200) for k in PLANTED.values()]
    np.testing.assert_allclose(row.trap_eigenvalues, expected, rtol=0.08)


def test_mlp_keys_come_in_layer_order_with_ten_or_more_layers():
    shapes = {f"layers.{i}.{p}": ((8, 8) if p == "W" else (8,)) for i in (10, 2, 0, 1) for p in ("b", "W")}
    refs, skipped = plan_matrices(shapes)
    assert [r.name for r in refs] == ["layers.0.W", "layers.1.W", "layers.2.W", "layers.10.W"]
    assert [s.name for s in skipped] == ["layers.0.b", "layers.1.b", "layers.2.b", "layers.10.b"]


def with_spectrum(evals: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """n x M, W = U diag(√λ) Vᵀ with orthonormal U, V from QR of Gaussian matrices: WᵀW has eigenvalues ``evals``."""
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(n, len(evals), generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(len(evals), len(evals), generator=g, dtype=torch.float64))
    return u @ torch.diag(evals.sqrt()) @ v.T


def test_alpha_of_a_known_power_law_in_the_first_layer(tmp_path):
    """A wider MLP (1500-1000-1000-10): 1000 eigenvalues, where the KS-chosen tail is long enough for a 4-stderr
    bound (measured over 40 seeds: at most 2.7 stderr). The MNIST MLP's 200 give KS tails of ~50 points, whose
    α wanders further; test_htsr.py covers the estimator itself."""
    a, cfg = 3.0, {**CFG, "d_in": 1500, "d_hidden": 1000}
    u = torch.rand(1000, generator=torch.Generator().manual_seed(30), dtype=torch.float64)
    evals = (1 - u) ** (-1 / (a - 1))  # Pareto: density ∝ λ^(−a) on λ ≥ 1
    model = build_mlp(cfg, seed=0, dtype=torch.float64)
    with torch.no_grad():
        model.layers[0].W.copy_(with_spectrum(evals, 1500, seed=6))
    table = {r["matrix"]: r for r in alpha_table(model)}
    assert list(table) == NAMES
    fit = table["layers.0.W"]
    # the MLE's standard error is (a − 1)/√n_tail; 4 of them (the KS choice of xmin adds a little)
    assert fit["alpha_reason"] is None and abs(fit["alpha"] - a) < 4 * (a - 1) / math.sqrt(fit["n_tail"])
    direct = fit_power_law(evals)  # the eigenvalues themselves, without the matrix
    assert fit["alpha"] == pytest.approx(direct.alpha, rel=1e-9) and fit["n_tail"] == direct.n_tail
    # the checkpoint scan reports the same α
    scan = scan_path(save_checkpoint(tmp_path, 0, model, cfg), progress=False, workers=1)
    assert scan.checkpoints[0].matrices[0]["alpha"] == pytest.approx(fit["alpha"], rel=1e-9)


# --- JSD ablation -------------------------------------------------------------------------------


def js_by_hand(z: torch.Tensor, z2: torch.Tensor) -> float:
    p, q = torch.softmax(z, -1).numpy(), torch.softmax(z2, -1).numpy()
    return float(np.mean([jensenshannon(p[i], q[i]) ** 2 for i in range(len(p))]))


def test_jsd_is_zero_when_the_trap_is_restored_exactly(monkeypatch):
    model = mlp()
    plant(model)
    g = torch.Generator().manual_seed(1)
    x, y = torch.rand(50, 784, generator=g, dtype=torch.float64), torch.randint(0, 10, (50,), generator=g)
    monkeypatch.setattr(jsd_mod, "replacement", lambda w, comp, gen: w.clone())
    rows = trap_jsd(model, n_probes=64, n_null=2, split=(x, y))
    assert len(rows) == 3 and all(r.matrix == "layers.1.W" and r.probe == "gaussian" for r in rows)
    assert all(r.jsd == 0.0 and r.null_p95 == 0.0 and r.jsd_split == 0.0 and r.accuracy_change == 0.0 for r in rows)


def test_jsd_on_gaussian_probes_equals_a_hand_computation(monkeypatch):
    """With W' = W − C (no noise, patched in), J_1 and the test-split columns by torch/scipy on a copy of the model."""
    model = mlp()
    plant(model)
    before = copy.deepcopy(model.state_dict())
    monkeypatch.setattr(jsd_mod, "replacement", lambda w, comp, gen: w - comp.in_original())
    g = torch.Generator().manual_seed(2)
    images, labels = torch.randint(0, 256, (40, 784), generator=g, dtype=torch.uint8), torch.randint(0, 10, (40,), generator=g)
    x_test = pixels_to_inputs(images, torch.float64)
    rows = trap_jsd(model, seed=3, n_probes=100, n_null=0, split=(x_test, labels), matrices=["layers.1.W"])
    # by hand: the probes are N(0, I) draws of torch.Generator().manual_seed(3), the logits the full outputs
    probes = torch.randn(100, 784, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    _, comps = detect_traps(model.layers[1].W.detach(), seed=3, return_components=True)  # the shuffle of seed 3
    assert len(rows) == len(comps) >= 1
    ablated = copy.deepcopy(model)
    with torch.no_grad():
        ablated.layers[1].W -= comps[0].in_original()
        z, z2 = model(probes), ablated(probes)
        t, t2 = model(x_test), ablated(x_test)
    r = rows[0]
    # float64 forward passes and logs summed in other orders: ~1e-15 absolute; 1e-10 on any CPU/BLAS
    assert r.jsd == pytest.approx(js_by_hand(z, z2), abs=1e-10) and r.jsd > 1e-4
    assert r.jsd_split == pytest.approx(js_by_hand(t, t2), abs=1e-10)
    acc, acc2 = float((t.argmax(-1) == labels).double().mean()), float((t2.argmax(-1) == labels).double().mean())
    assert r.accuracy == acc2 and r.accuracy_change == pytest.approx(acc2 - acc, abs=1e-12)
    assert math.isnan(r.null_p95) and not r.harmful
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # the model itself is untouched


def test_a_trap_that_drives_the_outputs_is_harmful_on_gaussian_probes():
    model = mlp()
    with torch.no_grad():  # hidden unit 7 of layer 2 -> class 4, through one huge entry
        model.layers[2].W[7, 4] = 60 * float(model.layers[2].W.std())
    rows = trap_jsd(model, n_probes=128, n_null=10, matrices=["layers.2.W"])
    assert len(rows) == 1 and rows[0].probe == "gaussian"
    r = rows[0]
    assert 0 <= r.null_mean <= r.null_p95 <= math.log(2) and r.jsd > r.null_p95 and r.harmful


# --- a real run: scan_path, --jsd with the test images, the CLI ----------------------------------


@pytest.fixture(scope="module")
def mnist_run(tmp_path_factory):
    """A tiny trained MNIST run (784-16-16-3, 3 classes x 4 images, float64), plus a checkpoint at epoch
    100 with one planted entry (40 times the std) in ``layers.0.W``."""
    d = tmp_path_factory.mktemp("mnist_run")
    cfg = mnist_run_config(n_per_class=4, n_classes=3, d_hidden=16, epochs=4, eval_every=2, batch_size=12, dtype="float64")
    train(cfg, d, progress=False)
    run = Run.open(d)
    model = run.model()
    with torch.no_grad():
        model.layers[0].W[100, 5] = 40 * float(model.layers[0].W.std())
    save_checkpoint(d, 100, model, run.config["model"])
    return d


def test_scan_path_on_a_real_mnist_run_gives_three_matrices_per_checkpoint(mnist_run):
    scan = scan_path(mnist_run, progress=False, workers=1)
    assert scan.kind == "run" and [c.epoch for c in scan.checkpoints] == [e for e, _ in list_checkpoints(mnist_run)]
    assert len(scan.checkpoints) >= 3
    for ck in scan.checkpoints:
        assert ck.error is None
        assert [(r["name"], r["N"], r["M"]) for r in ck.matrices] == [
            ("layers.0.W", 784, 16),
            ("layers.1.W", 16, 16),
            ("layers.2.W", 16, 3),
        ]
        assert all(r["error"] is None for r in ck.matrices)
        assert [s["name"] for s in ck.skipped] == ["layers.0.b", "layers.1.b", "layers.2.b"]
        assert ck.matrices[1]["alpha_reason"] is None and ck.matrices[1]["alpha"] > 1
        assert math.isnan(ck.matrices[2]["alpha"]) and "< 8" in ck.matrices[2]["alpha_reason"]  # M = 3
    assert scan.checkpoints[-1].matrices[0]["n_traps"] == 1  # the planted entry


def test_jsd_on_a_mnist_checkpoint_uses_gaussian_probes_and_the_test_images(mnist_run, monkeypatch):
    from lenslab.interp.spectral import paths

    monkeypatch.setattr(paths, "JSD_NULL", 3)
    scan = scan_path(mnist_run / "checkpoints" / "100.safetensors", jsd=True, progress=False, workers=1)
    rows = scan.checkpoints[0].jsd
    assert len(rows) == 1 and rows[0]["matrix"] == "layers.0.W" and rows[0]["probe"] == "gaussian"
    assert 0 <= rows[0]["jsd"] <= math.log(2) and 0 <= rows[0]["jsd_split"] <= math.log(2)
    # accuracy − its change is the unablated test accuracy on pixels / 255, by hand
    run = Run.open(mnist_run)
    x, y = run.splits["test_images"].double() / 255, run.splits["test_labels"]
    with torch.no_grad():
        base = float((run.model(100)(x).argmax(-1) == y).double().mean())
    assert rows[0]["accuracy"] - rows[0]["accuracy_change"] == pytest.approx(base, abs=1e-12)
    assert "on gaussian probes" in format_traps_table(scan) and "J on test split" in format_traps_table(scan)


def test_lenslab_traps_cli_on_a_mnist_run(mnist_run, capsys):
    assert main(["traps", str(mnist_run), "--json", "--no-progress", "--workers", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "run" and len(doc["checkpoints"]) == len(list_checkpoints(mnist_run))
    assert all([m["name"] for m in ck["matrices"]] == NAMES for ck in doc["checkpoints"])
    assert main(["traps", str(mnist_run), "--no-progress", "--workers", "1"]) == 0
    text = capsys.readouterr().out
    assert "layers.2.W" in text and "skipped 3 1-D tensors" in text


# --- WeightWatcher 0.7.7 on an nn.Sequential with the same weights --------------------------------


def sequential_of(model: HookedMLP) -> torch.nn.Sequential:
    """``nn.Linear`` layers (weight = Wᵀ, same bias) with ReLUs between them: the same function as ``model``."""
    mods = []
    for i, layer in enumerate(model.layers):
        d_in, d_out = layer.W.shape
        lin = torch.nn.Linear(d_in, d_out, dtype=layer.W.dtype)
        with torch.no_grad():
            lin.weight.copy_(layer.W.T)
            lin.bias.copy_(layer.b)
        mods += [lin] + ([torch.nn.ReLU()] if i < len(model.layers) - 1 else [])
    return torch.nn.Sequential(*mods)


def linear_perm_to_ours(p: torch.Tensor, d_in: int, d_out: int) -> torch.Tensor:
    """The permutation p' of W ([d_in, d_out]) with shuffle(W, p') = shuffle(Wᵀ, p)ᵀ (Wᵀ: the Linear weight), so both
    shuffles have the same singular values."""
    to_w = torch.arange(d_in * d_out).reshape(d_in, d_out).T.reshape(-1)  # Linear-weight flat index -> W flat index
    back = torch.arange(d_in * d_out).reshape(d_out, d_in).T.reshape(-1)  # W-shaped flat index -> shuffled-Linear flat index
    return to_w[p][back]


def test_the_permutation_for_the_linear_orientation():
    w = torch.randn(7, 5, generator=torch.Generator().manual_seed(0))
    p = random_permutation(35, make_generator(1))
    assert torch.equal(shuffle(w, linear_perm_to_ours(p, 7, 5)), shuffle(w.T.contiguous(), p).T)


def test_matches_weightwatcher_077_on_the_mlp(monkeypatch):
    ww = pytest.importorskip("weightwatcher")
    logging.getLogger("weightwatcher").setLevel(logging.ERROR)
    model = build_mlp(CFG, seed=0)  # float32, as WeightWatcher users hold nn.Linear weights
    with torch.no_grad():
        model.layers[1].W[3, 7] = 40 * float(model.layers[1].W.std())
        model.layers[2].W[9, 4] = 30 * float(model.layers[2].W.std())
    seq = sequential_of(model)
    x = torch.randn(8, 784, generator=torch.Generator().manual_seed(0))
    assert all(
        torch.equal(seq[2 * i].weight, layer.W.T) and torch.equal(seq[2 * i].bias, layer.b)
        for i, layer in enumerate(model.layers)
    )
    # the same function (x @ W vs addmm with Wᵀ sum in other orders: ~1e-6 relative in float32, outputs ~1e2)
    torch.testing.assert_close(seq(x), model(x), rtol=1e-5, atol=1e-3)
    ms = extract_matrices(model)
    # α: WeightWatcher's analyze(randomize=True) on the whole Sequential (α does not depend on the shuffles)
    df = ww.WeightWatcher(model=seq).analyze(randomize=True, plot=False)
    assert len(df) == 3
    for name, (_, ref) in zip(NAMES, df.iterrows()):
        fit = htsr_alpha(ms.matrices[name], name, min_tail=2)  # WW reports α for any tail
        assert fit.alpha == pytest.approx(float(ref["alpha"]), rel=1e-9), name  # SVD vs eigvalsh: ~1e-13 relative
    # traps: one Linear at a time with our permutations patched into np.random.shuffle (as test_weightwatcher.py)
    real = np.random.shuffle
    gen = make_generator(7)
    for i, name in enumerate(NAMES):
        lin = seq[2 * i]
        d_out, d_in = lin.weight.shape
        perms = [random_permutation(d_in * d_out, gen) for _ in range(5 if min(d_in, d_out) < 100 else 1)]
        pending = iter(perms)

        def ours(a, pending=pending):
            p = next(pending, None)
            if p is None:
                return real(a)
            a[:] = a[p.numpy()]

        monkeypatch.setattr(np.random, "shuffle", ours)
        ref = ww.WeightWatcher(model=torch.nn.Sequential(lin)).analyze(randomize=True, plot=False).iloc[0]
        monkeypatch.setattr(np.random, "shuffle", real)
        row = detect_traps(
            ms.matrices[name], name, mode="weightwatcher", perms=[linear_perm_to_ours(p, d_in, d_out) for p in perms]
        )
        assert row.n_traps == int(ref["rand_num_spikes"]), name
        assert row.lambda_plus * row.N == pytest.approx(float(ref["rand_bulk_max"]), rel=1e-6), name
