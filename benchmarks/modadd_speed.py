"""Modular-addition training steps per second: plain TransformerLens loop vs the ensemble engine, float32 and float64.

    .venv/bin/python benchmarks/modadd_speed.py [--primes 31,59,113] [--steps 20] [--rounds 3] [--ensemble 8] [--device cpu]

The grokking set-up: train fraction 0.3, full batch (one step = one epoch), AdamW lr 1e-3,
betas (0.9, 0.98), weight decay 1.0. Loops, timed round-robin (so load from other processes hits
each alike) and reported as the best of ``--rounds`` rounds of ``--steps`` steps:

- ``plain``: one seed, ``HookedTransformer`` + ``torch.optim.AdamW`` (what ``lenslab train`` runs per step);
- ``ensemble``: E seeds, ``StackedTransformer`` + ``StackedAdamW`` (``lenslab train --seeds``).

``seed_steps_per_s`` counts each member's step; ``ratio_vs_plain`` divides it by the plain
loop's steps/s of the same prime and dtype, measured in the same run. Training steps only, no
evaluation. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lenslab.training.config import modadd_run_config
from lenslab.training.ensemble import ensemble_step
from lenslab.training.presets import build_model
from lenslab.training.stacked import StackedTransformer
from lenslab.training.stacked_adamw import StackedAdamW
from lenslab.training.trainer import epoch_generator, make_splits


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def plain_stepper(cfg, splits, dev):
    t = cfg["train"]
    model = build_model(cfg["model"], seed=0, device=str(dev), dtype=t["dtype"])
    opt = torch.optim.AdamW(model.parameters(), lr=t["lr"], betas=tuple(t["betas"]), weight_decay=t["weight_decay"])
    tokens, labels = splits["train_tokens"].to(dev), splits["train_labels"].to(dev)
    perm = torch.randperm(len(tokens), generator=epoch_generator(0, 1)).to(dev)

    def step():
        loss = F.cross_entropy(model(tokens[perm])[:, -1], labels[perm])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def ensemble_stepper(cfg, splits, E, dev):
    t = cfg["train"]
    stack = StackedTransformer.from_models([build_model(cfg["model"], seed=s, dtype=t["dtype"]) for s in range(E)]).to(dev)
    opt = StackedAdamW(list(stack.params), [t["lr"]] * E, [t["weight_decay"]] * E, tuple(t["betas"]))
    tokens = splits["train_tokens"].to(dev).expand(E, -1, -1).contiguous()
    labels = splits["train_labels"].to(dev).expand(E, -1).contiguous()
    n = tokens.shape[1]
    perm = torch.stack([torch.randperm(n, generator=epoch_generator(s, 1)) for s in range(E)]).to(dev)

    def step():
        ensemble_step(stack, opt, tokens, labels, perm)

    return step


def _time(step, steps, dev) -> float:
    _sync(dev)
    t = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(dev)
    return (time.perf_counter() - t) / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--primes", default="31,59,113")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ensemble", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    dev = torch.device(a.device)
    E = a.ensemble
    rows = []
    for p in [int(x) for x in a.primes.split(",")]:
        for dtype in ("float32", "float64"):
            cfg = modadd_run_config(p=p, train_frac=0.3, dtype=dtype)
            splits = make_splits(cfg)
            loops = {"plain": plain_stepper(cfg, splits, dev), "ensemble": ensemble_stepper(cfg, splits, E, dev)}
            for step in loops.values():
                step()  # warm-up
            best = {k: float("inf") for k in loops}
            for _ in range(a.rounds):
                for k, step in loops.items():
                    best[k] = min(best[k], _time(step, a.steps, dev))
            plain = 1 / best["plain"]
            ens = E / best["ensemble"]
            rows.append(
                {
                    "p": p,
                    "dtype": dtype,
                    "n_train": len(splits["train_tokens"]),
                    "plain_steps_per_s": round(plain, 2),
                    "ensemble_size": E,
                    "ensemble_steps_per_s": round(1 / best["ensemble"], 2),
                    "ensemble_seed_steps_per_s": round(ens, 2),
                    "ratio_vs_plain": round(ens / plain, 2),
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    out = {
        "benchmark": "modadd_speed",
        "device": str(dev),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "steps_per_round": a.steps,
        "rounds": a.rounds,
        "note": "full batch: one step = one epoch; training steps only (no evaluation); best of rounds, round-robin",
        "results": rows,
    }
    if dev.type == "cuda":
        out["cuda_device"] = torch.cuda.get_device_name(dev)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
