"""The ‖x‖² test: does an MLP's prediction depend on the input's norm rather than its direction?

    probes = standard_probes(model, test_x, test_y, n=256, seed=0)   # {"gaussian": x, "mixed": x}
    rows = norm_response(model, probes, scales=(0.25, 0.5, 1, 2, 4))

Each input is multiplied by c. Per probe set and scale, the row gives ``agree_with_unit`` (share of
inputs whose argmax class equals the one at c = 1), ``top_class`` and ``top_class_share`` (the most
predicted class and its share: 1.0 means every input goes to one class), ``mean_max_logit``, and
``mean_logit_norm``. A bias-free ReLU network is positively homogeneous, f(cx) = c·f(x), so its
predictions do not move with c at all; biases break that, and a model whose predictions collapse
onto one class as c grows answers by norm. Probe sets: Gaussian N(0, I) inputs (paper 2's MLP
probe) and *mixed images*, (x_a + x_b)/2 for test images of two different classes.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lenslab.interp.common import InterpError, Table, check_scales
from lenslab.interp.spectral.jsd import gaussian_probes
from lenslab.interp.spectral.shuffle import make_generator

DEFAULT_SCALES = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)


def mixed_images(
    x: Float[Tensor, "n_images d"], y: Int[Tensor, " n_images"], n: int = 256, seed: int = 0
) -> tuple[Float[Tensor, "n_mixed d"], Int[Tensor, "n_mixed 2"]]:
    """``n`` inputs (x_a + x_b) / 2 with y_a ≠ y_b, pairs drawn from ``make_generator(seed)``; and their class pairs."""
    if len(torch.unique(y)) < 2:
        raise InterpError("mixed_images needs images of at least 2 classes")
    gen = make_generator(seed)
    a = torch.randint(0, len(y), (4 * n,), generator=gen)
    b = torch.randint(0, len(y), (4 * n,), generator=gen)
    keep = torch.nonzero(y[a] != y[b]).flatten()[:n]
    if len(keep) < n:
        raise InterpError(f"could draw only {len(keep)} pairs of different classes for n={n}; lower n")
    a, b = a[keep], b[keep]
    return (x[a] + x[b]) / 2, torch.stack([y[a], y[b]], 1)


def standard_probes(model, test_x: Tensor, test_y: Tensor, n: int = 256, seed: int = 0) -> dict[str, Tensor]:
    """``{"gaussian": N(0, I) inputs, "mixed": mixed test images}``, ``n`` each, in the model's dtype."""
    mixed, _ = mixed_images(test_x, test_y, n, seed)
    return {"gaussian": gaussian_probes(model, n, seed), "mixed": mixed.to(model.dtype)}


@torch.no_grad()
def norm_response(model, probes: dict[str, Tensor], scales=DEFAULT_SCALES) -> Table:
    """Rows ``{probe, scale, input_norm, agree_with_unit, top_class, top_class_share, mean_max_logit, mean_logit_norm}``.

    ``model``: anything that maps ``[n, d_in]`` to logits ``[n, k]`` (a ``HookedMLP``). ``probes``:
    named input sets (``standard_probes``). ``input_norm`` is the mean ‖c·x‖.
    """
    scales = check_scales(scales)
    if not isinstance(probes, dict) or not probes:
        raise InterpError("probes must be a non-empty dict {name: inputs [n, d_in]}; see standard_probes")
    rows = Table()
    for name, x in probes.items():
        if not isinstance(x, Tensor) or x.ndim != 2 or not len(x):
            raise InterpError(f"probes[{name!r}] must be a non-empty [n, d_in] tensor; got {getattr(x, 'shape', type(x))}")
        unit = model(x).argmax(-1)
        for c in scales:
            logits = model(x * c)
            pred = logits.argmax(-1)
            counts = torch.bincount(pred, minlength=logits.shape[-1])
            rows.append(
                {
                    "probe": name,
                    "scale": c,
                    "input_norm": float((x * c).norm(dim=-1).mean()),
                    "agree_with_unit": float((pred == unit).double().mean()),
                    "top_class": int(counts.argmax()),
                    "top_class_share": float(counts.max() / len(pred)),
                    "mean_max_logit": float(logits.max(-1).values.double().mean()),
                    "mean_logit_norm": float(logits.double().norm(dim=-1).mean()),
                }
            )
    return rows
