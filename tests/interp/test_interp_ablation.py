import pytest
import torch
from interp_handmade import copy_first_model, random_tokens

from lenslab.interp.ablation import Ablation, AttnTarget, HeadTarget, MLPTarget, ResidTarget, evaluate_ablations
from lenslab.interp.common import InterpError, label_vs_shortcut_diff


@pytest.fixture(scope="module")
def data():
    model = copy_first_model()
    tokens = random_tokens(400)
    labels = tokens[:, 0] % 2  # the hand-built model computes exactly this
    shortcut = tokens[:, 1] % 2  # any other feature, to exercise both logit-diff branches
    return model, tokens, labels, shortcut


def test_unablated_model_is_known(data):
    model, tokens, labels, _shortcut = data
    logits = model(tokens)[:, -1]
    # hand-set weights give logits that are exact small sums of 0/±1/2 terms; LayerNorm-free float32 adds at most
    # an ulp of O(1) per op in any order (kernel blocking, threads, ISA): 1e-6
    torch.testing.assert_close(logits, torch.nn.functional.one_hot(labels, 2).float(), atol=1e-6, rtol=0)


def test_zero_mean_resample_on_copy_head(data):
    model, tokens, labels, shortcut = data
    all_odd = tokens.clone()
    all_odd[:, 0] = 1  # reference split whose first element is always odd
    abls = [Ablation(HeadTarget(0, 0), "zero"), Ablation(HeadTarget(0, 0), "resample"), Ablation(AttnTarget(0), "zero")]
    table = evaluate_ablations(model, abls, {"s": (tokens, labels, shortcut)}, reference_tokens=all_odd)
    rows = {r["target"]: r for r in table}
    assert rows["none"]["acc_s"] == 1.0
    # zero: all logits 0 -> argmax picks class 0 -> accuracy = fraction of label 0
    # accuracies are counts over the batch: pytest.approx's default 1e-6 only absorbs float32 division
    assert rows["L0H0:zero"]["acc_s"] == pytest.approx(float((labels == 0).float().mean()))
    assert rows["L0.attn:zero"]["acc_s"] == pytest.approx(float((labels == 0).float().mean()))
    # resample from an all-odd reference: the head always reports class 1
    assert rows["L0H0:resample"]["acc_s"] == pytest.approx(float((labels == 1).float().mean()))
    # logit difference: unablated logits are onehot(label): +1 for every row (margin or vs shortcut)
    expected = torch.where(labels == shortcut, 1.0, 1.0).mean()
    # a float32 mean of O(1) exact values: reordered sums (threads, blocking) move it by ~1e-7
    assert rows["none"]["logit_diff_s"] == pytest.approx(float(expected), abs=1e-5)


def test_mean_ablation_predicts_the_reference_majority(data):
    model, tokens, labels, shortcut = data
    ref = tokens.clone()
    ref[:, 0] = torch.tensor([0, 2, 4, 1] * 100)  # 75 % even first elements
    table = evaluate_ablations(
        model, [Ablation(HeadTarget(0, 0), "mean")], {"s": (tokens, labels, shortcut)}, reference_tokens=ref
    )
    # mean z = 0.75 * even + 0.25 * odd -> logits (0.75, 0.25) -> always class 0
    assert table[1]["acc_s"] == pytest.approx(float((labels == 0).float().mean()))
    assert table[1]["logit_diff_s"] == pytest.approx(
        float(label_vs_shortcut_diff(torch.tensor([[0.75, 0.25]]).expand(len(labels), 2), labels, shortcut).mean()), abs=1e-5
    )


def test_position_of_a_head_ablation(data):
    model, tokens, labels, shortcut = data
    abls = [Ablation(HeadTarget(0, 0), "zero", pos=0), Ablation(HeadTarget(0, 0), "zero", pos=4)]
    table = evaluate_ablations(model, abls, {"s": (tokens, labels, shortcut)})
    assert table[1]["acc_s"] == 1.0  # the head's output at position 0 never reaches the readout
    assert table[2]["acc_s"] == pytest.approx(float((labels == 0).float().mean()))


def test_batched_equals_one_forward_per_ablation(trained, splits):
    """The batched call (every ablation in one forward) equals separate hooked forwards."""
    tokens, labels, shortcut = splits["validation_tokens"], splits["validation_labels"], splits["validation_shortcut"]
    ref = splits["train_tokens"][:256]
    abls = [
        Ablation(HeadTarget(1, 1), "mean"),
        Ablation(MLPTarget(0), "zero"),
        Ablation(ResidTarget(1, 2), "mean"),
        Ablation(HeadTarget(0, 0), "mean", pos=4),
    ]
    table = evaluate_ablations(trained, abls, {"v": (tokens, labels, shortcut)}, reference_tokens=ref)
    _, cache = trained.run_with_cache(ref)
    for ab, row in zip(abls, table[1:]):
        name = ab.target.hook_name
        mean = cache[name].mean(0)

        def hook(act, hook, ab=ab, mean=mean):
            act = act.clone()
            if isinstance(ab.target, HeadTarget):
                p = slice(None) if ab.pos is None else ab.pos
                act[:, p, ab.target.head] = 0 if ab.mode == "zero" else mean[p, ab.target.head]
            elif isinstance(ab.target, ResidTarget):
                act[:, ab.target.pos] = mean[ab.target.pos]
            else:
                act[:] = 0 if ab.mode == "zero" else mean
            return act

        logits = trained.run_with_hooks(tokens, fwd_hooks=[(name, hook)])[:, -1]
        assert row["acc_v"] == pytest.approx(float((logits.argmax(-1) == labels).float().mean()))
        # batched ablation vs one run_with_hooks forward: another batch shape, so other BLAS blocking; float32
        # logits of O(1-10) agree to a few ulps (~1e-6) on any CPU, their mean as well
        assert row["logit_diff_v"] == pytest.approx(
            float(label_vs_shortcut_diff(logits, labels, shortcut).mean().detach()), abs=1e-5
        )


def test_out_of_range_targets_name_the_valid_range(trained, splits):
    data = {"v": (splits["validation_tokens"], splits["validation_labels"], splits["validation_shortcut"])}
    with pytest.raises(InterpError, match=r"head=5 .*0\.\.1"):
        evaluate_ablations(trained, [Ablation(HeadTarget(0, 5), "zero")], data)
    with pytest.raises(InterpError, match=r"layer=2 .*0\.\.1"):
        evaluate_ablations(trained, [Ablation(MLPTarget(2), "zero")], data)
    with pytest.raises(InterpError, match="mode"):
        evaluate_ablations(trained, [Ablation(HeadTarget(0, 0), "bogus")], data)
    with pytest.raises(InterpError, match="reference_tokens"):
        evaluate_ablations(trained, [Ablation(HeadTarget(0, 0), "mean")], data)


def test_ablations_by_transformer_lens_hook_name(trained, splits):
    from transformer_lens.utilities import get_act_name

    from lenslab.interp.ablation import AttnTarget, ResidTarget

    assert Ablation(get_act_name("z", 0), head=1) == Ablation(HeadTarget(0, 1))
    assert Ablation("blocks.1.hook_mlp_out", "zero") == Ablation(MLPTarget(1), "zero")
    assert Ablation("blocks.0.hook_attn_out").target == AttnTarget(0)
    assert Ablation("blocks.1.hook_resid_pre", pos=2) == Ablation(ResidTarget(1, 2))
    data = {"v": (splits["validation_tokens"], splits["validation_labels"], splits["validation_shortcut"])}
    ref = splits["train_tokens"]
    by_name = evaluate_ablations(trained, [Ablation("blocks.1.attn.hook_z", head=0)], data, reference_tokens=ref)
    by_target = evaluate_ablations(trained, [Ablation(HeadTarget(1, 0))], data, reference_tokens=ref)
    assert by_name == by_target
    with pytest.raises(InterpError, match="say which, e.g. Ablation"):
        Ablation("blocks.0.attn.hook_z")
    with pytest.raises(InterpError, match="not an ablation site"):
        Ablation("blocks.0.attn.hook_pattern", head=0)
    with pytest.raises(InterpError, match="unknown ablation mode 'median'"):
        Ablation(HeadTarget(0, 0), mode="median")  # at construction, not at evaluation


def test_a_metric_function_gets_its_own_columns(trained, splits):
    data = {"v": (splits["validation_tokens"], splits["validation_labels"], splits["validation_shortcut"])}
    abls = [Ablation(HeadTarget(0, 0), "zero"), Ablation(HeadTarget(1, 1), "zero")]

    def shortcut_rate(logits, labels, shortcut):  # how often the model answers with the shortcut class
        return (logits.argmax(-1) == shortcut).double().mean()

    rows = evaluate_ablations(trained, abls, data, metric=shortcut_rate)
    for r, ab in zip(rows, [None, *abls]):
        tokens, labels, shortcut = data["v"]
        if ab is None:
            logits = trained(tokens)[:, -1]
        else:
            t = ab.target

            def zero(z, hook, h=t.head):
                z[:, :, h] = 0.0
                return z

            logits = trained.run_with_hooks(tokens, fwd_hooks=[(t.hook_name, zero)])[:, -1]
        assert r["metric_v"] == pytest.approx(float(shortcut_rate(logits.detach(), labels, shortcut)), abs=1e-12)
        assert r["delta_metric_v"] == pytest.approx(r["metric_v"] - rows[0]["metric_v"])
    with pytest.raises(InterpError, match="metric must be a function"):
        evaluate_ablations(trained, abls, data, metric="logit_diff")
