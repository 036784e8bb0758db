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
from torch import Tensor, nn

from lenslab.training.errors import ConfigError
from lenslab.training.mlp import ACTIVATIONS, HookedMLP


class StackedMLP(nn.Module):
    """E members with one ``HookedMLP`` config; ``params[k]`` is ``[E, *shape]`` of the k-th named parameter."""

    def __init__(self, template: HookedMLP, stacked: dict[str, Tensor]):
        super().__init__()
        self.cfg = dict(template.cfg)
        self.names = [n for n, _ in template.named_parameters()]
        missing = set(self.names) - set(stacked)
        if missing:
            raise ConfigError(f"stacked parameters lack {sorted(missing)[:3]}")
        self.n_members = next(iter(stacked.values())).shape[0]
        self.params = nn.ParameterList([nn.Parameter(stacked[n].detach().clone()) for n in self.names])
        self._index = {n: i for i, n in enumerate(self.names)}
        self.n_layers = len(template.layers)
        self.act = ACTIVATIONS[self.cfg["act_fn"]]

    @classmethod
    def from_models(cls, models: list[HookedMLP]) -> StackedMLP:
        if not models:
            raise ConfigError("an ensemble needs at least one member")
        if any(m.cfg != models[0].cfg for m in models[1:]):
            raise ConfigError("stacked MLP members must share one config (widths, layers, activation)")
        names = [n for n, _ in models[0].named_parameters()]
        stacked = {n: torch.stack([dict(m.named_parameters())[n].detach() for m in models]) for n in names}
        return cls(models[0], stacked)

    def p(self, name: str) -> Tensor:
        return self.params[self._index[name]]

    def member_state_dict(self, e: int) -> dict[str, Tensor]:
        """Member ``e`` as a ``HookedMLP`` state dict (parameters copied)."""
        return {n: p[e].detach().clone() for n, p in zip(self.names, self.params)}

    def load_member(self, e: int, state: dict[str, Tensor]) -> None:
        with torch.no_grad():
            for n, p in zip(self.names, self.params):
                p[e].copy_(state[n])

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
