"""Part a's TF32 rule on the CPU, with TF32 emulated: every matmul's inputs rounded to TF32's 10-bit mantissa.

An H100 multiplies float32 matrices in TF32 when ``allow_tf32`` is on: each input keeps 10 of float32's
23 mantissa bits (products and sums stay float32). ``EmulatedTF32`` is a ``TorchDispatchMode`` that
rounds the float32 inputs of every matrix product (mm, bmm, addmm, baddbmm) that way, to nearest, so
the stacked engine and HookedTransformer both see TF32-sized errors on a CPU. Part a's rule (issue 24):
the stacked error may be at most ``HT_RATIO`` x HookedTransformer's own error at that precision, both
against the float64 HookedTransformer. Checked on part a's own setting (E = 4, B = 256).
"""

from __future__ import annotations

import device_run as dr
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lenslab.training.presets import build_model
from lenslab.training.stacked import StackedTransformer

aten = torch.ops.aten
MATMULS = {aten.mm.default: (0, 1), aten.bmm.default: (0, 1), aten.addmm.default: (1, 2), aten.baddbmm.default: (1, 2)}
DROP = 23 - 10  # float32 mantissa bits that TF32 does not keep


def to_tf32(x: torch.Tensor) -> torch.Tensor:
    """Round a float32 tensor to TF32 (10 mantissa bits), to nearest (ties away from zero), as float32."""
    if x.dtype != torch.float32:
        return x
    i = x.contiguous().view(torch.int32)
    r = (i + (1 << (DROP - 1))) & ~((1 << DROP) - 1)
    return r.view(torch.float32).view(x.shape)


class EmulatedTF32(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in MATMULS:
            args = list(args)
            for j in MATMULS[func]:
                args[j] = to_tf32(args[j])
            self.calls += 1
        return func(*args, **kwargs)


def test_to_tf32_keeps_ten_mantissa_bits():
    x = torch.tensor([1.0, 1 + 2**-10, 1 + 2**-11, 1 + 2**-12, 3.0, -1 - 3 * 2**-12, 1e-30])
    got = to_tf32(x)
    assert got[0] == 1 and got[1] == 1 + 2**-10  # representable: unchanged
    assert got[2] == 1 + 2**-10  # a tie, rounded away from zero
    assert got[3] == 1  # below half a step: down
    assert got[4] == 3 and got[5] == -1 - 2**-10 and got[6] != 0
    assert (to_tf32(got) == got).all()  # idempotent
    r = torch.randn(10_000)
    rel = ((to_tf32(r) - r) / r).abs().max().item()
    assert 2**-12 < rel <= 2**-11  # half a unit in the 10th bit, and the rounding really happens


@pytest.fixture(scope="module")
def part_a_setting():
    E, B = 4, 256
    mk = dr.paper1_model_kwargs()
    models = [build_model(mk, seed=s, device="cpu") for s in range(E)]
    ens = StackedTransformer.from_models(models)
    tokens, labels = dr.random_batch(mk, E, B, torch.device("cpu"), seed=1)
    ref = dr.ht_outputs([dr.to_float64(m) for m in models], tokens, labels)
    mode = EmulatedTF32()
    with mode:
        e_stack = dr.compare(dr.stack_outputs(ens, ens, tokens, labels), ref)
        e_ht = dr.compare(dr.ht_outputs(models, tokens, labels), ref)
    e_fp32 = dr.compare(dr.ht_outputs(models, tokens, labels), ref)
    return {"stack": e_stack, "ht": e_ht, "fp32": e_fp32, "calls": mode.calls}


def test_emulation_reaches_both_engines(part_a_setting):
    s = part_a_setting
    assert s["calls"] > 0
    # TF32-sized errors, far above fp32's (so the rule below is tested at TF32's scale, not fp32's)
    assert s["ht"]["grads"] > 30 * s["fp32"]["grads"] and s["ht"]["grads"] > 1e-4
    assert s["stack"]["grads"] > 30 * s["fp32"]["grads"]


def test_stacked_passes_parts_a_tf32_rule_with_margin(part_a_setting):
    s = part_a_setting
    assert dr.passes(s["stack"], "tf32", s["ht"])
    for k in ("logits", "grads"):
        # the margin the rule leaves: the stacked engine's error within HT_RATIO x HookedTransformer's own
        assert s["stack"][k] <= dr.HT_RATIO * s["ht"][k], (k, s["stack"][k], s["ht"][k])


def test_the_rule_fails_an_engine_three_times_worse(part_a_setting):
    s = part_a_setting
    worse = {k: 3 * max(s["ht"][k], dr.TOL["fp32"][k]) for k in ("logits", "grads")}
    assert not dr.passes(worse, "tf32", s["ht"])
    assert not dr.passes({**s["stack"], "grads": float("nan")}, "tf32", s["ht"])
