# %% [markdown]
# # A first look at a run
#
# Issue 27's trial as a notebook: open a run, then each analysis takes the run (or the model it
# returns) and nothing is built by hand. `tests/interp/test_first_look_notebook.py` executes it on
# a test run, counts its lines of user code (at most 25) and renders it with nbconvert.

# %%
import os

from lenslab.interp.ablation import all_head_ablations, evaluate_ablations
from lenslab.interp.fingerprints import weight_fingerprints
from lenslab.interp.patching import cross_split_patching
from lenslab.interp.spectral import alpha_table, trap_counts_over_run
from lenslab.interp.visual import accuracy_figure, attention_view, patching_figure, use_notebook_renderer
from lenslab.training.run import Run

use_notebook_renderer()  # figures draw in JupyterLab, VS Code and nbconvert's HTML alike
run = Run.open(os.environ.get("LENSLAB_RUN", "runs/demo"))
run

# %%
accuracy_figure(run.metrics)

# %%
model = run.model()
evaluate_ablations(model, all_head_ablations(model), run)

# %%
patching_figure(cross_split_patching(run)["validation->counterfactual"]["z_by_pos"])

# %%
weight_fingerprints(model)

# %%
attention_view(model, run.split("validation").tokens[0])

# %%
trap_counts_over_run(run, workers=1)

# %%
alpha_table(run)
