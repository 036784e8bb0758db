"""Cross-split activation patching, whole grids at once, equal to ``transformer_lens.patching``.

Pairs: ``validation`` row i (shortcut-consistent, "clean") and ``counterfactual`` row i (its
anti-shortcut partner, usually one value token changed). We patch in both directions:
``"validation->counterfactual"`` (source = validation, receiver = counterfactual) and back.

**Metric (normalized logit difference).** For pair i let ``a_i`` = the counterfactual's true
label and ``b_i`` = its shortcut class (they differ by construction), and
``LD(x) = logit_a(x) - logit_b(x)`` at the readout position. For a grid cell,

    value = (mean_i LD(patched receiver) - mean_i LD(receiver)) / (mean_i LD(source) - mean_i LD(receiver))

so 0 = the patch changed nothing, 1 = the receiver now behaves (on average) like the source.
This is exactly what TL's ``get_act_patch_*`` functions compute with
``normalized_logit_diff_metric`` (tested to 1e-5). The same classes ``(a, b)`` are used in both
directions.

**How the grid is computed (one batched pass instead of one forward per cell).** Caches of the
source and receiver runs are taken once (hooks, ``run_with_cache``). Every cell is then turned
into an edited residual stream at the first layer it can influence, and all cells that start
at the same layer run through the remaining blocks together, in chunks:

- ``resid_pre`` at (l, p): resume at block l with position p replaced;
- ``attn_out``/``z`` at (l, p): everything up to ``resid_post`` of block l changes only at p
  (the MLP and LayerNorm are position-wise), so that one position is recomputed and we resume
  at block l+1; ``mlp_out`` likewise;
- the last block is evaluated only at the readout query (its keys/values use all positions);
- pairs whose patched activation equals the receiver's bit for bit (e.g. positions before the
  changed token, under causal attention) are a no-op and keep the receiver's logit difference.

These are exact rewrites of the same computation, not approximations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer, utils

from interp.common import InterpError, Table, check_tokens, gather_class, subsample

GRID_KINDS = ("resid_pre", "attn_out", "mlp_out", "z_by_pos", "z_all_pos")
GRID_AXES = {
    "resid_pre": ("layer", "pos"),
    "attn_out": ("layer", "pos"),
    "mlp_out": ("layer", "pos"),
    "z_by_pos": ("layer", "pos", "head"),  # TL's get_act_patch_attn_head_out_by_pos layout
    "z_all_pos": ("layer", "head"),
}
DIRECTIONS = ("validation->counterfactual", "counterfactual->validation")


@dataclass(frozen=True)
class PatchGrid:
    """One patching grid: ``values`` in TL's layout (see ``GRID_AXES[kind]``)."""

    kind: str
    direction: str
    values: Tensor = field(repr=False)
    n_pairs: int
    ld_source: float  # mean logit difference of the source run
    ld_receiver: float  # mean logit difference of the unpatched receiver run

    @property
    def axes(self) -> tuple[str, ...]:
        return GRID_AXES[self.kind]

    def to_records(self) -> Table:
        rows = Table()
        for idx in torch.cartesian_prod(*[torch.arange(s) for s in self.values.shape]).reshape(-1, self.values.ndim):
            idx = tuple(int(i) for i in idx)
            row = {"kind": self.kind, "direction": self.direction}
            row.update(dict(zip(self.axes, idx)))
            row["value"] = float(self.values[idx])
            rows.append(row)
        return rows

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "direction": self.direction,
            "axes": list(self.axes),
            "values": self.values.tolist(),
            "n_pairs": self.n_pairs,
            "ld_source": self.ld_source,
            "ld_receiver": self.ld_receiver,
        }


def logit_diff(logits: Float[Tensor, "batch k"], a: Int[Tensor, " batch"], b: Int[Tensor, " batch"]) -> Float[Tensor, " batch"]:
    """``logit_a - logit_b`` per example."""
    return gather_class(logits, a) - gather_class(logits, b)


def normalized_logit_diff_metric(
    a: Int[Tensor, " batch"], b: Int[Tensor, " batch"], ld_receiver: float, ld_source: float
) -> Callable[[Float[Tensor, "batch pos d_vocab"]], Float[Tensor, ""]]:
    """The metric as a TL ``patching_metric`` (logits of the whole batch -> scalar)."""

    def metric(logits: Float[Tensor, "batch pos d_vocab"]) -> Float[Tensor, ""]:
        return (logit_diff(logits[:, -1], a, b).mean() - ld_receiver) / (ld_source - ld_receiver)

    return metric


# -- the resumed forward ------------------------------------------------------------------
def _fast_last_block(model: HookedTransformer) -> bool:
    cfg = model.cfg
    unsupported = (
        getattr(cfg, "parallel_attn_mlp", False)
        or getattr(cfg, "use_split_qkv_input", False)
        or getattr(cfg, "use_attn_in", False)
        or getattr(cfg, "n_key_value_heads", None) is not None
        or getattr(cfg, "use_normalization_before_and_after", False)
        or getattr(cfg, "use_qk_norm", False)
        or getattr(cfg, "attention_dir", "causal") != "causal"
        or (getattr(cfg, "attn_scores_soft_cap", -1.0) or -1.0) > 0
        or getattr(cfg, "original_architecture", None) is not None
    )
    return cfg.positional_embedding_type == "standard" and not unsupported


def _apply_mlp(block, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
    return block.apply_mlp(block.ln2(x)) if hasattr(block, "apply_mlp") else block.mlp(block.ln2(x))


def _last_block_at_readout(model: HookedTransformer, resid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch d_model"]:
    """``resid_post`` of the last block at the last position only (keys/values from every position)."""
    block = model.blocks[-1]
    if not _fast_last_block(model):
        return block(resid)[:, -1]
    attn = block.attn
    x = block.ln1(resid)
    H = attn.W_Q.shape[0]
    w_kv = einops.rearrange(torch.stack([attn.W_K, attn.W_V]), "two h d e -> d (two h e)")
    b_kv = einops.rearrange(torch.stack([attn.b_K, attn.b_V]), "two h e -> (two h e)")
    k, v = einops.rearrange(x @ w_kv + b_kv, "b p (two h e) -> two b p h e", two=2, h=H)
    q = x[:, -1] @ einops.rearrange(attn.W_Q, "h d e -> d (h e)") + einops.rearrange(attn.b_Q, "h e -> (h e)")
    q = einops.rearrange(q, "b (h e) -> b 1 h e", h=H)
    scores = (q * k).sum(-1) / attn.attn_scale  # [b, key pos, head]
    pattern = torch.softmax(scores, dim=1)  # the last query sees every key under the causal mask
    z = (pattern[..., None] * v).sum(1)  # [b, head, d_head]
    attn_out = einops.rearrange(z, "b h e -> b (h e)") @ einops.rearrange(attn.W_O, "h e d -> (h e) d") + attn.b_O
    mid = resid[:, -1] + attn_out
    if model.cfg.attn_only:
        return mid
    return mid + _apply_mlp(block, mid[:, None])[:, 0]


def resume_readout_logits(model: HookedTransformer, resid: Float[Tensor, "batch pos d_model"], start_layer: int) -> Float[Tensor, "batch k"]:
    """Logits at the readout position when ``resid`` is the residual stream entering block ``start_layer``."""
    L = model.cfg.n_layers
    for layer in range(start_layer, L - 1):
        resid = model.blocks[layer](resid)
    final = resid[:, -1] if start_layer >= L else _last_block_at_readout(model, resid)
    return model.unembed(model.ln_final(final[:, None]))[:, 0]


# -- building the cells --------------------------------------------------------------------
CACHE_NAMES = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "z")


def _cache(model: HookedTransformer, tokens: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Readout logits and the activations the grids need (one hooked forward)."""
    names = {utils.get_act_name(n, layer) for n in CACHE_NAMES for layer in range(model.cfg.n_layers)}
    logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    return logits[:, -1], {n: cache[n] for n in names if n in cache.cache_dict}


def _local_post(model: HookedTransformer, layer: int, resid_pre: Tensor, attn_out: Tensor) -> Tensor:
    """``resid_post`` of block ``layer`` at some positions, given its ``resid_pre`` and ``attn_out`` there."""
    mid = resid_pre + attn_out
    return mid if model.cfg.attn_only else mid + _apply_mlp(model.blocks[layer], mid)


def _attn_out_from_z(model: HookedTransformer, layer: int, z: Float[Tensor, "batch pos head d_head"]) -> Float[Tensor, "batch pos d_model"]:
    attn = model.blocks[layer].attn
    return einops.einsum(z, attn.W_O, "b p h e, h e d -> b p d") + attn.b_O


def _layer_cells(model: HookedTransformer, kind: str, layer: int, src: dict, rec: dict, n_pos: int):
    """All cells of ``kind`` at ``layer`` as one batch of edited residual streams.

    Returns ``(cell, row, start, resid)``: flat cell index within the layer and pair index per
    row, the block to resume at, and the residual stream entering it. Rows whose patch is a
    no-op (identical activations, or a last-block site off the readout) are left out.
    """
    H, L = model.cfg.n_heads, model.cfg.n_layers
    act = lambda c, n: c[utils.get_act_name(n, layer)]
    site = "z" if kind.startswith("z") else kind
    a_src, a_rec = act(src, site), act(rec, site)
    if kind == "z_all_pos":
        diff = (a_src != a_rec).flatten(3).any(-1).any(1)  # [pair, head]
    elif kind == "z_by_pos":
        diff = (a_src != a_rec).any(-1).reshape(len(a_src), -1)  # [pair, pos*head]
    else:
        diff = (a_src != a_rec).any(-1)  # [pair, pos]
    row, cell = diff.nonzero(as_tuple=True)
    if kind == "z_all_pos":
        head = cell
        z = a_rec[row].clone()
        z[torch.arange(len(row)), :, head] = a_src[row, :, head]
        resid = _local_post(model, layer, act(rec, "resid_pre")[row], _attn_out_from_z(model, layer, z))
        return cell, row, layer + 1, resid
    pos = cell // H if kind == "z_by_pos" else cell
    start = layer if kind == "resid_pre" else layer + 1
    if start == L:  # only the readout position reaches the logits
        keep = pos == n_pos - 1
        row, cell, pos = row[keep], cell[keep], pos[keep]
    n = torch.arange(len(row))
    if kind == "resid_pre":
        resid = act(rec, "resid_pre")[row].clone()
        resid[n, pos] = a_src[row, pos]
        return cell, row, start, resid
    resid = act(rec, "resid_post")[row].clone()
    if kind == "mlp_out":
        resid[n, pos] = act(rec, "resid_mid")[row, pos] + a_src[row, pos]
        return cell, row, start, resid
    if kind == "attn_out":
        out = a_src[row, pos]
    else:
        head = cell % H
        z = a_rec[row, pos].clone()  # [rows, head, d_head]
        z[n, head] = a_src[row, pos, head]
        out = _attn_out_from_z(model, layer, z[:, None])[:, 0]
    resid[n, pos] = _local_post(model, layer, act(rec, "resid_pre")[row, pos][:, None], out[:, None])[:, 0]
    return cell, row, start, resid


def _check_kind(model: HookedTransformer, kind: str) -> None:
    if kind not in GRID_KINDS:
        raise InterpError(f"unknown patching grid {kind!r}: choose one of {list(GRID_KINDS)}")
    if kind == "mlp_out" and model.cfg.attn_only:
        raise InterpError("grid 'mlp_out' needs MLPs, but this model is attention-only: drop it from kinds")


def _grids_from_caches(model, kinds, direction, src, rec, ld_src, ld_rec, a, b, n_pos, max_batch) -> dict[str, PatchGrid]:
    L, H = model.cfg.n_layers, model.cfg.n_heads
    n = len(ld_rec)
    mean_src, mean_rec = float(ld_src.double().mean()), float(ld_rec.double().mean())
    out = {}
    for kind in kinds:
        shape = {"z_by_pos": (L, n_pos, H), "z_all_pos": (L, H)}.get(kind, (L, n_pos))
        per_layer = int(torch.tensor(shape[1:]).prod())
        totals = torch.zeros(L * per_layer, dtype=torch.float64)  # sum over pairs of (LD patched - LD receiver)
        for layer in range(L):
            cell, row, start, resid = _layer_cells(model, kind, layer, src, rec, n_pos)
            for i in range(0, len(row), max_batch):
                r = row[i : i + max_batch]
                ld = logit_diff(resume_readout_logits(model, resid[i : i + max_batch], start), a[r], b[r])
                totals.index_add_(0, layer * per_layer + cell[i : i + max_batch], (ld - ld_rec[r]).double())
        values = ((totals.reshape(shape) / n) / (mean_src - mean_rec)).float()
        out[kind] = PatchGrid(kind=kind, direction=direction, values=values, n_pairs=n, ld_source=mean_src, ld_receiver=mean_rec)
    return out


def _check_pairs(model, source_tokens, receiver_tokens, a, b):
    source_tokens = check_tokens(model, source_tokens, "source_tokens")
    receiver_tokens = check_tokens(model, receiver_tokens, "receiver_tokens")
    if source_tokens.shape != receiver_tokens.shape or len(a) != len(source_tokens) or len(b) != len(source_tokens):
        raise InterpError(
            f"source {tuple(source_tokens.shape)}, receiver {tuple(receiver_tokens.shape)}, a [{len(a)}], b [{len(b)}]: "
            "pairs must have equal shapes and one (a, b) per pair"
        )
    return source_tokens, receiver_tokens


def patch_grids(
    model: HookedTransformer,
    source_tokens: Int[Tensor, "pair pos"],
    receiver_tokens: Int[Tensor, "pair pos"],
    a: Int[Tensor, " pair"],
    b: Int[Tensor, " pair"],
    kinds: tuple[str, ...] = GRID_KINDS,
    direction: str = "source->receiver",
    max_batch: int = 4096,
) -> dict[str, PatchGrid]:
    """Every grid in ``kinds``, patching source activations into the receiver run (caches shared)."""
    for kind in kinds:
        _check_kind(model, kind)
    source_tokens, receiver_tokens = _check_pairs(model, source_tokens, receiver_tokens, a, b)
    with torch.no_grad():
        src_logits, src = _cache(model, source_tokens)
        rec_logits, rec = _cache(model, receiver_tokens)
        return _grids_from_caches(
            model, kinds, direction, src, rec, logit_diff(src_logits, a, b), logit_diff(rec_logits, a, b), a, b, receiver_tokens.shape[1], max_batch
        )


def patch_grid(model, source_tokens, receiver_tokens, a, b, kind: str, direction: str = "source->receiver", max_batch: int = 4096) -> PatchGrid:
    """One grid; see ``patch_grids``."""
    return patch_grids(model, source_tokens, receiver_tokens, a, b, (kind,), direction, max_batch)[kind]


def cross_split_patching(
    model: HookedTransformer,
    validation_tokens: Int[Tensor, "pair pos"],
    counterfactual_tokens: Int[Tensor, "pair pos"],
    counterfactual_labels: Int[Tensor, " pair"],
    counterfactual_shortcut: Int[Tensor, " pair"],
    kinds: tuple[str, ...] = GRID_KINDS,
    directions: tuple[str, ...] = DIRECTIONS,
    max_pairs: int | None = 256,
    seed: int = 0,
    max_batch: int = 4096,
) -> dict[str, dict[str, PatchGrid]]:
    """Every grid in ``kinds`` for both directions: ``result[direction][kind]``.

    Uses at most ``max_pairs`` pairs (a seeded subsample). ``a`` = counterfactual label,
    ``b`` = counterfactual shortcut (see the module docstring). Two cached forwards in all.
    """
    for d in directions:
        if d not in DIRECTIONS:
            raise InterpError(f"unknown direction {d!r}: choose from {list(DIRECTIONS)}")
    for kind in kinds:
        _check_kind(model, kind)
    idx = subsample(len(validation_tokens), max_pairs, seed)
    a, b = counterfactual_labels[idx], counterfactual_shortcut[idx]
    if (a == b).any():
        raise InterpError("some counterfactual rows have label == shortcut: pass the anti-shortcut partners (counterfactual split)")
    val, cf = _check_pairs(model, validation_tokens[idx], counterfactual_tokens[idx], a, b)
    with torch.no_grad():
        runs = {"validation": _cache(model, val), "counterfactual": _cache(model, cf)}
        ld = {k: logit_diff(lg, a, b) for k, (lg, _) in runs.items()}
        out: dict[str, dict[str, PatchGrid]] = {}
        for d in directions:
            s, r = d.split("->")
            out[d] = _grids_from_caches(model, kinds, d, runs[s][1], runs[r][1], ld[s], ld[r], a, b, val.shape[1], max_batch)
    return out
