"""Adapter: names, shapes and skip reasons on a real HookedTransformer; write-back round trip."""

from __future__ import annotations

import einops
import pytest
import torch
from spectral_helpers import P

from lenslab.interp.spectral import extract_matrices, from_2d, plan_matrices
from lenslab.training.presets import build_model


def test_hooked_transformer_default_matrices(modadd_kwargs):
    model = build_model(modadd_kwargs, seed=0)
    ms = extract_matrices(model)
    d, h, dh, mlp = 128, 4, 32, 512
    expected = {
        "embed.W_E": (P + 1, d),
        "blocks.0.attn.W_Q": (d, h * dh),
        "blocks.0.attn.W_K": (d, h * dh),
        "blocks.0.attn.W_V": (d, h * dh),
        "blocks.0.attn.W_O": (h * dh, d),
        "blocks.0.mlp.W_in": (d, mlp),
        "blocks.0.mlp.W_out": (mlp, d),
        "unembed.W_U": (d, P),
    }
    assert list(ms.matrices) == list(expected)
    assert {k: tuple(v.shape) for k, v in ms.matrices.items()} == expected
    skipped = {s.name: s.reason for s in ms.skipped}
    assert "pos_embed.W_pos" in skipped and "positional" in skipped["pos_embed.W_pos"]
    assert all(k in skipped for k in ("blocks.0.attn.b_Q", "blocks.0.mlp.b_in"))  # 1-D, listed not dropped
    # concatenation: column block k·d_head.. of W_Q is head k (checked against TL's own param)
    wq = model.blocks[0].attn.W_Q.detach()
    for head in range(h):
        assert torch.equal(ms.matrices["blocks.0.attn.W_Q"][:, head * dh : (head + 1) * dh], wq[head])
        assert torch.equal(ms.matrices["blocks.0.attn.W_O"][head * dh : (head + 1) * dh], model.blocks[0].attn.W_O.detach()[head])


def test_per_head_and_positional(modadd_kwargs):
    model = build_model(modadd_kwargs, seed=0)
    ms = extract_matrices(model, per_head=True, include_pos=True)
    assert ms.matrices["pos_embed.W_pos"].shape == (3, 128)
    assert ms.matrices["blocks.0.attn.W_K.h2"].shape == (128, 32)
    assert ms.matrices["blocks.0.attn.W_O.h3"].shape == (32, 128)
    assert sum(n.startswith("blocks.0.attn.W_V.h") for n in ms.matrices) == 4


def test_too_small_and_unknown_tensors_are_reported():
    shapes = {"a.weight": (1, 64), "b.weight": (8, 16), "c.weight": (2, 3, 4, 5), "c.bias": (5,)}
    refs, skipped = plan_matrices(shapes)
    assert [r.name for r in refs] == ["b.weight"]
    reasons = {s.name: s.reason for s in skipped}
    assert "min(N, M) = 1" in reasons["a.weight"]
    assert "4-D" in reasons["c.weight"] and "1-D" in reasons["c.bias"]


def test_linear_module_and_write_back(modadd_kwargs):
    net = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.ReLU(), torch.nn.Linear(20, 3))
    assert {k: tuple(v.shape) for k, v in extract_matrices(net).matrices.items()} == {"0.weight": (20, 10), "2.weight": (3, 20)}
    model = build_model(modadd_kwargs, seed=0)
    ms = extract_matrices(model)
    for ref in ms.refs:
        param = model.state_dict()[ref.key]
        new = torch.randn(ref.shape)
        back = from_2d(new, ref, param)
        assert back.shape == param.shape
        assert torch.equal(extract_matrices({**model.state_dict(), ref.key: back}).matrices[ref.name], new)
    wo = model.blocks[0].attn.W_O.detach()
    ref = next(r for r in ms.refs if r.name == "blocks.0.attn.W_O")
    assert torch.equal(from_2d(einops.rearrange(wo, "h d m -> (h d) m"), ref, wo), wo)


def test_a_plain_linear_state_dict_is_read_as_a_bridge_model_would_hand_it_over():
    """TL 4's TransformerBridge keeps weights in fused nn.Linear layers: their state dict is all the spectral tools need."""
    from lenslab.interp.spectral import detect_traps, htsr_alpha

    g = torch.Generator().manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)).double()
    with torch.no_grad():
        w = net[0].weight  # [256, 128]
        w.copy_(torch.randn(w.shape, generator=g, dtype=torch.float64))
        w[5, 7], w[100, 3] = 40.0, 30.0  # two planted entries: two traps
    ms = extract_matrices(net.state_dict())
    assert list(ms.matrices) == ["0.weight", "2.weight"] and {s.name for s in ms.skipped} == {"0.bias", "2.bias"}
    assert torch.equal(ms.matrices["0.weight"], net[0].weight.detach())
    assert detect_traps(ms.matrices["0.weight"], "0.weight").n_traps == 2
    assert htsr_alpha(ms.matrices["2.weight"]).alpha == htsr_alpha(net[2].weight.detach()).alpha


def test_transformer_lens_bridge_native_model_state_dict():
    """What TL 4 changes, checked on TL 3.9's own bridge (offline: ``boot_native`` builds from a config): the weights
    are fused 2-D ``nn.Linear`` matrices (``attn.q.weight`` holds every head), exposed as 3-D ``W_Q`` properties;
    ``extract_matrices`` reads the state dict as is."""
    bridge_mod = pytest.importorskip("transformer_lens.model_bridge")
    cfg = {"n_layers": 1, "d_model": 64, "n_ctx": 8, "d_head": 16, "n_heads": 4, "d_mlp": 128, "d_vocab": 20, "act_fn": "relu"}
    bridge = bridge_mod.TransformerBridge.boot_native({**cfg, "seed": 0})
    ms = extract_matrices(bridge.state_dict())
    q = ms.matrices["blocks.0.attn.q.weight"]
    assert tuple(q.shape) == (64, 64) and tuple(ms.matrices["blocks.0.mlp.in.weight"].shape) == (128, 64)
    w_q = bridge.blocks[0].attn.W_Q.detach()  # [n_heads, d_model, d_head]
    assert tuple(w_q.shape) == (4, 64, 16)
    torch.testing.assert_close(w_q, q.reshape(4, 16, 64).transpose(1, 2), rtol=0, atol=0)
    assert "pos_embed.weight" in ms.matrices  # a plain state dict has no TL names: W_pos is not excluded by name here
