"""E ``HookedMLP`` members stacked: parameters ``[E, *shape]`` under the MLP's own names, one batched forward.

    ens = StackedMLP.from_models([build_mlp(cfg, seed=s) for s in range(4)])
    logits = ens(x)  # x [E, batch, d_in] -> [E, batch, d_out]; member e sees only x[e]

Layer ``i`` is ``torch.baddbmm(b_i, h, W_i)`` over the members, the activation between layers (as
``HookedMLP``'s ``x @ W + b``; the fused add may round the last bit differently). The interface is
``StackedTransformer``'s (``names``, ``params``, ``member_state_dict``, ``load_member``), so the
ensemble trainer and ``StackedAdamW`` drive either.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from lenslab.training.errors import ConfigError
from lenslab.training.mlp import ACTIVATIONS, HookedMLP
from lenslab.training.stacked import StackedParams


class StackedMLP(StackedParams):
    """E members with one ``HookedMLP`` config; ``params[k]`` is ``[E, *shape]`` of the k-th named parameter."""

    def __init__(self, template: HookedMLP, stacked: dict[str, Tensor]):
        super().__init__(template, stacked)
        self.cfg = dict(template.cfg)
        self.n_layers = len(template.layers)
        self.act = ACTIVATIONS[self.cfg["act_fn"]]

    @classmethod
    def from_models(cls, models: list[HookedMLP]) -> StackedMLP:
        if any(m.cfg != models[0].cfg for m in models[1:]):
            raise ConfigError("stacked MLP members must share one config (widths, layers, activation)")
        return super().from_models(models)

    def forward(self, x: Float[Tensor, "E batch d_in"]) -> Float[Tensor, "E batch d_out"]:
        if x.dim() != 3 or x.shape[0] != self.n_members:
            raise ConfigError(f"StackedMLP takes [E={self.n_members}, batch, d_in] inputs, got shape {tuple(x.shape)}")
        h = x
        for i in range(self.n_layers):
            h = torch.baddbmm(self.p(f"layers.{i}.b")[:, None, :], h, self.p(f"layers.{i}.W"))
            if i < self.n_layers - 1:
                h = self.act(h)
        return h

    def flops_per_example(self) -> float:
        """Multiply-adds of one member's forward and backward on one example, as flops (2 per multiply-add, backward 2x forward)."""
        macs = sum(self.p(f"layers.{i}.W")[0].numel() for i in range(self.n_layers))
        return 3 * 2 * float(macs)
