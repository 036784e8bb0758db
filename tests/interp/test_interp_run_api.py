"""One way in (issue 27): a Run where a model or splits are taken, Split named tuples, and rich reprs."""

from __future__ import annotations

import pytest
import torch

from lenslab.interp.ablation import Ablation, HeadTarget, evaluate_ablations
from lenslab.interp.common import Table
from lenslab.interp.spectral import alpha_table, extract_matrices, trap_counts_over_run
from lenslab.training.errors import RunError
from lenslab.training.run import Run, Split


def test_split_is_the_raw_tensors_as_a_named_tuple(fake_run):
    run = Run.open(fake_run)
    raw = run.splits
    for name in run.split_names():
        sp = run.split(name)
        assert isinstance(sp, Split) and isinstance(sp, tuple)
        assert torch.equal(sp.tokens, raw[f"{name}_tokens"]) and torch.equal(sp.labels, raw[f"{name}_labels"])
        assert torch.equal(sp.shortcut, raw[f"{name}_shortcut"])
    assert set(run.eval_splits()) == {n for n in run.split_names() if f"{n}_shortcut" in raw}
    with pytest.raises(RunError, match=r"no split 'nope'; this run has \["):
        run.split("nope")


def test_evaluate_ablations_takes_a_run_or_its_splits(fake_run):
    run = Run.open(fake_run)
    model = run.model()
    abls = [Ablation(HeadTarget(0, 0)), Ablation(HeadTarget(1, 1), mode="zero")]
    by_hand = {
        n: (run.splits[f"{n}_tokens"], run.splits[f"{n}_labels"], run.splits[f"{n}_shortcut"]) for n in ("validation", "adv")
    }
    train = run.splits["train_tokens"]
    ref = evaluate_ablations(model, abls, by_hand, reference_tokens=train)
    named = evaluate_ablations(model, abls, {n: run.split(n) for n in ("validation", "adv")}, reference_tokens=train)
    assert named == ref
    whole = evaluate_ablations(model, abls, run)  # the train split is the reference by default
    for a, b in zip(whole, ref):
        assert all(a[k] == b[k] for k in b)  # the Run adds its other splits' columns, the shared ones agree


def test_spectral_tools_take_a_run(fake_run):
    run = Run.open(fake_run)
    last = run.checkpoint_file()
    assert alpha_table(run) == alpha_table(last)
    assert list(extract_matrices(run).matrices) == list(extract_matrices(str(last)).matrices)
    assert trap_counts_over_run(run, workers=1) == trap_counts_over_run(str(fake_run), workers=1)


def test_run_reprs_name_the_run_task_model_and_epochs(fake_run):
    run = Run.open(fake_run)
    text = repr(run)
    assert len(text) < 300 and run.path.name in text and "mpsp" in text and "2L 2H" in text
    assert f"epochs {run.epochs()[0]}..{run.epochs()[-1]}" in text
    html = run._repr_html_()
    assert html.startswith("<div") and run.path.name in html and "mpsp" in html and str(len(run.epochs())) in html


def test_table_keeps_integer_columns_and_shows_as_html():
    t = Table(
        [{"target": "none", "layer": None, "head": None, "acc": 0.5}, {"target": "L0H1", "layer": 0, "head": 1, "acc": 0.25}]
    )
    df = t.to_pandas()
    assert str(df["layer"].dtype) == "Int64" and df["layer"].tolist()[1] == 0 and df["layer"].isna().tolist() == [True, False]
    assert str(df["acc"].dtype) == "float64"
    assert "<table" in t._repr_html_() and "2 rows" in t._repr_html_()
    assert repr(t) == "Table(2 rows; columns ['target', 'layer', 'head', 'acc'])"


def test_token_strings_take_a_tensor_row_or_a_list():
    from lenslab.interp.common import InterpError
    from lenslab.interp.visual import token_strings

    assert token_strings(torch.tensor([6, 0, 16]), 16) == ["6", "0", "READ"] == token_strings([6, 0, 16], 16)
    with pytest.raises(InterpError, match="one example"):
        token_strings(torch.zeros(2, 3, dtype=torch.long), 16)


def test_patch_grid_alpha_fit_and_trap_scan_reprs(fake_run):
    import math

    from lenslab.interp.patching import PatchGrid
    from lenslab.interp.spectral import fit_power_law, scan_path

    grid = PatchGrid("resid_pre", "val->cf", torch.tensor([[0.0, 0.5], [1.0, 0.25]]), 64, 2.0, -1.0)
    text = repr(grid)
    assert "resid_pre" in text and "0..1" in text and "64 pairs" in text
    page = grid._repr_html_()
    assert page.count("<td") == 4 and "rows: layer" in page and "rgba(178,24,43,1.00)" in page  # the max is full red
    g = torch.Generator().manual_seed(0)
    tail = (1 - torch.rand(2000, generator=g, dtype=torch.float64)) ** (-1 / 1.5)  # Pareto, alpha = 2.5 as a density
    fit = fit_power_law(tail)
    assert repr(fit).startswith(f"AlphaFit(alpha={fit.alpha:.4g} ± ") and "tail" in repr(fit)
    nan = fit_power_law(torch.ones(3, dtype=torch.float64))
    assert math.isnan(nan.alpha) and repr(nan).startswith("AlphaFit(alpha=nan: ")
    assert "<table" in fit._repr_html_() and f"{fit.alpha:.4g} ± " in fit._repr_html_()
    assert "α = NaN" in nan._repr_html_() and nan.reason.split()[0] in nan._repr_html_()
    scan = scan_path(fake_run, workers=1, progress=False)
    assert f"{len(scan.checkpoints)} checkpoints" in repr(scan) and "traps at the last" in repr(scan)
    assert "<pre>" in scan._repr_html_()


def test_a_run_model_carries_its_task_for_the_analysis_functions(fake_run):
    from lenslab.interp.common import InterpError
    from lenslab.interp.fingerprints import activation_fingerprints, weight_fingerprints
    from lenslab.interp.visual import attention_view

    run = Run.open(fake_run)
    model = run.model()
    task = run.task
    assert model.lenslab_task == task
    assert weight_fingerprints(model) == weight_fingerprints(model, task.n_values, task.k)
    val = run.split("validation")
    assert activation_fingerprints(model, val.tokens[:32]) == activation_fingerprints(model, val.tokens[:32], task.k)
    a, b = attention_view(model, val.tokens[0]), attention_view(model, val.tokens[0], task.n_values)
    assert a.props == b.props  # the same view (its HTML differs only in a random element id)
    bare = run.new_model()  # not loaded through the run: no task attached
    with pytest.raises(InterpError, match="pass n_values= and k="):
        weight_fingerprints(bare)


def test_cross_split_patching_takes_a_run_or_its_splits(fake_run):
    from lenslab.interp.common import InterpError
    from lenslab.interp.patching import cross_split_patching

    run = Run.open(fake_run)
    model, val, cf = run.model(), run.split("validation"), run.split("counterfactual")
    ref = cross_split_patching(model, val.tokens, cf.tokens, cf.labels, cf.shortcut, max_pairs=32)
    for got in (
        cross_split_patching(run, max_pairs=32),
        cross_split_patching(str(fake_run), max_pairs=32),
        cross_split_patching(model, val, cf, max_pairs=32),
    ):
        assert got.keys() == ref.keys()
        for d in ref:
            assert got[d].keys() == ref[d].keys()
            for kind in ref[d]:
                assert torch.equal(got[d][kind].values, ref[d][kind].values), (d, kind)
    with pytest.raises(
        InterpError, match="counterfactual_tokens, counterfactual_labels, counterfactual_shortcut not given: pass a Run"
    ):
        cross_split_patching(model, val.tokens)
