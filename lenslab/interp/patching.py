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

**How the grids are computed (a few batched passes instead of one forward per cell).** One
hooked forward caches the source and receiver runs together. Every cell of every grid (and of
both directions) becomes a patched receiver run that is *resumed* at the first block the patch
can influence, and all runs that resume at the same block are evaluated together, in chunks:

- ``resid_pre`` at (l, p): the residual entering block l, with position p replaced;
- ``attn_out`` / ``z`` at (l, p): everything up to ``resid_post`` of block l changes only at p
  (the MLP and LayerNorm act per position), so that one position is recomputed and the run
  resumes at block l + 1; ``mlp_out`` likewise; ``z`` of one head over all positions edits
  every position where that head's ``z`` differs (the ``z_by_pos`` edits, shared);
- a run that resumes at the last block reuses the receiver's cached keys, values and readout
  query, recomputes them only at its edited positions, and evaluates the block only at the
  readout query (keys and values are read per pair through an embedding bag, not copied per
  run); a run resuming after the last block needs only the readout;
- rows whose patched activation equals the receiver's bit for bit (e.g. positions before the
  changed token, under causal attention) are a no-op and keep the receiver's logit difference;
  a ``resid_pre`` patch of the only position where the two runs differ turns the receiver into
  the source, whose cached logit difference it takes.

Models with a non-standard attention (rotary, GQA, parallel blocks, ...) resume through
``HookedTransformer.forward(start_at_layer=...)`` instead of the readout-only last block.
These are exact rewrites of the same computation, not approximations.

**Readable reference.** ``lenslab.interp.patching_reference.patch_grids_reference`` computes
the same grids (same arguments, same ``{kind: PatchGrid}`` result) the plain TransformerLens
way: one ``run_with_cache`` of the source, then one ``run_with_hooks`` of the receiver per grid
cell, with a hook that copies the source activation in at that layer/position/head. Read it
first to see what is computed; ``tests/interp/test_patching_reference.py`` checks this engine
against it, and it against ``transformer_lens.patching``, in float32 and float64.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens import utilities as utils  # "utils" is deprecated (removed in TL 4)

from lenslab.interp.common import InterpError, Table, check_tokens, gather_class, subsample

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

    def __repr__(self) -> str:
        shape = " x ".join(f"{a} {n}" for a, n in zip(self.axes, self.values.shape))
        v = self.values
        return (
            f"PatchGrid({self.kind}, {self.direction}: {shape}; values {float(v.min()):.3g}..{float(v.max()):.3g}; "
            f"{self.n_pairs} pairs; logit diff source {self.ld_source:.3g}, receiver {self.ld_receiver:.3g})"
        )

    def _repr_html_(self) -> str:
        """The grid as a coloured HTML table (rows: the first axis; columns: the others), under a one-line header.
        Plain HTML, so it shows in any front end; ``visual.patching_figure(grid)`` is the plotly heatmap."""
        import html

        v = self.values.detach().double().cpu()
        flat = v.reshape(v.shape[0], -1)
        scale = float(flat.abs().max()) or 1.0
        cols = [list(ix) for ix in torch.cartesian_prod(*[torch.arange(n) for n in v.shape[1:]]).reshape(-1, v.ndim - 1).tolist()]
        head = "".join(f"<th>{html.escape(','.join(str(i) for i in c))}</th>" for c in cols)

        def cell(x: float) -> str:
            a = min(abs(x) / scale, 1.0)
            rgb = "178,24,43" if x > 0 else "33,102,172"  # red for positive, blue for negative
            return f"<td style='background: rgba({rgb},{a:.2f})'>{x:.3g}</td>"

        body = "".join(
            f"<tr><th>{i}</th>" + "".join(cell(float(x)) for x in row) + "</tr>" for i, row in enumerate(flat.tolist())
        )
        axes = f"rows: {self.axes[0]}; columns: {', '.join(self.axes[1:])}"
        return (
            f"<div><b>{html.escape(repr(self))}</b><br><small>{html.escape(axes)}</small>"
            f"<table><tr><th></th>{head}</tr>{body}</table></div>"
        )

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


# -- resuming a receiver run at a block -----------------------------------------------------
def _fast_last_block(model: HookedTransformer) -> bool:
    """Whether the last block may be evaluated at the readout query by our own (standard) attention."""
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


def _local_post(
    model: HookedTransformer,
    layer: int,
    resid_pre: Float[Tensor, "batch pos d_model"],
    attn_out: Float[Tensor, "batch pos d_model"],
) -> Float[Tensor, "batch pos d_model"]:
    """``resid_post`` of block ``layer`` at some positions, given its ``resid_pre`` and ``attn_out`` there."""
    mid = resid_pre + attn_out
    return mid if model.cfg.attn_only else mid + _apply_mlp(model.blocks[layer], mid)


def _attn_out_from_z(
    model: HookedTransformer, layer: int, z: Float[Tensor, "batch pos head d_head"]
) -> Float[Tensor, "batch pos d_model"]:
    attn = model.blocks[layer].attn
    return einops.rearrange(z, "b p h e -> b p (h e)") @ einops.rearrange(attn.W_O, "h e d -> (h e) d") + attn.b_O


def _readout(model: HookedTransformer, resid: Float[Tensor, "batch d_model"]) -> Float[Tensor, "batch k"]:
    """Logits from the final residual stream at the readout position: ``HookedTransformer.forward``
    started after the last block (final LayerNorm if any, unembedding, logit soft cap)."""
    return model(resid[:, None], start_at_layer=model.cfg.n_layers)[:, 0]


def _qkv(attn, x: Float[Tensor, "*batch d_model"], which: str = "qkv") -> tuple[Tensor, ...]:
    """Queries, keys and/or values (``which``) ``[batch, pos, head, d_head]`` of ``attn`` for its
    (normalized) input, from one matrix product."""
    w = einops.rearrange(torch.stack([getattr(attn, f"W_{c.upper()}") for c in which]), "n h d e -> d (n h e)")
    b = einops.rearrange(torch.stack([getattr(attn, f"b_{c.upper()}") for c in which]), "n h e -> (n h e)")
    out = torch.addmm(b, x.reshape(-1, x.shape[-1]), w).reshape(*x.shape[:-1], len(which), attn.W_Q.shape[0], -1)
    return out.unbind(-3)


def _readout_block_output(
    model: HookedTransformer, resid: Float[Tensor, "batch d_model"], z: Float[Tensor, "batch head d_head"]
) -> Float[Tensor, "batch d_model"]:
    """``resid_post`` of the last block at the readout position, from its ``resid_pre`` and ``z`` there."""
    block = model.blocks[-1]
    attn = block.attn
    mid = resid + einops.rearrange(z, "b h e -> b (h e)") @ einops.rearrange(attn.W_O, "h e d -> (h e) d") + attn.b_O
    return mid if model.cfg.attn_only else mid + _apply_mlp(block, mid[:, None])[:, 0]


def _last_block_at_readout(model: HookedTransformer, resid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch d_model"]:
    """``resid_post`` of the last block at the readout position (whose query sees every key under the
    causal mask), from the whole residual stream entering it."""
    attn = model.blocks[-1].attn
    x = model.blocks[-1].ln1(resid)
    (q,), (k, v) = _qkv(attn, x[:, -1:], "q"), _qkv(attn, x, "kv")
    pattern = torch.softmax((q * k).sum(-1) / attn.attn_scale, dim=1)  # [batch, key, head]
    return _readout_block_output(model, resid[:, -1], (pattern[..., None] * v).sum(1))


def _per_pair_matvec(
    table: Float[Tensor, "pair head n m"], pair: Int[Tensor, " rows"], x: Float[Tensor, "rows head n"]
) -> Float[Tensor, "rows head m"]:
    """``x[r, h] @ table[pair[r], h]`` for every row, as an embedding bag (no per-row copy of ``table``)."""
    _, H, n, m = table.shape
    idx = (pair[:, None, None] * H + torch.arange(H, device=pair.device)[:, None]) * n + torch.arange(
        n, device=pair.device
    )  # [rows, head, n]
    flat = torch.nn.functional.embedding_bag(
        idx.reshape(-1, n), table.reshape(-1, m), per_sample_weights=x.reshape(-1, n), mode="sum"
    )
    return flat.reshape(len(pair), H, m)


def _last_block_edited(
    model: HookedTransformer,
    rec: dict[str, Tensor],
    pair: Int[Tensor, " rows"],
    row: Int[Tensor, " edits"],
    pos: Int[Tensor, " edits"],
    vec: Float[Tensor, "edits d_model"],
) -> Float[Tensor, "rows d_model"]:
    """``_last_block_at_readout`` for receiver runs whose residual entering the last block differs
    from the cached one only at a few positions (edit i: row ``row[i]``, position ``pos[i]``,
    new vector ``vec[i]``). The receiver's cached keys, values and readout query are reused and
    recomputed only at the edited positions."""
    last = model.cfg.n_layers - 1
    attn = model.blocks[-1].attn
    act = lambda n: rec[utils.get_act_name(n, last)]
    keys, values = act("k"), act("v")  # [pair, pos, head, d_head]
    x = model.blocks[-1].ln1(vec[:, None])[:, 0]
    k_new, v_new = _qkv(attn, x, "kv")
    q, resid = act("q")[pair, -1], act("resid_pre")[pair, -1]
    at_readout = pos == keys.shape[1] - 1
    (q_new,) = _qkv(attn, x[at_readout], "q")
    q[row[at_readout]], resid[row[at_readout]] = q_new, vec[at_readout]
    scores = _per_pair_matvec(einops.rearrange(keys, "b p h e -> b h e p"), pair, q)  # [rows, head, key]
    scores[row, :, pos] = (q[row] * k_new).sum(-1)  # the edited keys
    pattern = torch.softmax(scores / attn.attn_scale, dim=-1)
    z = _per_pair_matvec(einops.rearrange(values, "b p h e -> b h p e"), pair, pattern)
    z.index_add_(0, row, pattern[row, :, pos, None] * (v_new - values[pair[row], pos]))  # the edited values
    return _readout_block_output(model, resid, z)


# -- the patched runs ------------------------------------------------------------------------
@dataclass(frozen=True)
class _Runs:
    """Patched receiver runs that resume at block ``start`` (``n_layers``: after the last block).

    Row r is receiver ``pair[r]`` for grid cell ``cell[r]``; its residual stream entering
    ``start`` is the cached one with each edit i where ``row[i] == r`` applied (position
    ``pos[i]`` replaced by ``vec[i]``). ``source`` rows are patched into the source run itself.
    """

    start: int
    cell: Tensor  # [rows]
    pair: Tensor  # [rows]
    row: Tensor  # [edits]
    pos: Tensor  # [edits]
    vec: Tensor  # [edits, d_model]
    source: bool = False

    def take(self, keep: Tensor) -> _Runs:
        """The rows where ``keep`` (bool ``[rows]``) holds, with their edits."""
        new_row = keep.long().cumsum(0) - 1
        edit = keep[self.row]
        return _Runs(
            self.start, self.cell[keep], self.pair[keep], new_row[self.row[edit]], self.pos[edit], self.vec[edit], self.source
        )


def _cat_runs(runs: list[_Runs]) -> _Runs:
    offsets = torch.tensor([0, *(len(r.pair) for r in runs)]).cumsum(0)
    cat = lambda name: torch.cat([getattr(r, name) for r in runs])
    row = torch.cat([r.row + o for r, o in zip(runs, offsets.tolist())])
    return _Runs(runs[0].start, cat("cell"), cat("pair"), row, cat("pos"), cat("vec"), runs[0].source)


def _site_edits(
    model: HookedTransformer, site: str, layer: int, src: dict, rec: dict
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor]:
    """Every patch of activation ``site`` (resid_pre, attn_out, mlp_out or z) at ``layer`` that
    changes something, as the new residual vector it leaves entering the next block it reaches.

    Returns ``differs`` (``[pair, pos]``, z: ``[pair, pos, head]``), and per edit its ``pair``,
    ``pos``, ``head`` (z only) and ``vec``. After the last block only readout edits are kept.
    """
    L = model.cfg.n_layers
    act = lambda c, n: c[utils.get_act_name(n, layer)]
    s, r = act(src, site), act(rec, site)
    differs = (s != r).any(-1)
    if site == "z":
        pair, pos, head = differs.nonzero(as_tuple=True)
    else:
        (pair, pos), head = differs.nonzero(as_tuple=True), None
    if site != "resid_pre" and layer == L - 1:  # after the last block only the readout position reaches the logits
        keep = pos == s.shape[1] - 1
        pair, pos, head = pair[keep], pos[keep], None if head is None else head[keep]
    if site == "resid_pre":
        return differs, pair, pos, head, s[pair, pos]
    if site == "mlp_out":
        return differs, pair, pos, head, act(rec, "resid_mid")[pair, pos] + s[pair, pos]
    if site == "attn_out":
        out = s[pair, pos]
    else:
        z = r[pair, pos].clone()  # [edits, head, d_head]
        z[torch.arange(len(pair), device=pair.device), head] = s[pair, pos, head]
        out = _attn_out_from_z(model, layer, z[:, None])[:, 0]
    return differs, pair, pos, head, _local_post(model, layer, act(rec, "resid_pre")[pair, pos][:, None], out[:, None])[:, 0]


def _layer_runs(model: HookedTransformer, kind: str, layer: int, edits: tuple) -> list[_Runs]:
    """All cells of grid ``kind`` at ``layer`` as patched runs (``cell`` counts from the layer's
    first cell), from ``_site_edits``. No-op patches are left out."""
    H = model.cfg.n_heads
    differs, pair, pos, head, vec = edits
    start = layer if kind == "resid_pre" else layer + 1
    if kind == "z_all_pos":  # one row per (pair, head), editing every position where its z differs
        rows, row = torch.unique(pair * H + head, return_inverse=True)
        return [_Runs(start, rows % H, rows // H, row, pos, vec)]
    cell = pos if head is None else pos * H + head
    runs = _Runs(start, cell, pair, torch.arange(len(pair), device=pair.device), pos, vec)
    if kind != "resid_pre":
        return [runs]
    # patching the only position where the runs differ turns the receiver into the source
    is_source = differs.sum(1)[pair] == 1
    return [runs.take(~is_source), replace(runs.take(is_source), source=True)]


def _runs_logits(model: HookedTransformer, runs: _Runs, rec: dict) -> Float[Tensor, "rows k"]:
    """Readout logits of one chunk of patched runs."""
    L = model.cfg.n_layers
    fast = _fast_last_block(model)
    if runs.start == L:  # each row has one edit, at the readout position
        final = runs.vec.new_empty(len(runs.pair), runs.vec.shape[1])
        final[runs.row] = runs.vec
        return _readout(model, final)
    if runs.start == L - 1 and fast:
        return _readout(model, _last_block_edited(model, rec, runs.pair, runs.row, runs.pos, runs.vec))
    resid = rec[utils.get_act_name("resid_pre", runs.start)][runs.pair]  # a gathered copy
    resid[runs.row, runs.pos] = runs.vec
    if not fast:
        return model(resid, start_at_layer=runs.start)[:, -1]
    resid = model(resid, start_at_layer=runs.start, stop_at_layer=L - 1)
    return _readout(model, _last_block_at_readout(model, resid))


# -- grids -------------------------------------------------------------------------------
CACHE_NAMES = ("resid_pre", "resid_mid", "attn_out", "mlp_out", "z")


def _cache(model: HookedTransformer, tokens: Int[Tensor, "batch pos"]) -> tuple[Float[Tensor, "batch k"], dict[str, Tensor]]:
    """Readout logits and the activations the grids need (one hooked forward)."""
    L = model.cfg.n_layers
    names = {utils.get_act_name(n, layer) for n in CACHE_NAMES for layer in range(L)}
    names |= {utils.get_act_name(n, L - 1) for n in ("q", "k", "v")}
    logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    return logits[:, -1], {n: cache[n] for n in names if n in cache.cache_dict}


def _grid_shape(model: HookedTransformer, kind: str, n_pos: int) -> tuple[int, ...]:
    L, H = model.cfg.n_layers, model.cfg.n_heads
    return {"z_by_pos": (L, n_pos, H), "z_all_pos": (L, H)}.get(kind, (L, n_pos))


def _grid_sums(
    model: HookedTransformer,
    kinds: tuple[str, ...],
    src: dict,
    rec: dict,
    ld_src: Float[Tensor, " pair"],
    ld_rec: Float[Tensor, " pair"],
    a: Int[Tensor, " pair"],
    b: Int[Tensor, " pair"],
    group: Int[Tensor, " pair"],
    n_groups: int,
    n_pos: int,
    max_batch: int,
) -> dict[str, Float[Tensor, "group ..."]]:
    """Per group of pairs, every cell's sum over pairs of (LD patched - LD receiver), in float64.

    The runs of all grids and groups that resume at the same block are evaluated together.
    """
    L = model.cfg.n_layers
    shapes = {kind: _grid_shape(model, kind, n_pos) for kind in kinds}
    sizes = {kind: int(torch.tensor(shape).prod()) for kind, shape in shapes.items()}
    offsets = dict(zip(kinds, torch.tensor([0, *sizes.values()]).cumsum(0).tolist()))
    by_key: dict[tuple[int, bool], list[_Runs]] = {}
    edits: dict[tuple[str, int], tuple] = {}
    for kind in kinds:
        per_layer = sizes[kind] // L
        site = "z" if kind.startswith("z") else kind
        for layer in range(L):
            if (site, layer) not in edits:  # z_by_pos and z_all_pos share theirs
                edits[site, layer] = _site_edits(model, site, layer, src, rec)
            for runs in _layer_runs(model, kind, layer, edits[site, layer]):
                slot = offsets[kind] * n_groups + group[runs.pair] * sizes[kind] + layer * per_layer + runs.cell
                by_key.setdefault((runs.start, runs.source), []).append(replace(runs, cell=slot))  # cell -> global slot
    totals = torch.zeros(sum(sizes.values()) * n_groups, dtype=torch.float64, device=ld_rec.device)
    for (_, source), parts in by_key.items():
        runs = _cat_runs(parts)
        if source:
            totals.index_add_(0, runs.cell, (ld_src[runs.pair] - ld_rec[runs.pair]).double())
            continue
        index = torch.arange(len(runs.pair), device=runs.pair.device)
        for i in range(0, len(runs.pair), max_batch):
            chunk = runs.take((index >= i) & (index < i + max_batch))
            ld = logit_diff(_runs_logits(model, chunk, rec), a[chunk.pair], b[chunk.pair])
            totals.index_add_(0, chunk.cell, (ld - ld_rec[chunk.pair]).double())
    return {
        kind: totals[offsets[kind] * n_groups : (offsets[kind] + sizes[kind]) * n_groups].reshape(n_groups, *shapes[kind])
        for kind in kinds
    }


def _grids(
    model: HookedTransformer,
    kinds: tuple[str, ...],
    directions: list[tuple[str, slice, slice]],
    cache: dict[str, Tensor],
    ld: Float[Tensor, " run"],
    a: Int[Tensor, " pair"],
    b: Int[Tensor, " pair"],
    n_pos: int,
    max_batch: int,
) -> dict[str, dict[str, PatchGrid]]:
    """``result[direction][kind]`` for ``directions`` = (name, source rows, receiver rows) of ``cache``."""
    stack = lambda t, which: torch.cat([t[rows] for rows in which])
    src = {n: stack(t, [d[1] for d in directions]) for n, t in cache.items()}
    rec = {n: stack(t, [d[2] for d in directions]) for n, t in cache.items()}
    ld_src, ld_rec = stack(ld, [d[1] for d in directions]), stack(ld, [d[2] for d in directions])
    n = len(a)
    group = torch.arange(len(directions), device=a.device).repeat_interleave(n)
    sums = _grid_sums(
        model,
        kinds,
        src,
        rec,
        ld_src,
        ld_rec,
        a.repeat(len(directions)),
        b.repeat(len(directions)),
        group,
        len(directions),
        n_pos,
        max_batch,
    )
    out: dict[str, dict[str, PatchGrid]] = {}
    for g, (name, _, _) in enumerate(directions):
        mean_src, mean_rec = (
            float(ld_src[g * n : (g + 1) * n].double().mean()),
            float(ld_rec[g * n : (g + 1) * n].double().mean()),
        )
        out[name] = {
            kind: PatchGrid(
                kind=kind,
                direction=name,
                values=(sums[kind][g] / n / (mean_src - mean_rec)).float().cpu(),
                n_pairs=n,
                ld_source=mean_src,
                ld_receiver=mean_rec,
            )
            for kind in kinds
        }
    return out


def _check_kind(model: HookedTransformer, kind: str) -> None:
    if kind not in GRID_KINDS:
        raise InterpError(f"unknown patching grid {kind!r}: choose one of {list(GRID_KINDS)}")
    if kind == "mlp_out" and model.cfg.attn_only:
        raise InterpError("grid 'mlp_out' needs MLPs, but this model is attention-only: drop it from kinds")


def _check_pairs(model, source_tokens, receiver_tokens, a, b):
    source_tokens = check_tokens(model, source_tokens, "source_tokens")
    receiver_tokens = check_tokens(model, receiver_tokens, "receiver_tokens")
    if source_tokens.shape != receiver_tokens.shape or len(a) != len(source_tokens) or len(b) != len(source_tokens):
        raise InterpError(
            f"source {tuple(source_tokens.shape)}, receiver {tuple(receiver_tokens.shape)}, a [{len(a)}], b [{len(b)}]: "
            "pairs must have equal shapes and one (a, b) per pair"
        )
    device = model.cfg.device
    return source_tokens.to(device), receiver_tokens.to(device), a.long().to(device), b.long().to(device)


def _check_options(model: HookedTransformer, kinds: tuple[str, ...], max_batch: int) -> None:
    for kind in kinds:
        _check_kind(model, kind)
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise InterpError(f"max_batch={max_batch!r} must be a positive int (patched runs per forward)")
    if getattr(model.cfg, "parallel_attn_mlp", False) or getattr(model.cfg, "use_normalization_before_and_after", False):
        raise InterpError(
            "patching grids recompute a block's output position by position as resid_pre + attn_out + MLP(LN(resid_mid)); "
            "parallel attention/MLP and extra post-normalization are not supported: use transformer_lens.patching"
        )
    if model.cfg.positional_embedding_type == "shortformer":
        raise InterpError(
            "patching grids resume runs from the residual stream, which misses shortformer positional embeddings: use a 'standard' or 'rotary' model"
        )


def patch_grids(
    model: HookedTransformer,
    source_tokens: Int[Tensor, "pair pos"],
    receiver_tokens: Int[Tensor, "pair pos"],
    a: Int[Tensor, " pair"],
    b: Int[Tensor, " pair"],
    kinds: tuple[str, ...] = GRID_KINDS,
    direction: str = "source->receiver",
    max_batch: int = 16384,
) -> dict[str, PatchGrid]:
    """Every grid in ``kinds``, patching source activations into the receiver run.

    One hooked forward caches both runs; ``max_batch`` patched runs are evaluated per forward.
    """
    _check_options(model, kinds, max_batch)
    source_tokens, receiver_tokens, a, b = _check_pairs(model, source_tokens, receiver_tokens, a, b)
    n = len(source_tokens)
    with torch.no_grad():
        logits, cache = _cache(model, torch.cat([source_tokens, receiver_tokens]))
        ld = logit_diff(logits, a.repeat(2), b.repeat(2))
        grids = _grids(
            model, kinds, [(direction, slice(0, n), slice(n, 2 * n))], cache, ld, a, b, source_tokens.shape[1], max_batch
        )
    return grids[direction]


def patch_grid(
    model, source_tokens, receiver_tokens, a, b, kind: str, direction: str = "source->receiver", max_batch: int = 16384
) -> PatchGrid:
    """One grid; see ``patch_grids``."""
    return patch_grids(model, source_tokens, receiver_tokens, a, b, (kind,), direction, max_batch)[kind]


def _patching_inputs(model, val, cf, cf_labels, cf_shortcut):
    """(model, validation tokens, counterfactual tokens, labels, shortcut) from a model or Run and tensors or Splits."""
    from pathlib import Path

    from lenslab.training.run import Run, Split

    run = Run.open(model) if isinstance(model, (str, Path)) else model if isinstance(model, Run) else None
    if run is not None:
        model = run.model()
        val = run.split("validation") if val is None else val
        cf = run.split("counterfactual") if cf is None else cf
    if isinstance(val, Split):
        val = val.tokens
    if isinstance(cf, Split):
        cf_labels = cf.labels if cf_labels is None else cf_labels
        cf_shortcut = cf.shortcut if cf_shortcut is None else cf_shortcut
        cf = cf.tokens
    missing = [
        n
        for n, v in (
            ("validation_tokens", val),
            ("counterfactual_tokens", cf),
            ("counterfactual_labels", cf_labels),
            ("counterfactual_shortcut", cf_shortcut),
        )
        if v is None
    ]
    if missing:
        raise InterpError(
            f"cross_split_patching: {', '.join(missing)} not given: pass a Run (its splits are used), "
            "Splits (run.split('validation'), run.split('counterfactual')), or all four tensors"
        )
    return model, val, cf, cf_labels, cf_shortcut


def cross_split_patching(
    model,
    validation_tokens: Int[Tensor, "pair pos"] | tuple | None = None,  # or a Split
    counterfactual_tokens: Int[Tensor, "pair pos"] | tuple | None = None,  # or a Split
    counterfactual_labels: Int[Tensor, " pair"] | None = None,
    counterfactual_shortcut: Int[Tensor, " pair"] | None = None,
    kinds: tuple[str, ...] = GRID_KINDS,
    directions: tuple[str, ...] = DIRECTIONS,
    max_pairs: int | None = 256,
    seed: int = 0,
    max_batch: int = 16384,
) -> dict[str, dict[str, PatchGrid]]:
    """Every grid in ``kinds`` for each direction: ``result[direction][kind]``.

    Uses at most ``max_pairs`` pairs (a seeded subsample). ``a`` = counterfactual label,
    ``b`` = counterfactual shortcut (see the module docstring). One hooked forward caches both
    splits; the patched runs of all grids and directions are then batched together.

    ``model`` is a ``HookedTransformer``, or a ``Run`` (or its path): then the model is its last
    (or focused) checkpoint and the splits default to its validation and counterfactual splits,
    so ``cross_split_patching(run)`` is the whole call. ``validation_tokens`` and
    ``counterfactual_tokens`` may also be ``Split``s (``run.split(name)``); a counterfactual
    ``Split`` brings its labels and shortcut.
    """
    model, validation_tokens, counterfactual_tokens, counterfactual_labels, counterfactual_shortcut = _patching_inputs(
        model, validation_tokens, counterfactual_tokens, counterfactual_labels, counterfactual_shortcut
    )
    for d in directions:
        if d not in DIRECTIONS:
            raise InterpError(f"unknown direction {d!r}: choose from {list(DIRECTIONS)}")
    _check_options(model, kinds, max_batch)
    idx = subsample(len(validation_tokens), max_pairs, seed)
    a, b = counterfactual_labels[idx], counterfactual_shortcut[idx]
    if (a == b).any():
        raise InterpError(
            "some counterfactual rows have label == shortcut: pass the anti-shortcut partners (counterfactual split)"
        )
    val, cf, a, b = _check_pairs(model, validation_tokens[idx], counterfactual_tokens[idx], a, b)
    n = len(val)
    rows = {"validation": slice(0, n), "counterfactual": slice(n, 2 * n)}
    with torch.no_grad():
        logits, cache = _cache(model, torch.cat([val, cf]))
        ld = logit_diff(logits, a.repeat(2), b.repeat(2))
        plan = [(d, rows[d.split("->")[0]], rows[d.split("->")[1]]) for d in directions]
        return _grids(model, kinds, plan, cache, ld, a, b, val.shape[1], max_batch)
