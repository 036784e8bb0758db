"""lenslab vs WeightWatcher 0.7.7 on one checkpoint of the MNIST MLP (issue 23; REPRODUCTION 8).

WeightWatcher is not a lenslab dependency; this script runs where it is importable, e.g.

    .venv/bin/pip install --target /tmp/wwpkgs --no-deps weightwatcher==0.7.7 powerlaw==2.0.0 matplotlib==3.11.2 \\
        scikit-learn==1.9.1 joblib==1.6.0 threadpoolctl==3.8.0 contourpy==1.3.3 cycler==0.12.1 fonttools==4.69.1 \\
        kiwisolver==1.5.1 pillow==13.0.0 pyparsing==3.3.3 cloudpickle==3.1.3
    PYTHONPATH=/tmp/wwpkgs .venv/bin/python reproduction/mnist_ww_compare.py ~/lenslab-runs/mnist/wd0-s1 \\
        reproduction/results/mnist/ww_compare-wd0-s1.json [--epoch E]

The checkpoint's three matrices go into an ``nn.Sequential`` of ``nn.Linear`` (weight = Wᵀ: the same
function), and ``WeightWatcher(model=seq).analyze(randomize=True)`` runs on it. Its shuffles come
from NumPy's global RNG, seeded here with 0..4 (this script's own process); lenslab's
``weightwatcher`` mode and its ``robust`` default use their own seeded permutations 0..4. So α must
agree to rounding (it does not depend on a shuffle), and the trap counts are compared as spreads
over five shuffles each. (``tests/interp/spectral/test_mlp_spectral.py`` feeds both the same
permutations, where the counts agree exactly.)
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SEEDS = (0, 1, 2, 3, 4)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--epoch", type=int, default=None, help="default: the run's last checkpoint")
    a = ap.parse_args()
    try:
        import weightwatcher as ww
    except ImportError:
        sys.exit("mnist_ww_compare: error: weightwatcher is not importable; see this script's docstring for the install")
    import numpy as np
    import torch

    from lenslab.interp.spectral import detect_traps, extract_matrices, htsr_alpha
    from lenslab.training.run import Run

    logging.getLogger("weightwatcher").setLevel(logging.ERROR)
    run = Run.open(a.run)
    epoch = a.epoch if a.epoch is not None else run.epochs()[-1]
    model = run.model(epoch)
    mods = []
    for i, layer in enumerate(model.layers):
        lin = torch.nn.Linear(*layer.W.shape, dtype=layer.W.dtype)
        with torch.no_grad():
            lin.weight.copy_(layer.W.T)
            lin.bias.copy_(layer.b)
        mods += [lin] + ([torch.nn.ReLU()] if i < len(model.layers) - 1 else [])
    seq = torch.nn.Sequential(*mods)
    ww_rows = {}
    for s in SEEDS:
        np.random.seed(s)
        df = ww.WeightWatcher(model=seq).analyze(randomize=True, plot=False)
        ww_rows[s] = df
    mats = extract_matrices(model).matrices
    out = {"run": str(a.run), "epoch": epoch, "weightwatcher": ww.__version__, "matrices": {}}
    for k, name in enumerate(mats):
        w = mats[name]
        ref = ww_rows[0].iloc[k]
        ours = htsr_alpha(w, name, min_tail=2)
        out["matrices"][name] = {
            "shape": list(w.shape),
            "alpha_ww": float(ref["alpha"]),
            "alpha_lenslab": ours.alpha,
            "alpha_rel_diff": abs(ours.alpha - float(ref["alpha"])) / abs(float(ref["alpha"])),
            "traps_ww_rand_num_spikes": [int(ww_rows[s].iloc[k]["rand_num_spikes"]) for s in SEEDS],
            "traps_lenslab_weightwatcher_mode": [detect_traps(w, name, mode="weightwatcher", seed=s).n_traps for s in SEEDS],
            "traps_lenslab_robust": [detect_traps(w, name, mode="robust", seed=s).n_traps for s in SEEDS],
        }
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
