"""Activation ablation (zero / mean / resample) of heads, attention layers, MLPs, residual positions.

An ablation is data: ``Ablation(target=HeadTarget(layer=0, head=1), mode="mean", pos=None)``.
``evaluate_ablations`` runs many of them in one batched forward per split: the batch is
repeated once per ablation (plus one unablated copy) and each hook edits only its own slice.

Modes:
- ``zero``: the activation is set to 0;
- ``mean``: set to its mean over a reference split (per position, over examples);
- ``resample``: set to the activation of a random reference example (seeded; row i of the
  evaluated batch gets reference row ``perm[i]``).

``pos=None`` ablates every position; an int ablates that position only (``ResidTarget`` always
names its position).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens import utilities as utils  # "utils" is deprecated (removed in TL 4)

from lenslab.interp.common import InterpError, Table, check_index, check_tokens, head_label, label_vs_shortcut_diff

MODES = ("zero", "mean", "resample")


@dataclass(frozen=True)
class HeadTarget:
    """One attention head's output before W_O (``blocks.{layer}.attn.hook_z``)."""

    layer: int
    head: int

    @property
    def hook_name(self) -> str:
        return utils.get_act_name("z", self.layer)

    def __str__(self) -> str:
        return head_label(self.layer, self.head)


@dataclass(frozen=True)
class AttnTarget:
    """A whole attention layer's output (``hook_attn_out``)."""

    layer: int

    @property
    def hook_name(self) -> str:
        return utils.get_act_name("attn_out", self.layer)

    def __str__(self) -> str:
        return f"L{self.layer}.attn"


@dataclass(frozen=True)
class MLPTarget:
    """One MLP's output (``hook_mlp_out``)."""

    layer: int

    @property
    def hook_name(self) -> str:
        return utils.get_act_name("mlp_out", self.layer)

    def __str__(self) -> str:
        return f"L{self.layer}.mlp"


@dataclass(frozen=True)
class ResidTarget:
    """The residual stream entering block ``layer`` at one position (``hook_resid_pre``)."""

    layer: int
    pos: int

    @property
    def hook_name(self) -> str:
        return utils.get_act_name("resid_pre", self.layer)

    def __str__(self) -> str:
        return f"L{self.layer}.resid_pre@{self.pos}"


Target = HeadTarget | AttnTarget | MLPTarget | ResidTarget


HOOK_RE = re.compile(r"^blocks\.(\d+)\.(attn\.hook_z|hook_attn_out|hook_mlp_out|hook_resid_pre)$")


def target_from_hook(name: str, head: int | None = None, pos: int | None = None) -> Target:
    """A target from a TransformerLens hook name (``utils.get_act_name("z", 0)`` = ``blocks.0.attn.hook_z``):
    ``hook_z`` with ``head`` is a head, ``hook_attn_out`` / ``hook_mlp_out`` a layer's output, ``hook_resid_pre``
    with ``pos`` the residual stream at one position."""
    m = HOOK_RE.match(name) if isinstance(name, str) else None
    if m is None:
        raise InterpError(
            f"{name!r} is not an ablation site: use blocks.L.attn.hook_z (with head=), blocks.L.hook_attn_out, "
            "blocks.L.hook_mlp_out or blocks.L.hook_resid_pre (with pos=)"
        )
    layer, site = int(m.group(1)), m.group(2)
    if site == "attn.hook_z":
        if head is None:
            raise InterpError(f"{name} holds every head: say which, e.g. Ablation({name!r}, head=0)")
        return HeadTarget(layer, head)
    if site == "hook_resid_pre":
        if pos is None:
            raise InterpError(f"{name} is ablated at one position: say which, e.g. Ablation({name!r}, pos=0)")
        return ResidTarget(layer, pos)
    if head is not None:
        raise InterpError(f"head={head} goes with blocks.L.attn.hook_z, not {name}")
    return AttnTarget(layer) if site == "hook_attn_out" else MLPTarget(layer)


@dataclass(frozen=True)
class Ablation:
    """What to ablate and how: ``Ablation(HeadTarget(1, 0))``, or by TransformerLens hook name,
    ``Ablation("blocks.1.attn.hook_z", head=0)``. ``mode`` is checked here; layer, head and position are
    checked against the model when the ablation is evaluated."""

    target: Target | str
    mode: str = "mean"
    pos: int | None = None
    head: int | None = None  # with a hook_z name only

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InterpError(f"unknown ablation mode {self.mode!r}: choose one of {list(MODES)}")
        if isinstance(self.target, str):
            target = target_from_hook(self.target, self.head, self.pos)
            object.__setattr__(self, "target", target)
            object.__setattr__(self, "head", None)
            if isinstance(target, ResidTarget):
                object.__setattr__(self, "pos", None)
        elif self.head is not None:
            raise InterpError(f"head={self.head} goes with a hook-name target; a HeadTarget carries its own head")

    @property
    def label(self) -> str:
        where = "" if self.position is None or isinstance(self.target, ResidTarget) else f"@{self.position}"
        return f"{self.target}{where}:{self.mode}"

    @property
    def position(self) -> int | None:
        return self.target.pos if isinstance(self.target, ResidTarget) else self.pos


def check_ablation(model: HookedTransformer, ab: Ablation, n_pos: int) -> None:
    """Raise ``InterpError`` naming the valid range for a bad layer / head / position / mode."""
    if not isinstance(ab, Ablation):
        raise InterpError(f"expected an Ablation, got {type(ab).__name__}")
    if ab.mode not in MODES:
        raise InterpError(f"unknown ablation mode {ab.mode!r}: choose one of {list(MODES)}")
    t = ab.target
    check_index("layer", t.layer, model.cfg.n_layers)
    if isinstance(t, HeadTarget):
        check_index("head", t.head, model.cfg.n_heads)
    if isinstance(t, MLPTarget) and model.cfg.attn_only:
        raise InterpError(f"{t}: the model is attention-only and has no MLPs")
    check_index("pos", ab.position, n_pos, allow_none=True)


def all_head_ablations(model: HookedTransformer, mode: str = "mean") -> list[Ablation]:
    """One ablation per attention head of ``model`` (``HeadTarget(layer, head)``), in layer-major order."""
    return [Ablation(HeadTarget(layer, head), mode) for layer in range(model.cfg.n_layers) for head in range(model.cfg.n_heads)]


def reference_values(
    model: HookedTransformer, ablations: list[Ablation], reference_tokens: Int[Tensor, "ref pos"] | None
) -> dict[str, Tensor]:
    """Cached activations of the reference split at every hook the ablations need."""
    names = {ab.target.hook_name for ab in ablations if ab.mode != "zero"}
    if not names:
        return {}
    if reference_tokens is None:
        raise InterpError("mean/resample ablation needs reference_tokens (e.g. the train split)")
    with torch.no_grad():
        _, cache = model.run_with_cache(reference_tokens, names_filter=lambda n: n in names)
    return {n: cache[n] for n in names}


def _replacement(ab: Ablation, act_slice: Tensor, ref: Tensor | None, perm: Tensor | None) -> Tensor:
    """The value that replaces ``act_slice`` ([n, pos, ...]) for this ablation."""
    if ab.mode == "zero":
        return torch.zeros_like(act_slice)
    if ab.mode == "mean":
        return ref.mean(0, keepdim=True).expand_as(act_slice)
    return ref[perm[: act_slice.shape[0]]]


def run_ablated(
    model: HookedTransformer,
    ablations: list[Ablation],
    tokens: Int[Tensor, "batch pos"],
    refs: dict[str, Tensor],
    seed: int = 0,
) -> Float[Tensor, "n_ablations_plus_1 batch k"]:
    """Readout logits: slot 0 unablated, slot i+1 with ``ablations[i]``, all in one forward."""
    n, n_pos = tokens.shape
    for ab in ablations:
        check_ablation(model, ab, n_pos)
    g = torch.Generator().manual_seed(seed)
    perms = {name: torch.randint(0, len(r), (n,), generator=g) for name, r in sorted(refs.items())}
    by_hook: dict[str, list[tuple[int, Ablation]]] = {}
    for i, ab in enumerate(ablations):
        by_hook.setdefault(ab.target.hook_name, []).append((i + 1, ab))

    def hook(act: Tensor, hook) -> Tensor:
        act = act.clone()
        for slot, ab in by_hook[hook.name]:
            rows = slice(slot * n, (slot + 1) * n)
            ref = refs.get(hook.name)
            repl = _replacement(ab, act[rows], ref, perms.get(hook.name))
            pos = slice(None) if ab.position is None else slice(ab.position, ab.position + 1)
            if isinstance(ab.target, HeadTarget):
                act[rows, pos, ab.target.head] = repl[:, pos, ab.target.head]
            else:
                act[rows, pos] = repl[:, pos]
        return act

    batch = tokens.repeat(len(ablations) + 1, 1)
    with torch.no_grad():
        logits = model.run_with_hooks(batch, fwd_hooks=[(name, hook) for name in by_hook])[:, -1]
    return logits.reshape(len(ablations) + 1, n, -1)


def evaluate_ablations(
    model: HookedTransformer,
    ablations: list[Ablation],
    splits,  # {name: (tokens, labels, shortcut)} (e.g. run.eval_splits()), or a Run for all of its splits
    reference_tokens: Int[Tensor, "ref pos"] | None = None,
    seed: int = 0,
    max_rows: int = 16_384,
    metric=None,  # (logits [n, k], labels [n], shortcut [n]) -> a scalar tensor or float, as TL's patching metrics
) -> Table:
    """One row per ablation (plus ``"none"``): accuracy and mean logit difference per split.

    ``splits`` maps a name to ``(tokens, labels, shortcut)`` (``Run.split(name)`` is one); a ``Run`` means
    ``run.eval_splits()``, with its train split as ``reference_tokens`` unless given. The logit difference is
    ``label_vs_shortcut_diff`` (true-label minus shortcut logit; the margin over the best other
    class where label == shortcut). Columns: ``target, kind, layer, head, pos, mode`` and for
    each split ``acc_<split>``, ``logit_diff_<split>``, ``delta_acc_<split>`` (vs unablated); with ``metric``,
    also ``metric_<split>`` (its value on the ablated readout logits) and ``delta_metric_<split>``.
    """
    if metric is not None and not callable(metric):
        raise InterpError(f"metric must be a function (logits, labels, shortcut) -> scalar; got {type(metric).__name__}")
    from lenslab.training.run import Run

    if isinstance(splits, Run):  # its splits, and its train split as the reference (mean / resample ablations)
        run, splits = splits, splits.eval_splits()
        if reference_tokens is None and "train" in run.split_names():
            reference_tokens = run.split("train").tokens
    n_pos = next(iter(splits.values()))[0].shape[1] if splits else model.cfg.n_ctx
    for ab in ablations:
        check_ablation(model, ab, n_pos)
    refs = reference_values(model, ablations, reference_tokens)
    rows = Table()
    base = {"target": "none", "kind": "none", "layer": None, "head": None, "pos": None, "mode": None}
    rows.append(dict(base))
    for ab in ablations:
        t = ab.target
        rows.append(
            {
                "target": ab.label,
                "kind": type(t).__name__.replace("Target", "").lower(),
                "layer": t.layer,
                "head": getattr(t, "head", None),
                "pos": ab.position,
                "mode": ab.mode,
            }
        )
    for name, (tokens, labels, shortcut) in splits.items():
        tokens = check_tokens(model, tokens, f"{name} tokens")
        per = max(1, max_rows // len(tokens) - 1)  # ablations per forward
        logits = [run_ablated(model, [], tokens, refs, seed)[0:1]]
        for i in range(0, len(ablations), per):
            logits.append(run_ablated(model, ablations[i : i + per], tokens, refs, seed)[1:])
        logits = torch.cat(logits)  # [1 + n_ablations, n, k]
        acc = (logits.argmax(-1) == labels).float().mean(-1)
        ld = torch.stack([label_vs_shortcut_diff(lg, labels, shortcut).mean() for lg in logits])
        for r, a, d in zip(rows, acc.tolist(), ld.tolist()):
            r[f"acc_{name}"] = a
            r[f"logit_diff_{name}"] = d
            r[f"delta_acc_{name}"] = a - acc[0].item()
        if metric is not None:
            vals = [float(metric(lg, labels, shortcut)) for lg in logits]
            for r, v in zip(rows, vals):
                r[f"metric_{name}"] = v
                r[f"delta_metric_{name}"] = v - vals[0]
    return rows
