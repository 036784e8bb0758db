"""The hooked MLP and its trainer path: equal to nn.Sequential, hooks that work, runs that reload and resume bitwise."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from lenslab.cli import main
from lenslab.training.config import mnist_run_config
from lenslab.training.mlp import HookedMLP, build_mlp
from lenslab.training.presets import build_model
from lenslab.training.run import Run
from lenslab.training.runio import list_checkpoints, read_jsonl
from lenslab.training.trainer import Interrupted, train

CFG = {"arch": "mlp", "d_in": 784, "d_hidden": 200, "n_layers": 3, "d_out": 10, "act_fn": "relu", "init_scale": 8.0}


def reference(seed: int, scale: float) -> nn.Sequential:
    """The predecessor's model: nn.Linear layers drawn after torch.manual_seed, every parameter times ``scale``."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Flatten(), nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(), nn.Linear(200, 10))
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(scale)
    return net


def test_hooked_mlp_equals_the_scaled_nn_sequential_and_leaves_the_global_rng_alone():
    torch.manual_seed(99)
    before = torch.random.get_rng_state()
    model = build_mlp(CFG, seed=5)
    assert torch.equal(torch.random.get_rng_state(), before)
    ref = reference(5, 8.0)
    linears = [m for m in ref if isinstance(m, nn.Linear)]
    for layer, lin in zip(model.layers, linears):
        assert torch.equal(layer.W, lin.weight.T) and torch.equal(layer.b, lin.bias)
    x = torch.rand(16, 784)
    torch.testing.assert_close(model(x), ref(x), rtol=0, atol=1e-4)


def test_run_with_cache_and_hooks_follow_transformer_lens_names():
    model = build_mlp({**CFG, "d_in": 6, "d_hidden": 5, "d_out": 3}, seed=0, dtype=torch.float64)
    x = torch.randn(4, 6, dtype=torch.float64)
    out, cache = model.run_with_cache(x)
    assert set(cache.keys()) == {
        "hook_input",
        "layers.0.hook_pre",
        "layers.0.hook_post",
        "layers.1.hook_pre",
        "layers.1.hook_post",
        "layers.2.hook_pre",
    }
    W = [(layer.W, layer.b) for layer in model.layers]
    h0 = x @ W[0][0] + W[0][1]
    torch.testing.assert_close(cache["layers.0.hook_pre"], h0)
    torch.testing.assert_close(cache["layers.0.hook_post"], h0.relu())
    torch.testing.assert_close(out, cache["layers.2.hook_pre"])
    # zero-ablating the second hidden layer leaves the output bias alone, by hand
    ablated = model.run_with_hooks(x, fwd_hooks=[("layers.1.hook_post", lambda a, hook: torch.zeros_like(a))])
    torch.testing.assert_close(ablated, W[2][1].expand(4, 3))


def tiny(**train):
    kw = {"epochs": 6, "eval_every": 2, "batch_size": 10, "dtype": "float64"}
    kw.update(train)
    return mnist_run_config(n_per_class=4, n_classes=3, d_hidden=16, **kw)


def test_the_loss_is_mse_on_one_hot_and_a_checkpoint_reproduces_its_metrics(tmp_path):
    train(tiny(), tmp_path, progress=False)
    rows = {r["epoch"]: r for r in read_jsonl(tmp_path / "metrics.jsonl")}
    splits = load_file(str(tmp_path / "splits.safetensors"))
    assert rows[6]["step"] == 6 * 2  # 12 train images, batch 10: 2 steps per epoch
    run = Run.open(tmp_path)
    assert isinstance(run.model(), HookedMLP) and run.model().dtype == torch.float64
    for epoch, _ in list_checkpoints(tmp_path):
        model = run.model(epoch)
        for split in ("train", "test"):
            x = splits[f"{split}_images"].double() / 255
            y = splits[f"{split}_labels"]
            with torch.no_grad():
                out = model(x)
            target = torch.zeros(len(y), 3, dtype=torch.float64)
            target[torch.arange(len(y)), y] = 1.0
            assert rows[epoch][f"{split}_loss"] == pytest.approx(float(((out - target) ** 2).mean()), rel=1e-12)
            assert rows[epoch][f"{split}_acc"] == pytest.approx(float((out.argmax(-1) == y).double().mean()), abs=1e-7)


def test_cross_entropy_is_the_other_choice(tmp_path):
    train(mnist_run_config(n_per_class=4, n_classes=3, d_hidden=16, loss="ce", epochs=1, batch_size=12), tmp_path, progress=False)
    row = read_jsonl(tmp_path / "metrics.jsonl")[0]
    run, splits = Run.open(tmp_path), load_file(str(tmp_path / "splits.safetensors"))
    with torch.no_grad():
        out = run.model(0)(splits["train_images"].float() / 255)
    assert row["train_loss"] == pytest.approx(float(nn.functional.cross_entropy(out, splits["train_labels"])), rel=1e-6)


def test_interrupted_and_resumed_equals_uninterrupted_bitwise(tmp_path):
    cfg = tiny(epochs=6, eval_schedule="log", n_evals=4)
    train(cfg, tmp_path / "straight", progress=False)

    def ctrl_c(row):
        if row["epoch"] == 2:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(Interrupted):
        train(cfg, tmp_path / "cut", progress=False, on_eval=ctrl_c)
    train(cfg, tmp_path / "cut", resume=True, progress=False)
    for (ea, a), (eb, b) in zip(list_checkpoints(tmp_path / "straight"), list_checkpoints(tmp_path / "cut"), strict=True):
        assert ea == eb and a.read_bytes() == b.read_bytes()
    assert read_jsonl(tmp_path / "straight" / "metrics.jsonl") == read_jsonl(tmp_path / "cut" / "metrics.jsonl")


def test_build_model_dispatches_on_the_model_block():
    m = build_model(CFG, seed=1, dtype="float64")
    assert isinstance(m, HookedMLP) and m.layers[0].W.dtype == torch.float64
    assert torch.equal(m.layers[0].W.float(), build_mlp(CFG, seed=1).layers[0].W)  # float64 starts from the float32 init


def run_cli(capsys, *argv):
    try:
        rc = main(list(argv))
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_trains_mnist_and_refuses_bad_flags_before_any_io(tmp_path, capsys):
    out = tmp_path / "r"
    argv = ["train", "--task", "mnist", "--n-per-class", "3", "--n-classes", "2", "--d-hidden", "8", "--epochs", "2"]
    rc, stdout, err = run_cli(capsys, *argv, "--out", str(out), "--no-progress", "--json")
    assert rc == 0, err
    assert json.loads(stdout)["status"] == "complete"
    assert json.loads((out / "config.json").read_text())["task"]["name"] == "mnist"
    for argv, msg in (
        (["--layers", "2"], "--layers is an mpsp flag; mnist takes --n-per-class"),
        (["--n-per-class", "600"], "n_per_class=600"),
        (["--loss", "l2"], "invalid choice: 'l2' (choose from 'mse', 'ce')"),
    ):
        bad = tmp_path / "bad"
        rc, _, err = run_cli(capsys, "train", "--task", "mnist", *argv, "--out", str(bad), "--no-progress")
        assert rc == 2 and msg in err and err.count("\n") == 1 and "Traceback" not in err
        assert not bad.exists()
    rc, _, err = run_cli(capsys, "train", "--n-per-class", "3", "--out", str(tmp_path / "b2"), "--no-progress")
    assert rc == 2 and "--n-per-class is an mnist flag; add --task mnist" in err
