# %% [markdown]
# # Tutorial 1: shortcut saturation on MPSP
#
# Paper 1 ("When data imbalance helps: robust generalization through shortcut saturation") trains
# small transformers on **MPSP**: the label is `sum(x) mod 2`, and the *shortcut* is `max(x) mod 2`.
# A training example is *shortcut-consistent* when the two agree. The **spurious ratio r** is the
# fraction of consistent training examples. The paper's surprise: a 2-layer model at r = 0.9
# finds the true rule more often (77 % of seeds) than at the balanced r = 0.5 (0 %). A 1-layer
# model does the opposite (33 % at r = 0.5, 0 % at r = 0.9).
#
# This notebook walks through the paper with lenslab's public API:
#
# 1. build the splits and check the ratio;
# 2. train 1L and 2L models at r = 0.5 and 0.9;
# 3. plot accuracy per split, gradient conflict and gradient amplification;
# 4. look at a shortcut head and a parity head with circuitsvis;
# 5. follow the fingerprints over training, and patch across splits;
# 6. see how to run the paper-scale seed sweep.
#
# **What a quick run can and cannot show.** Quick mode (what CI runs) trains one seed per cell
# for a few dozen epochs on 4-value sequences and 4,000 training examples, so it finishes in a
# couple of minutes on a laptop CPU. One seed per cell says nothing about *rates*, and these
# short sequences are easier than the paper's task: on this CPU, 2L models at sequence length 4
# generalized at r = 0.5 as well, which the paper says should not happen. Quick mode shows the
# tools and the shape of the dynamics. It does not reproduce the paper's table; the sweep at the
# end is for that.

# %%
import os

MODE = os.environ.get("LENSLAB_TUTORIAL_MODE", "quick")  # "quick" (CI, minutes on a CPU) or "full" (paper scale)

SETTINGS = {
    # a few minutes on 2 CPU cores; easier than the paper (4 values per sequence, 4,000 examples)
    "quick": {
        "seq_len": 4,
        "n_values": 16,
        "n_train": 4_000,
        "n_val": 1_000,
        "n_adv": 1_000,
        "epochs": 40,
        "eval_every": 5,
        "evo_checkpoints": 9,
        "evo_pairs": 64,
        "evo_examples": 256,
    },
    # the paper's split sizes and 15,000 epochs, for a GPU or several nights on a CPU, in the regime where
    # the question is still open (REPRODUCTION.md item 1: 6 values from 0..11, where 2L runs split
    # between learning the rule and memorizing the split within 200 epochs)
    "full": {
        "seq_len": 6,
        "n_values": 12,
        "n_train": 16_384,
        "n_val": 2_048,
        "n_adv": 2_048,
        "epochs": 15_000,
        "eval_every": 50,
        "evo_checkpoints": 40,
        "evo_pairs": 256,
        "evo_examples": 512,
    },
}
if MODE not in SETTINGS:
    raise ValueError(f"LENSLAB_TUTORIAL_MODE={MODE!r}: use 'quick' or 'full'")
S = SETTINGS[MODE]
LAYERS, RATIOS, HEADS, SEED = (1, 2), (0.5, 0.9), 2, 0
print(MODE, S)

# %%
import time
import warnings
from pathlib import Path

import pandas as pd
import torch
from IPython.display import display

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm.auto without ipywidgets; we pass progress=False anyway

from lenslab.interp import visual
from lenslab.interp.common import readout_logits
from lenslab.interp.evolution import circuit_evolution, detect_phase2
from lenslab.interp.fingerprints import activation_fingerprints, weight_fingerprints
from lenslab.interp.patching import cross_split_patching, logit_diff
from lenslab.tasks import MPSPTask, make_mpsp_splits
from lenslab.training.config import mpsp_run_config
from lenslab.training.run import Run
from lenslab.training.trainer import train

# Each figure as its plotly JSON (what JupyterLab, Notebook 7 and VS Code draw) plus an HTML copy
# with plotly.js inlined once (what nbconvert's HTML draws), nothing fetched: visual.use_notebook_renderer().
# The committed copy was run with PLOTLY_RENDERER=plotly_mimetype+png, which adds a static PNG beside
# each figure for viewers that run no JavaScript (python tutorials/build_notebooks.py --execute).
visual.use_notebook_renderer()
RUNS = Path("runs") / "tutorial01" / MODE

# %% [markdown]
# ## 1. The splits
#
# `make_mpsp_splits` builds four disjoint, seeded splits:
#
# - **train** at ratio r: exactly `round(r · n_train)` consistent examples (halves round up), the
#   rest anti-shortcut;
# - **validation**: all consistent (r = 1), so it measures the shortcut;
# - **adv** (adversarial): all anti-shortcut (r = 0), so it measures the true rule;
# - **counterfactual**: for each validation row, an anti-shortcut sequence one token away (the
#   pairs for patching).
#
# Each sequence ends with a `READ` token, and the model answers there.

# %%
task = MPSPTask(label="sum2", shortcut="max", seq_len=S["seq_len"], n_values=S["n_values"])
splits = {r: make_mpsp_splits(task, r, S["n_train"], S["n_val"], S["n_adv"], seed=0) for r in RATIOS}

rows = []
for r, sp in splits.items():
    for name in ("train", "validation", "adv", "counterfactual"):
        consistent = int((sp[f"{name}_labels"] == sp[f"{name}_shortcut"]).sum())
        n = len(sp[f"{name}_labels"])
        rows.append({"r": r, "split": name, "n": n, "consistent": consistent, "ratio": consistent / n})
table = pd.DataFrame(rows)
display(table)

sp = splits[0.9]
print("first validation rows and their counterfactual partners (values, then READ):")
for i in range(3):
    v, c = sp["validation_tokens"][i].tolist(), sp["counterfactual_tokens"][i].tolist()
    print(
        f"  {v[:-1]} label {int(sp['validation_labels'][i])} shortcut {int(sp['validation_shortcut'][i])}"
        f"   ->  {c[:-1]} label {int(sp['counterfactual_labels'][i])} shortcut {int(sp['counterfactual_shortcut'][i])}"
    )

# %% [markdown]
# ## 2. Train 1L and 2L models at r = 0.5 and r = 0.9
#
# `mpsp_run_config` holds every setting (task, `HookedTransformerConfig` fields, AdamW). `train`
# writes a run directory with the config, the exact splits, checkpoints (dense early, sparse
# late), `metrics.jsonl` and `summary.json`. Re-running this cell resumes finished runs
# instantly rather than training again.
#
# A run **generalizes** if it reaches 100 % adversarial accuracy at any evaluation (the paper's
# definition).

# %%
runs = {}
t0 = time.time()
for L in LAYERS:
    for r in RATIOS:
        cfg = mpsp_run_config(
            ratio=r,
            layers=L,
            heads=HEADS,
            seq_len=S["seq_len"],
            n_values=S["n_values"],
            n_train=S["n_train"],
            n_val=S["n_val"],
            n_adv=S["n_adv"],
            epochs=S["epochs"],
            eval_every=S["eval_every"],
            seed=SEED,
        )
        out = RUNS / f"L{L}_r{r}"
        train(cfg, out, resume=(out / "config.json").is_file(), progress=False)
        runs[(L, r)] = Run.open(out)
        print(f"{L}L r={r}: done at {time.time() - t0:.0f} s")

summary_rows = []
for (L, r), run in runs.items():
    s, m = run.summary, run.metrics
    summary_rows.append(
        {
            "layers": L,
            "r": r,
            "generalized": s["generalized"],
            "first 100% adv epoch": s["first_generalized_epoch"],
            "max adv acc": s["max_adv_acc"],
            "final validation acc": m[-1]["validation_acc"],
            "final adv acc": m[-1]["adv_acc"],
        }
    )
display(pd.DataFrame(summary_rows))

# %% [markdown]
# ## 3. Accuracy per split
#
# Paper 1's generalizing runs have two phases. In phase 1 the shortcut is learned: validation
# accuracy is near 100 % and adversarial accuracy near 0 %. In phase 2 adversarial accuracy
# rises while validation stays at about 100 %. `detect_phase2` finds both onsets in the metrics;
# the dashed lines mark them (absent when not found). `train_consistent_acc` and
# `train_anti_acc` are the two groups of the training split.

# %%
phases = []
for (L, r), run in runs.items():
    m = run.metrics
    phase = detect_phase2(m)
    fig = visual.accuracy_figure(m, phase)
    fig.update_layout(title=f"{L}L, r = {r}: accuracy per split", height=360)
    fig.show()
    phases.append(
        {"layers": L, "r": r, **{k: phase[k] for k in ("phase1_epoch", "plateau_adv_acc", "phase2_epoch", "generalized_epoch")}}
    )
display(pd.DataFrame(phases))

# %% [markdown]
# ## 4. Gradient conflict and amplification
#
# At every evaluation the trainer probes the gradients on the training split (see
# `training.gradients`):
#
# - **conflict** = cosine between the gradient of the mean loss on consistent examples and on
#   anti-shortcut examples. The paper finds it negative at first; in 2L high-r runs it relaxes
#   toward 0 as the model generalizes, and in 1L runs it stays negative;
# - **amplification** = mean per-example gradient norm of anti-shortcut examples divided by that
#   of consistent ones. When the shortcut circuit saturates, the consistent majority has near-zero
#   loss, and the paper measures 9–17× at r = 0.9 (about r/(1−r) = 9).

# %%
grad_rows = []
for (L, r), run in runs.items():
    m = run.metrics
    fig = visual.gradient_figure(m)
    fig.update_layout(title=f"{L}L, r = {r}: gradient dynamics", height=340)
    fig.show()
    conflict = [row["grad_conflict"] for row in m]
    amp = [row["grad_amplification"] for row in m]
    grad_rows.append(
        {
            "layers": L,
            "r": r,
            "conflict at epoch 0": conflict[0],
            "min conflict": min(conflict),
            "final conflict": conflict[-1],
            "max amplification": max(amp),
            "final amplification": amp[-1],
        }
    )
display(pd.DataFrame(grad_rows))
for g in grad_rows:
    if g["r"] == 0.9:
        print(
            f"{g['layers']}L, r = 0.9: largest amplification {g['max amplification']:.1f}x "
            f"(paper: 9-17x at r = 0.9; r/(1-r) = {0.9 / 0.1:.0f})"
        )

# %% [markdown]
# Compare the first conflict column with the paper's "starts negative": at initialisation the
# sign depends on the model and its init, and one seed per cell shows only one draw.
#
# How to read these numbers: amplification only becomes large once the shortcut is learned and
# the consistent examples' loss has collapsed. In a run that generalizes, the anti-shortcut loss
# then collapses too, and the ratio falls back. A few dozen epochs may not reach the paper's
# 9–17× regime. The full mode and the sweep are for the paper's values.
#
# ## 5. A shortcut head and a parity head
#
# Fingerprints summarise each head (see `interp.fingerprints`), with the readout position as the
# query:
#
# - `qk_rho`: Spearman ρ between a key's value and its attention score (near +1: the head
#   attends to the maximum, i.e. the shortcut circuit);
# - `pos0_mass`: attention to position 0 (the first-element shortcut);
# - `ov_parity_rho`: how strongly the head writes the parity of the token it attends to into the
#   logits (the parity circuit; at most ≈ 0.87 for two classes).
#
# From weights alone ("virtual" circuits through the embeddings) or from activations on a split.
# We take the 2L, r = 0.9 model, pick the head with the largest `qk_rho` as the shortcut head,
# and the head with the largest `ov_parity_rho` among the others as the parity head.

# %%
run = runs[(2, 0.9)]
model = run.model(device="cpu")  # last checkpoint, a plain HookedTransformer (the analysis runs on the CPU)
sp = run.splits
fp_w = weight_fingerprints(model, task.n_values, task.k)
fp_a = activation_fingerprints(model, sp["validation_tokens"][:512], task.k)
display(pd.DataFrame(fp_w.to_records() + fp_a.to_records()))

shortcut_head = max(fp_a, key=lambda r_: r_["qk_rho"])
parity_head = max((r_ for r_ in fp_a if r_ is not shortcut_head), key=lambda r_: r_["ov_parity_rho"])
print(
    f"shortcut head: {shortcut_head['head_name']} (qk_rho {shortcut_head['qk_rho']:.2f}); "
    f"parity head: {parity_head['head_name']} (ov_parity_rho {parity_head['ov_parity_rho']:.2f})"
)
if parity_head["ov_parity_rho"] <= 0:
    print(
        "No head writes the parity of the token it attends to (every ov_parity_rho <= 0), so the 'parity head' below is "
        "only the best of the rest. In this model the parity computation is not carried by one head's OV circuit."
    )

# %% [markdown]
# circuitsvis draws the attention pattern of the two heads. The bottom row is the `READ` query,
# which produces the answer. A max-shortcut head puts its attention on the largest value. Here
# `AttentionView` inlines circuitsvis's own JavaScript bundle (once per kernel) instead of loading
# it from a CDN, so the views render offline.


# %%
def two_head_patterns(tokens):
    _, cache = model.run_with_cache(tokens[None], names_filter=lambda n: n.endswith("hook_pattern"))
    return torch.stack([cache["pattern", h["layer"]][0, h["head"]] for h in (shortcut_head, parity_head)])


def two_head_view(tokens, title):
    names = [f"{shortcut_head['head_name']} (shortcut)", f"{parity_head['head_name']} (parity)"]
    return visual.AttentionView(two_head_patterns(tokens), visual.token_strings(tokens.tolist(), task.n_values), names, title)


views = []
for split in ("validation", "counterfactual"):
    tok = sp[f"{split}_tokens"][0]
    view = two_head_view(
        tok, f"{split} #0: {tok[:-1].tolist()}, label {int(sp[f'{split}_labels'][0])}, shortcut {int(sp[f'{split}_shortcut'][0])}"
    )
    views.append(view)
for view in views:
    display(view)

# %% [markdown]
# ## 6. Fingerprints over training, and cross-split patching
#
# `circuit_evolution` re-analyses the run's checkpoints (fingerprints from weights and
# activations, per-head mean ablation, per-head patching). The paper reads circuit
# reorganisation from this: the shortcut fingerprint forms first, and in capable 2L models a
# parity-encoding head forms later while the shortcut circuit is displaced.

# %%
evo = circuit_evolution(run, max_checkpoints=S["evo_checkpoints"], max_pairs=S["evo_pairs"], max_examples=S["evo_examples"])
head_rows = evo["head_rows"]
print(evo["note"])
for source in ("w", "a"):
    visual.fingerprint_evolution_figure(head_rows, source).show()
fig = visual.head_evolution_heatmap(head_rows, "patch_z", "per-head patching (validation → counterfactual) over training")
fig.show()

# %% [markdown]
# **Cross-split patching** on the final model. Each validation row (consistent) is paired with
# its counterfactual (anti-shortcut, one token changed). One activation at a time is copied from
# the source run into the receiver run. The cell shows the normalized logit difference of the
# counterfactual's true label against its shortcut class: 0 = no effect, 1 = the receiver now
# behaves like the source. `resid_pre` is a layer × position grid; `z_by_pos` splits it per head.
# The grids equal TransformerLens's `get_act_patch_*` functions (the test suite checks this), but
# are computed in one batched pass.

# %%
grids = cross_split_patching(
    model,
    sp["validation_tokens"],
    sp["counterfactual_tokens"],
    sp["counterfactual_labels"],
    sp["counterfactual_shortcut"],
    kinds=("resid_pre", "z_by_pos"),
    max_pairs=None,
)
a, b = sp["counterfactual_labels"], sp["counterfactual_shortcut"]
ld = {
    name: float(logit_diff(readout_logits(model, sp[f"{name}_tokens"]), a, b).double().mean())
    for name in ("validation", "counterfactual")
}
print(
    f"mean logit diff (label − shortcut class): validation run {ld['validation']:.3f}, counterfactual run {ld['counterfactual']:.3f}"
)
for by_kind in grids.values():
    for grid in by_kind.values():
        visual.patching_figure(grid).show()

# %% [markdown]
# ## 7. Scale up: the seed sweep, and what the paper reports
#
# The paper's claims are about **rates over seeds**: the fraction of seeds that reach 100 %
# adversarial accuracy. One seed per cell, as above, cannot test them. The sweep command trains
# every (layers, heads, r, seed) combination, one run directory each, plus a table:
#
# ```bash
# lenslab sweep --task mpsp --layers 1,2 --heads 1,2 --ratios 0.5,0.9 --seeds 0-31 --out runs/sweep
# ```
#
# Open any member with `Run.open(...)` exactly as above, or inspect it with
# `lenslab inspect runs/sweep/<member>`. To reproduce one cell of this notebook from the shell:
#
# ```bash
# lenslab train --task mpsp --ratio 0.9 --layers 2 --heads 2 --seq-len 4 --n-train 4000 --n-val 1000 --n-adv 1000 \
#     --epochs 40 --eval-every 5 --seed 0 --out runs/L2_r0.9
# lenslab inspect runs/L2_r0.9
# ```
#
# What the paper reports (15,000 epochs, AdamW, d_model 64, d_mlp 128):
#
# | model | r = 0.5 | r = 0.9 |
# |---|---|---|
# | 2L | 0 % of seeds generalize | 77 % |
# | 1L | 33 % | 0 % |
#
# It also reports 9–17× gradient amplification at r = 0.9, a gradient conflict that relaxes
# toward 0 only in generalizing 2L runs, and a shortcut circuit that forms first and is then
# displaced by a parity circuit in 2L models. Weight decay 0.4 instead of 0.1 gives more
# transient generalization.
#
# **Cost on a CPU.** One epoch of the paper's 2L model on 16,384 examples takes about 1.6 s on
# 2 cores (`docs/PROBES.md`), so 15,000 epochs is about 7 hours per seed. The 128-run
# sweep above is a job for a GPU or a cluster. Set `LENSLAB_TUTORIAL_MODE=full` to run this
# notebook at the paper's sizes (16,384 examples, 15,000 epochs) with 6 values from 0..11.
#
# **Where the paper's effect might live.** The task's open knobs decide the outcome more than r
# does. `lenslab sweep` maps them (`--seq-len`, `--n-values`, `--batch-size`, `--lr` take lists)
# and says how each failed run failed; `reproduction/regime_map.py` draws the map. On 2 CPU
# cores (REPRODUCTION.md item 1): with 5 values per sequence, or 6 values from 0..7, balanced data
# (r = 0.5) learns the rule at least as often as r = 0.9; with 6 values from 0..15 (0.1 % of all
# sequences in the train split) both memorize the split; 6 values from 0..11 sits between. No
# regime showed the paper's direction within a few hundred epochs.
#
# **What this quick run showed, and what it did not.** It showed the pipeline end to end: exact
# splits, four trained runs, per-split curves, gradient probes, the two head types, their
# evolution, and cross-split patching. The test suite checks each of them: the checks live in
# `tests/tutorials/checks.py`, and the test runs each one right after the cell it checks. The
# tables above give its numbers for one seed. With 4-value sequences the task is easier than the
# paper's. Whether a cell generalizes here is one sample, not a rate, and it says nothing
# about the paper's table either way.

# %% [markdown]
# The paper's rates next to this notebook's runs (one seed per cell):

# %%
paper = {(2, 0.5): "0 %", (2, 0.9): "77 %", (1, 0.5): "33 %", (1, 0.9): "0 %"}
side = pd.DataFrame(
    [
        {
            "layers": L,
            "r": r,
            "paper: seeds that generalize": paper[(L, r)],
            f"this notebook ({MODE}, seed {SEED}): generalized?": runs[(L, r)].summary["generalized"],
            "max adv acc": runs[(L, r)].summary["max_adv_acc"],
        }
        for (L, r) in runs
    ]
)
display(side)
