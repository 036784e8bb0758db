"""Turn a model (HookedTransformer, state dict, nn.Module with Linear layers, run dir, checkpoint)
into named 2-D matrices, plus a list of what was skipped and why (nothing is dropped silently).

TransformerLens layout (the paper's matrices), per layer, heads concatenated by default:

    embed.W_E            [d_vocab, d_model]
    blocks.L.attn.W_Q    [n_heads, d_model, d_head] -> [d_model, n_heads·d_head]  ("h m d -> m (h d)")
    blocks.L.attn.W_K, W_V  likewise
    blocks.L.attn.W_O    [n_heads, d_head, d_model] -> [n_heads·d_head, d_model]  ("h d m -> (h d) m")
    blocks.L.mlp.W_in    [d_model, d_mlp];  blocks.L.mlp.W_out [d_mlp, d_model]
    unembed.W_U          [d_model, d_vocab_out]

Lenslab's ``HookedMLP`` (``training.mlp``), already ``[d_in, d_out]`` (``x @ W + b``), in layer order:

    layers.i.W           [d_in, d_out]   (``layers.i.b``, 1-D, is listed as skipped)

``per_head=True`` gives one matrix per head instead (``blocks.L.attn.W_Q.h3``). ``W_pos`` is
excluded unless ``include_pos``. A matrix with min(N, M) < 2 is skipped: a 1×M matrix has a single
eigenvalue, so there is no bulk to fit an MP law to.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import einops
from jaxtyping import Float
from torch import Tensor, nn

from lenslab.interp.spectral.errors import SpectralError
from lenslab.interp.spectral.traps import MIN_DIM

HEAD_IN = "h m d -> m (h d)"
HEAD_OUT = "h d m -> (h d) m"
TL_ATTN = {"W_Q": HEAD_IN, "W_K": HEAD_IN, "W_V": HEAD_IN, "W_O": HEAD_OUT}
_TL_KEY = re.compile(r"^(embed\.W_E|pos_embed\.W_pos|unembed\.W_U|blocks\.(\d+)\.(attn\.(W_Q|W_K|W_V|W_O)|mlp\.(W_in|W_out)))$")
_ORDER = {"W_Q": 0, "W_K": 1, "W_V": 2, "W_O": 3, "W_in": 4, "W_out": 5}
_MLP_KEY = re.compile(r"^layers\.(\d+)\.(W|b)$")  # HookedMLP: layers.i.W [d_in, d_out], layers.i.b [d_out]


@dataclass(frozen=True)
class MatrixRef:
    """Where a 2-D matrix comes from: state-dict ``key``, optional head index and einops pattern."""

    name: str
    key: str
    shape: tuple[int, int]
    pattern: str | None = None  # param -> 2-D, for concatenated heads
    head: int | None = None  # per-head slice of a [n_heads, ., .] param


@dataclass(frozen=True)
class Skipped:
    """A tensor the adapter did not analyse, with its shape and the reason (1-D, too small, not floating point, ...)."""

    name: str
    shape: tuple[int, ...]
    reason: str


def _sort_key(key: str) -> tuple:
    if key == "embed.W_E":
        return (0, 0, 0)
    if key == "pos_embed.W_pos":
        return (0, 1, 0)
    if key == "unembed.W_U":
        return (2, 0, 0)
    m = _TL_KEY.match(key)
    if m and m.group(2) is not None:
        return (1, int(m.group(2)), _ORDER[m.group(4) or m.group(5)])
    return (3, 0, 0)


def is_tl_state(shapes: dict[str, tuple]) -> bool:
    """Whether a state dict's shapes are a TransformerLens ``HookedTransformer``'s (``embed.W_E`` and ``blocks.*``)."""
    return "embed.W_E" in shapes and any(k.startswith("blocks.") for k in shapes)


def is_mlp_state(shapes: dict[str, tuple]) -> bool:
    """Every key is a ``HookedMLP`` weight or bias (``layers.i.W`` / ``layers.i.b``)."""
    return bool(shapes) and all(_MLP_KEY.match(k) for k in shapes)


def _mlp_sort_key(key: str) -> tuple[int, int]:
    m = _MLP_KEY.match(key)
    return int(m.group(1)), 0 if m.group(2) == "W" else 1  # layer order (layers.10 after layers.9), W before b


def plan_matrices(
    shapes: dict[str, tuple[int, ...]],
    per_head: bool = False,
    include_pos: bool = False,
    include_unembed: bool = True,
) -> tuple[list[MatrixRef], list[Skipped]]:
    """Decide, from tensor shapes alone, which matrices to analyse (and why others are skipped).

    TransformerLens keys follow the layout above; ``HookedMLP`` keys come in layer order; any other
    floating 2-D tensor is taken as is;
    other tensors with ≥ 3 dims are skipped with a reason; 1-D tensors (biases, norm scales) are
    listed as skipped too.
    """
    refs, skipped = [], []
    tl = is_tl_state(shapes)
    keys = sorted(shapes, key=_sort_key) if tl else sorted(shapes, key=_mlp_sort_key) if is_mlp_state(shapes) else list(shapes)
    for key in keys:
        shape = tuple(shapes[key])
        m = _TL_KEY.match(key) if tl else None
        if m is None and tl and (key.endswith(("mask", "IGNORE")) or ".hook_" in key):
            continue  # TransformerLens buffers (attention mask, IGNORE constant): not weights
        if m is None and tl:
            skipped.append(Skipped(key, shape, "TransformerLens bias or norm parameter, not one of the analysed weight matrices"))
            continue
        if key == "pos_embed.W_pos" and not include_pos:
            skipped.append(Skipped(key, shape, "positional embedding excluded by default (include_pos=True keeps it)"))
            continue
        if key == "unembed.W_U" and not include_unembed:
            skipped.append(Skipped(key, shape, "unembedding excluded (include_unembed=False)"))
            continue
        attn = m.group(4) if m else None
        if attn and len(shape) == 3:
            if per_head:
                sub = shape[1:]
                cands = [MatrixRef(f"{key}.h{h}", key, sub, head=h) for h in range(shape[0])]
            else:
                two = (shape[1], shape[0] * shape[2]) if TL_ATTN[attn] == HEAD_IN else (shape[0] * shape[1], shape[2])
                cands = [MatrixRef(key, key, two, pattern=TL_ATTN[attn])]
        elif len(shape) == 2:
            cands = [MatrixRef(key, key, shape)]
        elif len(shape) < 2:
            skipped.append(Skipped(key, shape, f"{len(shape)}-D tensor (bias or norm scale), not a matrix"))
            continue
        else:
            skipped.append(Skipped(key, shape, f"{len(shape)}-D tensor of unknown layout; reshape it to 2-D yourself"))
            continue
        for ref in cands:
            if min(ref.shape) < MIN_DIM:
                skipped.append(
                    Skipped(ref.name, ref.shape, f"min(N, M) = {min(ref.shape)} < {MIN_DIM}: one eigenvalue, no bulk to fit")
                )
            else:
                refs.append(ref)
    return refs, skipped


def to_2d(param: Tensor, ref: MatrixRef) -> Float[Tensor, "n m"]:
    """The 2-D matrix ``ref`` names, from its state-dict tensor."""
    if ref.head is not None:
        return param[ref.head]
    if ref.pattern is not None:
        return einops.rearrange(param, ref.pattern)
    return param


def from_2d(mat: Float[Tensor, "n m"], ref: MatrixRef, param: Tensor) -> Tensor:
    """A copy of ``param`` with the 2-D matrix ``ref`` replaced by ``mat`` (inverse of ``to_2d``)."""
    out = param.detach().clone()
    if ref.head is not None:
        out[ref.head] = mat.to(out.dtype)
    elif ref.pattern is not None:
        lhs, rhs = ref.pattern.split("->")
        h = param.shape[0]
        out.copy_(einops.rearrange(mat, f"{rhs} -> {lhs}", h=h).to(out.dtype))
    else:
        out.copy_(mat.to(out.dtype))
    return out


def state_dict_of(source) -> dict[str, Tensor]:
    """A state dict from a HookedTransformer / HookedMLP / nn.Module / dict / ``Run`` / run dir / checkpoint path.

    For a ``HookedMLP`` (any TransformerLens ``HookedRootModule`` but a HookedTransformer) its
    parameters by name; for a plain nn.Module only ``Linear`` weights are used (keys ``<module>.weight``).
    A run directory gives its last checkpoint.
    """
    from transformer_lens import HookedRootModule, HookedTransformer

    from lenslab.training.run import Run

    if isinstance(source, Run):  # its focused or last checkpoint
        from lenslab.training.runio import read_safetensors

        return read_safetensors(source.checkpoint_file())[0]
    if isinstance(source, HookedTransformer):
        return {k: v.detach() for k, v in source.state_dict().items()}
    if isinstance(source, HookedRootModule):  # HookedMLP: layers.i.W [d_in, d_out], layers.i.b
        return {k: v.detach() for k, v in source.named_parameters()}
    if isinstance(source, nn.Module):
        return {f"{n}.weight": m.weight.detach() for n, m in source.named_modules() if isinstance(m, nn.Linear)}
    if isinstance(source, dict):
        return source
    if isinstance(source, (str, Path)):
        from lenslab.training.errors import RunError
        from lenslab.training.run import Run
        from lenslab.training.runio import read_safetensors

        path = Path(source)
        try:
            if path.is_dir():
                ckpts = Run.open(path).checkpoints()
                if not ckpts:
                    raise SpectralError(f"{path}: the run has no checkpoints")
                path = ckpts[-1][1]
            return read_safetensors(path)[0]
        except RunError as e:
            raise SpectralError(str(e)) from None
    raise SpectralError(
        f"cannot read weights from a {type(source).__name__}; pass a HookedTransformer, HookedMLP, nn.Module, state dict, Run or path"
    )


@dataclass
class MatrixSet:
    """Named 2-D matrices (in order), their refs, and the skipped tensors with reasons."""

    matrices: dict[str, Tensor]
    refs: list[MatrixRef]
    skipped: list[Skipped]


def extract_matrices(source, per_head: bool = False, include_pos: bool = False, include_unembed: bool = True) -> MatrixSet:
    """The paper's matrices of ``source`` (see the module docstring)."""
    state = state_dict_of(source)
    shapes = {k: tuple(v.shape) for k, v in state.items() if isinstance(v, Tensor)}
    refs, skipped = plan_matrices(shapes, per_head, include_pos, include_unembed)
    out, kept = {}, []
    for ref in refs:
        t = state[ref.key]
        if not t.is_floating_point():
            skipped.append(Skipped(ref.name, tuple(t.shape), f"dtype {t.dtype} is not floating point"))
            continue
        out[ref.name] = to_2d(t, ref)
        kept.append(ref)
    return MatrixSet(out, kept, skipped)
