"""Modular-addition seeds in the ensemble engine, in float32 and float64, against the single-seed trainer.

Tolerances (measured on this machine; what varies across CPUs is which elements land on
noise-level gradients, through BLAS summation order):

- float64: every weight within 1e-12 of the single-seed trainer's after each of 8 full-batch AdamW
  steps (measured 8.7e-15: the stacked math only reorders sums).
- float32: the same reordering leaves gradient errors of ~1e-9 absolute. AdamW's update
  lr * m / (sqrt(v) + eps) amplifies an absolute gradient error by up to lr / eps = 1e5 on the few
  elements whose gradient is itself ~eps (1e-8), so after the first steps a handful of elements
  (measured: 3e-5 of them) differ by up to 2e-5, and by step 7 a ReLU flips and the difference
  spreads (11 % of elements > 1e-6 at step 8). So float32 is checked over 3 steps: at most 1e-4
  of the elements beyond 1e-6, none beyond 1e-4. The float64 check is the tight one.
- ``attn.b_K`` is excluded in float32, as in test_training_ensemble.py: its true gradient is 0,
  so it moves only by rounding noise.
"""

from __future__ import annotations

import pytest
import torch

from lenslab.training.config import modadd_run_config
from lenslab.training.ensemble import check_ensemble, train_ensemble
from lenslab.training.errors import ConfigError
from lenslab.training.run import Run
from lenslab.training.trainer import train

NOISE_ONLY = "attn.b_K"


def _cfg(seed, wd, data_seed=0, dtype="float32"):
    return modadd_run_config(
        p=13, train_frac=0.5, data_seed=data_seed, seed=seed, weight_decay=wd, epochs=8, eval_every=1, dtype=dtype
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_modadd_member_follows_the_single_seed_trainer(tmp_path, dtype):
    """Seed 1 at weight decay 0 inside an ensemble whose other members differ in seed, weight decay and data seed."""
    cfgs = [_cfg(0, 1.0, dtype=dtype), _cfg(1, 0.0, dtype=dtype), _cfg(2, 0.01, data_seed=1, dtype=dtype)]
    train(cfgs[1], tmp_path / "alone", progress=False)
    train_ensemble(cfgs, [tmp_path / f"m{i}" for i in range(3)], progress=False)
    alone, member = Run.open(tmp_path / "alone"), Run.open(tmp_path / "m1")
    assert member.epochs() == alone.epochs() == list(range(9))
    last = 8 if dtype == "float64" else 3  # see the module docstring
    for (epoch, ma), (_, mb) in zip(alone.iter_models(), member.iter_models()):  # step by step
        if epoch > last:
            break
        sa, sb = {k: v.clone() for k, v in ma.state_dict().items()}, mb.state_dict()
        keys = [
            k
            for k, v in sa.items()
            if v.dtype.is_floating_point and v.isfinite().all() and (dtype == "float64" or NOISE_ONLY not in k)
        ]
        assert all(sa[k].dtype == sb[k].dtype == getattr(torch, dtype) for k in keys)
        diff = torch.cat([(sa[k].double() - sb[k].double()).abs().flatten() for k in keys])
        if dtype == "float64":
            assert diff.max() <= 1e-12, (epoch, float(diff.max()))
        else:
            assert (diff > 1e-6).double().mean() <= 1e-4 and diff.max() <= 1e-4, (
                epoch,
                float((diff > 1e-6).double().mean()),
                float(diff.max()),
            )
    for ra, rb in zip(alone.metrics[: last + 1], member.metrics[: last + 1]):
        assert ra["epoch"] == rb["epoch"]
        for key in ("train_acc", "test_acc"):
            assert abs(ra[key] - rb[key]) <= 1 / 84, key  # at most one of the 84 examples flips on a last-bit tie
        for key in ("train_loss", "weight_norm", "train_max_abs_logit"):
            assert rb[key] == pytest.approx(ra[key], rel=1e-5), key  # float32 last bits; float64 far closer
        if ra["grad_norm"] is None:
            assert rb["grad_norm"] is None and ra["epoch"] == 0
        else:
            assert rb["grad_norm"] == pytest.approx(ra["grad_norm"], rel=1e-4)  # float32 sums in another order
    # the weight-decay-1 and data-seed-1 members really are other runs
    assert not torch.equal(Run.open(tmp_path / "m2").splits["train_tokens"], alone.splits["train_tokens"])
    assert not torch.equal(Run.open(tmp_path / "m0").model().embed.W_E, alone.model().embed.W_E)


def test_members_must_share_dtype_and_schedule():
    with pytest.raises(ConfigError, match="train.dtype"):
        check_ensemble([_cfg(0, 1.0), _cfg(1, 1.0, dtype="float64")])
    b = modadd_run_config(p=13, train_frac=0.5, seed=1, epochs=8, eval_every=1, eval_schedule="log")
    with pytest.raises(ConfigError, match="train.eval_schedule"):
        check_ensemble([_cfg(0, 1.0), b])
