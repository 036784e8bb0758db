"""The ensemble engine on paper 2's MNIST MLP (issue 24 part f's stack): StackedMLP's forward equals each
HookedMLP's, and a member trained in a stack follows the single-seed trainer (training.trainer.train).

The reference is the single-seed trainer, an independent path: HookedMLP's ``x @ W + b`` per model,
``F.mse_loss`` / ``F.cross_entropy``, ``torch.optim.AdamW``. The stack uses ``baddbmm`` over members, a
per-member loss and ``StackedAdamW``, so floats differ in the last bits; in float64 they stay within
1e-12 over these few steps.
"""

from __future__ import annotations

import pytest
import torch

from lenslab.training.config import mnist_run_config
from lenslab.training.ensemble import train_ensemble
from lenslab.training.errors import ConfigError
from lenslab.training.mlp import build_mlp
from lenslab.training.run import Run
from lenslab.training.stacked_mlp import StackedMLP
from lenslab.training.trainer import train


def _cfg(seed: int, **kw):
    """3 digits x 6 train images, a 784-16-16-3 MLP, float64, batches of 8 (3 steps per epoch)."""
    kw = {"epochs": 3, "eval_every": 1, "batch_size": 8, "dtype": "float64", "seed": seed, **kw}
    return mnist_run_config(n_per_class=6, n_classes=3, d_hidden=16, **kw)


def test_stacked_forward_equals_each_hooked_mlp():
    cfg = _cfg(0)["model"]
    models = [build_mlp(cfg, seed=s, dtype=torch.float64) for s in range(3)]
    stack = StackedMLP.from_models(models)
    x = torch.rand(3, 5, cfg["d_in"], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    got = stack(x)
    for e, m in enumerate(models):
        torch.testing.assert_close(got[e], m(x[e]), atol=1e-12, rtol=0)
        assert set(stack.member_state_dict(e)) == set(m.state_dict())
    # a member's own [batch, d_in] is refused (by the tests' jaxtyping hook, or by forward's own check without it)
    with pytest.raises((ConfigError, TypeError), match=r"\[E=3, batch, d_in\]|E batch d_in"):
        stack(x[0])


@pytest.mark.parametrize("loss", ["mse", "ce"])
def test_a_member_follows_the_single_seed_trainer(tmp_path, loss):
    cfgs = [_cfg(0, loss=loss), _cfg(1, loss=loss), _cfg(2, loss=loss)]
    cfgs[0]["train"]["weight_decay"] = 0.0
    cfgs[2]["train"]["weight_decay"] = 0.01
    cfgs[2]["train"]["lr"] = 1e-3
    train(cfgs[1], tmp_path / "alone", progress=False)
    train_ensemble(cfgs, [tmp_path / f"m{i}" for i in range(3)], progress=False)
    alone, member = Run.open(tmp_path / "alone"), Run.open(tmp_path / "m1")
    assert [r["epoch"] for r in member.metrics] == [r["epoch"] for r in alone.metrics] == [0, 1, 2, 3]
    for ra, rb in zip(alone.metrics, member.metrics):
        assert rb["step"] == ra["step"]
        for key in ("train_acc", "test_acc"):
            assert rb[key] == ra[key], key
        assert rb["train_loss"] == pytest.approx(ra["train_loss"], rel=1e-10)
    sa, sb = alone.model().state_dict(), member.model().state_dict()
    moved = 0.0
    for k in sa:
        torch.testing.assert_close(sb[k], sa[k], atol=1e-10, rtol=0)
        moved = max(moved, float((sa[k] - build_mlp(cfgs[1]["model"], seed=1, dtype=torch.float64).state_dict()[k]).abs().max()))
    assert moved > 1e-4  # it trained: the comparison is not of two initial states
    other = Run.open(tmp_path / "m2").model().state_dict()
    assert not torch.equal(other["layers.0.W"], sa["layers.0.W"])  # members are independent models


def test_seeds_of_the_mlp_train_stacked_with_a_measured_size(tmp_path):
    """``lenslab train --seeds`` on an MNIST config: the ensemble size is timed on StackedMLP, then each seed
    gets a complete run directory."""
    from lenslab.training.seeds import train_seeds

    cfgs = [_cfg(s, epochs=1) for s in (0, 1)]
    outs = [tmp_path / f"seed_{s}" for s in (0, 1)]
    said: list[str] = []
    summaries = train_seeds(cfgs, outs, ensemble_size=None, progress=False, log=said.append)
    assert len(summaries) == 2 and said[0].startswith("ensemble size: E=1 ")
    assert [Run.open(o).epochs()[-1] for o in outs] == [1, 1]


def test_a_given_step_function_runs_every_update(tmp_path):
    """``train_ensemble(step=...)`` hands each update to the caller's function (the GPU's graph-captured step
    uses it); one that delegates to ``ensemble_step`` gives the default run's weights exactly."""
    from lenslab.training.ensemble import ensemble_step

    calls = []

    def counting(*args):
        calls.append(args[4].shape)  # idx: [E, batch]
        return ensemble_step(*args)

    cfgs = [_cfg(0), _cfg(1)]
    train_ensemble(cfgs, [tmp_path / "a0", tmp_path / "a1"], progress=False)
    train_ensemble(cfgs, [tmp_path / "b0", tmp_path / "b1"], progress=False, step=counting)
    assert calls == [torch.Size([2, 8]), torch.Size([2, 8]), torch.Size([2, 2])] * 3  # 18 images, batches of 8
    for i in range(2):
        a, b = Run.open(tmp_path / f"a{i}").model().state_dict(), Run.open(tmp_path / f"b{i}").model().state_dict()
        for k in a:
            assert torch.equal(a[k], b[k]), k
