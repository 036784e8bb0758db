"""The checks of the tutorials' results, kept out of the teaching cells.

A notebook cell shows a result; a check here tests it. ``CHECKS[name]`` lists, in notebook order,
``(anchor, check_code)`` pairs for ``tutorials/<name>.py``: ``anchor`` is a substring of exactly
one code cell, and ``check_code`` is Python source that ``insert_checks`` adds as a new code cell
right after that cell. ``test_tutorial_runs_in_quick_mode`` then executes the notebook, so each
check runs in the notebook's kernel, after the cell it checks, and sees the notebook's variables.

Each check runs inside a function (``insert_checks`` wraps it), so its names stay local and never
change what the later cells see. One consequence: a check must not assign a name it also reads
from the notebook (Python would take the name as local throughout the check). Where a cell's
values were per-iteration locals of a loop, the check loops again over the notebook's variables
and recomputes them, with the notebook's own helpers and lenslab's public functions.
"""

from __future__ import annotations

import textwrap

import nbformat

CHECK_TAG = "tutorial-check"

# the harmful/benign ablation rows of section 6 of tutorial 02, checked the same way for the
# traps the run has and for the planted ones
_JSD_ROWS = """\
import math


def check_jsd(rows, model):
    acc = accuracy(model, *test_split)
    for r in rows:
        assert 0.0 <= r.jsd <= math.log(2) + 1e-9 and 0.0 <= r.null_mean <= math.log(2) + 1e-9
        assert math.isfinite(r.null_p95)  # the null's 95th percentile is reported
        assert r.harmful == (r.jsd > r.null_p95)
        assert math.isclose(r.accuracy - acc, r.accuracy_change, abs_tol=1e-9)
"""

CHECKS: dict[str, list[tuple[str, str]]] = {
    "01_shortcut_saturation": [
        (
            "splits = {r: make_mpsp_splits(",
            """\
import math

for r, sp in splits.items():
    x = sp["train_tokens"][:, :-1]
    # the rule, recomputed here from the raw values
    assert torch.equal(sp["train_labels"], x.sum(1) % 2) and torch.equal(sp["train_shortcut"], x.max(1).values % 2)
    expected = math.floor(r * S["n_train"] + 0.5)  # round(r·n), halves up
    shown = table[(table.r == r) & (table.split == "train")].iloc[0]
    assert shown.consistent == expected, (shown.consistent, expected)
    if (r * S["n_train"]).is_integer():
        assert shown.ratio == r  # exactly r, not approximately
    assert abs(shown.ratio - r) <= 0.5 / S["n_train"]
    assert table[(table.r == r) & (table.split == "validation")].ratio.item() == 1.0
    assert table[(table.r == r) & (table.split == "adv")].ratio.item() == 0.0
    assert table[(table.r == r) & (table.split == "counterfactual")].ratio.item() == 0.0
    seqs = {name: {tuple(t) for t in sp[f"{name}_tokens"].tolist()} for name in ("train", "validation", "adv")}
    assert (
        not (seqs["train"] & seqs["validation"]) and not (seqs["train"] & seqs["adv"]) and not (seqs["validation"] & seqs["adv"])
    )
""",
        ),
        (
            "summary_rows = []",
            """\
for (L, r), run in runs.items():
    s, m = run.summary, run.metrics
    # checks against the raw metrics (not against the summary's own bookkeeping)
    assert [row["epoch"] for row in m] == list(range(0, S["epochs"] + 1, S["eval_every"]))
    assert s["generalized"] == any(row["adv_acc"] == 1.0 for row in m)
    assert s["max_adv_acc"] == max(row["adv_acc"] for row in m)
    assert all(0.0 <= row[k] <= 1.0 for row in m for k in ("train_acc", "validation_acc", "adv_acc"))
    assert torch.equal(run.splits["train_tokens"], splits[r]["train_tokens"])  # the run trained on exactly these splits
""",
        ),
        (
            "phase = detect_phase2(m)",
            """\
for (L, r), run in runs.items():
    m = run.metrics
    phase = detect_phase2(m)
    for trace in visual.accuracy_figure(m, phase).data:  # the cell's figure, before its title
        assert len(trace.x) == len(m), (trace.name, len(trace.x))  # one point per evaluation
    assert phase["generalized_epoch"] == runs[(L, r)].summary["first_generalized_epoch"]
""",
        ),
        (
            "grad_rows = []",
            """\
for (L, r), run in runs.items():
    m = run.metrics
    assert [len(t.x) for t in visual.gradient_figure(m).data] == [len(m), len(m)]
    conflict = [row["grad_conflict"] for row in m]
    amp = [row["grad_amplification"] for row in m]
    assert all(-1.0 - 1e-6 <= c <= 1.0 + 1e-6 for c in conflict) and all(a > 0 for a in amp)
""",
        ),
        (
            "fp_w = weight_fingerprints(",
            """\
n_heads = model.cfg.n_layers * model.cfg.n_heads
assert len(fp_w) == len(fp_a) == n_heads
assert all(-1 <= r_["qk_rho"] <= 1 and 0 <= r_["pos0_mass"] <= 1 and -1 <= r_["ov_parity_rho"] <= 1 for r_ in fp_w + fp_a)
""",
        ),
        (
            "views = []",
            """\
for split, view in zip(("validation", "counterfactual"), views, strict=True):
    pats = two_head_patterns(sp[f"{split}_tokens"][0])  # what the view draws
    assert pats.shape == (2, task.n_ctx, task.n_ctx)
    assert torch.allclose(pats.sum(-1), torch.ones(2, task.n_ctx), atol=1e-5)  # each query's attention sums to 1
    html = view.html()
    assert "CircuitsVis.render" in html and "http://" not in html and "https://" not in html
assert visual.circuitsvis_bundle_html().startswith("<script>")  # the bundle itself, inline, not a <script src=...>
""",
        ),
        (
            "evo = circuit_evolution(",
            """\
n_heads = model.cfg.n_layers * model.cfg.n_heads
assert len(evo["rows"]) == len(evo["epochs_used"]) <= S["evo_checkpoints"]
assert set(evo["epochs_used"]) <= set(run.epochs()) and evo["epochs_used"][-1] == run.epochs()[-1]
assert len(head_rows) == len(evo["rows"]) * n_heads
for source in ("w", "a"):
    evolution = visual.fingerprint_evolution_figure(head_rows, source)
    assert len(evolution.data) == 3 * n_heads and all(len(t.x) == len(evo["rows"]) for t in evolution.data)
# fig: the cell's last figure, the per-head patching heatmap
assert len(fig.data[0].z) == n_heads and len(fig.data[0].z[0]) == len(evo["rows"])
""",
        ),
        (
            "grids = cross_split_patching(",
            """\
import math

L_, H_, P_ = model.cfg.n_layers, model.cfg.n_heads, task.n_ctx
for direction, by_kind in grids.items():
    src, rec = direction.split("->")
    for kind, grid in by_kind.items():
        assert grid.n_pairs == S["n_val"]
        assert tuple(grid.values.shape) == {"resid_pre": (L_, P_), "z_by_pos": (L_, P_, H_)}[kind]
        assert torch.isfinite(grid.values).all()
        # the unpatched runs, recomputed with a plain forward pass
        assert math.isclose(grid.ld_source, ld[src], rel_tol=1e-4, abs_tol=1e-4) and math.isclose(
            grid.ld_receiver, ld[rec], rel_tol=1e-4, abs_tol=1e-4
        )
        if kind == "resid_pre":
            assert grid.values[0, -1] == 0  # layer 0 at READ: the same token in both runs, so patching changes nothing
        else:
            assert (grid.values[-1, :-1] == 0).all()  # last layer, non-READ positions: cannot reach the readout logits
""",
        ),
        (
            "paper = {(2, 0.5)",
            """\
assert len(side) == 4 and side.iloc[:, 3].map(type).eq(bool).all()
""",
        ),
    ],
    "02_correlation_traps": [
        (
            "schedule = log_schedule(",
            """\
n_pairs, n_train = S["p"] ** 2, round(S["train_frac"] * S["p"] ** 2)
for (dtype, wd, s), run in runs.items():
    assert [r["epoch"] for r in run.metrics] == schedule  # an evaluation at every log-spaced epoch
    assert run.epochs() == schedule  # and a checkpoint at each
    assert run.dtype == getattr(torch, dtype)
    cfg = run.config["train"]
    assert (cfg["weight_decay"], cfg["lr"], tuple(cfg["betas"]), cfg["batch_size"]) == (
        wd,
        S["lr"],
        (0.9, 0.98),
        None,
    )  # full batch
    assert len(run.splits["train_labels"]) == n_train and len(run.splits["test_labels"]) == n_pairs - n_train
    tok, lab = run.splits["test_tokens"], run.splits["test_labels"]
    assert torch.equal(lab, (tok[:, 0] + tok[:, 1]) % S["p"])  # the rule, recomputed here
""",
        ),
        (
            "mirror_share = sum(",
            """\
assert not train_pairs & set(test_pairs)
""",
        ),
        (
            "fig.add_hline(y=GROKKED",
            """\
assert len(fig.data) == 2 * len(runs) and all(len(t.x) == len(schedule) - 1 for t in fig.data)
""",
        ),
        (
            "pairs = [(dtype, wd, s) for dtype, wd in",
            """\
import math

import torch.nn.functional as F

assert len(fig.data) == len(panels) * len(pairs)
for dtype, wd, s in pairs:
    run = runs[dtype, wd, s]
    last = run.metrics[-1]
    for r in run.metrics:
        assert all(r.get(k) is not None for k in ("train_max_abs_logit", "train_zero_loss_frac", "weight_norm", "weight_norms"))
        assert 0.0 <= r["train_zero_loss_frac"] <= 1.0
        assert math.isclose(r["weight_norm"], math.sqrt(sum(v**2 for v in r["weight_norms"].values())), rel_tol=1e-5)
    # the last row's numbers, recomputed from the saved model
    with torch.no_grad():
        logits = readout_logits(run.model(), run.splits["train_tokens"])
        losses = F.cross_entropy(logits, run.splits["train_labels"], reduction="none")
    assert logits.dtype == getattr(torch, dtype)
    assert math.isclose(float(logits.abs().max()), last["train_max_abs_logit"], rel_tol=1e-4)
    assert math.isclose(float((losses == 0).double().mean()), last["train_zero_loss_frac"], abs_tol=0.02)
""",
        ),
        (
            "visual.collapse_items(",
            """\
assert isinstance(fig, go.Figure) and len(fig.data) >= 4
""",
        ),
        (
            "trap_counts_over_run(run.path",
            """\
for key, df in traps.items():
    assert len(df) == len(schedule) * len(MATRICES)  # one row per checkpoint x matrix
    assert all(sorted(g.matrix) == sorted(MATRICES) for _, g in df.groupby("epoch"))
    assert sorted(df.epoch.unique()) == schedule
    assert df.error.isna().all() and (df.n_traps >= 0).all()
    assert (df.alpha.notna() | df.alpha_reason.notna()).all()  # alpha, or why it could not be fitted
assert len(fig.data) == 2 * len(runs)
""",
        ),
        (
            "key0 = (",
            """\
assert len(fig.data) == 2 + 2 * len(MATRICES)  # train/test accuracy, traps per matrix, alpha per matrix
assert final_alpha.shape == (len(MATRICES), len(runs))
""",
        ),
        (
            "o = modadd_outcome(run)",
            """\
for (dtype, wd, s), run in runs.items():
    o = modadd_outcome(run)
    t = per_ckpt[dtype, wd, s]
    # the outcome's grokking step is the first evaluation at >= GROKKED, recomputed from the rows
    accs = [(r["epoch"], r["test_acc"]) for r in run.metrics]
    assert o["first_grokked_epoch"] == next((e for e, a in accs if a >= GROKKED), None)
    assert o["anti_grokked_epoch"] is None or (
        o["first_grokked_epoch"] is not None and o["anti_grokked_epoch"] > o["first_grokked_epoch"]
    )
    assert o["epochs"] == S["epochs"] and len(t) == len(schedule)
assert len(summary) == len(ARMS) * len(S["seeds"])  # one row per arm and seed
""",
        ),
        (
            "model0 = runs[key0].model()",
            """\
last0 = traps[key0][traps[key0].epoch == schedule[-1]].set_index("matrix")
assert len(fig.data[0].x) == min(W.shape)  # one eigenvalue per column of the (N >= M) shuffled matrix
assert row.n_traps == last0.n_traps[name] and row.threshold > row.lambda_plus > 0  # the scan's count for this checkpoint
assert row.n_traps == int((torch.tensor(fig.data[0].x) > row.threshold).sum())  # the histogram shows what was counted
""",
        ),
        (
            "jsd_found = trap_jsd(",
            _JSD_ROWS
            + """
assert math.isclose(base_acc, runs[key0].metrics[-1]["test_acc"], abs_tol=1e-6)
check_jsd(jsd_found, model0)
last0 = traps[key0][traps[key0].epoch == schedule[-1]].set_index("matrix")
assert len(jsd_found) == int(last0.n_traps.sum())  # one ablation row per trap the scan counted
""",
        ),
        (
            "planted = copy.deepcopy(model0)",
            _JSD_ROWS
            + """
planted_row = detect_traps(extract_matrices(planted).matrices[name], name)
check_jsd(jsd_planted, planted)
assert len(jsd_planted) == planted_row.n_traps >= 1
# fig: the ESD of the planted matrix
assert int((torch.tensor(fig.data[0].x) > planted_row.threshold).sum()) == planted_row.n_traps
""",
        ),
        (
            "mlp_model.run_with_cache(",
            """\
assert cache["layers.0.hook_post"].shape == (2, 200) and logits.shape == (2, 10)  # TransformerLens hooks on an MLP
""",
        ),
        (
            "mlp_traps = trap_counts_over_run(",
            """\
assert set(mlp_df.matrix) == {"layers.0.W", "layers.1.W", "layers.2.W"}
assert len(mlp_df) == 3 * len(mlp_run.epochs())  # one row per matrix and checkpoint
""",
        ),
        (
            "control = pd.DataFrame(rescale_control(",
            """\
for m, g in control.groupby("matrix"):
    scaled = g[g.scale != "gaussian"]
    assert scaled.n_traps.nunique() == 1  # unchanged under rescaling
""",
        ),
        (
            'maps = trap_pixel_maps(mlp_model, "layers.0.W")',
            """\
if not len(trap_pixel_maps(mlp_model, "layers.0.W").rows):  # the trained model has none: the cell planted four
    assert sorted(r["peak_pixel"] for r in maps.rows) == sorted(centre)  # each planted entry's own pixel
""",
        ),
        (
            "nr = pd.DataFrame(norm_response(",
            """\
assert (nr[nr.scale == 1.0].agree_with_unit == 1.0).all()
""",
        ),
    ],
}


def anchor_cells(nb: nbformat.NotebookNode, anchor: str) -> list[int]:
    """Indices (in ``nb.cells``) of the code cells whose source contains ``anchor``."""
    return [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and anchor in c.source]


def check_cell_source(name: str, k: int, anchor: str, code: str) -> str:
    """The source of the check cell: ``code`` run inside a function, so its names stay local."""
    body = textwrap.indent(textwrap.dedent(code).strip("\n"), "    ")
    fn = f"_check_{k:02d}"
    return f"# check {k} of {name} (tests/tutorials/checks.py), after the cell with {anchor!r}\ndef {fn}():\n{body}\n\n\n{fn}()\ndel {fn}"


def insert_checks(nb: nbformat.NotebookNode, name: str) -> int:
    """Insert the checks of tutorial ``name`` into ``nb``, each right after its anchor's cell; return how many.

    Raises ``ValueError`` when an anchor is in no code cell or in more than one, or when the
    checks are not listed in the notebook's order. The anchors are looked up before any check
    is inserted, so a check's own text never counts.
    """
    if name not in CHECKS:
        raise ValueError(f"no checks for tutorial {name!r}; known: {sorted(CHECKS)}")
    after: list[int] = []
    for anchor, _ in CHECKS[name]:
        found = anchor_cells(nb, anchor)
        if len(found) != 1:
            raise ValueError(
                f"{name}: the check anchor {anchor!r} is in {len(found)} code cells (cells {found}); it must be in exactly one"
            )
        if after and found[0] < after[-1]:
            raise ValueError(f"{name}: the check anchored at {anchor!r} is listed out of the notebook's order")
        after.append(found[0])
    for k in reversed(range(len(after))):  # from the end, so the earlier indices stay valid
        anchor, code = CHECKS[name][k]
        cell = nbformat.v4.new_code_cell(check_cell_source(name, k, anchor, code))
        cell["id"] = f"check-{name[:2]}-{k:02d}"  # not ``cell-NN``: output_shape skips it
        cell.metadata["tags"] = [CHECK_TAG]
        nb.cells.insert(after[k] + 1, cell)
    return len(after)
