"""Activation patching the slow, obvious way: the reference the fast engine is tested against.

``lenslab.interp.patching.patch_grids`` computes its grids with a few batched, resumed forwards
(see that module). This module computes the same grids with one ``run_with_hooks`` per grid
cell, so that each step can be read top to bottom and checked by eye:

1. ``model.run_with_cache(source)`` once (the "clean" run), and the receiver ("corrupted") run;
2. for every cell, rerun the receiver with one hook that copies the source activation into it
   at that cell (a layer's hook point, at one position and/or one head);
3. value = (mean_i LD(patched receiver) - mean_i LD(receiver)) / (mean_i LD(source) - mean_i LD(receiver)),
   with ``LD = logit_a - logit_b`` at the last (readout) position; 0 = no effect, 1 = like the source.

The hook point of each grid kind (``L`` = layer), its activation, and a cell's index into it:

- ``resid_pre``: ``blocks.L.hook_resid_pre`` ``[batch pos d_model]``, cell ``[:, pos]``;
- ``attn_out``: ``blocks.L.hook_attn_out`` ``[batch pos d_model]``, cell ``[:, pos]``;
- ``mlp_out``: ``blocks.L.hook_mlp_out`` ``[batch pos d_model]``, cell ``[:, pos]``;
- ``z_by_pos``: ``blocks.L.attn.hook_z`` ``[batch pos head d_head]``, cell ``[:, pos, head]``;
- ``z_all_pos``: ``blocks.L.attn.hook_z`` ``[batch pos head d_head]``, cell ``[:, :, head]``.

The result has the fast engine's structure (``{kind: PatchGrid}``, ``values`` float32 on the
CPU in ``GRID_AXES[kind]`` layout), so the two compare directly with ``torch.testing.assert_close``.
It costs one forward per cell; use it on small models only.
"""

from __future__ import annotations

import itertools
from functools import partial

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens.hook_points import HookPoint
from transformer_lens.utilities import get_act_name

from lenslab.interp.common import InterpError
from lenslab.interp.patching import GRID_KINDS, PatchGrid

HOOK = {"resid_pre": "resid_pre", "attn_out": "attn_out", "mlp_out": "mlp_out", "z_by_pos": "z", "z_all_pos": "z"}


def patch_hook(
    receiver_act: Float[Tensor, "batch pos ..."],
    hook: HookPoint,
    source_act: Float[Tensor, "batch pos ..."],
    index: tuple,
) -> Float[Tensor, "batch pos ..."]:
    """Copy the source activation into the receiver's at ``index`` (e.g. ``[:, pos, head]``)."""
    receiver_act[index] = source_act[index]
    return receiver_act


def mean_logit_diff(logits: Float[Tensor, "batch pos d_vocab"], a: Int[Tensor, " batch"], b: Int[Tensor, " batch"]) -> float:
    """mean_i (logit_a - logit_b) at the readout position, averaged in float64."""
    readout = logits[:, -1].double()
    rows = torch.arange(len(a), device=a.device)
    return float((readout[rows, a] - readout[rows, b]).mean())


def cells(model: HookedTransformer, kind: str, n_pos: int) -> list[tuple[tuple[int, ...], tuple]]:
    """Every cell of grid ``kind``: its ``(layer, pos[, head])`` grid index and its activation index."""
    L, P, H = range(model.cfg.n_layers), range(n_pos), range(model.cfg.n_heads)
    all_ = slice(None)
    if kind == "z_by_pos":
        return [((l, p, h), (all_, p, h)) for l, p, h in itertools.product(L, P, H)]
    if kind == "z_all_pos":
        return [((l, h), (all_, all_, h)) for l, h in itertools.product(L, H)]
    return [((l, p), (all_, p)) for l, p in itertools.product(L, P)]


def patch_grids_reference(
    model: HookedTransformer,
    source_tokens: Int[Tensor, "pair pos"],
    receiver_tokens: Int[Tensor, "pair pos"],
    a: Int[Tensor, " pair"],
    b: Int[Tensor, " pair"],
    kinds: tuple[str, ...] = GRID_KINDS,
    direction: str = "source->receiver",
) -> dict[str, PatchGrid]:
    """Same as ``patch_grids`` (same arguments, same result), by one hooked forward per cell."""
    device = model.cfg.device
    source_tokens, receiver_tokens = source_tokens.long().to(device), receiver_tokens.long().to(device)
    a, b = a.long().to(device), b.long().to(device)
    if unknown := set(kinds) - set(GRID_KINDS):
        raise InterpError(f"unknown patching grid(s) {sorted(unknown)}: choose from {list(GRID_KINDS)}")
    L, P, H = model.cfg.n_layers, receiver_tokens.shape[1], model.cfg.n_heads
    grids = {}
    with torch.no_grad():
        source_logits, source_cache = model.run_with_cache(source_tokens)  # the clean run, cached once
        ld_source = mean_logit_diff(source_logits, a, b)
        ld_receiver = mean_logit_diff(model(receiver_tokens), a, b)
        for kind in kinds:
            values = torch.zeros({"z_by_pos": (L, P, H), "z_all_pos": (L, H)}.get(kind, (L, P)), dtype=torch.float64)
            for cell, index in cells(model, kind, P):
                hook_name = get_act_name(HOOK[kind], cell[0])
                hook_fn = partial(patch_hook, source_act=source_cache[hook_name], index=index)
                patched_logits = model.run_with_hooks(receiver_tokens, fwd_hooks=[(hook_name, hook_fn)])
                values[cell] = (mean_logit_diff(patched_logits, a, b) - ld_receiver) / (ld_source - ld_receiver)
            grids[kind] = PatchGrid(kind, direction, values.float(), len(a), ld_source, ld_receiver)
    return grids
