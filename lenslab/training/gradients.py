"""Gradient dynamics probes: conflict and amplification between shortcut groups.

Definitions (both computed on the *training* split, with the model's current weights):

- **gradient conflict** = cos(g_c, g_a), where g_c is the gradient (over all parameters,
  flattened) of the mean cross-entropy on the shortcut-consistent training examples and g_a the
  same on the anti-shortcut training examples. Negative: the groups pull against each other.
- **gradient amplification** = mean_i∈anti ‖∇ℓ_i‖ / mean_i∈consistent ‖∇ℓ_i‖, the ratio of
  mean per-example gradient norms, computed on the first ``probe_size`` examples of each group
  (train order) with ``torch.func.vmap``. Paper 1 reports 9–17× at r = 0.9.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from jaxtyping import Int
from torch import Tensor
from torch.func import functional_call, grad, vmap
from transformer_lens import HookedTransformer


def readout_logits(model: HookedTransformer, tokens: Int[Tensor, "batch pos"], batch_size: int | None = None) -> Tensor:
    """Logits at the last (readout) position: [batch, d_vocab_out].

    ``batch_size=None``: one forward pass, gradients flow as the caller's context allows (training).
    ``batch_size=n``: in chunks of ``n`` examples without gradients (evaluation of a whole split).
    The one definition in lenslab (``interp.common`` re-exports it).
    """
    if batch_size is None:
        return model(tokens, return_type="logits")[:, -1, :]
    with torch.no_grad():
        return torch.cat(
            [model(tokens[i : i + batch_size], return_type="logits")[:, -1, :] for i in range(0, len(tokens), batch_size)]
        )


def _flat_grad(model: HookedTransformer, tokens: Tensor, labels: Tensor, chunk: int = 4096) -> Tensor:
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    n = tokens.shape[0]
    for start in range(0, n, chunk):
        t, y = tokens[start : start + chunk], labels[start : start + chunk]
        loss = F.cross_entropy(readout_logits(model, t), y, reduction="sum") / n
        for acc, g in zip(total, torch.autograd.grad(loss, params)):
            acc += g
    return torch.cat([g.reshape(-1) for g in total])


def per_example_grad_norms(model: HookedTransformer, tokens: Int[Tensor, "batch pos"], labels: Int[Tensor, " batch"]) -> Tensor:
    """‖∇_θ ℓ(x_i, y_i)‖₂ for every example, via ``vmap(grad(functional_call))``."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v for k, v in model.named_buffers()}

    def loss_one(p, t, y):
        logits = functional_call(model, (p, buffers), (t[None],), {"return_type": "logits"})[0, -1]
        return F.cross_entropy(logits[None], y[None])

    grads = vmap(grad(loss_one), in_dims=(None, 0, 0))(params, tokens, labels)
    sq = sum(g.reshape(g.shape[0], -1).pow(2).sum(1) for g in grads.values())
    return sq.sqrt()


def gradient_dynamics(
    model: HookedTransformer,
    tokens: Int[Tensor, "n pos"],
    labels: Int[Tensor, " n"],
    consistent: Tensor,
    probe_size: int = 256,
    conflict_size: int = 4096,
) -> dict[str, float | None]:
    """Conflict and amplification (see the module docstring); ``None`` where a group is empty."""
    out: dict[str, float | None] = {
        "grad_conflict": None,
        "grad_amplification": None,
        "grad_norm_consistent": None,
        "grad_norm_anti": None,
    }
    idx_c = torch.nonzero(consistent).flatten()
    idx_a = torch.nonzero(~consistent).flatten()
    if len(idx_c) == 0 or len(idx_a) == 0:
        return out
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            cc, ca = idx_c[:conflict_size], idx_a[:conflict_size]
            g_c = _flat_grad(model, tokens[cc], labels[cc])
            g_a = _flat_grad(model, tokens[ca], labels[ca])
            denom = g_c.norm() * g_a.norm()
            out["grad_conflict"] = float((g_c @ g_a) / denom) if denom > 0 else None
            pc, pa = idx_c[:probe_size], idx_a[:probe_size]
            n_c = per_example_grad_norms(model, tokens[pc], labels[pc]).mean().item()
            n_a = per_example_grad_norms(model, tokens[pa], labels[pa]).mean().item()
    finally:
        model.train(was_training)
    out["grad_norm_consistent"] = n_c
    out["grad_norm_anti"] = n_a
    out["grad_amplification"] = n_a / n_c if n_c > 0 and math.isfinite(n_a / n_c) else None
    return out
