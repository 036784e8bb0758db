"""Epoch time of lenslab's trainer vs a plain TransformerLens loop, measured in the same run.

    .venv/bin/python benchmarks/train_speed.py [--epochs 2] [--n-train 16384]

Both train the paper's 2L 2-head model (d_model 64, d_mlp 128) on MPSP (seq_len 5) with AdamW,
batch 512. The plain loop is HookedTransformer forward + cross-entropy + AdamW and nothing else;
lenslab's epoch time includes its per-epoch work but not evaluations (eval_every > epochs).
Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings

import torch
import torch.nn.functional as F

warnings.filterwarnings("ignore", message=".*HookedTransformer is deprecated.*")

from lenslab.training.config import mpsp_run_config
from lenslab.training.presets import build_model
from lenslab.training.trainer import make_splits, train


def plain_tl_epoch_time(cfg: dict, epochs: int) -> float:
    splits = make_splits(cfg)
    model = build_model(cfg["model"], seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    x, y = splits["train_tokens"], splits["train_labels"]
    times = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        perm = torch.randperm(len(x))
        for s in range(0, len(x), 512):
            idx = perm[s : s + 512]
            loss = F.cross_entropy(model(x[idx])[:, -1], y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        times.append(time.perf_counter() - t0)
    return min(times)


def lenslab_epoch_time(cfg: dict, epochs: int) -> float:
    cfg = {**cfg, "train": {**cfg["train"], "epochs": epochs, "eval_every": 10**6}}
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        train(cfg, d, progress=False)
        total = time.perf_counter() - t0
    return total / epochs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--n-train", type=int, default=16_384)
    a = ap.parse_args()
    cfg = mpsp_run_config(n_train=a.n_train, layers=2, heads=2)
    tl = plain_tl_epoch_time(cfg, a.epochs)
    ours = lenslab_epoch_time(cfg, a.epochs)
    print(
        json.dumps(
            {
                "model": "2L 2H d_model 64 d_mlp 128, MPSP seq_len 5",
                "n_train": a.n_train,
                "batch_size": 512,
                "threads": torch.get_num_threads(),
                "plain_tl_s_per_epoch": round(tl, 3),
                "lenslab_s_per_epoch_incl_2_evals": round(ours, 3),
                "ratio_lenslab_over_tl": round(ours / tl, 3),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
