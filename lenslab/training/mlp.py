"""A hooked MLP: paper 2's 784-200-200-10 ReLU network as a TransformerLens ``HookedRootModule``.

    model = build_mlp({"arch": "mlp", "d_in": 784, "d_hidden": 200, "n_layers": 3, "d_out": 10,
                       "act_fn": "relu", "init_scale": 8.0}, seed=0)
    logits, cache = model.run_with_cache(x)          # cache["layers.0.hook_post"]: [batch, 200]
    model.run_with_hooks(x, fwd_hooks=[("layers.1.hook_pre", hook)])

Weights are ``[d_in, d_out]`` matrices (TransformerLens's orientation: ``x @ W + b``), named
``layers.{i}.W`` and ``layers.{i}.b``. Hook points, per layer ``i``: ``layers.{i}.hook_pre``
(``x @ W + b``) and, for every layer but the last, ``layers.{i}.hook_post`` (after the
activation); ``hook_input`` sees the input. The last layer's ``hook_pre`` is the output.

Init (the predecessor's, Omnigrok's): each layer is drawn as ``torch.nn.Linear(d_in, d_out)``
draws it (Kaiming-uniform weights with a=sqrt(5), uniform biases, both bounded by
1/sqrt(d_in)), in order, under ``torch.manual_seed(seed)`` inside ``fork_rng`` (the caller's RNGs
are untouched), and then every parameter is multiplied by ``init_scale``. So the model equals an
``nn.Sequential`` of ``nn.Linear`` built after ``torch.manual_seed(seed)`` and scaled, weight for weight.
"""

from __future__ import annotations

import itertools

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

ACTIVATIONS = {"relu": torch.relu, "gelu": nn.functional.gelu, "tanh": torch.tanh}


class MLPLayer(nn.Module):
    """One ``x @ W + b`` layer with its hook points (``hook_pre``; ``hook_post`` after the activation, where there is one)."""

    def __init__(self, d_in: int, d_out: int, act_fn: str | None):
        super().__init__()
        self.W = nn.Parameter(torch.empty(d_in, d_out))
        self.b = nn.Parameter(torch.empty(d_out))
        self.hook_pre = HookPoint()
        self.act = ACTIVATIONS[act_fn] if act_fn is not None else None
        if act_fn is not None:
            self.hook_post = HookPoint()

    def forward(self, x: Float[Tensor, "batch d_in"]) -> Float[Tensor, "batch d_out"]:
        pre = self.hook_pre(x @ self.W + self.b)
        return pre if self.act is None else self.hook_post(self.act(pre))


class HookedMLP(HookedRootModule):
    """``n_layers`` linear layers, ``d_in -> d_hidden -> ... -> d_out``, an activation between them."""

    def __init__(self, cfg: dict):
        super().__init__()
        self.cfg = dict(cfg)
        dims = mlp_dims(cfg)
        self.hook_input = HookPoint()
        self.layers = nn.ModuleList(
            MLPLayer(a, b, cfg["act_fn"] if i < len(dims) - 2 else None) for i, (a, b) in enumerate(itertools.pairwise(dims))
        )
        self.setup()  # TransformerLens: names every HookPoint (hook_dict, run_with_cache, run_with_hooks)

    @property
    def dtype(self) -> torch.dtype:
        return self.layers[0].W.dtype

    def forward(self, x: Float[Tensor, "batch d_in"]) -> Float[Tensor, "batch d_out"]:
        x = self.hook_input(x)
        for layer in self.layers:
            x = layer(x)
        return x

    def matrices(self) -> dict[str, Tensor]:
        """``{"layers.{i}.W": [d_in, d_out]}``: the weight matrices, by state-dict name."""
        return {f"layers.{i}.W": layer.W for i, layer in enumerate(self.layers)}


def mlp_dims(cfg: dict) -> list[int]:
    """``[d_in, d_hidden, ..., d_hidden, d_out]``: ``n_layers`` + 1 widths."""
    return [cfg["d_in"], *[cfg["d_hidden"]] * (cfg["n_layers"] - 1), cfg["d_out"]]


def init_mlp_(model: HookedMLP, seed: int, init_scale: float) -> HookedMLP:
    """Draw every layer as ``nn.Linear`` does under ``torch.manual_seed(seed)``, times ``init_scale`` (global RNGs untouched)."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        for layer in model.layers:
            d_in, d_out = layer.W.shape
            ref = nn.Linear(d_in, d_out)  # its reset_parameters() is the init: weight then bias
            layer.W.copy_(ref.weight.T * init_scale)
            layer.b.copy_(ref.bias * init_scale)
    return model


def build_mlp(cfg: dict, seed: int | None = None, device: str | None = None, dtype: torch.dtype | None = None) -> HookedMLP:
    """A fresh ``HookedMLP`` drawn in float32 from ``seed`` (0 when None) and then cast to ``dtype``."""
    model = init_mlp_(HookedMLP(cfg), 0 if seed is None else seed, cfg["init_scale"])
    if dtype is not None:
        model = model.to(dtype)
    if device is not None:
        model = model.to(device)
    return model
