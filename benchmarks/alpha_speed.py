"""Speed and agreement of HTSR α: WeightWatcher 0.7.7 ``analyze()`` (its defaults) vs ``interp.spectral.htsr_alpha``.

Model: GPT-2-small shapes as ``nn.Linear`` layers WeightWatcher can see (``--layers`` blocks of
c_attn 768→2304, attn c_proj 768→768, c_fc 768→3072, mlp c_proj 3072→768; weights N(0, 1/fan_in),
seeded). WeightWatcher's time is its whole default ``analyze()`` (SVD, power-law fit and the rest of
its columns); lenslab's is ``htsr_alpha`` on every matrix, one after the other (torch's default
threads), and over a thread pool of 2 workers with one torch thread each (as ``lenslab traps`` runs
its tasks). Both get the same float32 weights. On a shared 2-core machine run it with
``OMP_NUM_THREADS=1`` (two spinning threads per process on busy cores slow both sides erratically). WeightWatcher is optional (``--skip-ww``); it needs
``pip install 'lenslab[ww]'`` in a separate venv (see the PR notes), e.g.

    OMP_NUM_THREADS=1 PYTHONPATH=. ~/ww-venv/bin/python benchmarks/alpha_speed.py > benchmarks/results_alpha_speed.json

Where the time goes, one thread, one 3072×768 float64 matrix (measured on the loaded machine):
WeightWatcher's ``scipy.linalg.svd`` 0.26 s of its ≈ 0.37 s; ours: WᵀW 0.10 s, ``eigvalsh`` 0.06 s, the
fit 0.015 s. Any full-spectrum float64 method pays the O(M³) ``eigvalsh``, so on this CPU the ratio
stays near 2–3× (float32 WᵀW and ``eigvalsh`` took 0.057 s and 0.030 s: still < 5×).

The ``floor`` entry makes that bound a measurement. Every exact route to all eigenvalues of WᵀW
costs at least the Gram matrix WᵀW itself (2·N·M² flops of BLAS-3, the cheapest step of any
eigen- or singular-value method); ``floor_gram_float32_s`` times just that, in float32, for every
matrix (best of 3), and ``max_speedup_of_any_gram_method`` = WeightWatcher's time / that floor is
the most any such method could gain here, with a free eigen-solve and a free fit.
``weightwatcher_svd_s`` is WeightWatcher's own ``scipy.linalg.svd(W, compute_uv=False)`` in
float64, the part of ``analyze()`` that is not bookkeeping.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lenslab.interp.spectral import htsr_alpha

SHAPES = {"attn.c_attn": (768, 2304), "attn.c_proj": (768, 768), "mlp.c_fc": (768, 3072), "mlp.c_proj": (3072, 768)}  # (in, out)


def gpt2_linears(n_layers: int, seed: int) -> torch.nn.Sequential:
    g = torch.Generator().manual_seed(seed)
    layers = []
    for _ in range(n_layers):
        for fan_in, fan_out in SHAPES.values():
            lin = torch.nn.Linear(fan_in, fan_out, bias=False)
            with torch.no_grad():
                lin.weight.copy_(torch.randn(fan_out, fan_in, generator=g) / math.sqrt(fan_in))
            layers.append(lin)
    return torch.nn.Sequential(*layers)


def best_of(f, repeats: int = 3) -> float:
    """Least wall time of ``repeats`` calls (after one warm-up call)."""
    f()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


def floor(mats: list[torch.Tensor]) -> dict:
    """The cheapest step of any exact method (the float32 Gram matrix) and WeightWatcher's SVD, summed over matrices."""
    import numpy as np
    import scipy.linalg

    short = [w if w.shape[0] >= w.shape[1] else w.T for w in mats]  # N >= M: the Gram matrix is M x M
    gram = sum(best_of(lambda a=a: a.T @ a) for a in short)
    svd = sum(best_of(lambda a=a: scipy.linalg.svd(a.numpy().astype(np.float64), compute_uv=False), 1) for a in mats)
    return {"floor_gram_float32_s": round(gram, 3), "weightwatcher_svd_s": round(svd, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-ww", action="store_true", help="only time lenslab")
    args = ap.parse_args()

    load = os.getloadavg()[0]
    model = gpt2_linears(args.layers, args.seed)
    names = [f"h.{i}.{k}" for i in range(args.layers) for k in SHAPES]
    mats = [lin.weight.detach() for lin in model]

    t = time.perf_counter()
    ours = [htsr_alpha(w, n, min_tail=2) for n, w in zip(names, mats)]  # min_tail=2: a number wherever WW gives one
    t_ours = time.perf_counter() - t
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads // 2))
    try:
        t = time.perf_counter()
        with ThreadPoolExecutor(max_workers=2) as pool:
            ours2 = list(pool.map(lambda nw: htsr_alpha(nw[1], nw[0], min_tail=2), zip(names, mats)))
        t_ours2 = time.perf_counter() - t
    finally:
        torch.set_num_threads(threads)

    result = {
        "model": {
            "n_layers": args.layers,
            "shapes_in_out": {k: list(v) for k, v in SHAPES.items()},
            "init": "N(0, 1/fan_in)",
            "seed": args.seed,
        },
        "n_matrices": len(mats),
        "torch_threads": threads,
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
        "load_average_1min_at_start": round(load, 2),  # the 2-core machine was shared with other jobs
        "lenslab_s": round(t_ours, 3),
        "lenslab_2_workers_s": round(t_ours2, 3),
        "two_workers_same_xmin": all(a.n_tail == b.n_tail for a, b in zip(ours, ours2)),
        "two_workers_max_abs_alpha_diff": max(abs(a.alpha - b.alpha) for a, b in zip(ours, ours2)),  # eigvalsh rounding
        "alpha_range": [round(min(f.alpha for f in ours), 3), round(max(f.alpha for f in ours), 3)],
        "nan_with_default_min_tail": sum(htsr_alpha(w).reason is not None for w in mats),
        "floor": floor(mats),
    }
    if not args.skip_ww:
        import weightwatcher as ww

        logging.getLogger("weightwatcher").setLevel(logging.ERROR)
        t = time.perf_counter()
        df = ww.WeightWatcher(model=model).analyze()
        t_ww = time.perf_counter() - t
        d_alpha = [abs(f.alpha - float(a)) for f, a in zip(ours, df["alpha"])]
        d_ks = [abs(f.ks_distance - float(d)) for f, d in zip(ours, df["D"])]
        result.update(
            weightwatcher_version=ww.__version__,
            weightwatcher_analyze_s=round(t_ww, 3),
            speedup_vs_weightwatcher=round(t_ww / t_ours, 1),
            speedup_vs_weightwatcher_2_workers=round(t_ww / t_ours2, 1),
            max_speedup_of_any_gram_method=round(t_ww / result["floor"]["floor_gram_float32_s"], 1),
            ww_rows=len(df),
            max_abs_alpha_diff=max(d_alpha),
            max_abs_ks_diff=max(d_ks),
            same_xmin_index=all(f.n_tail == int(k) for f, k in zip(ours, df["num_pl_spikes"])),
            per_matrix=[
                {
                    "name": n,
                    "shape": list(w.shape),
                    "ww_alpha": float(a),
                    "lenslab_alpha": f.alpha,
                    "abs_diff": d,
                    "n_tail": f.n_tail,
                }
                for n, w, a, f, d in zip(names, mats, df["alpha"], ours, d_alpha)
            ],
        )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
