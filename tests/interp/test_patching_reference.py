"""The hook-based reference (``patching_reference``) against the fast engine and against TransformerLens.

fast engine == reference == ``transformer_lens.patching``, on small random HookedTransformers
(1-2 layers, 1-4 heads, LN / no LN / attention-only / rotary), in float32 and float64.

Tolerances. Every grid value is ``(mean LD(patched) - mean LD(receiver)) / (mean LD(source) -
mean LD(receiver))``. The three implementations run the same arithmetic in different orders:
the engine batches other rows together, resumes runs mid-model and evaluates the last block at
one query (other GEMM shapes, so other MKL/oneDNN blocking), and the reductions (matmul,
softmax, LayerNorm, mean) split their sums differently with the thread count and with the SIMD
width ATen dispatches to (AVX-512 / AVX2 / ``ATEN_CPU_CAPABILITY=default``). Reordering a
floating-point sum moves it by a few units of ``eps * |its largest term|``, so a logit moves by
a few ``eps * max|logit|`` and a grid value by a few ``eps * max|logit| / |denominator|``. We
allow 64 of these units (observed: below 1 for these models in float32, below 3 for a
3-layer model without LayerNorm; 0 in float64 after the final rounding), plus ``rtol = 2**-22``
because every implementation rounds its final value to float32: two float64 values that agree
to ~1e-15 can still round to adjacent float32 numbers (1 float32 ulp <= 2**-23 * |value|). In
float64 this makes the comparison essentially exact; in float32 it is ~1e-5 for these models.
"""

import pytest
import torch
from transformer_lens import patching as tlp

from lenslab.interp.common import InterpError
from lenslab.interp.patching import DIRECTIONS, GRID_KINDS, cross_split_patching, normalized_logit_diff_metric, patch_grids
from lenslab.interp.patching_reference import patch_grids_reference
from lenslab.training.presets import build_model

TL = {
    "resid_pre": tlp.get_act_patch_resid_pre,
    "attn_out": tlp.get_act_patch_attn_out,
    "mlp_out": tlp.get_act_patch_mlp_out,
    "z_by_pos": tlp.get_act_patch_attn_head_out_by_pos,
    "z_all_pos": tlp.get_act_patch_attn_head_out_all_pos,
}
BASE = {
    "d_model": 32,
    "d_mlp": 64,
    "d_vocab": 12,
    "d_vocab_out": 7,
    "n_ctx": 6,
    "act_fn": "relu",
    "default_prepend_bos": False,
    "normalization_type": "LN",
    "positional_embedding_type": "standard",
    "attn_only": False,
    "initializer_range": 0.2,
}
CONFIGS = {
    "1L-2H": {"n_layers": 1, "n_heads": 2, "d_head": 16},
    "2L-4H": {"n_layers": 2, "n_heads": 4, "d_head": 8},
    "2L-1H-attn-only": {"n_layers": 2, "n_heads": 1, "d_head": 32, "attn_only": True},
    "2L-2H-noLN": {"n_layers": 2, "n_heads": 2, "d_head": 16, "normalization_type": None},
    "2L-2H-rotary": {"n_layers": 2, "n_heads": 2, "d_head": 16, "positional_embedding_type": "rotary", "rotary_dim": 8},
}
DTYPES = [torch.float32, torch.float64]


def make_model(name: str, dtype: torch.dtype):
    return build_model({**BASE, **CONFIGS[name]}, seed=0, dtype=dtype).eval()


def kinds_of(model) -> tuple[str, ...]:
    return tuple(k for k in GRID_KINDS if not (k == "mlp_out" and model.cfg.attn_only))


def random_pairs(model, n: int = 16, seed: int = 0):
    """Source/receiver pairs differing in 1-3 positions, and per pair the classes ``(a, b)`` the
    patch moves most apart (so the metric's denominator is far from 0)."""
    g = torch.Generator().manual_seed(seed)
    source = torch.randint(0, model.cfg.d_vocab, (n, model.cfg.n_ctx), generator=g)
    changed = torch.rand(n, model.cfg.n_ctx, generator=g).argsort(1) < torch.randint(1, 4, (n, 1), generator=g)
    shift = torch.randint(1, model.cfg.d_vocab, (n, model.cfg.n_ctx), generator=g)
    receiver = torch.where(changed, (source + shift) % model.cfg.d_vocab, source)
    with torch.no_grad():
        diff = model(source)[:, -1] - model(receiver)[:, -1]
    return source, receiver, diff.argmax(-1), diff.argmin(-1)


def tolerance(model, source, receiver, grid) -> dict:
    """``assert_close`` tolerances for one grid (see the module docstring)."""
    with torch.no_grad():
        max_logit = max(model(source)[:, -1].abs().max().item(), model(receiver)[:, -1].abs().max().item())
    denominator = abs(grid.ld_source - grid.ld_receiver)
    assert denominator > 0.1, "a near-zero denominator would make every comparison meaningless"
    return {"atol": 64 * torch.finfo(model.cfg.dtype).eps * max_logit / denominator, "rtol": 2**-22}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_fast_engine_equals_reference(name, dtype):
    model = make_model(name, dtype)
    source, receiver, a, b = random_pairs(model)
    kinds = kinds_of(model)
    fast = patch_grids(model, source, receiver, a, b, kinds=kinds, max_batch=37)  # several chunks per block
    ref = patch_grids_reference(model, source, receiver, a, b, kinds=kinds)
    for kind in kinds:
        tol = tolerance(model, source, receiver, ref[kind])
        assert fast[kind].values.shape == ref[kind].values.shape and fast[kind].axes == ref[kind].axes
        torch.testing.assert_close(fast[kind].values, ref[kind].values, **tol, msg=lambda m, kind=kind: f"{kind}: {m}")
        assert fast[kind].ld_source == pytest.approx(ref[kind].ld_source, rel=1e-5)
        assert fast[kind].ld_receiver == pytest.approx(ref[kind].ld_receiver, rel=1e-5)
        assert ref[kind].values.abs().max() > 0.05  # not a trivially-zero grid


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_reference_equals_transformer_lens(name, dtype):
    """The reference checked independently: TL's ``get_act_patch_*`` with the same metric."""
    model = make_model(name, dtype)
    source, receiver, a, b = random_pairs(model, seed=1)
    ref = patch_grids_reference(model, source, receiver, a, b, kinds=kinds_of(model))
    with torch.no_grad():
        _, source_cache = model.run_with_cache(source)
        for kind, grid in ref.items():
            metric = normalized_logit_diff_metric(a, b, grid.ld_receiver, grid.ld_source)
            expected = TL[kind](model, receiver, source_cache, metric)
            torch.testing.assert_close(grid.values, expected.float(), **tolerance(model, source, receiver, grid))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cross_split_patching_equals_reference(splits, dtype):
    """Both directions of the real entry point, on validation/counterfactual pairs."""
    model = build_model(
        {
            **BASE,
            **CONFIGS["2L-4H"],
            "d_vocab": splits["validation_tokens"].max().item() + 1,
            "d_vocab_out": splits["counterfactual_labels"].max().item() + 1,
            "n_ctx": 5,
        },
        seed=0,
        dtype=dtype,
    ).eval()
    val, cf = splits["validation_tokens"][:24], splits["counterfactual_tokens"][:24]
    a, b = splits["counterfactual_labels"][:24], splits["counterfactual_shortcut"][:24]
    fast = cross_split_patching(model, val, cf, a, b, max_pairs=None)
    for direction in DIRECTIONS:
        source, receiver = (val, cf) if direction == DIRECTIONS[0] else (cf, val)
        ref = patch_grids_reference(model, source, receiver, a, b, direction=direction)
        for kind in GRID_KINDS:
            torch.testing.assert_close(
                fast[direction][kind].values, ref[kind].values, **tolerance(model, source, receiver, ref[kind])
            )


def test_reference_rejects_unknown_kinds():
    model = make_model("1L-2H", torch.float32)
    with pytest.raises(InterpError, match="unknown patching grid"):
        patch_grids_reference(model, *random_pairs(model, n=2), kinds=("q_by_pos",))
