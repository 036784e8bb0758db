"""Gradient conflict and amplification against direct per-group / per-example autograd."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from helpers import tiny_config

from lenslab.tasks import MPSPTask, make_mpsp_splits
from lenslab.training.gradients import gradient_dynamics
from lenslab.training.presets import build_model


def test_against_direct_autograd():
    cfg = tiny_config()
    model = build_model(cfg["model"], seed=0).eval()
    s = make_mpsp_splits(MPSPTask(seq_len=4, n_values=8), 0.8, 200, 10, 10, seed=0)
    x, y = s["train_tokens"], s["train_labels"]
    consistent = s["train_labels"] == s["train_shortcut"]
    got = gradient_dynamics(model, x, y, consistent, probe_size=1000)

    def group_grad(mask):
        model.zero_grad()
        F.cross_entropy(model(x[mask])[:, -1], y[mask]).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    gc, ga = group_grad(consistent), group_grad(~consistent)
    cos = torch.dot(gc, ga) / (gc.norm() * ga.norm())
    assert abs(got["grad_conflict"] - cos.item()) < 1e-4

    norms = []
    for i in range(len(x)):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1])[:, -1], y[i : i + 1]).backward()
        norms.append(torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item())
    norms = torch.tensor(norms)
    ratio = norms[~consistent].mean() / norms[consistent].mean()
    assert abs(got["grad_amplification"] - ratio.item()) < 1e-4 * ratio.item()
    assert abs(got["grad_norm_anti"] - norms[~consistent].mean().item()) < 1e-4


def test_empty_group_gives_none():
    cfg = tiny_config()
    model = build_model(cfg["model"], seed=0)
    s = make_mpsp_splits(MPSPTask(seq_len=4, n_values=8), 1.0, 100, 10, 10, seed=0)
    got = gradient_dynamics(model, s["train_tokens"], s["train_labels"], s["train_labels"] == s["train_shortcut"])
    assert got["grad_conflict"] is None and got["grad_amplification"] is None
