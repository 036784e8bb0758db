# %% [markdown]
# # Tutorial 2: correlation traps in long-horizon grokking
#
# Paper 2 (Prakash & Martin, "Detecting overfitting in neural networks during long-horizon
# grokking using random matrix theory") asks whether the weights alone, with no data, can show
# that a model has started to overfit. A model that *grokked* modular addition can, after much
# longer training without weight decay, lose test accuracy while train accuracy stays at 100 %
# ("anti-grokking"). The paper's detector is the **correlation trap**:
#
# 1. shuffle all entries of a weight matrix W (one permutation of the whole matrix);
# 2. take the eigenvalues of X = W_randᵀ W_rand / N;
# 3. fit the Marchenko–Pastur (MP) law to them;
# 4. count eigenvalues above the MP bulk edge plus a Tracy–Widom allowance: those are traps.
#
# Shuffling destroys every correlation *between* entries, so what survives as an outlier comes
# from a few huge entries (localized mass). The paper reports 0 traps per matrix before and at
# grokking, and 3–7 per matrix in the anti-grokked model (test accuracy 0.68).
#
# This notebook:
#
# 1. trains the modular-addition model until it groks;
# 2. keeps training from the grokked weights with weight decay 0, looking for anti-grokking;
# 3. tracks trap counts per matrix against train/test accuracy;
# 4. shows one ESD with its MP fit;
# 5. runs the trap-replacement JSD ablation with its null;
# 6. compares with weight decay 0.01.
#
# **What a quick run can and cannot show.** Quick mode uses p = 31 with 80 % of the pairs for
# training and a learning rate of 3e-3, a size that groks in a few hundred epochs on a CPU. With
# the usual 1e-3 the same model had reached only 0.82 test accuracy by epoch 350, against 0.96
# with 3e-3. It then continues for a few hundred epochs. The paper's anti-grokking needs orders
# of magnitude longer training (its MNIST model ran 10⁷ steps). So a dip in test accuracy here is
# not anti-grokking in the paper's sense, and a handful of traps just above the threshold is not
# the paper's 3–7 per matrix. An earlier probe on this CPU (p = 59, 23,500 epochs from scratch at
# weight decay 0, a simpler counter) found no traps and no grokking. The tables below show what
# this run found. Section 5 also runs the ablation on a copy of the model with planted traps,
# for a reference case with unmistakable traps. Full mode uses the paper's p = 113 and a long
# continuation; that run is for a GPU or a long night.

# %%
import os

MODE = os.environ.get("LENSLAB_TUTORIAL_MODE", "quick")  # "quick" (CI, minutes on a CPU) or "full" (paper scale)

SETTINGS = {
    # groks in a few hundred epochs on a CPU (lr 3e-3 instead of the usual 1e-3, 80 % of the pairs)
    "quick": {"p": 31, "train_frac": 0.8, "lr": 3e-3, "grok_epochs": 600, "eval_every": 25, "continue_epochs": 300, "record_every": 50},
    # the paper's model size and the standard grokking recipe, then a long continuation
    "full": {"p": 113, "train_frac": 0.3, "lr": 1e-3, "grok_epochs": 25_000, "eval_every": 100, "continue_epochs": 200_000,
             "record_every": 2_000},
}
if MODE not in SETTINGS:
    raise ValueError(f"LENSLAB_TUTORIAL_MODE={MODE!r}: use 'quick' or 'full'")
S = SETTINGS[MODE]
WEIGHT_DECAYS = (0.0, 0.01)  # for the continuation; the grokking run uses the recipe's 1.0
print(MODE, S)

# %%
import copy
import math
import time
import warnings
from pathlib import Path

import pandas as pd
import plotly.io as pio
import torch
from IPython.display import display

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm.auto without ipywidgets; we pass progress=False anyway

from lenslab.interp import visual
from lenslab.interp.common import readout_logits
from lenslab.interp.spectral import detect_traps, esd_figure, extract_matrices, trap_count_figure, trap_counts_over_run, trap_jsd
from lenslab.training.config import modadd_run_config, with_init
from lenslab.training.run import Run
from lenslab.training.trainer import train

# The figure as JSON, drawn by the plotly extension that ships in the plotly wheel (JupyterLab,
# Notebook 7, VS Code): nothing is fetched. plotly's "notebook" renderer would load MathJax from a CDN.
pio.renderers.default = "plotly_mimetype"
RUNS = Path("runs") / "tutorial02" / MODE
MATRICES = ["embed.W_E", "blocks.0.attn.W_Q", "blocks.0.attn.W_K", "blocks.0.attn.W_V", "blocks.0.attn.W_O",
            "blocks.0.mlp.W_in", "blocks.0.mlp.W_out", "unembed.W_U"]  # the paper's eight (W_pos excluded)

# %% [markdown]
# ## 1. Grok modular addition
#
# Tokens `a b =`, label `(a + b) mod p`. The model is TransformerLens's grokking model: 1 layer,
# d_model 128, 4 heads, d_mlp 512, no LayerNorm. It is trained full batch with AdamW
# (weight decay 1.0, betas 0.9/0.98). `train` writes a run directory with checkpoints; re-running
# the cell resumes the finished run instead of training again.

# %%
t0 = time.time()
cfg = modadd_run_config(p=S["p"], train_frac=S["train_frac"], lr=S["lr"], weight_decay=1.0,
                        epochs=S["grok_epochs"], eval_every=S["eval_every"], seed=0)
out = RUNS / "grok"
train(cfg, out, resume=(out / "config.json").is_file(), progress=False)
grok = Run.open(out)
m = grok.metrics
print(f"trained {S['grok_epochs']} epochs in {time.time() - t0:.0f} s")

n_pairs = S["p"] ** 2
assert len(grok.splits["train_labels"]) == round(S["train_frac"] * n_pairs) and len(grok.splits["test_labels"]) == n_pairs - round(S["train_frac"] * n_pairs)
assert [r["epoch"] for r in m] == list(range(0, S["grok_epochs"] + 1, S["eval_every"]))
tok, lab = grok.splits["test_tokens"], grok.splits["test_labels"]
assert torch.equal(lab, (tok[:, 0] + tok[:, 1]) % S["p"])  # the rule, recomputed here

memorized = next(r["epoch"] for r in m if r["train_acc"] == 1.0)
grokked = next((r["epoch"] for r in m if r["test_acc"] >= 0.95), None)
print(f"train accuracy 1.0 from epoch {memorized}; test accuracy ≥ 0.95 from epoch {grokked}; "
      f"final train {m[-1]['train_acc']:.3f}, test {m[-1]['test_acc']:.3f}")
# this notebook's claim: the model memorises first and generalizes later, and ends grokked
assert grokked is not None and grokked > memorized and m[-1]["train_acc"] == 1.0 and m[-1]["test_acc"] >= 0.95

fig = visual.lines(m, "epoch", ["train_acc", "test_acc"], f"p = {S['p']}: grokking (weight decay 1.0)", "accuracy",
                   vlines={"train = 1": memorized, "test ≥ 0.95": grokked})
assert [len(t.x) for t in fig.data] == [len(m), len(m)]
fig.show()

# %% [markdown]
# ## 2. Trap counts through grokking
#
# `trap_counts_over_run` scans every checkpoint of the run. For each of the eight matrices it
# shuffles the entries once (seeded), fits the MP law to the bulk only (the robust mode), and
# counts the eigenvalues above the threshold. The rows carry the accuracies logged at the same
# epoch. The paper predicts 0 traps in every matrix before and at grokking.

# %%
rows_grok = trap_counts_over_run(grok.path)
df = pd.DataFrame(rows_grok.to_records())
assert len(df) == len(grok.epochs()) * len(MATRICES)
assert all(sorted(g.matrix) == sorted(MATRICES) for _, g in df.groupby("epoch"))
assert df.error.isna().all()
assert all(isinstance(n, int) and n >= 0 for n in rows_grok.column("n_traps"))
display(df.pivot(index="epoch", columns="matrix", values="n_traps")[MATRICES])
first_trap = {k: int(g.epoch[g.n_traps > 0].min()) for k, g in df.groupby("matrix") if (g.n_traps > 0).any()}
print(f"first checkpoint with a trap, per matrix: {first_trap or 'none'} (test accuracy ≥ 0.95 from epoch {grokked})")

fig = trap_count_figure(rows_grok.to_records(), grok.metrics, title=f"p = {S['p']}: traps while grokking")
assert len(fig.data) == 2 + 2 * len(MATRICES)  # train/test accuracy, traps per matrix, HTSR alpha per matrix
fig.show()

# %% [markdown]
# ## 3. Keep training with weight decay 0 (and, for comparison, 0.01)
#
# Anti-grokking is reported after long training *without* weight decay. `with_init(config, run)`
# (on the command line: `lenslab train --init-from RUN`) makes a new run that starts from the
# run's last checkpoint instead of a fresh init, with a fresh optimizer. Here it keeps the lr,
# betas and full batch of the grokking run and changes only the weight decay. A fresh AdamW has
# no moment estimates yet, so its first steps are large: a dip right after the switch can come
# from that rather than from overfitting. Every `record_every` epochs the run evaluates and keeps a
# checkpoint, and `trap_counts_over_run` counts the traps of each matrix in each checkpoint (the
# same analysis as above). The new run's epoch 0 is the grokked model; we shift its epochs by
# the grokking run's length to draw one history.

# %%
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the continuation's device; the analysis runs on the CPU


def accuracy(model, tokens, labels):
    return float((readout_logits(model, tokens.to(model.cfg.device)).argmax(-1).cpu() == labels).double().mean())


def weight_norm(model):
    return float(sum((w.double() ** 2).sum() for w in extract_matrices(model).matrices.values()).sqrt())


def continue_training(weight_decay):
    n_records = S["continue_epochs"] // S["record_every"]
    cfg = modadd_run_config(p=S["p"], train_frac=S["train_frac"], lr=S["lr"], weight_decay=weight_decay, epochs=S["continue_epochs"],
                            eval_every=S["record_every"], ckpt_density=n_records + 1, seed=0)  # a checkpoint at every record
    out = RUNS / f"continue_wd{weight_decay:g}"
    train(with_init(cfg, grok.path), out, resume=(out / "config.json").is_file(), progress=False, device=DEVICE)
    run = Run.open(out)
    shift = S["grok_epochs"]
    norms = {e: weight_norm(model) for e, model in run.iter_models()}
    metrics = [{"epoch": shift + r["epoch"], "train_acc": r["train_acc"], "test_acc": r["test_acc"], "weight_norm": norms[r["epoch"]]}
               for r in run.metrics]
    traps = [{**r, "epoch": shift + r["epoch"]} for r in trap_counts_over_run(out).to_records()]
    return run.model(), metrics, traps


t0 = time.time()
cont = {}
for wd in WEIGHT_DECAYS:
    cont[wd] = continue_training(wd)
    print(f"weight decay {wd}: {S['continue_epochs']} more epochs in {time.time() - t0:.0f} s")

n_records = S["continue_epochs"] // S["record_every"] + 1
for wd, (model_wd, metrics_wd, traps_wd) in cont.items():
    assert len(metrics_wd) == n_records and len(traps_wd) == n_records * len(MATRICES)
    assert math.isclose(metrics_wd[0]["test_acc"], accuracy(grok.model(), grok.splits["test_tokens"], grok.splits["test_labels"]), abs_tol=1e-6)
    assert math.isclose(metrics_wd[0]["test_acc"], m[-1]["test_acc"], abs_tol=1e-6)  # picks up where the run ended
    assert all(isinstance(t["n_traps"], int) and t["n_traps"] >= 0 and t["error"] is None for t in traps_wd)

# %% [markdown]
# The whole history at weight decay 0: the grokking run, then the continuation (after the dashed
# line). The paper's anti-grokking would show as test accuracy falling while traps appear.

# %%
model0, metrics0, traps0 = cont[0.0]
def after(rows):  # the continuation's first record is the run's last one: drop it
    return [r for r in rows if r["epoch"] > S["grok_epochs"]]


fig = trap_count_figure(rows_grok.to_records() + after(traps0), grok.metrics + after(metrics0),
                        title=f"p = {S['p']}: grokking (wd 1.0), then weight decay 0")
fig.add_vline(x=S["grok_epochs"], line_dash="dash")
assert len(fig.data) == 2 + 2 * len(MATRICES)
fig.show()
display(pd.DataFrame(traps0).pivot(index="epoch", columns="matrix", values="n_traps")[MATRICES])
print(f"test accuracy at weight decay 0: {metrics0[0]['test_acc']:.3f} -> {metrics0[-1]['test_acc']:.3f} "
      f"(min {min(r['test_acc'] for r in metrics0):.3f}); traps at the end: {sum(t['n_traps'] for t in traps0 if t['epoch'] == metrics0[-1]['epoch'])}")

# %% [markdown]
# ## 4. One ESD and its MP fit
#
# The histogram is the spectrum of the *shuffled* matrix. The curve is the MP density with the
# σ fitted to the bulk, the dotted line is the bulk edge λ₊, and the dashed red line is the trap
# threshold (λ₊ plus the Tracy–Widom allowance). We show the matrix with the most traps at the
# end of the weight-decay-0 continuation (`W_in` when none has any).

# %%
last = metrics0[-1]["epoch"]
final_counts = {t["matrix"]: t["n_traps"] for t in traps0 if t["epoch"] == last}
name = max(MATRICES, key=lambda k: (final_counts[k], k == "blocks.0.mlp.W_in"))
W = extract_matrices(model0).matrices[name]
row = detect_traps(W, name)
fig = esd_figure(W, name)
assert len(fig.data[0].x) == min(W.shape)  # one eigenvalue per column of the (N ≥ M) shuffled matrix
assert row.n_traps == final_counts[name] and row.threshold > row.lambda_plus > 0
assert row.n_traps == int((torch.tensor(fig.data[0].x) > row.threshold).sum())  # the histogram shows what was counted
print(f"{name}: N={row.N}, M={row.M}, σ={row.sigma:.4g}, λ₊={row.lambda_plus:.4g}, threshold={row.threshold:.4g}, "
      f"largest eigenvalue {row.lambda_max:.4g}, traps {row.n_traps}")
fig.show()

# %% [markdown]
# ## 5. Trap-replacement JSD ablation
#
# Are the traps harmful or benign? For each trap, `trap_jsd` takes its rank-1 component in the
# shuffled matrix and maps it back through the inverse permutation. It subtracts that component
# from W, adds Gaussian noise matched to the component's mean and std, and measures how far the
# output distribution moves: J = mean Jensen–Shannon divergence between the softmax outputs on
# random token sequences (in nats, at most ln 2). The **null** repeats the same recipe with a
# random rank-1 component of the same size. A trap is called harmful when J exceeds the null's
# 95th percentile. With `split=` it also reports the test accuracy after the replacement.

# %%
test_split = (grok.splits["test_tokens"], grok.splits["test_labels"])
base_acc = accuracy(model0, *test_split)
jsd_found = trap_jsd(model0, split=test_split, n_null=20)
print(f"traps found in the weight-decay-0 model: {len(jsd_found)}")


def check_jsd(rows, model):
    acc = accuracy(model, *test_split)
    for r in rows:
        assert 0.0 <= r.jsd <= math.log(2) + 1e-9 and 0.0 <= r.null_mean <= math.log(2) + 1e-9
        assert math.isfinite(r.null_p95)  # the null's 95th percentile is reported
        assert r.harmful == (r.jsd > r.null_p95)
        assert math.isclose(r.accuracy - acc, r.accuracy_change, abs_tol=1e-9)


check_jsd(jsd_found, model0)
if jsd_found:
    display(pd.DataFrame([r.to_record() for r in jsd_found]))

# %% [markdown]
# Traps in a model trained this briefly are few and sit just above the threshold (or are absent,
# and then there is nothing to ablate). For a reference case, we plant traps in a **copy** of the
# model: three
# entries of `W_in` set to 30, −25 and 20 times its entry std. A few huge entries are exactly
# the localized structure that shuffling cannot destroy. We then run the same ablation on that
# matrix. These traps are artificial, and the numbers below describe them, not anything the
# training produced.

# %%
planted = copy.deepcopy(model0)
with torch.no_grad():
    w_in = planted.blocks[0].mlp.W_in
    std = float(w_in.std())
    w_in.view(-1)[torch.tensor([11, 5_000, 40_000])] = torch.tensor([30.0, -25.0, 20.0]) * std
planted_row = detect_traps(extract_matrices(planted).matrices["blocks.0.mlp.W_in"], "blocks.0.mlp.W_in")
jsd_planted = trap_jsd(planted, split=test_split, n_null=20, matrices=["blocks.0.mlp.W_in"])
check_jsd(jsd_planted, planted)
assert len(jsd_planted) == planted_row.n_traps >= 1
display(pd.DataFrame([r.to_record() for r in jsd_planted]))
print(f"test accuracy with the planted entries: {accuracy(planted, *test_split):.3f} (unplanted {base_acc:.3f})")
fig = esd_figure(extract_matrices(planted).matrices["blocks.0.mlp.W_in"], "blocks.0.mlp.W_in with 3 planted entries")
assert int((torch.tensor(fig.data[0].x) > planted_row.threshold).sum()) == planted_row.n_traps
fig.show()

# %% [markdown]
# ## 6. Weight decay 0 against 0.01
#
# The paper reports that weight decay 0.01 suppresses trap growth. The table compares the two
# continuations at their last record. The weight norm is shown because the paper's controls
# say trap counts are not a proxy for it.

# %%
compare = []
for wd, (model_wd, metrics_wd, traps_wd) in cont.items():
    end = [t for t in traps_wd if t["epoch"] == metrics_wd[-1]["epoch"]]
    compare.append({"weight decay": wd, "epochs after grokking": S["continue_epochs"], "final train acc": metrics_wd[-1]["train_acc"],
                    "final test acc": metrics_wd[-1]["test_acc"], "min test acc": min(r["test_acc"] for r in metrics_wd),
                    "traps (all matrices)": sum(t["n_traps"] for t in end), "max traps in one matrix": max(t["n_traps"] for t in end),
                    "weight norm start": metrics_wd[0]["weight_norm"], "weight norm end": metrics_wd[-1]["weight_norm"]})
    assert len(end) == len(MATRICES)
display(pd.DataFrame(compare))
assert compare[0]["weight norm start"] == compare[1]["weight norm start"]  # both start from the same grokked weights

fig = visual.lines([{"epoch": r["epoch"], f"test_acc wd={wd}": r["test_acc"]} for wd, (_, mw, _) in cont.items() for r in mw],
                   "epoch", [f"test_acc wd={wd}" for wd in WEIGHT_DECAYS], "test accuracy after grokking", "accuracy")
assert [len(t.x) for t in fig.data] == [n_records] * len(WEIGHT_DECAYS)
fig.show()

# %% [markdown]
# ## What this run showed, and what it did not
#
# - It showed the pipeline: a model that memorises and then groks, trap counts per matrix at
#   every checkpoint next to the accuracies, an ESD with its MP fit and threshold, and the JSD
#   ablation with its null. The assertions in each cell check the shapes, ranges and definitions
#   behind what is shown.
# - Which matrices have traps, from which epoch, and how the test accuracy moves are printed
#   above for this run. A few hundred epochs without weight decay is far from the paper's
#   anti-grokking regime, so these numbers do not test its claims. A trap in the grokked model
#   would, taken at face value, disagree with the paper's "0 traps at grokking". At this size
#   (p = 31, one seed, one shuffle per matrix) it is one observation, not a contradiction. The
#   planted traps in section 5 are a reference for the ablation, not a property of trained
#   models.
# - The paper's numbers for modular addition (p = 113): train/test accuracy 1.0/0.40 before
#   grokking, 1.0/0.97 grokked, and 1.0/0.68 anti-grokked, with traps per matrix in the
#   anti-grokked model of embed 7, W_Q 3, W_K 5, W_V 3, W_O 4, MLP-in 5, MLP-out 7 and unembed 5,
#   and 0 in every matrix before.
#
# Full mode (`LENSLAB_TUTORIAL_MODE=full`) uses p = 113 with 30 % of the pairs, 25,000 epochs of
# grokking and then 200,000 epochs at weight decay 0. The paper does not say how long its
# anti-grokking run was, so that length is a guess. At about 150 ms per epoch on 2 CPU cores,
# this is more than 8 hours; on a GPU it is much shorter. The same analysis from the shell:
#
# ```bash
# lenslab train --task modadd --p 113 --train-frac 0.3 --epochs 25000 --out runs/ma113
# lenslab traps runs/ma113 --mode robust          # traps per matrix at every checkpoint
# lenslab traps runs/ma113/checkpoints/25000.safetensors --jsd   # plus the JSD ablation
# lenslab traps runs/ma113 --mode weightwatcher   # WeightWatcher 0.7.7's rules, for comparison
# ```
