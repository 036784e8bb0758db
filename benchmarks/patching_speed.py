"""Batched cross-split patching grids vs transformer_lens.patching (one forward per cell).

    python benchmarks/patching_speed.py [--pairs 256] [--repeats 5] [--threads 1]

The 2L 2-head paper model (d_model 64, d_mlp 128, seq_len 5, 16 values), freshly initialised
(speed does not depend on training), ``--pairs`` validation/counterfactual pairs. Both sides
run on the same inputs in the same process, interleaved, ``--repeats`` times; the JSON gives
best and median seconds, speed-ups of best over best and median over median, and the largest
absolute difference between each of our grids and TL's.

- ``grids``: one grid kind, one direction; TL's time includes its ``run_with_cache`` of the
  source, ours its one cached forward.
- ``one_direction_all_grids``: all five kinds (TL: one cache + five functions; ours: one call).
- ``both_directions_all_grids`` (the headline): all five kinds in both directions, i.e. what
  ``cross_split_patching`` returns (TL: two caches + ten functions; ours: one call).

``--threads`` sets torch's intra-op threads for both sides (default 1; 0 keeps torch's
default). On a shared 2-core machine one thread is the setting kind to TL: with two threads
under load its ~130 small forwards slow down far more than our few large ones.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # TL's per-cell progress bars would be timed too
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
warnings.filterwarnings("ignore")

import torch
from transformer_lens import patching as tlp

from lenslab.interp.patching import (
    DIRECTIONS,
    GRID_KINDS,
    cross_split_patching,
    logit_diff,
    normalized_logit_diff_metric,
    patch_grid,
    patch_grids,
)
from lenslab.tasks import MPSPTask, make_mpsp_splits
from lenslab.training.presets import build_model, mpsp_model_config

TL = {
    "resid_pre": tlp.get_act_patch_resid_pre,
    "attn_out": tlp.get_act_patch_attn_out,
    "mlp_out": tlp.get_act_patch_mlp_out,
    "z_by_pos": tlp.get_act_patch_attn_head_out_by_pos,
    "z_all_pos": tlp.get_act_patch_attn_head_out_all_pos,
}
assert tuple(TL) == GRID_KINDS


def timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def summary(t_tl: list[float], t_ours: list[float]) -> dict:
    best_tl, best_ours = min(t_tl), min(t_ours)
    med_tl, med_ours = statistics.median(t_tl), statistics.median(t_ours)
    return {
        "tl_s": {"best": round(best_tl, 4), "median": round(med_tl, 4)},
        "ours_s": {"best": round(best_ours, 4), "median": round(med_ours, 4)},
        "speedup_best": round(best_tl / best_ours, 1),
        "speedup_median": round(med_tl / med_ours, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    task = MPSPTask()
    model = build_model(mpsp_model_config(task, 2, 2), seed=0).eval()
    sp = make_mpsp_splits(task, 0.9, n_train=2048, n_val=args.pairs, n_adv=64, seed=0)
    val, cf = sp["validation_tokens"], sp["counterfactual_tokens"]
    a, b = sp["counterfactual_labels"], sp["counterfactual_shortcut"]
    runs = {"validation": val, "counterfactual": cf}
    ld = {k: logit_diff(model(t)[:, -1], a, b).mean().item() for k, t in runs.items()}

    def tl_grids(direction: str, kinds=GRID_KINDS) -> dict:
        s, r = direction.split("->")
        _, cache = model.run_with_cache(runs[s])
        metric = normalized_logit_diff_metric(a, b, ld[r], ld[s])
        return {kind: TL[kind](model, runs[r], cache, metric) for kind in kinds}

    cross_split_patching(model, val, cf, a, b, max_pairs=None)  # warm-up
    out = {
        "model": "2L 2-head d_model 64 d_mlp 128 (seq_len 5, 16 values), fresh init",
        "pairs": args.pairs,
        "repeats": args.repeats,
        "torch_threads": torch.get_num_threads(),
        "load_average_1min_at_start": round(os.getloadavg()[0], 2),
        "grids": {},
    }
    d0 = DIRECTIONS[0]
    for kind in GRID_KINDS:
        t_tl, t_ours = [], []
        for _ in range(args.repeats):
            t, ref = timed(lambda kind=kind: tl_grids(d0, (kind,))[kind])
            t_tl.append(t)
            t, ours = timed(lambda kind=kind: patch_grid(model, val, cf, a, b, kind))
            t_ours.append(t)
        out["grids"][kind] = {
            "cells": int(ref.numel()),
            **summary(t_tl, t_ours),
            "max_abs_diff": float((ours.values - ref).abs().max()),
        }
    t_tl, t_ours = [], []
    for _ in range(args.repeats):
        t_tl.append(timed(lambda: tl_grids(d0))[0])
        t_ours.append(timed(lambda: patch_grids(model, val, cf, a, b))[0])
    out["one_direction_all_grids"] = summary(t_tl, t_ours)
    t_tl, t_ours, diff = [], [], 0.0
    for _ in range(args.repeats):
        t, ref = timed(lambda: {d: tl_grids(d) for d in DIRECTIONS})
        t_tl.append(t)
        t, ours = timed(lambda: cross_split_patching(model, val, cf, a, b, max_pairs=None))
        t_ours.append(t)
        diff = max(diff, max(float((ours[d][k].values - ref[d][k]).abs().max()) for d in DIRECTIONS for k in GRID_KINDS))
    out["both_directions_all_grids"] = {
        "cells": 2 * sum(int(v.numel()) for v in ref[d0].values()),
        **summary(t_tl, t_ours),
        "max_abs_diff": diff,
    }
    out["load_average_1min_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
