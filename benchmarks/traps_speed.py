"""Speed of trap detection: WeightWatcher 0.7.7 ``analyze(randomize=True)`` vs lenslab's modes.

Model: a randomly initialised GPT-2-small-shaped HookedTransformer (d_model 768, 12 heads × 64,
d_mlp 3072; ``--layers`` blocks; ``--d-vocab`` rows in W_E, default 8192 instead of 50257 to keep
the run short). Matrices: W_E and per layer W_Q, W_K, W_V, W_O (heads concatenated), W_in, W_out;
the unembedding is excluded. WeightWatcher gets the same 2-D matrices as ``nn.Linear`` weights and,
through a patched ``np.random.shuffle``, the same permutations as our ``weightwatcher`` mode, so
counts can be compared one to one. Its time includes the rest of ``analyze`` (the unshuffled ESD
and power-law fit), which it always runs. lenslab's weightwatcher mode is timed in one thread
pool of 1 (both torch threads) and of 2 workers with one torch thread each (what ``lenslab traps``
does with its default ``--workers 2``); WeightWatcher gets the default torch/numpy threads. Also scans the same matrices written as 2 safetensors
shards + index in a child process and reports that process's peak RSS.

    .venv/bin/python benchmarks/traps_speed.py --layers 1
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lenslab.interp.spectral import detect_traps, extract_matrices, make_generator, random_permutation
from lenslab.interp.spectral.traps import WW_POOL, WW_POOL_BELOW
from lenslab.training.presets import build_model


def gpt2_like(n_layers: int, d_vocab: int):
    cfg = {
        "n_layers": n_layers,
        "d_model": 768,
        "n_heads": 12,
        "d_head": 64,
        "d_mlp": 3072,
        "d_vocab": d_vocab,
        "d_vocab_out": d_vocab,
        "n_ctx": 64,
        "act_fn": "gelu",
        "normalization_type": "LN",
        "positional_embedding_type": "standard",
        "attn_only": False,
        "default_prepend_bos": False,
    }
    return build_model(cfg, seed=0)


def run_ww(mats: dict[str, torch.Tensor], perms: list[torch.Tensor]):
    import weightwatcher as ww

    logging.getLogger("weightwatcher").setLevel(logging.ERROR)
    layers = []
    for w in mats.values():
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        with torch.no_grad():
            lin.weight.copy_(w)
        layers.append(lin)
    model = torch.nn.Sequential(*layers)
    real = np.random.shuffle
    # per layer WW shuffles 1 or 5 times for the fitted ESD, then once more (its rand_distance column)
    seq, it = [], iter(perms)
    for w in mats.values():
        seq += [next(it) for _ in range(WW_POOL if min(w.shape) < WW_POOL_BELOW else 1)] + [None]
    pending = iter(seq)

    def ours_seq(x):
        p = next(pending, None)
        return real(x) if p is None else x.__setitem__(slice(None), x[p.numpy()])

    np.random.shuffle = ours_seq
    try:
        t = time.perf_counter()
        df = ww.WeightWatcher(model=model).analyze(randomize=True, plot=False)
        elapsed = time.perf_counter() - t
    finally:
        np.random.shuffle = real
    return df, elapsed


def shard_scan_peak(mats: dict[str, torch.Tensor]) -> dict:
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as d:
        names = list(mats)
        half = len(names) // 2
        wm = {}
        for i, part in enumerate((names[:half], names[half:])):
            fn = f"model-{i + 1:05d}-of-00002.safetensors"
            save_file({k: mats[k].contiguous() for k in part}, os.path.join(d, fn))
            wm.update({k: fn for k in part})
        Path(d, "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
        size = sum(p.stat().st_size for p in Path(d).glob("*.safetensors"))
        code = (
            f"import sys, time, resource; sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r}); from lenslab.interp.spectral import traps_command; t=time.perf_counter(); "
            f"r = traps_command({d!r}, progress=False, workers=2); print(time.perf_counter()-t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
        base = (
            f"import sys, resource; sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r}); import lenslab.interp.spectral; "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
        )
        imported = int(subprocess.run([sys.executable, "-c", base], capture_output=True, text=True, check=True).stdout.split()[0])
        return {
            "shard_bytes_mib": round(size / 2**20, 1),
            "scan_s": round(float(out[0]), 2),
            "peak_rss_mib": round(int(out[1]) / 1024, 1),
            "import_only_rss_mib": round(imported / 1024, 1),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--d-vocab", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-ww", action="store_true", help="only time lenslab's modes")
    args = ap.parse_args()

    model = gpt2_like(args.layers, args.d_vocab)
    mats = {k: v.detach().float().contiguous() for k, v in extract_matrices(model, include_unembed=False).matrices.items()}
    gen = make_generator(args.seed)
    per_mat = {
        k: [random_permutation(w.numel(), gen) for _ in range(WW_POOL if min(w.shape) < WW_POOL_BELOW else 1)]
        for k, w in mats.items()
    }

    t = time.perf_counter()
    ours = {k: detect_traps(w, k, mode="weightwatcher", perms=per_mat[k]) for k, w in mats.items()}
    t_ours = time.perf_counter() - t
    # the same mode over both cores, as `lenslab traps` runs it (threads, torch threads split between them)
    from concurrent.futures import ThreadPoolExecutor

    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads // 2))
    try:
        t = time.perf_counter()
        with ThreadPoolExecutor(max_workers=2) as pool:
            ours2 = dict(
                zip(mats, pool.map(lambda k: detect_traps(mats[k], k, mode="weightwatcher", perms=per_mat[k]), list(mats)))
            )
        t_ours2 = time.perf_counter() - t
    finally:
        torch.set_num_threads(threads)
    t = time.perf_counter()
    robust = {k: detect_traps(w, k, mode="robust", seed=args.seed) for k, w in mats.items()}
    t_robust = time.perf_counter() - t

    result = {
        "model": {"n_layers": args.layers, "d_model": 768, "d_mlp": 3072, "n_heads": 12, "d_vocab": args.d_vocab},
        "n_matrices": len(mats),
        "shapes": sorted({str(tuple(w.shape)) for w in mats.values()}),
        "torch_threads": torch.get_num_threads(),
        "lenslab_weightwatcher_mode_s": round(t_ours, 2),
        "lenslab_robust_mode_s": round(t_robust, 2),
        "lenslab_weightwatcher_mode_2_workers_s": round(t_ours2, 2),
        "two_workers_same_counts": [r.n_traps for r in ours2.values()] == [r.n_traps for r in ours.values()],
        "robust_traps": {k: r.n_traps for k, r in robust.items()},
    }
    if not args.skip_ww:
        df, t_ww = run_ww(mats, [p for ps in per_mat.values() for p in ps])
        ww_counts = [int(x) for x in df["rand_num_spikes"]]
        ours_counts = [r.n_traps for r in ours.values()]
        result.update(
            weightwatcher_analyze_s=round(t_ww, 2),
            speedup_vs_weightwatcher=round(t_ww / t_ours, 1),
            speedup_vs_weightwatcher_2_workers=round(t_ww / t_ours2, 1),
            counts_identical=ww_counts == ours_counts,
            per_matrix=[
                {"name": k, "ww": a, "lenslab": b, "ww_sigma": float(s), "lenslab_sigma": ours[k].sigma_normalized}
                for k, a, b, s in zip(mats, ww_counts, ours_counts, df["rand_sigma_mp"])
            ],
        )
    result["shard_scan"] = shard_scan_peak(mats)
    result["bench_peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
