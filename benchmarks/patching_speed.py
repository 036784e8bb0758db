"""Batched cross-split patching grids vs transformer_lens.patching (one forward per cell).

    python benchmarks/patching_speed.py [--pairs 256] [--repeats 3]

The 2L 2-head paper model (d_model 64, d_mlp 128, seq_len 5, 16 values), freshly initialised
(speed does not depend on training), 256 validation/counterfactual pairs. For every grid kind
both implementations run on the same inputs, interleaved, best of ``repeats``; prints JSON with
seconds, speed-ups and the largest absolute difference between the two grids.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
warnings.filterwarnings("ignore")

import torch
from transformer_lens import patching as tlp

from interp.patching import cross_split_patching, logit_diff, normalized_logit_diff_metric, patch_grid, patch_grids
from tasks import MPSPTask, make_mpsp_splits
from training.presets import build_model, mpsp_model_config

TL = {
    "resid_pre": tlp.get_act_patch_resid_pre,
    "attn_out": tlp.get_act_patch_attn_out,
    "mlp_out": tlp.get_act_patch_mlp_out,
    "z_by_pos": tlp.get_act_patch_attn_head_out_by_pos,
    "z_all_pos": tlp.get_act_patch_attn_head_out_all_pos,
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    task = MPSPTask()
    model = build_model(mpsp_model_config(task, 2, 2), seed=0).eval()
    sp = make_mpsp_splits(task, 0.9, n_train=2048, n_val=args.pairs, n_adv=64, seed=0)
    src, rec = sp["validation_tokens"], sp["counterfactual_tokens"]
    a, b = sp["counterfactual_labels"], sp["counterfactual_shortcut"]
    ld_src = logit_diff(model(src)[:, -1], a, b).mean().item()
    ld_rec = logit_diff(model(rec)[:, -1], a, b).mean().item()
    metric = normalized_logit_diff_metric(a, b, ld_rec, ld_src)
    out = {"model": "2L 2-head d_model 64 (seq_len 5, 16 values)", "pairs": args.pairs, "torch_threads": torch.get_num_threads(), "grids": {}}
    tot_tl = tot_ours = 0.0
    for kind, fn in TL.items():
        t_tl, t_ours = [], []
        for _ in range(args.repeats):
            t = time.perf_counter()
            _, cache = model.run_with_cache(src)
            ref = fn(model, rec, cache, metric)
            t_tl.append(time.perf_counter() - t)
            t = time.perf_counter()
            ours = patch_grid(model, src, rec, a, b, kind)
            t_ours.append(time.perf_counter() - t)
        tt, to = min(t_tl), min(t_ours)
        tot_tl, tot_ours = tot_tl + tt, tot_ours + to
        out["grids"][kind] = {
            "cells": int(ref.numel()),
            "tl_s": round(tt, 4),
            "ours_s": round(to, 4),
            "speedup": round(tt / to, 1),
            "max_abs_diff": float((ours.values - ref).abs().max()),
        }
    out["sum_of_single_grids"] = {"tl_s": round(tot_tl, 4), "ours_s": round(tot_ours, 4), "speedup": round(tot_tl / tot_ours, 1)}
    # the way interp uses it: all five grids from one pair of caches, and both directions
    t_all, t_both, t_tl_both = [], [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        patch_grids(model, src, rec, a, b)
        t_all.append(time.perf_counter() - t)
        t = time.perf_counter()
        cross_split_patching(model, src, rec, a, b, max_pairs=None)
        t_both.append(time.perf_counter() - t)
        t = time.perf_counter()
        for s_tok, r_tok in ((src, rec), (rec, src)):
            _, cache = model.run_with_cache(s_tok)
            m = normalized_logit_diff_metric(a, b, 0.0, 1.0)
            for fn in TL.values():
                fn(model, r_tok, cache, m)
        t_tl_both.append(time.perf_counter() - t)
    out["all_grids_one_call"] = {"tl_s": round(tot_tl, 4), "ours_s": round(min(t_all), 4), "speedup": round(tot_tl / min(t_all), 1)}
    out["both_directions_all_grids"] = {"tl_s": round(min(t_tl_both), 4), "ours_s": round(min(t_both), 4), "speedup": round(min(t_tl_both) / min(t_both), 1)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
