import pytest
import torch
from jaxtyping import TypeCheckError
from transformer_lens import patching as tlp

from lenslab.interp.common import InterpError
from lenslab.interp.patching import DIRECTIONS, cross_split_patching, logit_diff, normalized_logit_diff_metric, patch_grid
from lenslab.training.presets import build_model

TL = {
    "resid_pre": tlp.get_act_patch_resid_pre,
    "attn_out": tlp.get_act_patch_attn_out,
    "mlp_out": tlp.get_act_patch_mlp_out,
    "z_by_pos": tlp.get_act_patch_attn_head_out_by_pos,
    "z_all_pos": tlp.get_act_patch_attn_head_out_all_pos,
}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """TL's reference runs many tiny forwards; on a busy 2-core machine two threads make them far slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def grids(trained, splits):
    return cross_split_patching(
        trained,
        splits["validation_tokens"],
        splits["counterfactual_tokens"],
        splits["counterfactual_labels"],
        splits["counterfactual_shortcut"],
        max_pairs=64,
        seed=0,
    )


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("kind", list(TL))
def test_grid_equals_transformer_lens(trained, splits, grids, kind, direction):
    torch.set_grad_enabled(False)
    try:
        idx = torch.randperm(len(splits["validation_tokens"]), generator=torch.Generator().manual_seed(0))[:64].sort().values
        val, cf = splits["validation_tokens"][idx], splits["counterfactual_tokens"][idx]
        a, b = splits["counterfactual_labels"][idx], splits["counterfactual_shortcut"][idx]
        source, receiver = (val, cf) if direction == DIRECTIONS[0] else (cf, val)
        ld_src = logit_diff(trained(source)[:, -1], a, b).mean().item()
        ld_rec = logit_diff(trained(receiver)[:, -1], a, b).mean().item()
        assert abs(ld_src - ld_rec) > 0.5, "the trained model must tell the splits apart for a meaningful test"
        _, source_cache = trained.run_with_cache(source)
        expected = TL[kind](trained, receiver, source_cache, normalized_logit_diff_metric(a, b, ld_rec, ld_src))
        got = grids[direction][kind]
        assert got.values.shape == expected.shape
        torch.testing.assert_close(got.values, expected.float(), atol=1e-5, rtol=0)
        assert got.values.abs().max() > 0.05  # not a trivially-zero grid
    finally:
        torch.set_grad_enabled(True)


@pytest.mark.parametrize(
    "variant",
    [
        # 3 blocks, no LayerNorm: runs resumed before the last block, no ln_final
        {"n_layers": 3, "normalization_type": None, "initializer_range": 0.2},
        # 1 attention-only block: every run resumes at (or after) the last block
        {"n_layers": 1, "attn_only": True, "initializer_range": 0.3},
    ],
    ids=["3L-noLN", "1L-attn-only"],
)
def test_other_architectures_equal_transformer_lens(splits, model_kwargs, variant):
    """Fresh models (weights scaled up so the splits' logit differences are far apart)."""
    model = build_model({**model_kwargs, **variant}, seed=0).eval()
    n = 24
    val, cf = splits["validation_tokens"][:n], splits["counterfactual_tokens"][:n]
    a, b = splits["counterfactual_labels"][:n], splits["counterfactual_shortcut"][:n]
    kinds = tuple(k for k in TL if not (k == "mlp_out" and model.cfg.attn_only))
    grids = cross_split_patching(model, val, cf, a, b, kinds=kinds, max_pairs=None, max_batch=50)  # several chunks
    torch.set_grad_enabled(False)
    try:
        for direction in DIRECTIONS:
            source, receiver = (val, cf) if direction == DIRECTIONS[0] else (cf, val)
            ld_src = logit_diff(model(source)[:, -1], a, b).mean().item()
            ld_rec = logit_diff(model(receiver)[:, -1], a, b).mean().item()
            assert abs(ld_src - ld_rec) > 0.2
            _, source_cache = model.run_with_cache(source)
            for kind in kinds:
                expected = TL[kind](model, receiver, source_cache, normalized_logit_diff_metric(a, b, ld_rec, ld_src))
                torch.testing.assert_close(
                    grids[direction][kind].values, expected.float(), atol=1e-5, rtol=0, msg=f"{direction} {kind}"
                )
    finally:
        torch.set_grad_enabled(True)


def test_endpoints_of_the_metric(trained, splits):
    """Patching the whole final residual (resid_pre of layer 0 at every position) gives 1 exactly."""
    val, cf = splits["validation_tokens"][:32], splits["counterfactual_tokens"][:32]
    a, b = splits["counterfactual_labels"][:32], splits["counterfactual_shortcut"][:32]
    g = patch_grid(trained, val, cf, a, b, "resid_pre")
    # pairs differ in one position, so summing the layer-0 cells over positions covers every pair once
    d = (val != cf).sum(1)
    assert (d == 1).all()
    assert g.values[0].sum().item() == pytest.approx(1.0, abs=1e-5)
    rec = g.to_records()
    assert len(rec) == g.values.numel() and {"layer", "pos", "value"} <= set(rec[0])


def test_bad_inputs(trained, splits):
    val, cf = splits["validation_tokens"][:8], splits["counterfactual_tokens"][:8]
    a, b = splits["counterfactual_labels"][:8], splits["counterfactual_shortcut"][:8]
    with pytest.raises(InterpError, match="unknown patching grid"):
        patch_grid(trained, val, cf, a, b, "q_by_pos")
    # the shape annotation (jaxtyping, checked under pytest: tests/conftest.py) or, without the
    # checker, the engine's own check refuses a receiver batch of another size
    with pytest.raises((InterpError, TypeCheckError), match="pair"):
        patch_grid(trained, val, cf[:4], a, b, "resid_pre")
    with pytest.raises(InterpError, match="max_batch=0"):
        patch_grid(trained, val, cf, a, b, "resid_pre", max_batch=0)
    with pytest.raises(InterpError, match="label == shortcut"):
        cross_split_patching(trained, val, val, splits["validation_labels"][:8], splits["validation_shortcut"][:8])
