"""StackedAdamW's device-resident mode (issue 24): no host-to-device copy or sync per step, the same
updates as the host mode (which stays bitwise torch.optim.AdamW), and the same checkpointable state."""

from __future__ import annotations

import pytest
import torch

from lenslab.training.stacked_adamw import StackedAdamW

E = 4
LR = [1e-3, 3e-3, 5e-4, 1e-2]
WD = [0.0, 0.01, 0.1, 1.0]


def params(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(E, 7, 5, generator=g, dtype=dtype), torch.randn(E, 3, generator=g, dtype=dtype)]


def grads_at(step, dtype):
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(E, 7, 5, generator=g, dtype=dtype), torch.randn(E, 3, generator=g, dtype=dtype)]


def run(device_resident, dtype, n=25):
    ps = params(dtype)
    opt = StackedAdamW(ps, LR, WD, (0.9, 0.98), device_resident=device_resident)
    for t in range(n):
        active = None if t % 3 else [True, t % 2 == 0, True, t < 10]  # members pausing and finishing
        opt.step(grads_at(t, dtype), active)
    return ps, opt


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_device_mode_matches_host_mode(dtype):
    host, h = run(False, dtype)
    dev, d = run(True, dtype)
    assert d.steps == h.steps == [25, h.steps[1], 25, h.steps[3]] and h.steps[3] < 25
    for a, b in zip(host, dev):
        torch.testing.assert_close(b, a, rtol=1e-13 if dtype == torch.float64 else 1e-6, atol=0)
    for e in range(E):
        hs, ds = h.member_state(e), d.member_state(e)
        assert hs.keys() == ds.keys() and all(hs[i]["step"] == ds[i]["step"] for i in hs)


def test_host_mode_is_bitwise_torch_adamw():
    ps = params(torch.float64)
    opt = StackedAdamW(ps, LR, WD, (0.9, 0.98), device_resident=False)
    refs = []
    for e in range(E):
        members = [torch.nn.Parameter(p[e].clone()) for p in params(torch.float64)]
        refs.append((members, torch.optim.AdamW(members, lr=LR[e], weight_decay=WD[e], betas=(0.9, 0.98))))
    for t in range(10):
        gs = grads_at(t, torch.float64)
        opt.step(gs)
        for e, (members, ref) in enumerate(refs):
            for m, g in zip(members, gs):
                m.grad = g[e].clone()
            ref.step()
    for e, (members, _) in enumerate(refs):
        for p, m in zip(ps, members):
            assert torch.equal(p[e], m.detach())


def test_a_device_step_makes_no_host_to_device_copy_and_no_sync(monkeypatch):
    ps = params(torch.float32)
    opt = StackedAdamW(ps, LR, WD, (0.9, 0.999), device_resident=True)
    active = torch.tensor([True, False, True, True])
    opt.step(grads_at(0, torch.float32))  # warm

    def boom(*a, **k):
        raise AssertionError("a host value went to the device (or came back) inside step()")

    monkeypatch.setattr(torch, "tensor", boom)  # what builds a tensor from host numbers
    monkeypatch.setattr(torch.Tensor, "item", boom)  # what reads one back
    monkeypatch.setattr(torch.Tensor, "tolist", boom)
    monkeypatch.setattr(torch.Tensor, "__bool__", boom)
    opt.step(grads_at(1, torch.float32))
    opt.step(grads_at(2, torch.float32), active)  # a device mask
    opt.step(grads_at(3, torch.float32), [True] * E)  # an all-True list needs no mask
    monkeypatch.undo()
    assert opt.steps == [4, 3, 4, 4]
    host = StackedAdamW(params(torch.float32), LR, WD, (0.9, 0.999), device_resident=True)
    with pytest.raises(AssertionError, match="host value"):  # the check can fail: the host mode does build one
        monkeypatch.setattr(torch, "tensor", boom)
        StackedAdamW(params(torch.float32), LR, WD, (0.9, 0.999), device_resident=False).step(grads_at(0, torch.float32))
    monkeypatch.undo()
    assert host.steps == [0] * E


def test_device_mode_state_round_trip():
    _, d = run(True, torch.float64, n=7)
    fresh = StackedAdamW(params(torch.float64), LR, WD, (0.9, 0.98), device_resident=True)
    for e in range(E):
        fresh.load_member_state(e, d.member_state(e))
    assert fresh.steps == d.steps
    for a, b in zip(fresh.exp_avg + fresh.exp_avg_sq, d.exp_avg + d.exp_avg_sq):
        assert torch.equal(a, b)
    fresh.load_member_state(0, {})
    assert fresh.steps[0] == 0 and not fresh.exp_avg[0][0].any()
